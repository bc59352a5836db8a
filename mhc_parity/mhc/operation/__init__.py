"""What a parity run needs to know of the mHC layer, in one place: the operation's side of
the engine's seam (`mhc_parity.harness.engine.operation.Operation` is the interface; a second
operation is a second package like this one).

    leaves        the leaves a run compares, their dtypes and kinds, the weight names
    layers        how a path's forward is built from this project's layer
    oracle_draws  the float64 oracle run on a fixture, and its rounding model's units
    hypotheses    roundings the model does not allow, through the oracle: a failing leaf's causes

Imports nothing of the project outside `mhc`.
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
# Where the code of each kind of answer lives, for the stores' keys (`mhc_parity.records.code`): only
# the oracle runs `ORACLE_MODULES`, only a path's program `PROGRAM_MODULES`, and only the
# kernel paths `KERNEL_MODULES`; so an oracle edit keeps compiled programs, a layer edit
# keeps oracle answers, a kernel edit keeps the reference's programs.
ORACLE_MODULES = (
    "mhc_parity.mhc.oracle",
    "mhc_parity.mhc.oracle_chunks",
    "mhc_parity.mhc.oracle_math",
    "mhc_parity.mhc.oracle_roundings",
    "mhc_parity.mhc.oracle_fits",
    "mhc_parity.mhc.operation.hypotheses",
)
# The methods of an external implementation run inside this project's layer (`mhc_parity.mhc.layer`'s
# `implementation`): `pre(x, weights, *, config)` and `post(layer_output, context, *, config)`.
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
