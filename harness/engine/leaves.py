"""The named leaves every path and the oracle produce, and what kind each one is.

  forward leaves   out, layer_input, h_pre, h_post, h_res
  gradient leaves  d_x, d_<MhcWeights field>, d_branch.<branch parameter>

Kept apart from the paths (`harness.engine.paths`) and the oracle (`harness.engine.oracle_path`): both
name their results with it, and the oracle cache and the program store key their entries
on the sources each is made of.
"""

from __future__ import annotations

from mhc.types import WEIGHT_FIELDS

FORWARD_LEAVES = ("out", "layer_input", "h_pre", "h_post", "h_res")
INTERMEDIATE_LEAVES = ("layer_input", "h_pre", "h_post", "h_res")


def weight_leaf(field: str) -> str:
    return f"d_{field}"


def branch_leaf(param: str) -> str:
    return f"d_branch.{param}"


def leaf_kind(leaf: str) -> str:
    """The policy's leaf kind of a leaf name (see records.schema.LEAF_KINDS)."""
    if leaf == "out":
        return "output"
    if leaf in INTERMEDIATE_LEAVES:
        return "intermediate"
    if leaf == "d_x":
        return "activation_grad"
    if leaf.startswith("d_branch."):
        return "branch_grad"
    if leaf.startswith("d_") and leaf[2:] in WEIGHT_FIELDS:
        return "scale_grad" if leaf.endswith("_scale") and leaf != "d_norm_scale" else "weight_grad"
    raise KeyError(f"unknown leaf {leaf!r}")


# Leaf kinds whose leaves are token-major (B, S, ...): every token computed on its own.
TOKEN_MAJOR_KINDS = ("output", "intermediate", "activation_grad")


def token_axes(leaf: str) -> int:
    """How many leading axes of `leaf` index tokens: 2 (batch, sequence) or 0 (a reduction over tokens)."""
    return 2 if leaf_kind(leaf) in TOKEN_MAJOR_KINDS else 0
