"""The float64 oracle: the mHC-lite (and Sinkhorn) math, written independently.

This module is the ground truth every path is measured against. It deliberately
imports nothing from `mhc_parity.mhc.common` (nor anything that computes): if a shared helper
were wrong, the reference and kernel paths would agree with each other and only the
oracle would disagree. It also takes a different route through the same algebra —
the RMS-norm scale is applied to the activations rather than folded into the
projection, the gate is written out as `1 / (1 + exp(-z))`, permutation matrices are
built by index assignment, and Sinkhorn normalises in linear space — so a shared
slip of thought is unlikely to be reproduced.

Inputs are the *already dtype-rounded* arrays a path receives, upcast to float64, so
the oracle measures the arithmetic of a path, not the rounding of its inputs.
Everything runs under `jax.enable_x64` with `jax.vjp` for the gradients, on the host
CPU whatever the default backend (`oracle_device`: TPUs have no float64), with every
matmul at `Precision.HIGHEST`.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from mhc_parity.mhc.rounding_model import (
    CONTRACTIONS,
    PRECISION_CLASSES,
    ROUNDING_SITES,
    BranchSites,
    RoundingSite,
    branch_site_tuple,
)

# The weight leaf names, spelled out again on purpose (see the module docstring).
_WEIGHT_NAMES = (
    "norm_scale",
    "pre_alpha",
    "pre_bias",
    "pre_scale",
    "post_alpha",
    "post_bias",
    "post_scale",
    "res_alpha",
    "res_bias",
    "res_scale",
)

# Gate parameters (upcast to float32 by the gates) vs the projection's matmul weights.
_GATE_NAMES = frozenset(name for name in _WEIGHT_NAMES if name.endswith(("_bias", "_scale")) and name != "norm_scale")

# branch_apply(params, h) or, for a branch that declares rounding sites of its own,
# branch_apply(params, h, rounding=r): r(value, site) is where its values round.
BranchApply = Callable[..., jax.Array]
# Float64 on the host CPU: full precision, whatever a case's matmul_precision (that
# enters only through the rounding model). What `mhc_parity.mhc.precision.dot_precision` gives
# float64; spelled out here because the oracle imports nothing from `mhc`.
_PRECISION = jax.lax.Precision.HIGHEST


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
    return {name: _as_f64(get(name)) for name in _WEIGHT_NAMES}


def oracle_permutations(n: int) -> np.ndarray:
    """(n!, n, n) float64; matrix p has a one at [i, perm_p[i]], perms in itertools order."""
    perms = list(itertools.permutations(range(n)))
    mats = np.zeros((len(perms), n, n), dtype=np.float64)
    for p, perm in enumerate(perms):
        for row, col in enumerate(perm):
            mats[p, row, col] = 1.0
    return mats


def _sigmoid(z):
    return 1.0 / (1.0 + jnp.exp(-z))


def _sinkhorn_linear(z, iterations: int):
    """Sinkhorn–Knopp on exp(z) in linear space (z shifted by its max for range)."""
    m = jnp.exp(z - jnp.max(z, axis=(-2, -1), keepdims=True))
    for _ in range(iterations):
        m = m / jnp.sum(m, axis=-1, keepdims=True)
        m = m / jnp.sum(m, axis=-2, keepdims=True)
    return m


def _contracted(r, name: str, a, b, exact: Callable[[], jax.Array], part: str = ""):
    """Contraction `name` of a and b: `exact()`, the oracle's own expression of it, unless the
    rounding hook `r` accumulates contractions itself (`r.contract(name, spec, a, b, part,
    exact)`, the hypotheses' program; part: which call it is where one contraction has several,
    e.g. the gate's name). `exact` keeps the oracle's bits as written."""
    contract = getattr(r, "contract", None)
    return exact() if contract is None else contract(name, CONTRACTIONS[name].spec, a, b, part, exact)


def _exact(v, site: str, part: str = ""):
    """The identity: the oracle without rounding noise."""
    del site, part
    return v


@jax.custom_vjp
def _round_both_ways(v, forward_delta, backward_delta):
    """v·(1 + forward_delta); its cotangent g comes back as g·(1 + backward_delta)."""
    return v * (1.0 + forward_delta)


def _round_both_ways_fwd(v, forward_delta, backward_delta):
    return v * (1.0 + forward_delta), (forward_delta, backward_delta)


def _round_both_ways_bwd(residuals, g):
    forward_delta, backward_delta = residuals
    return g * (1.0 + backward_delta), jnp.zeros_like(forward_delta), jnp.zeros_like(backward_delta)


_round_both_ways.defvjp(_round_both_ways_fwd, _round_both_ways_bwd)


class _SiteRecorder:
    """The identity at every site, noting each call's site and value shape in call order.

    A first, abstract trace of the program with a recorder tells `_RoundingNoise` how
    many random numbers the draw needs and where each site's share starts.
    """

    def __init__(self):
        self.sites: list[tuple[str, tuple[int, ...]]] = []
        self.parts: list[str] = []  # which value of its site each call is ("" where one value is)

    def __call__(self, v, site: str, part: str = ""):
        self.sites.append((site, tuple(v.shape)))
        self.parts.append(part)
        return v


class _RoundingNoise:
    """One simulated rounding at a value, and another at its cotangent, per `ROUNDING_SITES`.

    Called with a value and its site, it multiplies the value by (1 + δ) and,
    independently, the cotangent flowing back through that point by (1 + δ'), with δ, δ'
    uniform in [-u, u] for the unit roundoffs of the site's forward and backward classes.
    That is how a finite-precision path rounds both passes, so the spread it causes is
    the error the arithmetic explains — including where the math itself cancels (a
    peaked softmax's VJP subtracts nearly equal cotangent terms; a gate-scale gradient
    sums terms of both signs), which plain float64 would otherwise compute exactly.

    sites: the (site, shape) of every call in order (`_SiteRecorder`); bank: one uniform
    [-1, 1) float64 draw of two numbers per element of every site, sliced in call order
    (one random-number generator call per draw: one per site made XLA's compile slow);
    units: (len(PRECISION_CLASSES),) unit roundoffs, traced, so every unit setting
    (float32 and bfloat16 runs, the exact oracle's zeros) shares the program. With all
    units zero every δ is exactly 0 and the program computes the exact oracle.
    """

    def __init__(
        self,
        sites: Sequence[tuple[str, tuple[int, ...]]],
        bank,
        units,
        branch_sites: BranchSites = (),
        only_sites: frozenset[str] | None = None,
    ):
        self.sites, self.bank, self.units = list(sites), bank, units
        self.rules = {**ROUNDING_SITES, **dict(branch_sites)}
        self.only_sites = only_sites
        self.calls, self.offset = 0, 0

    def _unit(self, classes: tuple[str, ...]):
        if not classes:
            return 0.0
        return jnp.max(jnp.stack([self.units[PRECISION_CLASSES.index(c)] for c in classes]))

    def _take(self, shape: tuple[int, ...]):
        size = math.prod(shape)
        part = jax.lax.slice_in_dim(self.bank, self.offset, self.offset + size)
        self.offset += size
        return part.reshape(shape)

    def __call__(self, v, site: str, part: str = ""):
        del part  # every value of a site rounds in its classes
        if self.calls >= len(self.sites) or self.sites[self.calls] != (site, tuple(v.shape)):
            recorded = self.sites[self.calls] if self.calls < len(self.sites) else "nothing"
            raise AssertionError(f"rounding site {self.calls} is {(site, v.shape)}, the recording pass saw {recorded}")
        self.calls += 1
        rule = self.rules[site]
        forward_delta = self._unit(rule.forward) * self._take(v.shape)
        backward_delta = self._unit(rule.backward) * self._take(v.shape)
        if self.only_sites is not None and site not in self.only_sites:
            # Its share of the bank is still taken, so the other sites keep their numbers.
            forward_delta, backward_delta = 0.0 * forward_delta, 0.0 * backward_delta
        return _round_both_ways(v, forward_delta.astype(v.dtype), backward_delta.astype(v.dtype))


def _softmax(z, r):
    """softmax over the last axis; its VJP rounds the inner product <a, g> through `r`.

    The VJP is a ⊙ (g − <a, g>): for a peaked softmax the subtraction cancels almost
    completely, so the rounding of <a, g> that every finite-precision path makes is
    amplified by 1 / (1 − max a). Float64 autodiff of exp/sum would not show it.
    """

    def plain(z_):
        e = jnp.exp(z_ - jnp.max(z_, axis=-1, keepdims=True))
        return e / jnp.sum(e, axis=-1, keepdims=True)

    softmax = jax.custom_vjp(plain)

    def forward(z_):
        # The plain expression, not `softmax` again: a forward-mode derivative of the VJP
        # (`mhc_parity.mhc.oracle_fits`) passes through this rule, and a custom_vjp has none.
        a = plain(z_)
        return a, a

    def backward(a, g):
        return (a * (g - r(jnp.sum(a * g, axis=-1, keepdims=True), "softmax_inner_product")),)

    softmax.defvjp(forward, backward)
    return softmax(z)


def _scaled(w, name, logits, r):
    """The gate's scale (one number) times its logits (B, S, M)."""
    scale = w[f"{name}_scale"].reshape(())
    return _contracted(r, "gate_scale", scale, logits, lambda: scale * logits, part=name)


def _biased(w, name, z, r):
    """z (B, S, M) plus the gate's bias (M,; flattened where it is a matrix) on every token."""
    bias = w[f"{name}_bias"].reshape(-1)
    tokens = jnp.ones(z.shape[:2], z.dtype)
    return z + _contracted(r, "gate_bias", bias, tokens, lambda: bias, part=name)


def _gate_logit(w, name, logits, r):
    return r(_biased(w, name, _scaled(w, name, r(logits, "projection"), r), r), "gate_logit")


def _coefficients(x, w, config, r=_exact):
    n = config.streams
    batch, seq = x.shape[:2]
    v = x.reshape(batch, seq, -1)
    sum_of_squares = _contracted(r, "mean_square", v, v, lambda: jnp.sum(v * v, axis=-1))
    mean_square = sum_of_squares[..., None] / v.shape[-1]
    inv_rms = r(1.0 / jnp.sqrt(mean_square + config.rms_epsilon), "rms_inverse")
    normed = r(v * inv_rms * w["norm_scale"], "normed_operand")

    def logits(name):
        alpha = r(w[f"{name}_alpha"], "folded_weight")
        return _contracted(r, "projection", normed, alpha, lambda: jnp.matmul(normed, alpha, precision=_PRECISION))

    h_pre = r(_sigmoid(_gate_logit(w, "pre", logits("pre"), r)) + config.pre_epsilon, "gate")
    h_post = r(2.0 * _sigmoid(_gate_logit(w, "post", logits("post"), r)), "gate")
    z_res = r(_scaled(w, "res", r(logits("res"), "projection"), r), "gate_logit")
    if config.variant == "lite":
        z = r(_biased(w, "res", z_res, r), "gate_logit")
        a = r(r(_softmax(z, r), "gate"), "permutation_operand")
        perms = jnp.asarray(oracle_permutations(n))
        mix = _contracted(
            r, "permutation_mix", a, perms, lambda: jnp.einsum("bsp,pij->bsij", a, perms, precision=_PRECISION)
        )
        h_res = r(mix, "gate")
    else:
        z = r(_biased(w, "res", z_res, r).reshape(batch, seq, n, n), "gate_logit")
        h_res = r(_sinkhorn_linear(z, config.sinkhorn_iterations), "gate")
    return h_pre, h_post, h_res


def _pre(x, w, config, r=_exact):
    h_pre, h_post, h_res = _coefficients(x, w, config, r)
    weights = r(h_pre, "coefficient_operand")
    collapsed = _contracted(
        r, "collapse", weights, x, lambda: jnp.einsum("bsn,bsnc->bsc", weights, x, precision=_PRECISION)
    )
    layer_input = r(collapsed, "layer_input")
    return layer_input, (h_pre, h_post, h_res)


def _post(layer_output, x, coeffs, r=_exact):
    _, h_post, h_res = coeffs
    mix = r(h_res, "coefficient_operand")
    mixed = r(
        _contracted(r, "residual_mix", mix, x, lambda: jnp.einsum("bsij,bsic->bsjc", mix, x, precision=_PRECISION)),
        "residual_mix",
    )
    gate = r(h_post, "coefficient_operand")
    gated = _contracted(r, "post_gate", gate, layer_output, lambda: gate[..., None] * layer_output[..., None, :])
    return r(mixed + gated, "out")


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


def _layer_and_vjp(x, w, p, ct, r, config, branch_apply: BranchApply, branch_sites: BranchSites = (), pre_offsets=None):
    """Forward values and gradients of one layer application, every site rounded through `r`
    (the branch's own sites too, where it declares any). pre_offsets: None, or what to add to
    the pre's outputs (layer_input, h_pre, h_post, h_res) after it, its VJP left exact (a pre
    whose backward recomputes it: `mhc_parity.mhc.oracle_fits`)."""
    x, ct = r(x, "x"), r(ct, "cotangent")
    # Each weight names itself (`part`), so a hypothesis can round one gate's parameters.
    w = {k: r(v, "gate_weight" if k in _GATE_NAMES else "matmul_weight", part=k) for k, v in w.items()}
    p = {k: r(v, "branch_param", part=k) for k, v in p.items()}

    def whole(x_, w_, p_):
        layer_input, coeffs = _pre(x_, w_, config, r)
        if pre_offsets is not None:
            layer_input = layer_input + pre_offsets[0]
            coeffs = tuple(c + o for c, o in zip(coeffs, pre_offsets[1:]))
        branch_output = branch_apply(p_, layer_input, rounding=r) if branch_sites else branch_apply(p_, layer_input)
        layer_output = r(branch_output, "layer_output")
        out = _post(layer_output, x_, coeffs, r)
        return out, (layer_input, layer_output) + coeffs

    out, pullback, aux = jax.vjp(whole, x, w, p, has_aux=True)
    d_x, d_w, d_p = pullback(ct)
    layer_input, layer_output, h_pre, h_post, h_res = aux
    # The cotangent reaching the branch output: the VJP of `post` w.r.t. its first input.
    _, post_pullback = jax.vjp(lambda y: _post(y, x, (h_pre, h_post, h_res)), layer_output)
    (d_layer_output,) = post_pullback(ct)
    forward = {
        "out": out,
        "layer_input": layer_input,
        "h_pre": h_pre,
        "h_post": h_post,
        "h_res": h_res,
        "layer_output": layer_output,
    }
    return forward, d_x, d_layer_output, d_w, d_p


# XLA's CPU backend without LLVM's optimisation passes: the oracle's programs are cheap to
# run and their compile time dominates (bench/parity_bench.py measures it). Only float64
# rounding (e.g. fused multiply-adds) can differ, far below anything a comparison resolves.
_COMPILER_OPTIONS = {"xla_backend_optimization_level": 0}


def _recorded(
    x, w, p, ct, config, branch_apply: BranchApply, branch_sites: BranchSites = (), recorder=None
) -> _SiteRecorder:
    """A `_SiteRecorder` (or `recorder`, one of its kind) that saw every rounding of one draw,
    in call order (an abstract trace)."""
    recorder = _SiteRecorder() if recorder is None else recorder
    jax.eval_shape(lambda *a: _layer_and_vjp(*a, recorder, config, branch_apply, branch_sites), x, w, p, ct)
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
        noise = _RoundingNoise(sites, bank, units, branch_sites, only_sites)
        outputs = _layer_and_vjp(x, w, p, ct, noise, config, branch_apply, branch_sites)
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
    the exact oracle, whose seed is then irrelevant); branch_sites as for `run_oracle`;
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
        keys = jnp.stack([jax.random.key(seed) for seed, _ in draws])
        banks = _bank_program(_bank_size(_recorded_sites(x64, w64, p64, ct64, config, branch_apply, sites)))(keys)
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
        layer_input, coeffs = _pre(x64, w64, config)
        out = _post(layer_output_fn(layer_input), x64, coeffs)
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
            layer_input, (h_pre, h_post, h_res) = _pre(x_, w_, config)
            return layer_input, h_pre, h_post, h_res, x_

        _, pullback = jax.vjp(pre_outputs, x64, w64)
        d_x, d_w = pullback((ct["layer_input"], ct["h_pre"], ct["h_post"], ct["h_res"], ct["x"]))
        return np.asarray(d_x), {k: np.asarray(v) for k, v in d_w.items()}
