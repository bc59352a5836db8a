"""Init families: how a fixture's float64 masters are drawn, and what each one stresses (each
generator's docstring, shown by `mhc-parity cases families`). Every family starts from
`default_masters` and redraws only what it is about, from new random roles.

Notation: n streams, C embedding, K = n·C; gates ``h_pre = sigmoid(pre_scale·ℓ_pre + pre_bias)``,
``h_post = 2·sigmoid(...)``, ``h_res = Σ_p softmax(res_scale·ℓ_res + res_bias)_p P_p`` (lite),
logits ℓ = rms_inverse(v) · v @ (norm_scale · alpha) for the flattened token v (K,).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import ml_dtypes
import numpy as np

from mhc_parity.cases.branches import get_branch
from mhc_parity.cases.names import lookup
from mhc_parity.cases.random_streams import RandomStreams
from mhc_parity.cases.spec import Case
from mhc_parity.mhc.common import permutation_matrices

# Logit advantage of the identity permutation (lite) / the diagonal (Sinkhorn) in the
# default family: h_res starts close to, but clearly not exactly, a plain residual.
IDENTITY_BIAS = 3.0
# Logit advantage of the one dominant permutation in `peaky_permutation`.
PEAK_BIAS = 12.0
# Exponent range (base 2) of the per-token magnitudes in `large_magnitude`; see there.
LARGE_MAGNITUDE_EXPONENTS = (32, 36)
# Per-token magnitudes of `near_zero_rms`: 1, ≈ sqrt(eps), below it, far below it, zero.
NEAR_ZERO_TOKEN_SCALES = (1.0, 2.0**-8, 2.0**-10, 2.0**-20, 0.0)
# Fraction of a bfloat16 spacing `bf16_inexact_gates` values sit off a bfloat16 number: just
# under 1/2, so rounding never meets a tie.
BF16_INEXACT_OFFSET = 7.0 / 16.0


@dataclasses.dataclass(frozen=True, eq=False)
class Masters:
    """Float64 masters of one fixture: x, cotangent (B, S, n, C); weights by `MhcWeights`
    field (`MhcDims.weight_shapes()`); branch_params by name."""

    x: np.ndarray
    cotangent: np.ndarray
    weights: dict[str, np.ndarray]
    branch_params: dict[str, np.ndarray]

    def with_changes(self, *, x=None, cotangent=None, weights=None, branch_params=None) -> Masters:
        """A copy with the given arrays replaced; `weights`/`branch_params` are merged."""
        return Masters(
            x=self.x if x is None else x,
            cotangent=self.cotangent if cotangent is None else cotangent,
            weights={**self.weights, **(weights or {})},
            branch_params={**self.branch_params, **(branch_params or {})},
        )


def _identity_preferring_bias(case: Case, rs: RandomStreams, role: str, advantage: float, spread: float):
    """res_bias: N(0, spread²) noise plus `advantage` on the identity permutation/diagonal."""
    n = case.streams
    if case.variant == "lite":
        bias = rs.normal(role, (math.factorial(n),), std=spread)
        bias[0] += advantage  # permutation 0 is the identity in itertools order
    else:
        bias = rs.normal(role, (n, n), std=spread) + advantage * np.eye(n)
    return bias


def default_masters(case: Case, rs: RandomStreams) -> Masters:
    """The baseline every other family starts from.

    Follows the mHC papers in spirit — fan-in scaled projections (logits of order one),
    RMS-norm scale near one, small positive gate scales, h_pre biased towards ≈1/n per
    stream, h_post towards ≈1, and an mHC-lite residual bias favouring the identity
    permutation — but random enough that every gradient leaf is non-trivial: scales
    are 0.1–0.5 rather than the papers' 0.01, and every bias has per-entry noise.

    Stresses: nothing in particular; it is the well-conditioned regime in which kernel
    and reference should agree to within a few ULPs.
    """
    n, c = case.streams, case.embedding
    k = n * c
    dims = case.dims
    r = dims.residual_width
    weights = {
        "norm_scale": rs.normal("weights.norm_scale", (k,), std=0.1, mean=1.0),
        "pre_alpha": rs.normal("weights.pre_alpha", (k, n), std=1.0 / math.sqrt(k)),
        "pre_bias": rs.normal("weights.pre_bias", (n,), std=0.3, mean=-1.0),
        "pre_scale": rs.uniform("weights.pre_scale", (1,), 0.1, 0.5),
        "post_alpha": rs.normal("weights.post_alpha", (k, n), std=1.0 / math.sqrt(k)),
        "post_bias": rs.normal("weights.post_bias", (n,), std=0.3),
        "post_scale": rs.uniform("weights.post_scale", (1,), 0.1, 0.5),
        "res_alpha": rs.normal("weights.res_alpha", (k, r), std=1.0 / math.sqrt(k)),
        "res_bias": _identity_preferring_bias(case, rs, "weights.res_bias", IDENTITY_BIAS, 0.3),
        "res_scale": rs.uniform("weights.res_scale", (1,), 0.1, 0.5),
    }
    branch_params = get_branch(case.branch).init(rs.generator("branch"), c)
    return Masters(
        x=rs.normal("x", case.shape),
        cotangent=rs.normal("cotangent", case.shape),
        weights=weights,
        branch_params=branch_params,
    )


def saturated_gates_masters(case: Case, rs: RandomStreams) -> Masters:
    """Large gate logits: every gate is driven deep into saturation for most tokens.

    Projections ×4 and gate scales 4–8 make s·ℓ of order ±20, biases ±2–6. sigmoid
    rounds to exactly 0 or 1 in float32 for most tokens (its float32 derivative is 0
    where the float64 oracle's is ~e^-20), a few tokens stay in the transition region,
    and the residual softmax becomes near one-hot per token.

    Stresses: sigmoid/softmax evaluated without overflow for large |z| (exp of a large
    positive argument, max-subtraction in softmax), gradients that underflow, and a
    kernel that clamps or approximates the gate nonlinearity.
    """
    base = default_masters(case, rs)
    n = case.streams
    k = n * case.embedding
    r = case.dims.residual_width
    large = 4.0 / math.sqrt(k)
    weights = {
        "pre_alpha": rs.normal("saturated.pre_alpha", (k, n), std=large),
        "post_alpha": rs.normal("saturated.post_alpha", (k, n), std=large),
        "res_alpha": rs.normal("saturated.res_alpha", (k, r), std=large),
        "pre_scale": rs.uniform("saturated.pre_scale", (1,), 4.0, 8.0),
        "post_scale": rs.uniform("saturated.post_scale", (1,), 4.0, 8.0),
        "res_scale": rs.uniform("saturated.res_scale", (1,), 4.0, 8.0),
        "pre_bias": rs.signs("saturated.pre_bias_sign", (n,)) * rs.uniform("saturated.pre_bias", (n,), 2.0, 6.0),
        "post_bias": rs.signs("saturated.post_bias_sign", (n,)) * rs.uniform("saturated.post_bias", (n,), 2.0, 6.0),
    }
    return base.with_changes(weights=weights)


def peaky_permutation_masters(case: Case, rs: RandomStreams) -> Masters:
    """A peaky softmax over permutations: one non-identity permutation dominates h_res.

    The residual bias gives one randomly chosen permutation (never the identity when
    n > 1) a +12 logit advantage, so its softmax weight is 1 - O(n!·e^-12) and every
    other weight sits around 1e-5..1e-6. For Sinkhorn, the bias is +12 on that
    permutation's entries and the iterations converge to a near-permutation matrix.

    Stresses: softmax over n! entries with a huge dynamic range (max-subtraction, exp
    underflow of the losers, tiny but non-zero gradients for their biases), and the
    permutation order itself — a kernel whose permutation table is ordered differently
    from the oracle's mixes the wrong streams, which a near-identity h_res would hide.
    """
    base = default_masters(case, rs)
    n = case.streams
    perms = math.factorial(n)
    peak = int(rs.integers("peaky.peak_index", 1, perms)) if perms > 1 else 0
    if case.variant == "lite":
        bias = rs.normal("peaky.res_bias", (perms,), std=0.5)
        bias[peak] += PEAK_BIAS
    else:
        pattern = permutation_matrices(n)[peak].astype(np.float64)
        bias = rs.normal("peaky.res_bias", (n, n), std=0.5) + PEAK_BIAS * pattern
    return base.with_changes(weights={"res_bias": bias})


def near_zero_rms_masters(case: Case, rs: RandomStreams) -> Masters:
    """Tokens whose RMS is near or below the RMS-norm epsilon, and an all-zero token.

    Each token's (n, C) slab of x is scaled by one of 1, 2^-8 (mean(v²) ≈ 1.5e-5, about
    the 1e-5 epsilon), 2^-10, 2^-20 (mean(v²) ≪ eps) or exactly 0. The first tokens
    cycle through all five so every kind is present; the rest are random. Power-of-two
    scalings are exact, so bfloat16 rounding sees the same mantissas as the default.

    Stresses: where the epsilon enters (inside the square root, added to the mean not
    the sum), rsqrt of an all-zero row (must be rsqrt(eps), never inf/NaN), the RMS
    backward when eps dominates, and tiny exponents in bfloat16 activations.
    """
    base = default_masters(case, rs)
    tokens = case.tokens
    scales = np.asarray(NEAR_ZERO_TOKEN_SCALES)
    choice = rs.integers("near_zero.token_kind", 0, len(scales), (tokens,))
    head = min(tokens, len(scales))
    choice[:head] = np.arange(head)
    token_scale = scales[choice].reshape(case.batch, case.sequence, 1, 1)
    return base.with_changes(x=base.x * token_scale)


def large_magnitude_masters(case: Case, rs: RandomStreams) -> Masters:
    """Activations of magnitude 2^32..2^36 (≈4e9..7e10) per token, as large as float32 math allows.

    The binding limit is not x itself (float32 and bfloat16 reach 3.4e38) but the RMS
    backward, which forms m^(-3/2) for m = mean(v²) ≈ A²: it stays a normal float32
    (> 2^-126) only while A < 2^42, and Σv² over K ≤ 4096 entries stays far from
    overflow. A at most 2^36 (elements up to ≈2.4e11) keeps both with margin, so every
    forward output and gradient is finite in float32 while the squared magnitudes
    (≈1e21..1e23) are far beyond anything float16 or an unscaled bfloat16 sum-of-squares
    accumulation could hold. Per-token magnitudes are exact powers of two.

    Stresses: overflow in the sum of squares, underflow of rms⁻³ in the backward, loss
    of relative precision when large and normalised quantities meet (h_post·branch
    output vs h_res·x), and gradients spanning ~20 decades (d_x ≈ 1/A, d_alpha ≈ A).
    """
    base = default_masters(case, rs)
    low, high = LARGE_MAGNITUDE_EXPONENTS
    token_scale = rs.powers_of_two("large.token_scale", (case.batch, case.sequence, 1, 1), low, high)
    return base.with_changes(x=base.x * token_scale)


def _bfloat16_inexact(values: np.ndarray, directions: np.ndarray) -> np.ndarray:
    """Float32-exact values near `values` that rounding to bfloat16 moves by 7/16 of a spacing:
    snapped to bfloat16, then moved away from zero (`directions` +1) or towards it (-1; not at a
    power of two, where the spacing below is finer). Mixed signs do not cancel in a softmax."""
    snapped = values.astype(np.float32).astype(ml_dtypes.bfloat16).astype(np.float64)
    if np.any(snapped == 0):
        raise ValueError("bf16_inexact values must be non-zero")
    mantissa, exponent = np.frexp(np.abs(snapped))
    spacing = np.ldexp(np.ones_like(snapped), exponent - 8)
    directions = np.where(mantissa == 0.5, 1.0, directions)
    moved = snapped + np.sign(snapped) * directions * BF16_INEXACT_OFFSET * spacing
    assert np.array_equal(moved.astype(np.float32).astype(np.float64), moved)
    assert np.array_equal(moved.astype(np.float32).astype(ml_dtypes.bfloat16).astype(np.float64), snapped)
    return moved


def bf16_inexact_gates_masters(case: Case, rs: RandomStreams) -> Masters:
    """Gate scales and biases that bfloat16 cannot represent, placed where it matters.

    Every gate scale and bias sits 7/16 of a bfloat16 spacing from a bfloat16 number
    (`_bfloat16_inexact`, direction random per entry), so a stray bfloat16 cast moves it
    by 0.17% of its size. Sigmoid biases have magnitude 1.1–1.9 (pre negative, post
    mixed), where a rounding error of ≈0.0034 meets sigmoid' ≈ 0.1–0.2. Residual biases
    lie in 4.2–7.6 (identity / diagonal highest): softmax and Sinkhorn ignore the common
    offset, so the mix stays moderate while each entry's rounding error is ≈0.0137. Gate
    scales are 0.02–0.04, which keeps s·ℓ small and with it the legitimate noise of a
    bfloat16 run (bfloat16 rounding of the folded projection moves s·ℓ, not the bias).

    Measured with the reference path on n = 2–4, both variants, bfloat16 activations and
    float32 weights: pre-casting the gate scales/biases to bfloat16 moves h_pre, h_post
    and h_res (relative to their max) by 2.6e-3, 7.5e-4 and 3–5e-3, i.e. 18×, 20× and
    40–80× the reference's own error against the float64 oracle; the layer output moves
    by about 1–2× its bfloat16 noise. tests/test_init_families.py checks the ratio.

    Stresses: the gate must upcast its stored scale and bias to float32 before the
    affine map; a kernel that casts them to the activation dtype first (the upstream
    reference/kernel mismatch) fails the h_pre/h_post/h_res comparisons. Only visible
    with weight_dtype=float32 and bfloat16 activations (bfloat16 weights are already
    rounded; a cast to float32 activations is a no-op).
    """
    base = default_masters(case, rs)
    n = case.streams
    prefix = "bf16_inexact."

    def magnitudes(role, shape, low, high):
        return rs.uniform(prefix + role, shape, low, high)

    r = case.dims.residual_width
    res_shape = (r,) if case.variant == "lite" else (n, n)
    # Shift invariant: the [4, 8) binade gives larger rounding errors, the mix stays moderate.
    res_bias = magnitudes("res_bias", res_shape, 4.2, 6.5)
    if case.variant == "lite":
        res_bias[0] = magnitudes("res_bias_identity", (), 7.0, 7.6)
    else:
        res_bias[np.diag_indices(n)] = magnitudes("res_bias_identity", (n,), 7.0, 7.6)
    # Sigmoid is not shift invariant: its biases stay in the steep [1, 2) binade.
    weights = {
        "pre_bias": -magnitudes("pre_bias", (n,), 1.1, 1.9),
        "post_bias": rs.signs(prefix + "post_bias_sign", (n,)) * magnitudes("post_bias", (n,), 1.1, 1.9),
        "res_bias": res_bias,
        "pre_scale": magnitudes("pre_scale", (1,), 0.02, 0.04),
        "post_scale": magnitudes("post_scale", (1,), 0.02, 0.04),
        "res_scale": magnitudes("res_scale", (1,), 0.02, 0.04),
    }
    inexact = {
        k: _bfloat16_inexact(np.asarray(v), rs.signs(prefix + k + "_direction", np.shape(v)))
        for k, v in weights.items()
    }
    return base.with_changes(weights=inexact)


def mixed_signs_masters(case: Case, rs: RandomStreams) -> Masters:
    """Negative scales and streams that nearly cancel.

    norm_scale entries have random signs; pre_scale (small, -0.01..-0.05) and res_scale
    are negative, post_scale positive; post and residual biases get random signs. Streams
    of x alternate in sign around a shared base (x_s = (-1)^s·base + 0.05·noise) and the
    pre biases are almost equal, so h_pre is nearly uniform and the collapse
    Σ_s h_pre[s]·x[s] cancels to a small fraction of its terms (fully for even n).

    Stresses: catastrophic cancellation in the collapse and in the expansion sums
    (accumulation order and precision become visible as relative error), and a kernel
    that silently assumes positive scales (abs, log-space folding, unsigned clamps).
    """
    base = default_masters(case, rs)
    n, c = case.streams, case.embedding
    shared = rs.normal("mixed.base", (case.batch, case.sequence, 1, c))
    alternating = np.where(np.arange(n) % 2 == 0, 1.0, -1.0).reshape(1, 1, n, 1)
    x = alternating * shared + 0.05 * rs.normal("mixed.noise", case.shape)
    weights = {
        "norm_scale": base.weights["norm_scale"] * rs.signs("mixed.norm_sign", (n * c,)),
        "pre_scale": -0.1 * base.weights["pre_scale"],  # small: h_pre nearly uniform over streams
        "res_scale": -base.weights["res_scale"],
        "pre_bias": rs.normal("mixed.pre_bias", (n,), std=0.01, mean=-1.0),
        "post_bias": base.weights["post_bias"] * rs.signs("mixed.post_sign", (n,))
        + 0.5 * rs.signs("mixed.post_shift", (n,)),
        "res_bias": base.weights["res_bias"] * rs.signs("mixed.res_sign", base.weights["res_bias"].shape),
    }
    return base.with_changes(x=x, weights=weights)


@dataclasses.dataclass(frozen=True)
class InitFamily:
    """A named master generator; `stresses` is its docstring (what it is for)."""

    name: str
    generate: Callable[[Case, RandomStreams], Masters]

    @property
    def stresses(self) -> str:
        return (self.generate.__doc__ or "").strip()

    @property
    def summary(self) -> str:
        return self.stresses.splitlines()[0] if self.stresses else ""


INIT_FAMILIES: dict[str, InitFamily] = {
    family.name: family
    for family in (
        InitFamily("default", default_masters),
        InitFamily("saturated_gates", saturated_gates_masters),
        InitFamily("peaky_permutation", peaky_permutation_masters),
        InitFamily("near_zero_rms", near_zero_rms_masters),
        InitFamily("large_magnitude", large_magnitude_masters),
        InitFamily("bf16_inexact_gates", bf16_inexact_gates_masters),
        InitFamily("mixed_signs", mixed_signs_masters),
    )
}


def get_init_family(name: str) -> InitFamily:
    """The family called `name`; a KeyError with close matches for an unknown name."""
    return lookup(INIT_FAMILIES, name, "init family")


def generate_masters(case: Case) -> Masters:
    """Float64 masters for `case`, from its init family and seed alone; shapes checked."""
    masters = get_init_family(case.init).generate(case, RandomStreams(case.seed))
    expected = case.dims.weight_shapes()
    if set(masters.weights) != set(expected):
        raise AssertionError(f"init family {case.init!r} produced weights {sorted(masters.weights)}")
    for name, shape in expected.items():
        if masters.weights[name].shape != shape:
            raise AssertionError(
                f"init family {case.init!r}: {name} has shape {masters.weights[name].shape}, expected {shape}"
            )
    for array in (masters.x, masters.cotangent):
        if array.shape != case.shape:
            raise AssertionError(f"init family {case.init!r}: activation shape {array.shape} != {case.shape}")
    return masters
