"""What an implementation declares it supports. A case outside its envelope gets `unsupported` rows
and the implementation is never called on it; a rejection (UnsupportedInputError) of a case inside
it is a `fail`."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

IntOfCase = int | Callable[[object], int]


def _value(rule: IntOfCase, case) -> int:
    return int(rule(case) if callable(rule) else rule)


@dataclasses.dataclass(frozen=True)
class Envelope:
    """The cases an implementation supports; None (or 1) places no limit.

    act_dtypes / weight_dtypes: dtype names ("float32", "bfloat16"); variants: "lite" / "sinkhorn".
    embedding_multiple: C must be a multiple of it. token_multiple: the tokens one device holds
    (batch·sequence / the mesh's device count) must be a multiple of it. Either multiple may be a
    callable `case -> int`. meshes: the (data, fsdp) meshes a sharded path may use (None: any; (): none).
    """

    act_dtypes: tuple[str, ...] | None = None
    weight_dtypes: tuple[str, ...] | None = None
    streams: tuple[int, ...] | None = None
    variants: tuple[str, ...] | None = None
    branches: tuple[str, ...] | None = None
    embedding_multiple: IntOfCase = 1
    token_multiple: IntOfCase = 1
    meshes: tuple[tuple[int, int], ...] | None = None

    def reason(self, case, mesh: tuple[int, int] | None = None) -> str:
        """Why `case` (token-sharded on `mesh`, None: unsharded) is outside the envelope; "" if inside."""
        listed = (
            ("variant", case.variant, self.variants),
            ("activation dtype", case.dtype, self.act_dtypes),
            ("weight dtype", case.weight_dtype, self.weight_dtypes),
            ("stream count", case.streams, self.streams),
            ("branch", case.branch, self.branches),
        )
        for what, value, allowed in listed:
            if allowed is not None and value not in allowed:
                return f"{what} {value} is outside the envelope ({'/'.join(map(str, allowed))})"
        embedding_multiple = _value(self.embedding_multiple, case)
        if case.embedding % embedding_multiple:
            return f"embedding {case.embedding} is not a multiple of {embedding_multiple} (the envelope's alignment)"
        if mesh is not None and self.meshes is not None and tuple(mesh) not in self.meshes:
            allowed = ", ".join(f"{a}x{b}" for a, b in self.meshes) or "none: unsharded only"
            return f"the {mesh[0]}x{mesh[1]} mesh is outside the envelope (meshes: {allowed})"
        devices = 1 if mesh is None else mesh[0] * mesh[1]
        per_device = case.tokens // devices
        token_multiple = _value(self.token_multiple, case)
        if case.tokens % devices or per_device % token_multiple:
            where = "" if mesh is None else f" per device of a {mesh[0]}x{mesh[1]} mesh"
            return f"{per_device} tokens{where} is not a multiple of {token_multiple} (the envelope's token multiple)"
        return ""

    def case_reason(self, case) -> str:
        """Why any path of `case` (unsharded or on its mesh) is outside the envelope; "" if none is."""
        meshes = [None] + ([tuple(case.mesh)] if case.mesh is not None else [])
        for mesh in meshes:
            reason = self.reason(case, mesh)
            if reason:
                return reason
        return ""
