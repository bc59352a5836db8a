"""What may have caused a failing leaf: roundings the model does not allow, run through the oracle.

A correct path rounds each value of the layer in the precision class its site names
(`mhc.oracle.ROUNDING_SITES`). A precision bug rounds one of them more coarsely. For a case,
`hypotheses` lists every such rounding the rounding model does not already allow: each site,
its forward value and its cotangent apart, held in the activation dtype and in bfloat16
(round to nearest), and the gate parameters per gate (the pre/post gates and the residual
gate named apart, as the upstream bug rounds them). `hypothesis_draws` runs them through
`mhc.oracle_roundings` on the case's fixture: each draw's error against the exact oracle is
what that bug would compute.

A correct path accumulates every contraction (`mhc.oracle.CONTRACTIONS`) in float32; each
contraction's value and each operand's cotangent summed in a narrower dtype is a hypothesis
too, term by term (a loop, or a backend's narrow reduction) and in blocks (a kernel adding a
tile's partial sum to a narrow accumulator). Its error depends on the order of the sum, so it
is matched by size (kind "accumulation"). The whole sum rounded once is a rounding (matched
value for value), where the model has no site for it (the RMS statistic's sum of squares).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

import jax.numpy as jnp

from mhc import oracle
from mhc.operation.oracle_draws import on_fixture
from mhc.oracle_roundings import OUTPUTS, Accumulation, Rounding, output_spec, run_oracle_roundings, summed_letters

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
# The gate parameters by gate: the pre and post gates and the residual gate apart.
GATE_GROUPS: Mapping[str, tuple[str, ...]] = {
    "the pre gate": ("pre_scale", "pre_bias"),
    "the post gate": ("post_scale", "post_bias"),
    "the pre and post gates": ("pre_scale", "pre_bias", "post_scale", "post_bias"),
    "the residual gate": ("res_scale", "res_bias"),
    "all three gates": ("pre_scale", "pre_bias", "post_scale", "post_bias", "res_scale", "res_bias"),
}


# The blocks an accumulation hypothesis sums exactly before each narrow addition: 1 (term by
# term) and a kernel's tile along the lanes.
ACCUMULATION_BLOCKS = (1, 128)


@dataclasses.dataclass(frozen=True)
class Hypothesis:
    """One candidate cause of a failing leaf.

    name: a stable identifier ("round:<site>[/<group>]:<direction>:<dtype>", or
    "accumulate:<contraction>:<output>:<dtype>:<block | once>"); label: the cause in words; kind:
    "rounding" (matched value for value) or "accumulation" (matched by size); family: the
    place it rounds ("<site>:<direction>"; two of one family are never a pair); roundings:
    what the oracle rounds and sums narrowly to reproduce it.
    """

    name: str
    label: str
    kind: str
    family: str
    roundings: tuple[Rounding | Accumulation, ...]


def _unit_roundoff(dtype: str) -> float:
    return float(jnp.finfo(dtype).eps) / 2


def _allowed_unit(site: oracle.RoundingSite, direction: str, units: Mapping[str, float]) -> float:
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
    """The roundings the rounding model does not allow for `case`, as `Hypothesis`es.

    branch: the case's `cases.branches.Branch` (its own sites join the layer's); units: the
    model's unit roundoff per precision class (`mhc.oracle.unit_roundoffs`). A rounding to a
    dtype whose unit roundoff is not above the site's allowed one is legitimate and left out.
    """
    sites = {**oracle.ROUNDING_SITES, **dict(branch.rounding_sites)}
    dtypes = list(dict.fromkeys([case.dtype, "bfloat16"]))
    found = []
    for site_name, site in sites.items():
        groups = GATE_GROUPS if site_name == "gate_weight" else {"": ()}
        for direction in ("forward", "backward"):
            for dtype in dtypes:
                # The exact inputs are already in the activation dtype: rounding them there is
                # nothing; and nothing flows back through the output cotangent.
                already = site_name in ("x", "cotangent") and direction == "forward" and dtype == case.dtype
                inert = site_name == "cotangent" and direction == "backward"
                if already or inert or _unit_roundoff(dtype) <= _allowed_unit(site, direction, units):
                    continue
                for group, parts in groups.items():
                    tag = "/" + group.removeprefix("the ").replace(" ", "_") if group else ""
                    found.append(
                        Hypothesis(
                            name=f"round:{site_name}{tag}:{direction}:{dtype}",
                            label=f"{_words(site_name, direction, group)} rounded to {dtype}",
                            kind="rounding",
                            family=f"{site_name}:{direction}",
                            roundings=(Rounding(site_name, direction, dtype, parts),),
                        )
                    )
    return found + accumulation_hypotheses(case)


def _letter_sizes(case) -> dict[str, int]:
    """The length of each letter of `mhc.oracle.CONTRACTIONS`' specs for `case`."""
    n = case.streams
    mixes = math.factorial(n) if case.variant == "lite" else n * n
    sizes = dict(b=case.batch, s=case.sequence, k=n * case.embedding, c=case.embedding, n=n, i=n, j=n)
    return {**sizes, "m": 2 * n + mixes, "p": math.factorial(n)}


def _summed_words(contraction: oracle.Contraction, output: str) -> str:
    if output == "value":
        return contraction.words
    operand = contraction.operands[OUTPUTS.index(output) - 1]
    return f"the cotangent of {operand} in {contraction.words}"


def accumulation_hypotheses(case) -> list[Hypothesis]:
    """Each contraction's value and operand cotangents summed in a dtype narrower than float32
    (the activation dtype, and bfloat16), term by term and in `ACCUMULATION_BLOCKS`, and summed
    exactly then rounded once there (kind "rounding", the block as long as the sum); a sum of
    one term and the constant permutation matrices' cotangent left out."""
    sizes = _letter_sizes(case)
    wide = _unit_roundoff("float32")
    dtypes = [d for d in dict.fromkeys([case.dtype, "bfloat16"]) if _unit_roundoff(d) > wide]
    found = []
    for name, contraction in oracle.CONTRACTIONS.items():
        if name == "permutation_mix" and case.variant != "lite":
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
                        )
                    )
    return found


def hypothesis_draws(case, fixture, branch, chosen: Sequence[Hypothesis]) -> list[oracle.OracleResult]:
    """The oracle on `fixture` once per hypothesis (`mhc.oracle_roundings.run_oracle_roundings`),
    in order: per draw its `forward`, `d_x`, `d_weights` and `d_branch`, NumPy float64."""
    return on_fixture(run_oracle_roundings, case, fixture, branch, hypotheses=[h.roundings for h in chosen])
