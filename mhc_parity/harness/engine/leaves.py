"""The named leaves every path and the oracle produce, and each one's kind: the operation's forward
leaves (the output, then its intermediates), then d_x, d_<weight name>, d_branch.<branch parameter>."""

from __future__ import annotations

from mhc_parity.harness.engine.operation import OPERATION

FORWARD_LEAVES = OPERATION.FORWARD_LEAVES
INTERMEDIATE_LEAVES = tuple(leaf for leaf in FORWARD_LEAVES if OPERATION.forward_leaf_kind(leaf) == "intermediate")


def weight_leaf(name: str) -> str:
    return f"d_{name}"


def branch_leaf(param: str) -> str:
    return f"d_branch.{param}"


def leaf_kind(leaf: str) -> str:
    """The policy's leaf kind of a leaf name (see mhc_parity.records.schema.LEAF_KINDS)."""
    if leaf in FORWARD_LEAVES:
        return OPERATION.forward_leaf_kind(leaf)
    if leaf == "d_x":
        return "activation_grad"
    if leaf.startswith("d_branch."):
        return "branch_grad"
    if leaf.startswith("d_") and leaf[2:] in OPERATION.WEIGHT_NAMES:
        return OPERATION.weight_kind(leaf[2:])
    raise KeyError(f"unknown leaf {leaf!r}")


# Leaf kinds whose leaves are token-major (B, S, ...): every token computed on its own.
TOKEN_MAJOR_KINDS = ("output", "intermediate", "activation_grad")


def token_axes(leaf: str) -> int:
    """How many leading axes of `leaf` index tokens: 2 (batch, sequence) or 0 (a reduction over tokens)."""
    return 2 if leaf_kind(leaf) in TOKEN_MAJOR_KINDS else 0
