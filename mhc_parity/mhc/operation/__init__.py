"""The mHC layer's side of the engine's seam (`mhc_parity.harness.engine.operation.Operation`):
its leaves (`leaves`), how a path's forward is built (`layers`), the float64 oracle on a fixture
(`oracle_draws`) and a failing leaf's candidate causes (`hypotheses`). Imports nothing outside `mhc`.
"""

from mhc_parity.mhc.operation.hypotheses import hypotheses, hypothesis_draws, hypothesis_responses, name_problem
from mhc_parity.mhc.operation.layers import layer_builder
from mhc_parity.mhc.operation.leaves import (
    FORWARD_LEAVES,
    WEIGHT_NAMES,
    forward_leaf_dtypes,
    forward_leaf_kind,
    weight_kind,
)
from mhc_parity.mhc.operation.oracle_draws import oracle_chunks, oracle_draws, oracle_key, oracle_unit_roundoffs

NAME = "mhc"
# The code each kind of answer depends on, for the stores' keys: an oracle edit keeps compiled
# programs, a layer edit keeps oracle answers, a kernel edit keeps the reference's programs.
ORACLE_MODULES = (
    "mhc_parity.mhc.oracle",
    "mhc_parity.mhc.oracle_chunks",
    "mhc_parity.mhc.oracle_math",
    "mhc_parity.mhc.oracle_roundings",
    "mhc_parity.mhc.oracle_fits",
    "mhc_parity.mhc.operation.hypotheses",
)
# An external implementation run inside this project's layer provides
# `pre(x, weights, *, config)` and `post(layer_output, context, *, config)`.
EXTERNAL_HOOKS = ("pre", "post")
PROGRAM_MODULES = ("mhc_parity.mhc.operation.layers",)
KERNEL_MODULES = ("mhc_parity.mhc.kernels",)

__all__ = [
    "EXTERNAL_HOOKS",
    "FORWARD_LEAVES",
    "KERNEL_MODULES",
    "NAME",
    "ORACLE_MODULES",
    "PROGRAM_MODULES",
    "WEIGHT_NAMES",
    "forward_leaf_dtypes",
    "forward_leaf_kind",
    "hypotheses",
    "hypothesis_draws",
    "hypothesis_responses",
    "layer_builder",
    "name_problem",
    "oracle_chunks",
    "oracle_key",
    "oracle_draws",
    "oracle_unit_roundoffs",
    "weight_kind",
]
