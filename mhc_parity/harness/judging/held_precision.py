"""Which narrow dtype a path holds a leaf in: the evidence left where value matching stops.

A correct float32 value is a bfloat16 number with probability about 2**-16, so a leaf whose every non-zero
value is one was rounded there. Two paths differing by a narrow sum in their own orders are named by the
dtype both hold the leaf in (docs/judging.md).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import numpy as np

from mhc_parity.harness.judging.error_statistics import upcast
from mhc_parity.records import dtypes  # importing it gives NumPy the name "bfloat16" (ml_dtypes)

# The dtypes a leaf may be found held in, narrowest first.
NARROW_DTYPES = ("bfloat16", "float16")


@dataclasses.dataclass(frozen=True)
class HeldDraw:
    """One hypothesis' oracle draw: ordered: its error depends on a narrow sum's order; leaves: leaf
    -> values (float64)."""

    name: str
    ordered: bool
    leaves: Mapping[str, np.ndarray]


def held_in(values, dtype: str) -> bool:
    """Whether every value is a `dtype` number, at least one non-zero and all finite (zeros say nothing)."""
    flat = upcast(values).ravel()
    flat = flat[flat != 0.0]
    if flat.size == 0 or not np.all(np.isfinite(flat)):
        return False
    with np.errstate(over="ignore"):  # a value beyond the dtype's range becomes inf: not held
        narrow = flat.astype(np.dtype(dtype))
    return bool(np.array_equal(narrow.astype(np.float64), flat))


def _narrower(values, dtype: str) -> bool:
    """Whether `dtype` has fewer mantissa bits than `values`' own (a bfloat16 leaf is held there by
    construction)."""
    own = np.asarray(values).dtype
    try:
        return dtypes.mantissa_bits(dtype) < dtypes.mantissa_bits(own)
    except ValueError:  # not a float leaf
        return False


def _held_leaves(leaves: Mapping[str, np.ndarray], dtype: str, exact: Mapping[str, np.ndarray]) -> set[str]:
    return {
        leaf for leaf, v in leaves.items() if leaf in exact and held_in(v, dtype) and not held_in(exact[leaf], dtype)
    }


def ordered_sum_holding(
    leaf: str,
    paths: Sequence[Mapping[str, np.ndarray]],
    exact: Mapping[str, np.ndarray],
    draws: Sequence[HeldDraw],
) -> tuple[str, str] | None:
    """(hypothesis name, dtype): the one order-dependent hypothesis holding `leaf` in the narrow dtype every
    one of `paths` holds it in; None where there is not exactly one.

    The exact oracle must not hold it there, and an unordered hypothesis must (the rounding model does not
    allow it). An ordered hypothesis qualifies where every leaf its draw holds there every path holds too;
    the one holding the most leaves is named, a tie naming none.
    """
    if not paths or any(leaf not in p for p in paths) or leaf not in exact:
        return None
    for dtype in NARROW_DTYPES:
        if not all(_narrower(p[leaf], dtype) and held_in(p[leaf], dtype) for p in paths):
            continue
        if held_in(exact[leaf], dtype):
            return None
        held_by_draw = {d.name: _held_leaves(d.leaves, dtype, exact) for d in draws}
        if not any(leaf in held_by_draw[d.name] for d in draws if not d.ordered):
            return None
        held_by_paths = set.intersection(*(_held_leaves(p, dtype, exact) for p in paths))
        fitting = [
            (len(held_by_draw[d.name]), d.name)
            for d in draws
            if d.ordered and leaf in held_by_draw[d.name] and held_by_draw[d.name] <= held_by_paths
        ]
        if not fitting:
            return None
        fitting.sort(reverse=True)
        if len(fitting) > 1 and fitting[0][0] == fitting[1][0]:
            return None
        return fitting[0][1], dtype
    return None
