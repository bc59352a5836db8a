"""Facts about float dtypes from NumPy and ml_dtypes: canonical names, aliases, epsilon, mantissa bits, smallest normal
exponent. The float64 oracle reads `jnp.finfo` itself, independently of these helpers.
"""

from __future__ import annotations

import functools

import ml_dtypes
import numpy as np

# The float dtypes the harness measures, widest first.
FLOAT_DTYPES = ("float64", "float32", "float16", "bfloat16")
# Short spellings accepted wherever a user types a dtype (CLI, TOML, baselines).
ALIASES = {"f64": "float64", "f32": "float32", "fp32": "float32", "f16": "float16", "bf16": "bfloat16"}


def canonical_name(dtype) -> str:
    """The canonical name ("float32", ...) of a dtype given as a name or alias (case and blanks ignored), a
    NumPy/ml_dtypes/JAX dtype or scalar type. ValueError unless it is one of `FLOAT_DTYPES`."""
    if isinstance(dtype, str):
        text = dtype.strip().lower()
        name = ALIASES.get(text, text)
    else:
        try:
            name = np.dtype(dtype).name
        except TypeError as exc:
            raise ValueError(f"not a dtype: {dtype!r}") from exc
    if name not in FLOAT_DTYPES:
        raise ValueError(f"unsupported dtype {name!r}; expected one of {sorted(FLOAT_DTYPES)}")
    return name


@functools.cache
def _finfo(name: str):
    return ml_dtypes.finfo(np.dtype(name))  # importing ml_dtypes gives NumPy the name "bfloat16"


def epsilon(dtype) -> float:
    """Machine epsilon: the spacing at 1.0 (bfloat16 2**-7, float32 2**-23)."""
    return float(_finfo(canonical_name(dtype)).eps)


def mantissa_bits(dtype) -> int:
    """Explicit mantissa bits (bfloat16 7, float32 23)."""
    return int(_finfo(canonical_name(dtype)).nmant)


def min_normal_exponent(dtype) -> int:
    """The exponent of the smallest normal number (bfloat16 and float32 -126)."""
    return int(_finfo(canonical_name(dtype)).minexp)
