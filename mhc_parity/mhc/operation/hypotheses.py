"""What may have caused a failing leaf: roundings the model does not allow, run through the oracle.

`hypotheses` lists, per case, each site's value or cotangent rounded coarser than its class
allows (gate parameters per gate), each contraction summed in a narrow dtype (matched by size:
its error depends on the order), fitted per-token errors of the RMS statistic, and the
backend's own primitives. `hypothesis_draws` / `hypothesis_responses` run them on a fixture.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

import jax.numpy as jnp

from mhc_parity.mhc import oracle, rounding_model
from mhc_parity.mhc.operation.oracle_draws import on_fixture
from mhc_parity.mhc.oracle_backend import REPLAYED, backend_evaluator, run_oracle_backend
from mhc_parity.mhc.oracle_fits import FITTED_SITES, SiteResponse, site_response
from mhc_parity.mhc.oracle_roundings import (
    BACKEND_ORDER,
    DIRECTIONS,
    OUTPUTS,
    ROUNDING_DTYPES,
    Accumulation,
    Rounding,
    output_spec,
    run_oracle_roundings,
    summed_letters,
)

# The values each site holds, in words (the backward direction is their cotangent).
SITE_WORDS: Mapping[str, str] = {
    "x": "the input x",
    "matmul_weight": "the projection weights (norm scale, alphas)",
    "gate_weight": "the gate scales and biases",
    "branch_param": "the branch parameters",
    "rms_inverse": "the RMS statistic",
    "normed_operand": "the normalised activations",
    "folded_weight": "the folded projection weights",
    "projection": "the projection",
    "gate_logit": "the gate logits",
    "gate": "the gates (h_pre, h_post, h_res)",
    "permutation_operand": "the softmax weights as the permutation mix's operand",
    "softmax_inner_product": "the softmax VJP's inner product",
    "coefficient_operand": "h_pre, h_post, h_res as contraction operands",
    "layer_input": "the branch input",
    "layer_output": "the branch output",
    "residual_mix": "the residual mix",
    "out": "the layer output",
}
# A rounding of the pre/post gates and one of the residual gate may pair (different places).
GATE_GROUPS: Mapping[str, tuple[str, ...]] = {
    "the pre gate": ("pre_scale", "pre_bias"),
    "the post gate": ("post_scale", "post_bias"),
    "the pre and post gates": ("pre_scale", "pre_bias", "post_scale", "post_bias"),
    "the residual gate": ("res_scale", "res_bias"),
}


ACCUMULATION_BLOCKS = (1, 128)  # term by term, and a kernel's tile along the lanes
# Summed narrowly only where the gate parameters are held narrow (`_gate_held_narrow`).
GATE_CONTRACTIONS = ("gate_scale", "gate_bias")
# The suffix of a gate hypothesis whose gradients the backend sums narrowly.
BACKEND_SUMS = "backend_sums"


@dataclasses.dataclass(frozen=True)
class Hypothesis:
    """One candidate cause of a failing leaf.

    name: stable, in `name_problem`'s grammar. kind: "rounding" and "backend" (matched value for
    value), "accumulation" (by size) or "fitted". family: the place it rounds (two of one family
    never pair). ordered: its error depends on a narrow sum's order. backend_sum_weights: weights
    whose gradients a backend sums narrowly in its own order (off the host, only their size is a
    prediction). variant_of: the hypothesis with its forward values and another backward.
    """

    name: str
    label: str
    kind: str
    family: str
    roundings: tuple[Rounding | Accumulation, ...]
    site: str = ""
    backward: str = ""
    ordered: bool = False
    primitives: tuple[str, ...] = ()
    backend_sum_weights: tuple[str, ...] = ()
    variant_of: str = ""


def _unit_roundoff(dtype: str) -> float:
    return float(jnp.finfo(dtype).eps) / 2


def _allowed_unit(site: rounding_model.RoundingSite, direction: str, units: Mapping[str, float]) -> float:
    classes = site.forward if direction == "forward" else site.backward
    return max((units[c] for c in classes), default=0.0)


def _words(site: str, direction: str, group: str = "") -> str:
    what = SITE_WORDS.get(site, f"the branch's {site.replace('_', ' ')}")
    if group:
        what = f"{group}' scales and biases" if group.endswith("gates") else f"{group}'s scale and bias"
    if direction == "backward":
        gradient = site in ("matmul_weight", "gate_weight", "branch_param")
        return f"{'the gradient' if gradient else 'the cotangent'} of {what}"
    return what


def hypotheses(case, branch, units: Mapping[str, float]) -> list[Hypothesis]:
    """Every `Hypothesis` for `case`: roundings coarser than `units` (per precision class) allow
    at the layer's and `branch`'s sites, then accumulations, fitted and backend ones."""
    sites = {**rounding_model.ROUNDING_SITES, **dict(branch.rounding_sites)}
    dtypes = list(dict.fromkeys([case.dtype, "bfloat16"]))
    found = []
    for site_name, site in sites.items():
        if site.backend_only:
            continue  # the output of a backend primitive: `backend_hypotheses` name that
        groups = GATE_GROUPS if site_name == "gate_weight" else {"": ()}
        for direction in ("forward", "backward"):
            for dtype in dtypes:
                # x is already in the activation dtype; nothing flows back through the cotangent.
                already = site_name in ("x", "cotangent") and direction == "forward" and dtype == case.dtype
                inert = site_name == "cotangent" and direction == "backward"
                if already or inert or _unit_roundoff(dtype) <= _allowed_unit(site, direction, units):
                    continue
                for group, parts in groups.items():
                    tag = "/" + _group_tag(group) if group else ""
                    rounding = Rounding(site_name, direction, dtype, parts)
                    found.append(
                        Hypothesis(
                            name=f"round:{site_name}{tag}:{direction}:{dtype}",
                            label=f"{_words(site_name, direction, group)} rounded to {dtype}",
                            kind="rounding",
                            family=_family(site_name, direction, parts),
                            roundings=(rounding,),
                        )
                    )
                    if group and direction == "forward" and dtype == case.dtype:
                        # Held in the activation dtype, the gate's affine runs there too.
                        found.append(_gate_held_narrow(group, tag, rounding))
                    if group and direction == "forward":
                        found += _gate_variants(group, tag, rounding)
    return found + accumulation_hypotheses(case) + fitted_hypotheses() + backend_hypotheses(case, branch)


BACKEND_KIND = "backend"
# The primitives the layer itself evaluates, per variant (its branch's: the branch's sites).
LAYER_PRIMITIVES = {"lite": ("logistic", "rsqrt", "exp"), "sinkhorn": ("logistic", "rsqrt", "exp", "log")}


def case_primitives(case, branch) -> tuple[str, ...]:
    """The `REPLAYED` primitives the case's layer and branch evaluate, in `REPLAYED` order."""
    used = set(LAYER_PRIMITIVES[case.variant])
    for site in branch.rounding_sites.values():
        used.update(p for _, primitives in site.primitives for p in primitives)
    return tuple(p for p in REPLAYED if p in used)


def backend_hypotheses(case, branch) -> list[Hypothesis]:
    """The backend's own float32 primitives: each the case uses alone (its own family), and all at once."""
    used = case_primitives(case, branch)
    sets = [(p,) for p in used] + ([used] if len(used) > 1 else [])
    return [
        Hypothesis(
            name=f"backend:{'+'.join(chosen)}:float32",
            label=f"the backend's own float32 {_listed(chosen)}",
            kind=BACKEND_KIND,
            family=f"backend:{'+'.join(chosen)}",
            roundings=(),
            primitives=chosen,
        )
        for chosen in sets
    ]


def _listed(names: tuple[str, ...]) -> str:
    """("exp", "log", "tanh") -> "exp, log and tanh"."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def _group_tag(group: str) -> str:
    """ "the pre gate" -> "pre_gate"."""
    return group.removeprefix("the ").replace(" ", "_")


def _gate(part: str) -> str:
    """ "res_bias" -> "res"."""
    return part.split("_")[0]


def _family(site: str, direction: str, parts: tuple[str, ...]) -> str:
    """Site and direction, with pre_post / residual for gate parameters."""
    if not parts:
        return f"{site}:{direction}"
    gates = "residual" if {_gate(p) for p in parts} == {"res"} else "pre_post"
    return f"{site}/{gates}:{direction}"


def _gate_held_narrow(group: str, tag: str, rounding: Rounding) -> Hypothesis:
    """`group`'s gate parameters held in `rounding`'s dtype where the gate is computed, so their
    gradients' sums over tokens run in that dtype in the backend's order (as MaxText 0.2.5's
    reference casts them)."""
    gates = tuple(dict.fromkeys(_gate(p) for p in rounding.parts))
    sums = tuple(
        Accumulation(name, "first_cotangent", rounding.dtype, BACKEND_ORDER, parts=gates) for name in GATE_CONTRACTIONS
    )
    return Hypothesis(
        name=f"round:gate_weight{tag}:forward:{rounding.dtype}:{BACKEND_SUMS}",
        label=f"{_words('gate_weight', 'forward', group)} rounded to {rounding.dtype}, their gradients "
        f"summed in {rounding.dtype} by the backend",
        kind="rounding",
        family=_family("gate_weight", "forward", rounding.parts),
        roundings=(rounding, *sums),
        ordered=True,
        backend_sum_weights=rounding.parts,
        variant_of=f"round:gate_weight{tag}:forward:{rounding.dtype}",
    )


CAST = "cast"  # a gate rounding in both directions at once


def _gate_variants(group: str, tag: str, rounding: Rounding) -> list[Hypothesis]:
    """The forward rounding of `group`'s gate parameters with another backward: "recomputed"
    (the backward recomputes the gates from unrounded parameters) and "cast" (the cast's VJP also
    rounds each gradient, summed over tokens; a backend may fold it into that sum)."""
    ways = {
        "recomputed": (
            "rounded to {dtype} in the forward pass, the backward recomputing the gates from the unrounded ones",
            (dataclasses.replace(rounding, direction="recomputed"),),
        ),
        CAST: (
            "cast to {dtype} (their gradients rounded by the cast too)",
            (rounding, dataclasses.replace(rounding, direction="backward")),
        ),
    }
    return [
        Hypothesis(
            name=f"round:gate_weight{tag}:{way}:{rounding.dtype}",
            label=f"{_words('gate_weight', 'forward', group)} {words.format(dtype=rounding.dtype)}",
            kind="rounding",
            family=_family("gate_weight", "forward", rounding.parts),
            roundings=roundings,
            backend_sum_weights=rounding.parts if way == CAST else (),
            variant_of=f"round:gate_weight{tag}:forward:{rounding.dtype}",
        )
        for way, (words, roundings) in ways.items()
    ]


# Label words per `oracle_fits.BACKWARDS`.
FITTED_BACKWARD_WORDS: Mapping[str, str] = {
    "differentiated": "",
    "recomputed": " in the forward pass, the backward recomputing it",
}


def fitted_hypotheses() -> list[Hypothesis]:
    """A per-token error of any size at each `FITTED_SITES` value, per backward."""
    return [
        Hypothesis(
            name=f"fit:{site}:{backward}",
            label=f"{SITE_WORDS[site]} computed in a narrow dtype{words} (its error fitted per token)",
            kind="fitted",
            family=f"{site}:forward",
            roundings=(),
            site=site,
            backward=backward,
        )
        for site in FITTED_SITES
        for backward, words in FITTED_BACKWARD_WORDS.items()
    ]


def _letter_sizes(case) -> dict[str, int]:
    """The length of each letter of the `CONTRACTIONS` specs for `case`."""
    n = case.streams
    mixes = math.factorial(n) if case.variant == "lite" else n * n
    sizes = dict(b=case.batch, s=case.sequence, k=n * case.embedding, c=case.embedding, n=n, i=n, j=n)
    return {**sizes, "m": 2 * n + mixes, "p": math.factorial(n)}


def _summed_words(contraction: rounding_model.Contraction, output: str) -> str:
    if output == "value":
        return contraction.words
    operand = contraction.operands[OUTPUTS.index(output) - 1]
    return f"the cotangent of {operand} in {contraction.words}"


def accumulation_hypotheses(case) -> list[Hypothesis]:
    """Each contraction's value and operand cotangents summed narrower than float32, term by term
    and in `ACCUMULATION_BLOCKS`, or exactly then rounded once (kind "rounding"); one-term sums,
    the permutation matrices' cotangent and `GATE_CONTRACTIONS` left out."""
    sizes = _letter_sizes(case)
    wide = _unit_roundoff("float32")
    dtypes = [d for d in dict.fromkeys([case.dtype, "bfloat16"]) if _unit_roundoff(d) > wide]
    found = []
    for name, contraction in rounding_model.CONTRACTIONS.items():
        if (name == "permutation_mix" and case.variant != "lite") or name in GATE_CONTRACTIONS:
            continue
        for output in OUTPUTS:
            if (name, output) == ("permutation_mix", "second_cotangent"):
                continue
            length = math.prod(sizes[c] for c in summed_letters(output_spec(contraction.spec, output)))
            if length <= 1:
                continue
            words = _summed_words(contraction, output)
            for dtype in dtypes:
                blocks = [b for b in ACCUMULATION_BLOCKS if b < length] + [length]
                for block in blocks:
                    once = block == length
                    how = "term by term" if block == 1 else f"in blocks of {block}"
                    found.append(
                        Hypothesis(
                            name=f"accumulate:{name}:{output}:{dtype}:{'once' if once else block}",
                            label=f"{words} rounded to {dtype} once summed"
                            if once
                            else f"{words} summed in {dtype} {how}",
                            kind="rounding" if once else "accumulation",
                            family=f"accumulate:{name}:{output}",
                            roundings=(Accumulation(name, output, dtype, block),),
                            ordered=not once,
                        )
                    )
    return found


def name_problem(name: str) -> str:
    """What is wrong with `name` as a hypothesis name ("" if the grammar allows it): precision
    choices naming a hypothesis are checked, since a typo would otherwise change nothing."""
    fields = name.split(":")
    kind = fields[0]
    if kind == "round" and len(fields) in (4, 5):
        site, _, group = fields[1].partition("/")
        groups = {_group_tag(g) for g in GATE_GROUPS}
        if group and (site != "gate_weight" or group not in groups):
            return f"{name!r}: gate group {group!r} is not one of {sorted(groups)}"
        if not site.isidentifier():
            return f"{name!r}: {site!r} is not a site name"
        directions = (*DIRECTIONS, CAST) if group else DIRECTIONS
        if fields[2] not in directions or fields[3] not in ROUNDING_DTYPES:
            return f"{name!r}: direction and dtype are one of {directions} and one of {ROUNDING_DTYPES}"
        if len(fields) == 5 and (fields[4] != BACKEND_SUMS or not group or fields[2] != "forward"):
            return f"{name!r}: only a gate group's forward rounding ends in ':{BACKEND_SUMS}'"
        return ""
    if kind == "accumulate" and len(fields) == 5:
        contraction, output, dtype, block = fields[1:]
        if contraction not in rounding_model.CONTRACTIONS or output not in OUTPUTS or dtype not in ROUNDING_DTYPES:
            return (
                f"{name!r}: a contraction of {sorted(rounding_model.CONTRACTIONS)}, an output of {OUTPUTS} "
                f"and a dtype of {ROUNDING_DTYPES}"
            )
        if not (block == "once" or (block.isdigit() and int(block) >= 1)):
            return f"{name!r}: the block is a positive number or 'once'"
        return ""
    if kind == "backend" and len(fields) == 3:
        unknown = sorted(set(fields[1].split("+")) - set(REPLAYED))
        if unknown or fields[2] != "float32":
            return f"{name!r}: primitives of {tuple(REPLAYED)} joined by '+', then ':float32'"
        return ""
    if kind == "fit" and len(fields) == 3:
        if fields[1] not in FITTED_SITES or fields[2] not in FITTED_BACKWARD_WORDS:
            return f"{name!r}: a fitted site of {FITTED_SITES} and a backward of {tuple(FITTED_BACKWARD_WORDS)}"
        return ""
    return (
        f"{name!r} is no hypothesis name: 'round:<site>[/<gate group>]:<direction>:<dtype>', "
        f"'accumulate:<contraction>:<output>:<dtype>:<block|once>', 'fit:<site>:<backward>' or "
        f"'backend:<primitive>[+<primitive>]:float32'"
    )


def hypothesis_draws(case, fixture, branch, chosen: Sequence[Hypothesis]) -> list[oracle.OracleResult]:
    """The oracle on `fixture` once per (non-fitted) hypothesis, in order, NumPy float64."""
    fitted = [h.name for h in chosen if h.kind == "fitted"]
    if fitted:
        raise ValueError(f"fitted hypotheses have responses, not draws: {fitted}")
    backend = [i for i, h in enumerate(chosen) if h.kind == BACKEND_KIND]
    others = [i for i in range(len(chosen)) if i not in set(backend)]
    draws = {}
    if others:
        found = on_fixture(
            run_oracle_roundings, case, fixture, branch, hypotheses=[chosen[i].roundings for i in others]
        )
        draws.update(zip(others, found))
    if backend:
        sets = [frozenset(chosen[i].primitives) for i in backend]
        found = on_fixture(run_oracle_backend, case, fixture, branch, primitives=sets, evaluator=backend_evaluator())
        draws.update(zip(backend, found))
    return [draws[i] for i in range(len(chosen))]


def hypothesis_responses(case, fixture, branch, chosen: Sequence[Hypothesis]) -> list[SiteResponse]:
    """Each fitted hypothesis' `SiteResponse` (J·p and its transpose) on `fixture`, in order."""
    return [on_fixture(site_response, case, fixture, branch, site=h.site, backward=h.backward) for h in chosen]
