"""Whether the backend rounds the running sum of each dot layout the paths use to bfloat16: measured,
not assumed (XLA:CPU does for some layouts; a TPU's MXU accumulates in float32). Each layout sums
`PROBE_TERMS` terms, alternately 1 and bfloat16(1/3), which no bfloat16 running sum gets exact
(docs/judging.md)."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

# Enough terms that a bfloat16 running sum, summed in any order of blocks, strays.
PROBE_TERMS = 4096
_WIDTH = 8  # the other axes: small, the sum is what is measured
# In NumPy (ml_dtypes), not JAX: importing this module must start no backend.
_THIRD = float(np.float64(1 / 3).astype(ml_dtypes.bfloat16))
# What a float32 accumulation returns: the exact sum, rounded once to the bfloat16 result.
EXACT_SUM = float(np.float64(PROBE_TERMS // 2 * (1.0 + _THIRD)).astype(ml_dtypes.bfloat16))


# Each layout: (operand shapes, the program). The ones are arguments, never constants: XLA
# folds a constant program at compile time, in its own evaluator, not the backend's kernels.
def _dot_forward(a, b):
    return jnp.einsum("tk,kn->tn", a, b)


def _dot_vjp_weights(tokens, weights, cotangent):
    """The weight gradient of a bfloat16 einsum (`bsm,mn->bsn`), summed over the tokens."""
    _, pullback = jax.vjp(lambda w: jnp.einsum("bsm,mn->bsn", tokens, w), weights)
    return pullback(cotangent)[0]


def _dot_vjp_inputs(x, weights, cotangent):
    """The activation gradient of a bfloat16 einsum (`bsm,mn->bsn`), summed over its outputs."""
    _, pullback = jax.vjp(lambda x_: jnp.einsum("bsm,mn->bsn", x_, weights), x)
    return pullback(cotangent)[0]


def _product_vjp(gate, wide, cotangent):
    """The gradient of a broadcast bfloat16 product's narrow factor, summed over the broadcast axis."""
    _, pullback = jax.vjp(lambda g: g[:, :, None] * wide[:, None, :], gate)
    return pullback(cotangent)[0]


_N, _W = PROBE_TERMS, _WIDTH
# layout -> (operand shapes, (the operand, its axis) that alternates along the sum, program).
LAYOUTS = {
    "dot_forward": (((_W, _N), (_N, _W)), (0, 1), _dot_forward),
    "dot_vjp_weights": (((1, _N, _W), (_W, _W), (1, _N, _W)), (0, 1), _dot_vjp_weights),
    "dot_vjp_inputs": (((1, _W, _W), (_W, _N), (1, _W, _N)), (1, 1), _dot_vjp_inputs),
    "product_vjp": (((_W, _W), (_W, _N), (_W, _W, _N)), (1, 1), _product_vjp),
}


def _operands(shapes, alternating):
    """bfloat16 ones of `shapes`, but the operand `alternating` names: 1 and 1/3 along its axis."""
    index, axis = alternating
    operands = [jnp.ones(shape, jnp.bfloat16) for shape in shapes]
    shape = shapes[index]
    steps = jnp.arange(shape[axis]).reshape([-1 if a == axis else 1 for a in range(len(shape))])
    operands[index] = jnp.broadcast_to(jnp.where(steps % 2 == 0, 1.0, _THIRD), shape).astype(jnp.bfloat16)
    return operands


@dataclasses.dataclass(frozen=True)
class LayoutSum:
    """One layout's sum of the probe's `PROBE_TERMS` bfloat16 terms on this backend (`exact`
    when accumulated in float32)."""

    layout: str
    total: float
    exact: float = EXACT_SUM

    @property
    def narrow(self) -> bool:
        """Whether the backend's running sum was rounded to a narrow dtype (it strayed)."""
        return self.total != self.exact

    def evidence(self) -> str:
        wide = f"accumulated in float32: {self.exact:g}"
        return f"{self.layout}: {PROBE_TERMS} bfloat16 terms sum to {self.total:g} ({wide})"


@functools.cache
def probe_backend() -> dict[str, LayoutSum]:
    """layout -> its `LayoutSum` on the default backend, measured once per process."""
    found = {}
    for name, (shapes, alternating, program) in LAYOUTS.items():
        result = jax.jit(program)(*_operands(shapes, alternating))
        found[name] = LayoutSum(name, float(jnp.asarray(result, jnp.float32).ravel()[0]))
    return found


def probe_record(probe: dict[str, LayoutSum]) -> str:
    """The probe as one line of the run's environment record: each layout's sum / a float32 accumulation's."""
    sums = "; ".join(f"{s.layout}={s.total:g}/{s.exact:g}" for s in probe.values())
    return f"{PROBE_TERMS} bfloat16 terms on {jax.default_backend()}, sum / float32 accumulation's: {sums}"
