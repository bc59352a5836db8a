"""The float64 oracle, the ground truth every path is measured against: runs the independently
written math of `oracle_math` (exact, or with rounding noise per draw) as compiled programs.

Inputs are the already dtype-rounded arrays a path receives, upcast to float64, so the
oracle measures a path's arithmetic, not its inputs' rounding. Runs under `jax.enable_x64` on
the host CPU (TPUs have no float64), every matmul at HIGHEST.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from mhc_parity.mhc.oracle_math import (
    WEIGHT_NAMES,
    BranchApply,
    RoundingNoise,
    SiteRecorder,
    layer_and_vjp,
    post,
    pre,
)
from mhc_parity.mhc.rounding_model import (
    PRECISION_CLASSES,
    ROUNDING_SITES,
    BranchSites,
    RoundingSite,
    branch_site_tuple,
)


def oracle_device():
    """The device the oracle computes on: the host's first CPU device."""
    return jax.devices("cpu")[0]


@dataclasses.dataclass(frozen=True)
class OracleResult:
    """NumPy float64 forward values and gradients of one layer application.

    forward: out (B,S,n,C), layer_input (B,S,C), h_pre, h_post (B,S,n), h_res (B,S,n,n),
    layer_output (B,S,C) (the branch output). d_x (B,S,n,C); d_layer_output (B,S,C);
    d_weights / d_branch: by weight / branch parameter name.
    """

    forward: dict[str, np.ndarray]
    d_x: np.ndarray
    d_layer_output: np.ndarray
    d_weights: dict[str, np.ndarray]
    d_branch: dict[str, np.ndarray]


def _as_f64(a) -> np.ndarray:
    return np.asarray(a).astype(np.float64)


def _weight_mapping(weights) -> dict[str, np.ndarray]:
    """An `MhcWeights` (duck-typed) or a mapping -> name -> float64 array."""
    if isinstance(weights, Mapping):
        get = weights.__getitem__
    else:
        get = lambda name: getattr(weights, name)  # noqa: E731
    return {name: _as_f64(get(name)) for name in WEIGHT_NAMES}


def _units_vector(units: Mapping[str, float] | float | None) -> np.ndarray:
    """Unit roundoffs in `PRECISION_CLASSES` order from {class: u} naming every class, one float
    for all, or None / 0 (zeros: the exact oracle)."""
    if units is None or isinstance(units, (int, float)):
        return np.full(len(PRECISION_CLASSES), float(units or 0.0))
    missing = set(PRECISION_CLASSES) - set(units)
    if missing:
        raise ValueError(f"rounding_noise units lack the precision classes {sorted(missing)}")
    return np.array([float(units[c]) for c in PRECISION_CLASSES])


# The oracle's programs are cheap to run and their compile time dominates; only float64
# rounding can differ, far below anything a comparison resolves (docs/speed.md).
_COMPILER_OPTIONS = {"xla_backend_optimization_level": 0}
# The hypotheses' programs run once per failing case: compile time is most of their cost.
HYPOTHESIS_COMPILER_OPTIONS = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}


def _recorded(
    x, w, p, ct, config, branch_apply: BranchApply, branch_sites: BranchSites = (), recorder=None
) -> SiteRecorder:
    """A `SiteRecorder` (or `recorder`) that saw every rounding of one draw in call order
    (an abstract trace)."""
    recorder = SiteRecorder() if recorder is None else recorder
    jax.eval_shape(lambda *a: layer_and_vjp(*a, recorder, config, branch_apply, branch_sites), x, w, p, ct)
    return recorder


def _recorded_sites(
    x, w, p, ct, config, branch_apply: BranchApply, branch_sites: BranchSites = ()
) -> list[tuple[str, tuple[int, ...]]]:
    return _recorded(x, w, p, ct, config, branch_apply, branch_sites).sites


def _float64_inputs(x, weights, branch_params: Mapping[str, Any], cotangent):
    """The inputs as float64 JAX arrays (call under `jax.enable_x64`)."""
    return (
        jnp.asarray(_as_f64(x)),
        {k: jnp.asarray(v) for k, v in _weight_mapping(weights).items()},
        {k: jnp.asarray(_as_f64(v)) for k, v in branch_params.items()},
        jnp.asarray(_as_f64(cotangent)),
    )


def _bank_size(sites) -> int:
    """Random numbers one draw needs: two (value and cotangent) per element of every site."""
    return 2 * sum(math.prod(shape) for _, shape in sites)


@functools.lru_cache(maxsize=8)
def _bank_program(size: int):
    """The jitted `keys (D,) -> (D, size)` uniform [-1, 1) float64 banks. Compiled apart at XLA's
    default level: unoptimised it would dominate the oracle's run time (its bits do not change)."""
    return jax.jit(jax.vmap(lambda key: jax.random.uniform(key, (size,), jnp.float64, -1.0, 1.0)))


def _one_draw(x, w, p, ct, bank, units, config, branch_apply: BranchApply, branch_sites: BranchSites, kept=None):
    """One draw's float64 forward + VJP, its sites rounded by `bank` and `units` (`RoundingNoise`;
    kept: site -> traced 1.0 where it rounds, 0.0 where it is held exact; None: every site rounds)."""
    sites = _recorded_sites(x, w, p, ct, config, branch_apply, branch_sites)
    if bank.shape != (_bank_size(sites),):
        raise ValueError(f"a draw's bank holds {bank.shape} numbers; its rounding sites need {_bank_size(sites)}")
    noise = RoundingNoise(sites, bank, units, branch_sites, kept_sites=kept)
    outputs = layer_and_vjp(x, w, p, ct, noise, config, branch_apply, branch_sites)
    if noise.calls != len(sites):
        raise AssertionError(f"{noise.calls} rounding sites traced, the recording pass saw {len(sites)}")
    return outputs


# Each cached executable holds memory mappings (at most vm.max_map_count a process): keep few.
@functools.lru_cache(maxsize=8)
def _oracle_program(branch_apply: BranchApply, config, branch_sites: BranchSites = ()):
    """The jitted float64 forward + VJP of a batch of draws for one branch and config, every site
    rounding. program(x, w, p, ct, banks (D, `_bank_size`), units (D, classes)): outputs gain a
    leading D axis. Units are data, so the exact oracle and float32 and bfloat16 draws of one
    shape share the program."""

    def one_draw(x, w, p, ct, bank, units):
        return _one_draw(x, w, p, ct, bank, units, config, branch_apply, branch_sites)

    return jax.jit(jax.vmap(one_draw, in_axes=(None, None, None, None, 0, 0)), compiler_options=_COMPILER_OPTIONS)


@functools.lru_cache(maxsize=8)
def _oracle_program_of_sites(branch_apply: BranchApply, config, branch_sites: BranchSites = ()):
    """`_oracle_program` rounding only some sites, chosen by data, one program for every choice:
    program(x, w, p, ct, banks, units, keep): keep (`_site_names` order) 1.0 where a site rounds,
    0.0 where it is held exact. A kept delta times 1.0 is the delta bit for bit, and a held site
    still takes its share of the bank, so the other sites keep their numbers; no compile per
    choice (the rounding audit's shares ask for one per site)."""
    names = _site_names(branch_sites)

    def one_draw(x, w, p, ct, bank, units, keep):
        kept = {name: keep[index] for index, name in enumerate(names)}
        return _one_draw(x, w, p, ct, bank, units, config, branch_apply, branch_sites, kept)

    in_axes = (None, None, None, None, 0, 0, None)
    return jax.jit(jax.vmap(one_draw, in_axes=in_axes), compiler_options=_COMPILER_OPTIONS)


def _site_names(branch_sites: BranchSites) -> tuple[str, ...]:
    """Every rounding site's name: the layer's (`ROUNDING_SITES`), then the branch's."""
    return (*ROUNDING_SITES, *(name for name, _ in branch_sites))


def run_oracle(
    x,
    weights,
    branch_apply: BranchApply,
    branch_params: Mapping[str, Any],
    cotangent,
    config,
    *,
    rounding_noise: tuple[int, Mapping[str, float] | float] | None = None,
    branch_sites: Mapping[str, RoundingSite] | None = None,
) -> OracleResult:
    """Forward and VJP of `post(branch(pre(x)))` in float64.

    x, cotangent: (B, S, n, C) any float dtype (upcast); weights: `MhcWeights` or name ->
    array; branch_apply(params, h): dtype-polymorphic and hashable (the program is cached per
    branch and config). rounding_noise: None (exact), or (seed, units): every rounding site's
    value is multiplied by (1 + δ), |δ| <= its precision class's unit roundoff (units: class ->
    u, or one float). branch_sites: the branch's own rounding sites.
    """
    seed, units = rounding_noise or (0, None)
    (result,) = run_oracle_batch(
        x, weights, branch_apply, branch_params, cotangent, config, draws=[(seed, units)], branch_sites=branch_sites
    )
    return result


def run_oracle_draws(
    x,
    weights,
    branch_apply: BranchApply,
    branch_params: Mapping[str, Any],
    cotangent,
    config,
    *,
    seeds: Sequence[int],
    units: Mapping[str, float] | float,
    branch_sites: Mapping[str, RoundingSite] | None = None,
) -> list[OracleResult]:
    """`run_oracle` with `rounding_noise=(seed, units)` per seed, in one compiled program; each
    result holds the same deltas as the single call."""
    if not np.any(_units_vector(units)):
        raise ValueError("run_oracle_draws needs non-zero rounding units")
    return run_oracle_batch(
        x,
        weights,
        branch_apply,
        branch_params,
        cotangent,
        config,
        draws=[(seed, units) for seed in seeds],
        branch_sites=branch_sites,
    )


def run_oracle_batch(
    x,
    weights,
    branch_apply: BranchApply,
    branch_params: Mapping[str, Any],
    cotangent,
    config,
    *,
    draws: Sequence[tuple[int, Mapping[str, float] | float | None]],
    branch_sites: Mapping[str, RoundingSite] | None = None,
    only_sites: Sequence[str] | None = None,
) -> list[OracleResult]:
    """Several draws of `run_oracle` in one run of one program (vmapped), one result per draw.

    draws: (seed, units) per draw (units None or 0: exact). Seed None: every δ is +u, the
    same shift on every token. only_sites: round only there, each draw keeping its random
    numbers, so shares add up to first order. Draws are independent up to float64
    reassociation.
    """
    if not draws:
        raise ValueError("run_oracle_batch needs at least one draw")
    units = np.stack([_units_vector(u) for _, u in draws])
    sites = branch_site_tuple(branch_sites)
    unknown = sorted(set(only_sites or ()) - set(ROUNDING_SITES) - {name for name, _ in sites})
    if unknown:
        raise ValueError(f"only_sites names no rounding site: {unknown}")
    with jax.enable_x64(True), jax.default_device(oracle_device()):
        x64, w64, p64, ct64 = _float64_inputs(x, weights, branch_params, cotangent)
        keys = jnp.stack([jax.random.key(0 if seed is None else seed) for seed, _ in draws])
        banks = _bank_program(_bank_size(_recorded_sites(x64, w64, p64, ct64, config, branch_apply, sites)))(keys)
        shifted = jnp.asarray([seed is None for seed, _ in draws])[:, None]
        banks = jnp.where(shifted, jnp.ones_like(banks), banks)
        if only_sites is None:
            program = _oracle_program(branch_apply, config, sites)
            computed = program(x64, w64, p64, ct64, banks, jnp.asarray(units))
        else:
            keep = np.array([float(name in only_sites) for name in _site_names(sites)])
            program = _oracle_program_of_sites(branch_apply, config, sites)
            computed = program(x64, w64, p64, ct64, banks, jnp.asarray(units), jnp.asarray(keep))
        outputs = jax.tree.map(lambda a: np.asarray(a, dtype=np.float64), computed)
    return [_result(jax.tree.map(lambda a, i=i: a[i], outputs)) for i in range(len(draws))]


def _result(outputs) -> OracleResult:
    forward, d_x, d_layer_output, d_w, d_p = outputs
    return OracleResult(
        forward=dict(forward), d_x=d_x, d_layer_output=d_layer_output, d_weights=dict(d_w), d_branch=dict(d_p)
    )


def oracle_forward(x, weights, layer_output_fn: Callable[[jax.Array], jax.Array], config) -> dict[str, np.ndarray]:
    """Forward values only (float64), for tests that need no gradients."""
    with jax.enable_x64(True), jax.default_device(oracle_device()):
        x64 = jnp.asarray(_as_f64(x))
        w64 = {k: jnp.asarray(v) for k, v in _weight_mapping(weights).items()}
        layer_input, coeffs = pre(x64, w64, config)
        out = post(layer_output_fn(layer_input), x64, coeffs)
        return {
            "out": np.asarray(out),
            "layer_input": np.asarray(layer_input),
            "h_pre": np.asarray(coeffs[0]),
            "h_post": np.asarray(coeffs[1]),
            "h_res": np.asarray(coeffs[2]),
        }


def pre_vjp(x, weights, config, cotangents: Mapping[str, Any]) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """The float64 VJP of `pre` alone for cotangents on layer_input (B, S, C), h_pre, h_post
    (B, S, n), h_res (B, S, n, n) and the context's x (B, S, n, C): (d_x, name -> d_weight) in
    NumPy, what a kernel's `pre` backward must give for cotangents the layer never sends."""
    with jax.enable_x64(True), jax.default_device(oracle_device()):
        x64 = jnp.asarray(_as_f64(x))
        w64 = {k: jnp.asarray(v) for k, v in _weight_mapping(weights).items()}
        ct = {k: jnp.asarray(_as_f64(v)) for k, v in cotangents.items()}

        def pre_outputs(x_, w_):
            layer_input, (h_pre, h_post, h_res) = pre(x_, w_, config)
            return layer_input, h_pre, h_post, h_res, x_

        _, pullback = jax.vjp(pre_outputs, x64, w64)
        d_x, d_w = pullback((ct["layer_input"], ct["h_pre"], ct["h_post"], ct["h_res"], ct["x"]))
        return np.asarray(d_x), {k: np.asarray(v) for k, v in d_w.items()}
