"""The oracle's first-order response to an error of any size at one site: fitted hypotheses.

Some bugs (the RMS statistic in bfloat16) leave a per-token relative error p that no single
rounding reproduces; its effect on every leaf is J·p, J the oracle's Jacobian, and the
least-squares p over a candidate's errors is the evidence (`harness.judging.attribution`).
`site_response` gives J (forward mode) and Jᵀ (reverse mode) on a fixture.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from mhc_parity.mhc import oracle, oracle_math, rounding_model

# XLA:CPU's first optimisation level: at level 0 (the sensitivity draws' level) the forward-mode
# derivative of the softmax's VJP comes out NaN (docs/jax-notes.md); level 1 computes it.
_COMPILER_OPTIONS = {"xla_backend_optimization_level": 1}
# One value per token (B, S, 1): far fewer free numbers than the leaves it moves.
FITTED_SITES = ("rms_inverse",)
BACKWARDS = ("differentiated", "recomputed")
# In `layer_and_vjp`'s `pre_offsets` order.
PRE_OUTPUTS = ("layer_input", "h_pre", "h_post", "h_res")


class _Perturbed:
    """The oracle's rounding hook with one site's value times (1 + offset), every other exact."""

    def __init__(self, site: str, offset):
        self.site = site
        self.offset = offset

    def __call__(self, v, site: str, part: str = ""):
        return v * (1.0 + self.offset) if site == self.site else v


@dataclasses.dataclass(frozen=True)
class SiteResponse:
    """The leaves' first-order change for a relative error p (float64, `shape`) of one site's
    value: apply(p) -> `OracleResult` of J·p; transpose(result) -> Jᵀ·result (missing entries zero)."""

    site: str
    shape: tuple[int, ...]
    apply: Callable[[np.ndarray], oracle.OracleResult]
    transpose: Callable[[oracle.OracleResult], np.ndarray]


def _linear_programs(leaves):
    """The jitted J·t and Jᵀ·g of `leaves(x, w, p, ct, offset)` at offset = 0 (offset any pytree)."""

    def forward(x, w, p, ct, offset):
        zeros = jax.tree.map(jnp.zeros_like, offset)
        return jax.jvp(lambda o: leaves(x, w, p, ct, o), (zeros,), (offset,))[1]

    def backward(x, w, p, ct, offset_like, changes):
        _, pullback = jax.vjp(lambda o: leaves(x, w, p, ct, o), jax.tree.map(jnp.zeros_like, offset_like))
        return pullback(changes)[0]

    return jax.jit(forward, compiler_options=_COMPILER_OPTIONS), jax.jit(backward, compiler_options=_COMPILER_OPTIONS)


@functools.cache
def _site_programs(branch_apply, config, branch_sites: rounding_model.BranchSites, site: str):
    """J·p and Jᵀ·g of a relative error p of `site`'s value, differentiated through."""

    def leaves(x, w, p, ct, offset):
        return oracle_math.layer_and_vjp(x, w, p, ct, _Perturbed(site, offset), config, branch_apply, branch_sites)

    return _linear_programs(leaves)


@functools.cache
def _pre_output_programs(branch_apply, config, branch_sites: rounding_model.BranchSites):
    """J·o and Jᵀ·g of offsets o of the pre's outputs (`PRE_OUTPUTS`), the pre's VJP exact."""

    def leaves(x, w, p, ct, offsets):
        return oracle_math.layer_and_vjp(
            x, w, p, ct, oracle_math.unrounded, config, branch_apply, branch_sites, pre_offsets=offsets
        )

    return _linear_programs(leaves)


def _as_outputs(result, template) -> tuple:
    """`result` (an `OracleResult` or alike) in `template`'s `layer_and_vjp` structure, zeros
    where it has no entry."""
    forward, d_x, d_layer_output, d_w, d_p = template

    def entry(value, like):
        return jnp.zeros(like.shape, jnp.float64) if value is None else jnp.asarray(value, jnp.float64)

    return (
        {k: entry(result.forward.get(k), v) for k, v in forward.items()},
        entry(result.d_x, d_x),
        entry(getattr(result, "d_layer_output", None), d_layer_output),
        {k: entry(result.d_weights.get(k), v) for k, v in d_w.items()},
        {k: entry(result.d_branch.get(k), v) for k, v in d_p.items()},
    )


def _forward_only(forward: Mapping) -> oracle.OracleResult:
    return oracle.OracleResult(forward=dict(forward), d_x=None, d_layer_output=None, d_weights={}, d_branch={})


def site_response(
    x,
    weights,
    branch_apply: oracle_math.BranchApply,
    branch_params: Mapping[str, Any],
    cotangent,
    config,
    *,
    site: str,
    backward: str = "differentiated",
    branch_sites: Mapping[str, rounding_model.RoundingSite] | None = None,
) -> SiteResponse:
    """The oracle's first-order response to a relative error of `site`'s forward value on this
    fixture (arguments as for `oracle.run_oracle`). backward: "differentiated" (autodiff through
    the error) or "recomputed" (the pre's VJP exact, as a backward recomputing the pre). ValueError
    for a site not fitted or not passed exactly once, or an unknown backward."""
    if site not in FITTED_SITES:
        raise ValueError(f"site {site!r} is not fitted; fitted sites: {', '.join(FITTED_SITES)}")
    if backward not in BACKWARDS:
        raise ValueError(f"backward {backward!r} is not one of {', '.join(BACKWARDS)}")
    sites = rounding_model.branch_site_tuple(branch_sites)
    with jax.enable_x64(True), jax.default_device(oracle.oracle_device()):
        inputs = oracle._float64_inputs(x, weights, branch_params, cotangent)
        shapes = [shape for name, shape in oracle._recorded_sites(*inputs, config, branch_apply, sites) if name == site]
    if len(shapes) != 1:
        raise ValueError(f"the layer passes through site {site!r} {len(shapes)} times; a fit needs exactly one")
    shape = tuple(shapes[0])
    site_forward, site_backward = _site_programs(branch_apply, config, sites, site)
    pre_forward, pre_backward = _pre_output_programs(branch_apply, config, sites)
    templates = {}

    def template(program, like):
        if program not in templates:
            templates[program] = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), program(*inputs, like))
        return templates[program]

    def changes_of(p):
        changes = site_forward(*inputs, jnp.asarray(p, jnp.float64).reshape(shape))
        if backward == "recomputed":
            changes = pre_forward(*inputs, tuple(changes[0][k] for k in PRE_OUTPUTS))
        return changes

    def apply(p: np.ndarray) -> oracle.OracleResult:
        with jax.enable_x64(True), jax.default_device(oracle.oracle_device()):
            return oracle._result(jax.tree.map(lambda a: np.asarray(a, np.float64), changes_of(p)))

    def transpose(result) -> np.ndarray:
        with jax.enable_x64(True), jax.default_device(oracle.oracle_device()):
            like = jnp.zeros(shape, jnp.float64)
            if backward == "recomputed":  # Jᵀ = J_siteᵀ restricted to the pre's outputs, after J_preᵀ
                pre_like = tuple(jnp.zeros(template(site_forward, like)[0][k].shape, jnp.float64) for k in PRE_OUTPUTS)
                on_offsets = pre_backward(*inputs, pre_like, _as_outputs(result, template(pre_forward, pre_like)))
                result = _forward_only(dict(zip(PRE_OUTPUTS, on_offsets)))
            outputs = _as_outputs(result, template(site_forward, like))
            return np.asarray(site_backward(*inputs, like, outputs), np.float64)

    return SiteResponse(site, shape, apply, transpose)
