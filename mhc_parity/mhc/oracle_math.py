"""The float64 oracle's math: the mHC layer written again, with a rounding hook
`r(value, site, part)` at every site a finite-precision path may round (`ROUNDING_SITES`).

It imports nothing from `mhc_parity.mhc.common`, so a bug shared by the paths disagrees with
it, and takes its own route (RMS scale on the activations, not folded; the gate written out;
permutations by index assignment; Sinkhorn in linear space) so a shared slip of thought is
unlikely to be repeated.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from mhc_parity.mhc.rounding_model import (
    BACKEND_CLASSES,
    CONTRACTIONS,
    PRECISION_CLASSES,
    ROUNDING_SITES,
    BranchSites,
    evaluated,
)

# Spelled out again on purpose: no shared helper (module docstring).
WEIGHT_NAMES = (
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
_GATE_NAMES = frozenset(name for name in WEIGHT_NAMES if name.endswith(("_bias", "_scale")) and name != "norm_scale")

# branch_apply(params, h), or (params, h, rounding=r) for a branch with rounding sites.
BranchApply = Callable[..., jax.Array]
# Whatever a case's matmul_precision: that enters only through the rounding model.
PRECISION = jax.lax.Precision.HIGHEST


def oracle_permutations(n: int) -> np.ndarray:
    """(n!, n, n) float64; matrix p has a one at [i, perm_p[i]], perms in itertools order."""
    perms = list(itertools.permutations(range(n)))
    mats = np.zeros((len(perms), n, n), dtype=np.float64)
    for p, perm in enumerate(perms):
        for row, col in enumerate(perm):
            mats[p, row, col] = 1.0
    return mats


def _sigmoid(z, r):
    """The logistic function, written out; the backend's own where `r` evaluates primitives."""
    return evaluated(r, "logistic", lambda v: 1.0 / (1.0 + jnp.exp(-v)), z)


def _sinkhorn(z, iterations: int, r):
    """Sinkhorn–Knopp on exp(z) in linear space; each row and column sum passes the sites of a
    log-space path's exp and log. Where `r` evaluates the backend's primitives, the paths'
    log-space iteration (`_sinkhorn_log`)."""
    if getattr(r, "primitive", None) is not None:
        return _sinkhorn_log(z, iterations, r)
    # One materialised z for the max and for its VJP's `z == max` test: XLA:CPU recomputes z in
    # each consumer's fusion, where an FMA may round it otherwise, and a max matched by no
    # element divides by a count of 0 (NaN d_x; docs/jax-notes.md, AVX2 at optimisation level 0).
    z = jax.lax.optimization_barrier(z)
    m = jnp.exp(z - jnp.max(z, axis=(-2, -1), keepdims=True))
    for _ in range(iterations):
        m = m / r(r(jnp.sum(m, axis=-1, keepdims=True), "sinkhorn_sum"), "sinkhorn_log")
        m = m / r(r(jnp.sum(m, axis=-2, keepdims=True), "sinkhorn_sum"), "sinkhorn_log")
    return m


def _sinkhorn_log(z, iterations: int, r):
    """The paths' log-space Sinkhorn, its exp and log through `r`'s primitives."""

    def logsumexp(v, axis):
        top = jax.lax.stop_gradient(jnp.max(v, axis=axis, keepdims=True))
        terms = evaluated(r, "exp", jnp.exp, v - top)
        return top + evaluated(r, "log", jnp.log, jnp.sum(terms, axis=axis, keepdims=True))

    for _ in range(iterations):
        z = z - logsumexp(z, -1)
        z = z - logsumexp(z, -2)
    return evaluated(r, "exp", jnp.exp, z)


def _contracted(r, name: str, a, b, exact: Callable[[], jax.Array], part: str = ""):
    """Contraction `name` of a and b: `exact()` (the oracle's own expression), unless the hook
    accumulates contractions itself (`r.contract`, the hypotheses' program)."""
    contract = getattr(r, "contract", None)
    return exact() if contract is None else contract(name, CONTRACTIONS[name].spec, a, b, part, exact)


def unrounded(v, site: str, part: str = ""):
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


class SiteRecorder:
    """The identity at every site, noting each call's (site, shape) in order: an abstract first
    trace tells `RoundingNoise` how many random numbers a draw needs."""

    def __init__(self):
        self.sites: list[tuple[str, tuple[int, ...]]] = []
        self.parts: list[str] = []  # which value of its site each call is ("" where one value is)

    def __call__(self, v, site: str, part: str = ""):
        self.sites.append((site, tuple(v.shape)))
        self.parts.append(part)
        return v


class RoundingNoise:
    """One simulated rounding of a value, (1 + δ), and independently of its cotangent, (1 + δ'),
    δ, δ' uniform in [-u, u] for the site's forward / backward classes: the spread this causes
    is the error the arithmetic explains, also where the math cancels.

    sites: every call's (site, shape) in order (`SiteRecorder`); bank: two uniform [-1, 1)
    float64 numbers per element of every site, sliced in call order (one generator call per
    draw: one per site made XLA's compile slow); units: traced unit roundoffs per class (zeros:
    the exact oracle).
    """

    def __init__(
        self,
        sites: Sequence[tuple[str, tuple[int, ...]]],
        bank,
        units,
        branch_sites: BranchSites = (),
        kept_sites: Mapping[str, Any] | None = None,
    ):
        self.sites, self.bank, self.units = list(sites), bank, units
        self.rules = {**ROUNDING_SITES, **dict(branch_sites)}
        # site -> traced 1.0 where it rounds, 0.0 where it is held exact (None: every site rounds)
        self.kept_sites = kept_sites
        self.calls = 0
        # Backend-only sites take numbers after every other site's, so a CPU's draws are
        # unchanged (a longer bank's prefix is the shorter bank: partitionable threefry, tested).
        self.offset = 0
        self.backend_offset = 2 * sum(math.prod(shape) for s, shape in self.sites if not self.rules[s].backend_only)

    def _unit(self, classes: tuple[str, ...]):
        if not classes:
            return 0.0
        return jnp.max(jnp.stack([self.units[PRECISION_CLASSES.index(c)] for c in classes]))

    def _take(self, shape: tuple[int, ...], backend_only: bool = False):
        size = math.prod(shape)
        start = self.backend_offset if backend_only else self.offset
        part = jax.lax.slice_in_dim(self.bank, start, start + size)
        if backend_only:
            self.backend_offset += size
        else:
            self.offset += size
        return part.reshape(shape)

    def __call__(self, v, site: str, part: str = ""):
        if self.calls >= len(self.sites) or self.sites[self.calls] != (site, tuple(v.shape)):
            recorded = self.sites[self.calls] if self.calls < len(self.sites) else "nothing"
            raise AssertionError(f"rounding site {self.calls} is {(site, v.shape)}, the recording pass saw {recorded}")
        self.calls += 1
        rule = self.rules[site]
        # The value rounds in its site's classes, and as the output of the backend's primitives.
        backend = tuple(BACKEND_CLASSES[p] for p in rule.primitives_at(part))
        forward_delta = self._unit(rule.forward + backend) * self._take(v.shape, rule.backend_only)
        backward_delta = self._unit(rule.backward + backend) * self._take(v.shape, rule.backend_only)
        if self.kept_sites is not None:
            # A held site's share of the bank is still taken, so the other sites keep their numbers.
            keep = self.kept_sites[site]
            forward_delta, backward_delta = keep * forward_delta, keep * backward_delta
        return _round_both_ways(v, forward_delta.astype(v.dtype), backward_delta.astype(v.dtype))


def _softmax(z, r):
    """softmax over the last axis whose VJP a ⊙ (g − <a, g>) rounds <a, g> through `r`: for a
    peaked softmax that rounding is amplified by 1 / (1 − max a), which float64 autodiff hides."""

    def plain(z_):
        e = evaluated(r, "exp", jnp.exp, z_ - jnp.max(z_, axis=-1, keepdims=True))
        return evaluated(r, "divide", jnp.divide, e, jnp.sum(e, axis=-1, keepdims=True))

    softmax = jax.custom_vjp(plain)

    def forward(z_):
        # Not `softmax` again: `oracle_fits`' forward-mode derivative passes through here.
        a = plain(z_)
        return a, a

    def backward(a, g):
        return (a * (g - r(jnp.sum(a * g, axis=-1, keepdims=True), "softmax_inner_product")),)

    softmax.defvjp(forward, backward)
    return softmax(z)


def _scaled(w, name, logits, r):
    scale = w[f"{name}_scale"].reshape(())
    return _contracted(r, "gate_scale", scale, logits, lambda: scale * logits, part=name)


def _biased(w, name, z, r):
    """z (B, S, M) plus the gate's (flattened) bias (M,) on every token."""
    bias = w[f"{name}_bias"].reshape(-1)
    tokens = jnp.ones(z.shape[:2], z.dtype)
    return z + _contracted(r, "gate_bias", bias, tokens, lambda: bias, part=name)


def _gate_logit(w, name, logits, r):
    return r(_biased(w, name, _scaled(w, name, r(logits, "projection"), r), r), "gate_logit")


def _coefficients(x, w, config, r=unrounded):
    n = config.streams
    batch, seq = x.shape[:2]
    v = x.reshape(batch, seq, -1)
    sum_of_squares = _contracted(r, "mean_square", v, v, lambda: jnp.sum(v * v, axis=-1))
    mean_square = sum_of_squares[..., None] / v.shape[-1]
    inv_rms = r(evaluated(r, "rsqrt", lambda v_: 1.0 / jnp.sqrt(v_), mean_square + config.rms_epsilon), "rms_inverse")
    normed = r(v * inv_rms * w["norm_scale"], "normed_operand")

    def logits(name):
        alpha = r(w[f"{name}_alpha"], "folded_weight")
        return _contracted(r, "projection", normed, alpha, lambda: jnp.matmul(normed, alpha, precision=PRECISION))

    h_pre = r(_sigmoid(_gate_logit(w, "pre", logits("pre"), r), r) + config.pre_epsilon, "gate", part="pre")
    h_post = r(2.0 * _sigmoid(_gate_logit(w, "post", logits("post"), r), r), "gate", part="post")
    z_res = r(_scaled(w, "res", r(logits("res"), "projection"), r), "gate_logit")
    if config.variant == "lite":
        z = r(_biased(w, "res", z_res, r), "gate_logit")
        a = r(r(_softmax(z, r), "gate", part="softmax"), "permutation_operand")
        perms = jnp.asarray(oracle_permutations(n))
        mix = _contracted(
            r, "permutation_mix", a, perms, lambda: jnp.einsum("bsp,pij->bsij", a, perms, precision=PRECISION)
        )
        h_res = r(mix, "gate")
    else:
        z = r(_biased(w, "res", z_res, r).reshape(batch, seq, n, n), "gate_logit")
        h_res = r(_sinkhorn(z, config.sinkhorn_iterations, r), "gate", part="sinkhorn")
    return h_pre, h_post, h_res


def pre(x, w, config, r=unrounded):
    h_pre, h_post, h_res = _coefficients(x, w, config, r)
    weights = r(h_pre, "coefficient_operand")
    collapsed = _contracted(
        r, "collapse", weights, x, lambda: jnp.einsum("bsn,bsnc->bsc", weights, x, precision=PRECISION)
    )
    layer_input = r(collapsed, "layer_input")
    return layer_input, (h_pre, h_post, h_res)


def post(layer_output, x, coeffs, r=unrounded):
    _, h_post, h_res = coeffs
    mix = r(h_res, "coefficient_operand")
    mixed = r(
        _contracted(r, "residual_mix", mix, x, lambda: jnp.einsum("bsij,bsic->bsjc", mix, x, precision=PRECISION)),
        "residual_mix",
    )
    gate = r(h_post, "coefficient_operand")
    gated = _contracted(r, "post_gate", gate, layer_output, lambda: gate[..., None] * layer_output[..., None, :])
    return r(mixed + gated, "out")


def layer_and_vjp(x, w, p, ct, r, config, branch_apply: BranchApply, branch_sites: BranchSites = (), pre_offsets=None):
    """Forward values and gradients of one layer application, every site (the branch's too)
    rounded through `r`. pre_offsets: added to pre's (layer_input, h_pre, h_post, h_res), its
    VJP left exact (`oracle_fits`)."""
    x, ct = r(x, "x"), r(ct, "cotangent")
    # Each weight names itself (`part`), so a hypothesis can round one gate's parameters.
    w = {k: r(v, "gate_weight" if k in _GATE_NAMES else "matmul_weight", part=k) for k, v in w.items()}
    p = {k: r(v, "branch_param", part=k) for k, v in p.items()}

    def whole(x_, w_, p_):
        layer_input, coeffs = pre(x_, w_, config, r)
        if pre_offsets is not None:
            layer_input = layer_input + pre_offsets[0]
            coeffs = tuple(c + o for c, o in zip(coeffs, pre_offsets[1:]))
        branch_output = branch_apply(p_, layer_input, rounding=r) if branch_sites else branch_apply(p_, layer_input)
        layer_output = r(branch_output, "layer_output")
        out = post(layer_output, x_, coeffs, r)
        return out, (layer_input, layer_output) + coeffs

    out, pullback, aux = jax.vjp(whole, x, w, p, has_aux=True)
    d_x, d_w, d_p = pullback(ct)
    layer_input, layer_output, h_pre, h_post, h_res = aux
    # The cotangent reaching the branch output: the VJP of `post` w.r.t. its first input.
    _, post_pullback = jax.vjp(lambda y: post(y, x, (h_pre, h_post, h_res)), layer_output)
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
