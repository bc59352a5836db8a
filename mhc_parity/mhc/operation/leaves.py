"""The mHC layer's leaves: what a path returns besides gradients, their dtypes, their kinds.

forward leaves   out, then the intermediates layer_input, h_pre, h_post, h_res
weights          the `MhcWeights` fields (their gradients are the leaves d_<field>)
"""

from __future__ import annotations

from mhc_parity.mhc.types import WEIGHT_FIELDS

FORWARD_LEAVES = ("out", "layer_input", "h_pre", "h_post", "h_res")
WEIGHT_NAMES = WEIGHT_FIELDS
# The mixing coefficients are float32 whatever the activation dtype (`mhc_parity.mhc.types.MhcContext`).
MIXING_LEAVES = ("h_pre", "h_post", "h_res")
MIXING_DTYPE = "float32"


def forward_leaf_dtypes(act_dtype: str) -> dict[str, str]:
    """Forward leaf -> dtype name, for activations in `act_dtype`: `out` and `layer_input` in
    it, the mixing coefficients in float32."""
    return {name: MIXING_DTYPE if name in MIXING_LEAVES else act_dtype for name in FORWARD_LEAVES}


def forward_leaf_kind(leaf: str) -> str:
    """ "output" for `out`, "intermediate" for the others; KeyError for a name that is none."""
    if leaf not in FORWARD_LEAVES:
        raise KeyError(f"unknown forward leaf {leaf!r}")
    return "output" if leaf == "out" else "intermediate"


def weight_kind(name: str) -> str:
    """The leaf kind of the gradient of weight `name`: "scale_grad" for a gate's scale (one
    number scaling a whole logit), "weight_grad" for the rest (the norm scale included)."""
    if name not in WEIGHT_NAMES:
        raise KeyError(f"unknown weight {name!r}")
    return "scale_grad" if name.endswith("_scale") and name != "norm_scale" else "weight_grad"
