"""What a program moves and does against what its chip can do: the one source of the speed arithmetic.

A program's bytes (`array_bytes`: the size of its arguments and results, each read or written at
least once, so a lower bound on its memory traffic), its device time per run and, where known, its
FLOPs give its achieved bandwidth and FLOP rate (`Throughput`), and, on a chip whose peaks are
stated (`PEAKS`, by the device kind JAX reports), the fraction of each peak. The mHC layer is
memory-bound (14–28 FLOPs a byte in the `tpu` suite, where v5e's ridge is 240), so there the
bandwidth fraction is the one that matters; a case whose branch is an MLP adds its matmuls (189–367
FLOPs a byte), and there the FLOP fraction matters as much (docs/speed.md). A device kind not in
`PEAKS` (a CPU, a GPU) has no stated peak: its rates are shown without a fraction, never against
a TPU's.

Used by the run's Speed section (`mhc_parity.reports.program_speed`, from the rows' `execute_s`
and `bytes_moved`) and by `bench/device_speed.py`; the engine computes `bytes_moved` with
`array_bytes`. Plain Python: the reports import it without JAX.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable

import numpy as np


@dataclasses.dataclass(frozen=True)
class ChipPeaks:
    """What one chip can do at most: HBM bytes per second and dense bfloat16 FLOP per second."""

    hbm_bytes_per_s: float
    bf16_flops_per_s: float


# Per chip, as Google Cloud's TPU pages state them (v5e: 819 GB/s, 197 TFLOP/s; v6e: 1640 GB/s,
# 918 TFLOP/s; v5p: 2765 GB/s, 459 TFLOP/s), by the device kind JAX reports
# (`mhc_parity.harness.engine.tpu_targets.TARGETS` names the same kinds). On the lent v5e a large
# bfloat16 matmul ran at 167 TFLOP/s (docs/results).
PEAKS = {
    "TPU v5 lite": ChipPeaks(819e9, 197e12),
    "TPU v6 lite": ChipPeaks(1640e9, 918e12),
    "TPU v5": ChipPeaks(2765e9, 459e12),
}


def peaks_of(device_kind: str) -> ChipPeaks | None:
    """The peaks of a device kind (`jax.Device.device_kind`); None for one not in `PEAKS` (a CPU)."""
    return PEAKS.get(device_kind)


def array_bytes(arrays: Iterable) -> int:
    """The bytes of `arrays`: anything with `.shape` and `.dtype` (NumPy or JAX arrays, shape
    structs), summed as itemsize × element count; a sharded array counts once, whole."""
    return int(sum(np.dtype(a.dtype).itemsize * math.prod(a.shape) for a in arrays))


@dataclasses.dataclass(frozen=True)
class Throughput:
    """One program's rates: `bytes_moved` bytes and `flops` FLOPs (NaN: not known) per run of
    `seconds`, on a chip with `peaks` (None: no stated peak)."""

    bytes_moved: float
    seconds: float
    flops: float = math.nan
    peaks: ChipPeaks | None = None

    def _per_second(self, amount: float) -> float:
        if not (self.seconds > 0 and math.isfinite(self.seconds) and math.isfinite(amount)):
            return math.nan
        return amount / self.seconds

    @property
    def bytes_per_s(self) -> float:
        """Achieved bandwidth in bytes per second (NaN without a positive finite time or the bytes)."""
        return self._per_second(self.bytes_moved)

    @property
    def gb_per_s(self) -> float:
        """Achieved bandwidth in GB/s (10⁹ bytes per second, as the chips' peaks are stated)."""
        return self.bytes_per_s / 1e9

    @property
    def flops_per_s(self) -> float:
        return self._per_second(self.flops)

    @property
    def hbm_fraction(self) -> float:
        """bytes_per_s ÷ the chip's HBM peak (NaN without a stated peak)."""
        return math.nan if self.peaks is None else self.bytes_per_s / self.peaks.hbm_bytes_per_s

    @property
    def flop_fraction(self) -> float:
        """flops_per_s ÷ the chip's bfloat16 peak (NaN without a stated peak or the FLOPs)."""
        return math.nan if self.peaks is None else self.flops_per_s / self.peaks.bf16_flops_per_s


def throughput(bytes_moved: float, seconds: float, device_kind: str, *, flops: float = math.nan) -> Throughput:
    """`Throughput` of a program on a device of `device_kind` (its peaks from `PEAKS`, if stated)."""
    return Throughput(float(bytes_moved), float(seconds), float(flops), peaks_of(device_kind))
