"""Branch functions: what the mHC layer wraps between `pre` and `post`, h (..., C) -> (..., C).

- ``init(rng, embedding)``: float64 master parameters, drawn with `normalish` only.
- ``apply(params, h, matmul_precision, rounding=None)``: dtype-polymorphic `jax.numpy`; params cast
  to h's dtype, matmuls accumulate in `accumulation_dtype(h.dtype)`, result in h's dtype. So the
  float64 oracle runs the same function, and a branch parameter's gradient is a leaf like any weight.
- ``rounding_sites``: where apply holds a value below float64; the oracle passes
  ``rounding=r`` and each such value goes through ``r(value, site)`` (paths pass None: identity).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from mhc_parity.cases.names import lookup
from mhc_parity.cases.random_streams import normalish
from mhc_parity.mhc.common import matmul
from mhc_parity.mhc.precision import DEFAULT_MATMUL_PRECISION, accumulation_dtype
from mhc_parity.mhc.rounding_model import ACTIVATION, FLOAT32, MATMUL, OPERAND, RoundingSite, evaluated

# Hidden width of the MLP branch relative to the embedding.
MLP_HIDDEN_RATIO = 1


def identity_init(rng: np.random.Generator, embedding: int) -> dict[str, np.ndarray]:
    """No parameters."""
    return {}


def _unrounded(value, site: str):
    del site
    return value


def identity_apply(params: dict, h: jax.Array, matmul_precision: str = DEFAULT_MATMUL_PRECISION) -> jax.Array:
    """h unchanged: (..., C) -> (..., C), same dtype."""
    return h


def tanh_init(rng: np.random.Generator, embedding: int) -> dict[str, np.ndarray]:
    """No parameters."""
    return {}


# tanh's output: exact, but where the backend's tanh errs past the model (a TPU's).
TANH_ROUNDING_SITES = {
    "tanh_output": RoundingSite(
        (), (), "the backend's float32 tanh (exact where it is within the model)", primitives=(("", ("tanh",)),)
    ),
}


def tanh_apply(
    params: dict, h: jax.Array, matmul_precision: str = DEFAULT_MATMUL_PRECISION, rounding=None
) -> jax.Array:
    """tanh(h) in the accumulation dtype, cast back: (..., C) -> (..., C)."""
    r = rounding or _unrounded
    return r(evaluated(r, "tanh", jnp.tanh, h.astype(accumulation_dtype(h.dtype))), "tanh_output").astype(h.dtype)


def mlp_init(rng: np.random.Generator, embedding: int) -> dict[str, np.ndarray]:
    """Float64 masters: w_in (C, H), b_in (H,), w_out (H, C), b_out (C,), H = MLP_HIDDEN_RATIO·C.
    Biases are non-zero so every parameter gradient is non-trivial."""
    hidden = MLP_HIDDEN_RATIO * embedding
    return {
        "w_in": normalish(rng, (embedding, hidden)) / math.sqrt(embedding),
        "b_in": 0.1 * normalish(rng, (hidden,)),
        "w_out": normalish(rng, (hidden, embedding)) / math.sqrt(hidden),
        "b_out": 0.1 * normalish(rng, (embedding,)),
    }


def mlp_param_shapes(embedding: int) -> dict[str, tuple[int, ...]]:
    """Parameter name -> shape of the MLP branch for an embedding width."""
    hidden = MLP_HIDDEN_RATIO * embedding
    return {"w_in": (embedding, hidden), "b_in": (hidden,), "w_out": (hidden, embedding), "b_out": (embedding,)}


def _no_params(embedding: int) -> dict[str, tuple[int, ...]]:
    return {}


# Where the MLP holds a value below float64 (module docstring: ``rounding_sites``).
MLP_ROUNDING_SITES = {
    "mlp_preactivation": RoundingSite(
        (FLOAT32,),
        (OPERAND,),
        "h @ w_in + b_in accumulates in float32; its cotangent is an operand of the backward matmuls "
        "(d_h, d_w_in) and may be held in the activation dtype",
    ),
    "mlp_hidden": RoundingSite(
        (ACTIVATION, MATMUL),
        (ACTIVATION, MATMUL),
        "the hidden activation is cast to the activation dtype before the second matmul, and its "
        "cotangent comes back from that matmul's VJP in the same dtype; silu's sigmoid is the "
        "backend's logistic",
        primitives=(("", ("logistic",)),),
    ),
}


def mlp_apply(params: dict, h: jax.Array, matmul_precision: str = DEFAULT_MATMUL_PRECISION, rounding=None) -> jax.Array:
    """silu(h @ w_in + b_in) @ w_out + b_out: (..., C) -> (..., C) in h's dtype. Bias adds and
    silu in the accumulation dtype; the hidden activation is cast to h's dtype before the second
    matmul, as a production MLP in that dtype would."""
    r = rounding or _unrounded
    accumulate = accumulation_dtype(h.dtype)
    hidden = matmul(h, params["w_in"], matmul_precision) + params["b_in"].astype(h.dtype).astype(accumulate)
    hidden = r(hidden, "mlp_preactivation")
    hidden = r((hidden * evaluated(r, "logistic", jax.nn.sigmoid, hidden)).astype(h.dtype), "mlp_hidden")
    out = matmul(hidden, params["w_out"], matmul_precision) + params["b_out"].astype(h.dtype).astype(accumulate)
    return out.astype(h.dtype)


@dataclasses.dataclass(frozen=True)
class Branch:
    """A named branch function and its parameter initialiser."""

    name: str
    init: Callable[[np.random.Generator, int], dict[str, np.ndarray]]
    apply: Callable[..., jax.Array]
    description: str
    param_shapes: Callable[[int], dict[str, tuple[int, ...]]]
    rounding_sites: Mapping[str, RoundingSite] = dataclasses.field(default_factory=dict, compare=False)
    # Each output element depends on its own input element only: no matmul whose blocking XLA
    # may choose from the per-shard token count, so token-sharded runs are bit-identical.
    elementwise: bool = False


BRANCHES: dict[str, Branch] = {
    "identity": Branch(
        "identity", identity_init, identity_apply, "h -> h (no parameters)", _no_params, elementwise=True
    ),
    "tanh": Branch(
        "tanh",
        tanh_init,
        tanh_apply,
        "h -> tanh(h) (no parameters)",
        _no_params,
        rounding_sites=TANH_ROUNDING_SITES,
        elementwise=True,
    ),
    "mlp": Branch(
        "mlp",
        mlp_init,
        mlp_apply,
        "h -> silu(h @ w_in + b_in) @ w_out + b_out (4 parameters)",
        mlp_param_shapes,
        rounding_sites=MLP_ROUNDING_SITES,
    ),
}


def get_branch(name: str) -> Branch:
    """The branch called `name`; a KeyError with close matches for an unknown name."""
    return lookup(BRANCHES, name, "branch")
