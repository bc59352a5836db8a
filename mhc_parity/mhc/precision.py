"""Matmul precision: the one place that decides how every dot of the layer is computed.

A float32 dot with no stated precision runs at the backend's *default* precision:
exact float32 on a CPU, but bfloat16 passes on a TPU and TensorFloat-32 on recent
NVIDIA GPUs. The parity bounds are calibrated on exact float32 arithmetic, so every
dot in `mhc_parity/mhc/` (reference, shared helpers, kernels) and in the case branches passes
`precision=dot_precision(operand dtype, setting)` and accumulates in
`accumulation_dtype(operand dtype)`.

Settings (a case's `matmul_precision`):

  "highest"  float32 operands at `Precision.HIGHEST`, full float32. Two bfloat16
             operands at `Precision.DEFAULT`: a bfloat16 product is exact in float32
             and it accumulates in float32, so DEFAULT is the same arithmetic, and
             Mosaic rejects HIGHEST (an fp32 contract precision) for bfloat16 operands
             ("Bad lhs type", measured on TPU v5e and by libtpu's compiler for v5e,
             v6e and v5p). The float32 cotangents of such a dot's transposes are
             float32 operands and stay at HIGHEST (`cotangent_dot_precision`;
             `mhc_parity.mhc.common.matmul` states both) — the program a CPU runs, on
             every backend.
  "default"  `Precision.DEFAULT`: the backend's own default, the precision a model
             trained without a precision setting actually runs at.

`operand_rounding` is the knowledge of what a setting means on a backend: which
rounding the float32 operands of a dot undergo (none on a CPU, bfloat16 on a TPU at
default precision, TensorFloat-32 on an Ampere-or-newer NVIDIA GPU). The oracle's
rounding model and the run metadata both ask it; nothing else encodes that fact.

The Pallas TPU (Mosaic) lowering accepts only `DEFAULT` and `HIGHEST`, the same for both
operands, so the settings map onto exactly those two; its compiler accepts `HIGHEST` only
for float32 operands.
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
# NVIDIA GPUs of this compute capability and newer run a default-precision float32
# dot with TensorFloat-32 operands (Ampere and later).
TF32_MIN_COMPUTE_CAPABILITY = (8, 0)


def check_matmul_precision(setting: str) -> str:
    """`setting` if it is one of `MATMUL_PRECISIONS`; ValueError naming the choices otherwise."""
    if setting not in MATMUL_PRECISIONS:
        raise ValueError(f"matmul_precision must be one of {MATMUL_PRECISIONS}, got {setting!r}")
    return setting


def dot_precision(dtype, setting: str = DEFAULT_MATMUL_PRECISION) -> jax.lax.Precision:
    """The `precision=` argument of a dot whose operands are both `dtype`, under `setting`.

    dtype: float32 (the setting applies), bfloat16 (DEFAULT at either setting: its
    products are exact in float32, see the module docstring) or float64 (the oracle:
    always HIGHEST; float64 runs only on the host CPU). Raises ValueError for another
    dtype or an unknown setting.
    """
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
    """The `precision=` of the transposes (VJP dots) of a dot of two `dtype` operands.

    A transpose multiplies the float32 cotangent (`accumulation_dtype(dtype)`) by the
    other operand, so it follows the float32 rule: HIGHEST at "highest" also for a
    bfloat16 dot, whose forward runs at DEFAULT.
    """
    return dot_precision(accumulation_dtype(dtype), setting)


def accumulation_dtype(dtype) -> np.dtype:
    """The accumulation (`preferred_element_type`) of a dot of `dtype` operands.

    float32 for bfloat16 and float32 operands, float64 for the oracle's float64.
    """
    return np.dtype(jnp.promote_types(dtype, jnp.float32))


@dataclasses.dataclass(frozen=True)
class OperandRounding:
    """What a matmul does to its float32 operands on one backend at one setting.

    name: "float32" (operands used as they are), "bfloat16x6" (TPU HIGHEST: six
    bfloat16 passes, float32-accurate but not bit-exact), "bfloat16" or
    "tensorfloat32" (operands rounded to that format).
    unit_roundoff: the relative rounding of each float32 operand *beyond* float32
    itself (0 when the operands are not rounded further). bfloat16 operands are
    unaffected: they are exact in every format listed.
    """

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
    """How `setting` treats a dot's float32 operands on `platform` ("cpu", "gpu", "tpu").

    compute_capability: a GPU's (e.g. "8.0"); at default precision a GPU whose
    capability is unknown (not an NVIDIA number) is taken to use TensorFloat-32, the
    coarser of the two possibilities. Raises ValueError for an unknown platform.
    """
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
    """The setting a path effectively runs at: "default" is "highest" where the two agree.

    On a CPU (and pre-Ampere NVIDIA GPUs) the default precision *is* full float32, so
    a "default" case runs — and is reported — as "highest" there.
    """
    if setting == DEFAULT and operand_rounding(DEFAULT, platform, compute_capability) == operand_rounding(
        HIGHEST, platform, compute_capability
    ):
        return HIGHEST
    return check_matmul_precision(setting)


def device_compute_capability(device) -> str | None:
    """A JAX device's compute capability (GPUs), or None."""
    value = getattr(device, "compute_capability", None)
    return None if value in (None, "") else str(value)
