"""Pallas kernels of the mHC-lite layer (interpret mode on CPU, Mosaic on TPU).

Public API: `pre`, `post` (same contract as `mhc_parity.mhc.reference`, plus `kernel=` and
`mesh=`), `KernelConfig`, and `mhc_parity.mhc.kernels.lowering` for TPU lowering from a CPU.
"""

from mhc_parity.mhc.kernels.api import post, pre
from mhc_parity.mhc.kernels.config import KernelConfig

__all__ = ["KernelConfig", "post", "pre"]
