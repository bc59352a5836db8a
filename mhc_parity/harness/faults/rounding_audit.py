"""The rounding audit: every bfloat16 value the reference path holds, and the model's site for it.

A value a correct bfloat16 path rounds that the model holds exact leaves a correct error unexplained.
`bfloat16_values` traces the reference's forward and VJP and lists each function making a bfloat16 value
with its sites (`MODELLED_BY`; a test keeps `unmodelled` empty); `site_shares` gives each site's share of
each leaf's sensitivity. `mhc-parity faults --audit` writes both.
"""

from __future__ import annotations

import collections
import dataclasses
import pathlib
import re
from collections.abc import Mapping, Sequence

import jax
import jax.numpy as jnp
from jax.extend.core import ClosedJaxpr, Jaxpr
from jax.extend.source_info_util import summarize

from mhc_parity.cases.branches import get_branch
from mhc_parity.harness.engine.oracle_path import named_leaves, noise_seeds, noise_units, root_mean_square
from mhc_parity.harness.judging.error_statistics import draw_deviations
from mhc_parity.mhc import oracle, reference, rounding_model
from mhc_parity.records.project_code import PROJECT_ROOT

# The functions of the reference path (and of the branches) that hold a bfloat16 value, and
# the model's sites that round it: the value itself, or the cotangent its VJP hands back.
MODELLED_BY: Mapping[str, tuple[str, ...]] = {
    "MhcWeights.astype_for_compute": ("matmul_weight",),
    "fold_norm_into_projection": ("folded_weight", "matmul_weight"),
    "matmul": ("folded_weight", "branch_param", "projection", "layer_input", "mlp_hidden", "mlp_preactivation"),
    "rms_inverse": ("x",),
    "compute_coefficients": ("x",),
    "collapse_streams": ("layer_input", "x"),
    "expand_streams": ("out", "layer_output", "x"),
    "mlp_apply": ("branch_param", "mlp_hidden", "layer_output"),
    "tanh_apply": ("layer_output",),
}
# bfloat16 runs of each branch with parameters, and the cancelling init family.
AUDIT_CASES = (
    "lite-n4-c128-b2s64-bf16-w32-mlp-mixed_signs",
    "lite-n4-c256-b2s64-bf16-w32-mlp-default",
    "lite-n4-c128-b2s64-bf16-w32-identity-default",
)


_SUMMARY = re.compile(r"^(.*):(\d+):\d+ \((.*)\)$")
# A comprehension's own frame: Python 3.11 gives every comprehension one, 3.12 inlines all but
# generator expressions (PEP 709); either way the value is the enclosing function's.
_COMPREHENSION_FRAME = re.compile(r"(?:\.<locals>\.<(?:listcomp|dictcomp|setcomp|genexpr)>)+$")


@dataclasses.dataclass(frozen=True)
class BfloatValue:
    """The bfloat16 results one function of the reference path makes: where, how many equations, which
    primitives, and the model's sites for them."""

    function: str
    location: str
    equations: int
    primitives: tuple[str, ...]
    sites: tuple[str, ...]


def _walk(jaxpr, found: collections.defaultdict) -> None:
    if isinstance(jaxpr, ClosedJaxpr):
        jaxpr = jaxpr.jaxpr
    for eqn in jaxpr.eqns:
        if any(str(v.aval.dtype) == "bfloat16" for v in eqn.outvars):
            # "file:line:column (function)", JAX's public summary of where an equation was made.
            where = _SUMMARY.match(summarize(eqn.source_info))
            if where is not None:
                file_name, line, function = where.groups()
                function = _COMPREHENSION_FRAME.sub("", function)
                found[(function, file_name, int(line))].append(eqn.primitive.name)
        for value in eqn.params.values():
            for item in value if isinstance(value, (tuple, list)) else (value,):
                if isinstance(item, (ClosedJaxpr, Jaxpr)):
                    _walk(item, found)


def bfloat16_equations(jaxpr) -> dict[tuple[str, str, int], list[str]]:
    """(function, file, line) -> primitives of the equations there with a bfloat16 result, over `jaxpr` and
    the jaxprs inside it; a comprehension's equations are its enclosing function's."""
    found: collections.defaultdict = collections.defaultdict(list)
    _walk(jaxpr, found)
    return dict(found)


def bfloat16_values(case, fixture) -> list[BfloatValue]:
    """Every function of the reference's forward + VJP making a bfloat16 value for `case` (traced on the
    fixture's shapes, not run), with the model's sites for it."""
    config, branch = case.mhc_config(), get_branch(case.branch)

    def layer(x, weights, params):
        layer_input, context = reference.pre(x, weights, config=config)
        return reference.post(branch.apply(params, layer_input), context, config=config)

    def forward_and_vjp(x, weights, params, cotangent):
        out, pullback = jax.vjp(layer, x, weights, params)
        return out, pullback(cotangent)

    params = {k: jnp.asarray(v) for k, v in fixture.branch_params.items()}
    jaxpr = jax.make_jaxpr(forward_and_vjp)(fixture.x, fixture.mhc_weights(), params, fixture.cotangent)
    found = bfloat16_equations(jaxpr)
    by_function: dict[str, list] = collections.defaultdict(list)
    for (function, file_name, line), primitives in found.items():
        by_function[function].append((file_name, line, primitives))
    values = []
    for function, places in sorted(by_function.items()):
        locations = sorted({f"{_relative(f)}:{line}" for f, line, _ in places})
        primitives = tuple(sorted({p for _, _, prims in places for p in prims}))
        values.append(
            BfloatValue(
                function,
                ", ".join(locations),
                sum(len(prims) for _, _, prims in places),
                primitives,
                MODELLED_BY.get(function, ()),
            )
        )
    return values


def _relative(file_name: str) -> str:
    try:
        return str(pathlib.Path(file_name).resolve().relative_to(PROJECT_ROOT))
    except ValueError:
        return pathlib.Path(file_name).name


def unmodelled(values: Sequence[BfloatValue]) -> list[BfloatValue]:
    return [v for v in values if not v.sites]


def site_shares(case, fixture, leaves: Sequence[str] | None = None) -> dict[str, dict[str, float]]:
    """site -> leaf -> RMS deviation of the oracle's draws with only that site rounding over that with every
    site (same random numbers, so independent sites' shares add in squares)."""
    branch = get_branch(case.branch)
    units = noise_units(case)
    draws = [(0, None)] + [(seed, units) for seed in noise_seeds(case)]
    arguments = (fixture.x, fixture.weights, branch.apply, fixture.branch_params, fixture.cotangent, case.mhc_config())

    def deviations(only_sites=None) -> dict[str, float]:
        exact, *noisy = oracle.run_oracle_batch(
            *arguments, draws=draws, branch_sites=branch.rounding_sites, only_sites=only_sites
        )
        exact_leaves, noisy_leaves = named_leaves(exact), [named_leaves(d) for d in noisy]
        return {
            name: root_mean_square(draw_deviations([d[name] for d in noisy_leaves], exact_leaves[name])[1])
            for name in leaves or list(exact_leaves)
        }

    total = deviations()
    shares = {}
    for site in [*rounding_model.ROUNDING_SITES, *branch.rounding_sites]:
        alone = deviations((site,))
        shares[site] = {name: (alone[name] / total[name] if total[name] else 0.0) for name in total}
    return shares


# The leaves the share table shows (one per kind, and the ones the bounds rest on most).
SHARE_LEAVES = ("out", "layer_input", "h_pre", "d_x", "d_pre_bias", "d_post_alpha", "d_res_scale", "d_branch.w_in")


@dataclasses.dataclass(frozen=True)
class CaseAudit:
    case: str
    values: tuple[BfloatValue, ...]
    shares: Mapping[str, Mapping[str, float]]

    @property
    def unmodelled(self) -> list[BfloatValue]:
        return unmodelled(self.values)


def audit_case(case, fixture) -> CaseAudit:
    return CaseAudit(case.name, tuple(bfloat16_values(case, fixture)), site_shares(case, fixture))


def audit_markdown(audits: Sequence[CaseAudit]) -> str:
    """The audits as Markdown: per case the bfloat16 values with their sites, then each site's shares."""
    lines = [
        "# Rounding audit",
        "",
        "Every bfloat16 value the reference path's forward and VJP hold, by the function that makes it, and the "
        "rounding model's sites for it; then, per site, the share of each leaf's sensitivity that site explains "
        "alone (RMS over the oracle's draws with only that site rounding, over the RMS with every site). "
        "A leaf whose bound rests on one site is as sharp as that site's precision class is right.",
        "",
    ]
    for audit in audits:
        lines += [
            f"## `{audit.case}`",
            "",
            "| function | where | bfloat16 results | model sites |",
            "|---|---|---:|---|",
        ]
        lines += [
            f"| `{v.function}` | {v.location} | {v.equations} | {', '.join(v.sites) or '**none: unmodelled**'} |"
            for v in audit.values
        ]
        missing = audit.unmodelled
        lines += ["", f"Unmodelled: {', '.join(v.function for v in missing) if missing else 'none'}.", ""]
        shown = [leaf for leaf in SHARE_LEAVES if leaf in next(iter(audit.shares.values()))]
        lines += ["| site | " + " | ".join(f"`{leaf}`" for leaf in shown) + " |", "|---|" + "---:|" * len(shown)]
        for site, by_leaf in audit.shares.items():
            if any(by_leaf[leaf] >= 0.005 for leaf in shown):
                lines.append(f"| `{site}` | " + " | ".join(f"{by_leaf[leaf]:.3f}" for leaf in shown) + " |")
        lines += ["", "Sites below 0.005 of every shown leaf are left out.", ""]
    return "\n".join(lines) + "\n"
