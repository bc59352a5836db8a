"""What a program moves and does against what its chip can do: the one source of the speed arithmetic.

`array_bytes` (arguments and results, each moved at least once: a lower bound on traffic) and FLOPs over device time
give `Throughput`, and on a chip in `PEAKS` the fraction of each peak. Other device kinds (CPU, GPU) get rates without a
fraction. Which fraction matters for the mHC layer: docs/speed.md. Plain Python, no JAX.
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


# As Google Cloud's TPU pages state them, by the device kind JAX reports (`tpu_targets.TARGETS`).
PEAKS = {
    "TPU v5 lite": ChipPeaks(819e9, 197e12),
    "TPU v6 lite": ChipPeaks(1640e9, 918e12),
    "TPU v5": ChipPeaks(2765e9, 459e12),
}


def peaks_of(device_kind: str) -> ChipPeaks | None:
    """The peaks of a device kind (`jax.Device.device_kind`); None for one not in `PEAKS` (a CPU)."""
    return PEAKS.get(device_kind)


def array_bytes(arrays: Iterable) -> int:
    """Bytes of `arrays` (anything with `.shape` and `.dtype`): itemsize × element count, a sharded array counted once,
    whole."""
    return int(sum(np.dtype(a.dtype).itemsize * math.prod(a.shape) for a in arrays))


@dataclasses.dataclass(frozen=True)
class Throughput:
    """One program's rates: `bytes_moved` bytes and `flops` FLOPs (NaN: unknown) per run of `seconds`, on a chip with
    `peaks` (None: no stated peak)."""

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
        """Achieved bytes per second (NaN without a positive finite time or the bytes)."""
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
    return Throughput(float(bytes_moved), float(seconds), float(flops), peaks_of(device_kind))
