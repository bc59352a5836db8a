"""The rounding model: where a correct implementation may round each value of the mHC layer
(the oracle simulates one rounding per site; the hypotheses are roundings it does not allow).
Declarations only; imports nothing from `mhc_parity.mhc.common`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import jax.numpy as jnp

# Each value's unit roundoff is that of the precision a CORRECT implementation may hold it in:
# rounding everything at the activation dtype would explain away real bugs (a gate's bias
# rounded to bfloat16 moves h_post as much as a bfloat16 gate logit). The legitimate variants
# (mhc_parity/harness/variants.py) must pass under bounds built from this model.

# Precision classes (`unit_roundoffs` gives each a u per case); several: the coarsest applies.
ACTIVATION = "activation"  # stored in the activation dtype: inputs, outputs, their cotangents
OPERAND = "operand"  # a contraction operand a correct path may round to the activation dtype
FLOAT32 = "float32"  # computed and held in float32
WEIGHT = "weight"  # stored in the weights' dtype: weight leaves and their gradients
MATMUL = "matmul"  # a dot's float32 operands at the case's setting (`precision.operand_rounding`)
# Float32 primitives whose outputs round at the backend's measured excess error (class
# "backend_<primitive>"; 0 where within the model, e.g. a CPU); nothing else widens.
BACKEND_PRIMITIVES = ("exp", "log", "logistic", "tanh", "rsqrt", "divide")
BACKEND_CLASSES = {primitive: f"backend_{primitive}" for primitive in BACKEND_PRIMITIVES}
PRECISION_CLASSES = (ACTIVATION, OPERAND, FLOAT32, WEIGHT, MATMUL, *BACKEND_CLASSES.values())


@dataclasses.dataclass(frozen=True)
class RoundingSite:
    """Where one value may be rounded by a correct implementation. forward / backward: precision
    classes of the value / its cotangent (() : exact). primitives: per call `part` ("" every
    call), the `BACKEND_PRIMITIVES` whose output the value is (both directions round at them)."""

    forward: tuple[str, ...]
    backward: tuple[str, ...]
    why: str
    primitives: tuple[tuple[str, tuple[str, ...]], ...] = ()

    def primitives_at(self, part: str) -> tuple[str, ...]:
        found = dict(self.primitives)
        return found.get(part, found.get("", ()))

    @property
    def backend_only(self) -> bool:
        return bool(self.primitives) and not (self.forward or self.backward)


ROUNDING_SITES: Mapping[str, RoundingSite] = {
    # Inputs.
    "x": RoundingSite(
        (),
        (ACTIVATION,),
        "the input streams are exact (every path receives the same activation-dtype values, "
        "and a matmul operand already in that dtype rounds to itself); d_x is stored in the "
        "activation dtype",
    ),
    "cotangent": RoundingSite((), (), "the output cotangent is an exact input"),
    "matmul_weight": RoundingSite(
        (OPERAND,),
        (OPERAND, WEIGHT),
        "norm_scale and the alphas: cast to the compute dtype for the projection matmul; "
        "their gradients pass through that dtype and are stored in the weight dtype",
    ),
    "gate_weight": RoundingSite(
        (FLOAT32,),
        (FLOAT32, WEIGHT),
        "gate scales and biases: upcast to float32 before the gate, never rounded to the "
        "activation dtype; gradients accumulated in float32, stored in the weight dtype",
    ),
    "branch_param": RoundingSite(
        (OPERAND,), (OPERAND, WEIGHT), "branch parameters: cast to the activation dtype inside the branch"
    ),
    # The coefficients: float32 arithmetic on an activation-dtype projection.
    "rms_inverse": RoundingSite(
        (FLOAT32,), (FLOAT32,), "the RMS statistic rsqrt(mean(v^2) + eps), float32", primitives=(("", ("rsqrt",)),)
    ),
    "normed_operand": RoundingSite(
        (OPERAND,),
        (OPERAND,),
        "x * rms^-1 * norm_scale as the projection's operand, for a path that normalises "
        "the activations instead of folding the norm scale into the weights",
    ),
    "folded_weight": RoundingSite(
        (OPERAND,),
        (OPERAND,),
        "the projection weights with the norm scale folded in, rounded once to the "
        "activation dtype as the matmul operand (and their cotangent)",
    ),
    "projection": RoundingSite(
        (FLOAT32,),
        (OPERAND,),
        "the projection accumulates in float32; its cotangent is an operand of the "
        "backward matmuls (d_x, d_weights) and may be held in the activation dtype",
    ),
    "gate_logit": RoundingSite((FLOAT32,), (FLOAT32,), "scale * logit + bias, float32"),
    "gate": RoundingSite(
        (FLOAT32,),
        (FLOAT32,),
        "sigmoid and softmax outputs, h_pre / h_post / h_res as the layer returns them: float32; the "
        "sigmoid gates are the backend's logistic, the softmax its exp and division, the Sinkhorn "
        "matrix the exp of its log-space iterate",
        primitives=(
            ("pre", ("logistic",)),
            ("post", ("logistic",)),
            ("softmax", ("exp", "divide")),
            ("sinkhorn", ("exp",)),
        ),
    ),
    # The paths' log-space Sinkhorn step errs as the oracle's linear step with its sum off by
    # the exp's and the log's relative errors.
    "sinkhorn_sum": RoundingSite(
        (),
        (),
        "a Sinkhorn row or column sum: the backend's exp of each term (exact where it is within the model)",
        primitives=(("", ("exp",)),),
    ),
    "sinkhorn_log": RoundingSite(
        (),
        (),
        "a Sinkhorn row or column sum's log: the backend's log, whose absolute error is a relative "
        "error of the sum (exact where it is within the model)",
        primitives=(("", ("log",)),),
    ),
    "permutation_operand": RoundingSite(
        (MATMUL,),
        (MATMUL,),
        "the softmax weights as the operand of the permutation mix (a dot): rounded only by "
        "the backend's operand rounding at the case's matmul precision",
    ),
    "softmax_inner_product": RoundingSite(
        (FLOAT32,), (FLOAT32,), "<a, g> in the softmax VJP a * (g - <a, g>), float32 (it cancels for a peaked softmax)"
    ),
    "coefficient_operand": RoundingSite(
        (OPERAND,),
        (FLOAT32,),
        "h_pre, h_post, h_res as operands of the collapse and the residual mix (MXU operands "
        "in the activation dtype, float32 accumulation); their cotangents accumulate in float32",
    ),
    "layer_input": RoundingSite((ACTIVATION,), (ACTIVATION,), "the collapsed branch input and its cotangent, stored"),
    "layer_output": RoundingSite(
        (ACTIVATION, MATMUL),
        (ACTIVATION, MATMUL),
        "the branch output and its cotangent, stored; a branch's own matmuls round their "
        "operands at the case's matmul precision",
    ),
    "residual_mix": RoundingSite((FLOAT32,), (FLOAT32,), "h_res^T x accumulated in float32"),
    "out": RoundingSite((ACTIVATION,), (ACTIVATION,), "the layer output, stored in the activation dtype"),
}


@dataclasses.dataclass(frozen=True)
class Contraction:
    """A sum over products a path accumulates in float32: its einsum `spec` and words (only the
    hypotheses' program accumulates one otherwise)."""

    spec: str
    words: str
    operands: tuple[str, str]


CONTRACTIONS: Mapping[str, Contraction] = {
    "mean_square": Contraction("bsk,bsk->bs", "the RMS statistic's sum of squares", ("x", "x")),
    "projection": Contraction(
        "bsk,km->bsm", "the projection", ("the normalised activations", "the folded projection weights")
    ),
    "permutation_mix": Contraction(
        "bsp,pij->bsij", "the permutation mix", ("the softmax weights", "the permutation matrices")
    ),
    "collapse": Contraction("bsn,bsnc->bsc", "the stream collapse", ("h_pre", "x")),
    "residual_mix": Contraction("bsij,bsic->bsjc", "the residual mix", ("h_res", "x")),
    "post_gate": Contraction("bsn,bsc->bsnc", "the post gate's product", ("h_post", "the branch output")),
    # No sum forward, but the scale's and bias's gradients sum over every token.
    "gate_scale": Contraction(",bsm->bsm", "the gate's scaled logits", ("the gate's scale", "the logits")),
    "gate_bias": Contraction("m,bs->bsm", "the gate's bias over the tokens", ("the gate's bias", "the tokens")),
}


# A branch's own sites (`branch_sites`), as the oracle's programs take them: hashable.
BranchSites = tuple[tuple[str, RoundingSite], ...]


def evaluated(r, primitive: str, function, *operands):
    """function(*operands), a `BACKEND_PRIMITIVES` value, unless the hook `r` evaluates
    primitives itself (`r.primitive`: the backend's own, `oracle_backend`)."""
    hook = getattr(r, "primitive", None)
    return function(*operands) if hook is None else hook(primitive, function, *operands)


def branch_site_tuple(branch_sites: Mapping[str, RoundingSite] | None) -> BranchSites:
    """A branch's rounding sites as a sorted tuple; a name the layer's table has is an error."""
    sites = tuple(sorted((branch_sites or {}).items()))
    clashes = sorted(name for name, _ in sites if name in ROUNDING_SITES)
    if clashes:
        raise ValueError(
            f"branch rounding sites {clashes} clash with the layer's own (mhc_parity.mhc.rounding_model.ROUNDING_SITES)"
        )
    for name, site in sites:
        if not isinstance(site, RoundingSite):
            raise TypeError(
                f"branch rounding site {name!r} must be a mhc_parity.mhc.rounding_model.RoundingSite, "
                f"got {type(site).__name__}"
            )
    return sites


def unit_roundoffs(
    activation_dtype,
    weight_dtype,
    matmul_operand_roundoff: float = 0.0,
    backend_terms: Mapping[str, float] | None = None,
) -> dict[str, float]:
    """{class: u = eps / 2} for a run in these dtypes. matmul_operand_roundoff: a dot's float32
    operand rounding (`precision.operand_rounding`); backend_terms: primitive -> relative error
    past the model. OPERAND takes the coarser of the activation dtype and the dot's rounding."""
    # The probe measures more primitives than the model has sites for: those widen nothing.
    terms = dict(backend_terms or {})
    act = float(jnp.finfo(activation_dtype).eps) / 2
    backend = {BACKEND_CLASSES[p]: float(terms.get(p, 0.0)) for p in BACKEND_PRIMITIVES}
    return {
        ACTIVATION: act,
        OPERAND: max(act, matmul_operand_roundoff),
        FLOAT32: float(jnp.finfo(jnp.float32).eps) / 2,
        WEIGHT: float(jnp.finfo(weight_dtype).eps) / 2,
        MATMUL: float(matmul_operand_roundoff),
        **backend,
    }
