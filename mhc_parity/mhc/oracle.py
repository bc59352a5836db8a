"""The float64 oracle: the mHC-lite (and Sinkhorn) math, written independently.

This module is the ground truth every path is measured against. It deliberately
imports nothing from `mhc_parity.mhc.common` (nor anything that computes): if a shared helper
were wrong, the reference and kernel paths would agree with each other and only the
oracle would disagree. It also takes a different route through the same algebra —
the RMS-norm scale is applied to the activations rather than folded into the
projection, the gate is written out as `1 / (1 + exp(-z))`, permutation matrices are
built by index assignment, and Sinkhorn normalises in linear space — so a shared
slip of thought is unlikely to be reproduced.

The layer's math, with its rounding hook at every site, is `mhc_parity.mhc.oracle_math`;
this module runs it: the float64 inputs, the compiled programs of a batch of draws (the
exact oracle and the sensitivity's noisy ones) and their results.

Inputs are the *already dtype-rounded* arrays a path receives, upcast to float64, so
the oracle measures the arithmetic of a path, not the rounding of its inputs.
Everything runs under `jax.enable_x64` with `jax.vjp` for the gradients, on the host
CPU whatever the default backend (`oracle_device`: TPUs have no float64), with every
matmul at `Precision.HIGHEST`.
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
    """Float64 forward values and gradients of one layer application.

    forward: out (B,S,n,C), layer_input (B,S,C), h_pre (B,S,n), h_post (B,S,n),
      h_res (B,S,n,n), layer_output (B,S,C) — the branch output.
    d_x: (B,S,n,C); d_layer_output: (B,S,C), the cotangent reaching the branch output;
    d_weights: weight field name -> gradient; d_branch: branch parameter -> gradient.
    All NumPy float64.
    """

    forward: dict[str, np.ndarray]
    d_x: np.ndarray
    d_layer_output: np.ndarray
    d_weights: dict[str, np.ndarray]
    d_branch: dict[str, np.ndarray]


def _as_f64(a) -> np.ndarray:
    return np.asarray(a).astype(np.float64)


def _weight_mapping(weights) -> dict[str, np.ndarray]:
    """Accept an `MhcWeights` (duck-typed by field names) or a mapping."""
    if isinstance(weights, Mapping):
        get = weights.__getitem__
    else:
        get = lambda name: getattr(weights, name)  # noqa: E731
    return {name: _as_f64(get(name)) for name in WEIGHT_NAMES}


def _units_vector(units: Mapping[str, float] | float | None) -> np.ndarray:
    """The unit roundoffs in `PRECISION_CLASSES` order, float64 (zeros: the exact oracle).

    units: {class: u} naming every class, a single float for every class, or None / 0.
    """
    if units is None or isinstance(units, (int, float)):
        return np.full(len(PRECISION_CLASSES), float(units or 0.0))
    missing = set(PRECISION_CLASSES) - set(units)
    if missing:
        raise ValueError(f"rounding_noise units lack the precision classes {sorted(missing)}")
    return np.array([float(units[c]) for c in PRECISION_CLASSES])


# XLA's CPU backend without LLVM's optimisation passes: the oracle's programs are cheap to
# run and their compile time dominates (bench/parity_bench.py measures it). Only float64
# rounding (e.g. fused multiply-adds) can differ, far below anything a comparison resolves.
_COMPILER_OPTIONS = {"xla_backend_optimization_level": 0}
# The hypotheses' programs (`mhc_parity.mhc.oracle_roundings`, `mhc_parity.mhc.oracle_backend`) run once per
# failing case, so their compile is most of a failing run's extra cost: level 0 without LLVM's
# expensive passes compiled the roundings' program in 2.0-2.7 s against level 1's 5.2 s, and ran it
# in 0.55-0.78 s against 0.47 s (a float32 MLP case, a loaded 2-core host; bench/causes_bench.py).
HYPOTHESIS_COMPILER_OPTIONS = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}


def _recorded(
    x, w, p, ct, config, branch_apply: BranchApply, branch_sites: BranchSites = (), recorder=None
) -> SiteRecorder:
    """A `SiteRecorder` (or `recorder`, one of its kind) that saw every rounding of one draw,
    in call order (an abstract trace)."""
    recorder = SiteRecorder() if recorder is None else recorder
    jax.eval_shape(lambda *a: layer_and_vjp(*a, recorder, config, branch_apply, branch_sites), x, w, p, ct)
    return recorder


def _recorded_sites(
    x, w, p, ct, config, branch_apply: BranchApply, branch_sites: BranchSites = ()
) -> list[tuple[str, tuple[int, ...]]]:
    """The (site, shape) of every rounding of one draw, in call order (an abstract trace)."""
    return _recorded(x, w, p, ct, config, branch_apply, branch_sites).sites


def _float64_inputs(x, weights, branch_params: Mapping[str, Any], cotangent):
    """(x, weight name -> array, branch parameter -> array, cotangent) as float64 JAX arrays
    (call under `jax.enable_x64`)."""
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
    """The jitted `keys (D,) -> (D, size)` uniform [-1, 1) float64 banks, one per draw key.

    Compiled apart from `_oracle_program`, at XLA's default optimisation: the generator is
    integer arithmetic and an exact affine map, so its bits do not depend on the level,
    and unoptimised it would dominate the oracle's run time. One program serves every case
    whose draws are this size.
    """
    return jax.jit(jax.vmap(lambda key: jax.random.uniform(key, (size,), jnp.float64, -1.0, 1.0)))


# A jitted program keeps an executable per input shape alive, and each holds memory
# mappings (a process has at most vm.max_map_count): keep the programs of the few most
# recent branch/config combinations, not of every case a long run has seen.
@functools.lru_cache(maxsize=8)
def _oracle_program(
    branch_apply: BranchApply, config, branch_sites: BranchSites = (), only_sites: frozenset[str] | None = None
):
    """The jitted float64 forward + VJP of a batch of draws, for one branch (and its own
    rounding sites) and config; with `only_sites`, every other site is held exact (the
    share of the sensitivity those sites explain).

    program(x, w, p, ct, banks, units): banks (D, `_bank_size`) uniform [-1, 1) numbers
    (`_bank_program`) and units (D, classes) unit roundoffs, one row per draw
    (`_units_vector`; zeros: the exact oracle); the inputs are shared by every draw and
    every output gains a leading D axis. The units are data, so the exact oracle and the
    noisy draws of float32 and bfloat16 runs of one shape share one compiled program
    (cached: other shapes retrace).
    """

    def one_draw(x, w, p, ct, bank, units):
        sites = _recorded_sites(x, w, p, ct, config, branch_apply, branch_sites)
        if bank.shape != (_bank_size(sites),):
            raise ValueError(f"a draw's bank holds {bank.shape} numbers; its rounding sites need {_bank_size(sites)}")
        noise = RoundingNoise(sites, bank, units, branch_sites, only_sites)
        outputs = layer_and_vjp(x, w, p, ct, noise, config, branch_apply, branch_sites)
        if noise.calls != len(sites):
            raise AssertionError(f"{noise.calls} rounding sites traced, the recording pass saw {len(sites)}")
        return outputs

    # The inputs are shared by every draw; the bank and the units vary.
    return jax.jit(jax.vmap(one_draw, in_axes=(None, None, None, None, 0, 0)), compiler_options=_COMPILER_OPTIONS)


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

    x: (B, S, n, C) any float dtype (upcast); weights: `MhcWeights` or name -> array;
    branch_apply(params, h) must be dtype-polymorphic jax.numpy (and hashable: the
    compiled program is cached per branch function and config); cotangent: (B,S,n,C)
    seed for the VJP; config: an `MhcConfig` (streams, variant, epsilons, iterations).
    rounding_noise: None for the exact oracle, or (seed, units): every input and
    intermediate is multiplied by (1 + δ), |δ| <= the unit roundoff of its site's
    precision class (`ROUNDING_SITES`; units maps each of `PRECISION_CLASSES` to a unit
    roundoff, see `unit_roundoffs`; a single float applies to every class), to measure
    how far the rounding a correct implementation may make moves each leaf.
    branch_sites: the branch's own rounding sites (name -> `RoundingSite`), for a branch
    whose apply takes `rounding=r` and rounds its values through r(value, site).
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
    """`run_oracle` with `rounding_noise=(seed, units)` for every seed, in one compiled program.

    Arguments as for `run_oracle`; returns one `OracleResult` per seed, in order, each
    holding the same random deltas as the corresponding single `run_oracle` call.
    """
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
    """Several draws of `run_oracle` in one run of one compiled program (`jax.vmap` over the draws).

    draws: (seed, units) per draw, units as for `run_oracle`'s rounding_noise (None or 0:
    the exact oracle, whose seed is then irrelevant); seed None: no random draw, every δ is
    +u (each value moved by its classes' whole unit roundoff, the same way on every token:
    the shift an error that is a fixed function of the value would share);
    branch_sites as for `run_oracle`;
    only_sites: round only at these sites (each draw keeps the random numbers it has in a
    draw of every site, so the shares add up to first order). Returns one `OracleResult` per
    draw, in order; a draw's result does not depend on the other draws of the batch
    beyond a float64 reassociation of the contractions.
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
        program = _oracle_program(branch_apply, config, sites, None if only_sites is None else frozenset(only_sites))
        outputs = jax.tree.map(
            lambda a: np.asarray(a, dtype=np.float64), program(x64, w64, p64, ct64, banks, jnp.asarray(units))
        )
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
    """The VJP of `pre` alone in float64, for a cotangent on each of its outputs.

    x: (B, S, n, C); weights: `MhcWeights` or name -> array; cotangents: layer_input
    (B, S, C), h_pre and h_post (B, S, n), h_res (B, S, n, n) and x (B, S, n, C), the
    context's copy of the input. Returns (d_x, weight name -> gradient), NumPy float64:
    what a kernel's `pre` backward must produce for cotangents the whole layer never
    sends (the layer differentiates h_pre only through layer_input).
    """
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
