"""mHC-lite layer under test: shared numerics, reference path, float64 oracle, kernels."""

from mhc_parity.mhc.common import MhcDims, UnsupportedInputError, compute_sigmoid_gate, permutation_matrices
from mhc_parity.mhc.types import MhcConfig, MhcContext, MhcWeights

__all__ = [
    "MhcConfig",
    "MhcContext",
    "MhcDims",
    "MhcWeights",
    "UnsupportedInputError",
    "compute_sigmoid_gate",
    "permutation_matrices",
]
