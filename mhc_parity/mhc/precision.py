"""Matmul precision: the one place that decides how every dot of the layer is computed.

A float32 dot with no stated precision runs at the backend's default (bfloat16 passes on a
TPU, TensorFloat-32 on recent NVIDIA GPUs), but the bounds assume exact float32, so every dot
states `dot_precision(...)` and accumulates in `accumulation_dtype(...)`. Settings: "highest"
(float32 operands at HIGHEST; bfloat16 ones at DEFAULT, the same arithmetic, since Mosaic
rejects HIGHEST for them) and "default" (the backend's own). `operand_rounding` is the only
encoding of what a setting does to float32 operands on a backend.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

HIGHEST, DEFAULT = "highest", "default"
MATMUL_PRECISIONS = (HIGHEST, DEFAULT)
DEFAULT_MATMUL_PRECISION = HIGHEST

_LAX_PRECISION = {HIGHEST: jax.lax.Precision.HIGHEST, DEFAULT: jax.lax.Precision.DEFAULT}
_BFLOAT16 = np.dtype(jnp.bfloat16)
_MATMUL_DTYPES = (np.dtype(np.float32), _BFLOAT16, np.dtype(np.float64))
# From Ampere on, a default-precision float32 dot has TensorFloat-32 operands.
TF32_MIN_COMPUTE_CAPABILITY = (8, 0)


def check_matmul_precision(setting: str) -> str:
    """`setting` if it is one of `MATMUL_PRECISIONS`; ValueError naming the choices otherwise."""
    if setting not in MATMUL_PRECISIONS:
        raise ValueError(f"matmul_precision must be one of {MATMUL_PRECISIONS}, got {setting!r}")
    return setting


def dot_precision(dtype, setting: str = DEFAULT_MATMUL_PRECISION) -> jax.lax.Precision:
    """The `precision=` of a dot of two `dtype` operands under `setting`: float32 follows the
    setting, bfloat16 is always DEFAULT (exact products), float64 always HIGHEST. ValueError
    for another dtype or setting."""
    check_matmul_precision(setting)
    dtype = np.dtype(dtype)
    if dtype not in _MATMUL_DTYPES:
        raise ValueError(f"no matmul precision rule for operand dtype {dtype.name}")
    if dtype == np.float64:
        return jax.lax.Precision.HIGHEST
    if dtype == _BFLOAT16:
        return jax.lax.Precision.DEFAULT
    return _LAX_PRECISION[setting]


def cotangent_dot_precision(dtype, setting: str = DEFAULT_MATMUL_PRECISION) -> jax.lax.Precision:
    """The `precision=` of a dot's transposes (VJP dots): they multiply the float32 cotangent,
    so the float32 rule applies, also for a bfloat16 dot."""
    return dot_precision(accumulation_dtype(dtype), setting)


def accumulation_dtype(dtype) -> np.dtype:
    """The `preferred_element_type` of a dot of `dtype` operands: float32, or float64 for float64."""
    return np.dtype(jnp.promote_types(dtype, jnp.float32))


@dataclasses.dataclass(frozen=True)
class OperandRounding:
    """What a matmul does to its float32 operands on one backend at one setting. name:
    "float32", "bfloat16x6" (TPU HIGHEST: six bfloat16 passes, not bit-exact), "bfloat16" or
    "tensorfloat32"; unit_roundoff: each operand's relative rounding beyond float32 (0: none)."""

    name: str
    unit_roundoff: float

    @property
    def rounds_operands(self) -> bool:
        return self.unit_roundoff > 0.0


FLOAT32_OPERANDS = OperandRounding("float32", 0.0)
TPU_HIGHEST_OPERANDS = OperandRounding("bfloat16x6", 0.0)
BFLOAT16_OPERANDS = OperandRounding("bfloat16", 2.0**-8)  # 8 significant bits
TF32_OPERANDS = OperandRounding("tensorfloat32", 2.0**-11)  # 11 significant bits


def parse_compute_capability(value) -> tuple[int, int] | None:
    """(major, minor) of an NVIDIA compute capability like "8.0", or None if not one."""
    try:
        major, minor = str(value).split(".")[:2]
        return int(major), int(minor)
    except (TypeError, ValueError):
        return None


def operand_rounding(setting: str, platform: str, compute_capability=None) -> OperandRounding:
    """How `setting` treats a dot's float32 operands on `platform` ("cpu", "gpu", "tpu"); a GPU
    of unknown `compute_capability` is taken to use TensorFloat-32 (the coarser). ValueError
    for an unknown platform."""
    check_matmul_precision(setting)
    if platform == "cpu":
        return FLOAT32_OPERANDS
    if platform == "tpu":
        return TPU_HIGHEST_OPERANDS if setting == HIGHEST else BFLOAT16_OPERANDS
    if platform in ("gpu", "cuda", "rocm"):
        if setting == HIGHEST:
            return FLOAT32_OPERANDS
        capability = parse_compute_capability(compute_capability)
        if capability is not None and capability < TF32_MIN_COMPUTE_CAPABILITY:
            return FLOAT32_OPERANDS
        return TF32_OPERANDS
    raise ValueError(f"no matmul precision model for platform {platform!r}")


def effective_matmul_precision(setting: str, platform: str, compute_capability=None) -> str:
    """The setting a path effectively runs at: "default" is "highest" where they agree (a CPU,
    pre-Ampere GPUs)."""
    if setting == DEFAULT and operand_rounding(DEFAULT, platform, compute_capability) == operand_rounding(
        HIGHEST, platform, compute_capability
    ):
        return HIGHEST
    return check_matmul_precision(setting)


def device_compute_capability(device) -> str | None:
    """A JAX device's compute capability (GPUs), or None."""
    value = getattr(device, "compute_capability", None)
    return None if value in (None, "") else str(value)
