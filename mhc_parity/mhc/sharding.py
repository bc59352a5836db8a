"""Token sharding for the mHC Pallas kernels: XLA cannot partition a Mosaic custom call, so
kernels run inside `jax.shard_map` with activations (B, S, ...) split over ("data", "fsdp")
and weights replicated; per-shard weight gradients are summed by `psum_to_primal_vma`.
Interpret-mode kernels run under check_vma=False, where the vma helpers are no-ops
(docs/jax-notes.md).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
from jax.sharding import AxisType, NamedSharding, PartitionSpec

from mhc_parity.mhc.common import UnsupportedInputError

DEFAULT_TOKEN_AXES = ("data", "fsdp")

__all__ = [
    "DEFAULT_TOKEN_AXES",
    "TokenSharding",
    "psum_to_primal_vma",
    "resolve_mesh",
    "to_varying",
    "token_out_shape",
    "token_sharding",
    "run_token_sharded",
    "varying_axes",
]


def varying_axes(value: Any) -> frozenset:
    """Manual mesh axes `value` varies on (empty outside `shard_map`)."""
    return frozenset(jax.typeof(value).manual_axis_type.varying)


def token_out_shape(shape: tuple[int, ...], dtype, like: jax.Array) -> jax.ShapeDtypeStruct:
    """`pallas_call` output struct varying on the manual axes of the token-major `like`
    (plain outside `shard_map`)."""
    return jax.ShapeDtypeStruct(shape, dtype, manual_axis_type=jax.typeof(like).manual_axis_type)


def to_varying(value: jax.Array, like: jax.Array) -> jax.Array:
    """Mark a replicated operand varying on `like`'s manual axes (under `check_vma` a kernel's
    operands must agree); a no-op outside `shard_map`."""
    missing = varying_axes(like) - varying_axes(value)
    if not missing:
        return value
    return jax.lax.pcast(value, tuple(sorted(missing)), to="varying")


def psum_to_primal_vma(grad: jax.Array, primal: jax.Array) -> jax.Array:
    """Sum a per-shard gradient over the manual axes `grad` varies on and `primal` does not
    (a replicated weight's cotangent is the sum of its shards' partials); else `grad` unchanged."""
    extra = varying_axes(grad) - varying_axes(primal)
    if not extra:
        return grad
    return jax.lax.psum(grad, tuple(sorted(extra)))


def resolve_mesh(mesh):
    """The mesh the kernels shard over: `mesh` if given, else the context mesh
    (`jax.set_mesh` / `use_abstract_mesh`), else None."""
    if mesh is not None:
        return mesh
    context = jax.sharding.get_abstract_mesh()
    if context is None or context.empty:
        return None
    return context


@dataclasses.dataclass(frozen=True)
class TokenSharding:
    """Which axes of `mesh` (a Mesh or AbstractMesh) split the batch (axis 0) and sequence
    (axis 1) of activations; None for an unsplit one."""

    mesh: Any
    batch_axis: str | None
    seq_axis: str | None

    @property
    def spec(self) -> PartitionSpec:
        return PartitionSpec(self.batch_axis, self.seq_axis)

    def _size(self, axis: str | None) -> int:
        return 1 if axis is None else int(self.mesh.shape[axis])

    @property
    def shards(self) -> tuple[int, int]:
        """(batch shards, sequence shards)."""
        return self._size(self.batch_axis), self._size(self.seq_axis)

    def local_batch_seq(self, batch: int, seq: int) -> tuple[int, int]:
        """Per-shard (batch, sequence) sizes; UnsupportedInputError if they do not divide."""
        nb, ns = self.shards
        if batch % nb or seq % ns:
            raise UnsupportedInputError(
                f"token sharding needs batch divisible by mesh axis {self.batch_axis!r} "
                f"(size {nb}) and sequence divisible by mesh axis {self.seq_axis!r} "
                f"(size {ns}); got batch={batch}, sequence={seq}"
            )
        return batch // nb, seq // ns

    @property
    def explicit(self) -> bool:
        """True if any token axis is an Explicit mesh axis (inputs must be resharded)."""
        names = [a for a in (self.batch_axis, self.seq_axis) if a is not None]
        types = dict(zip(self.mesh.axis_names, self.mesh.axis_types))
        return any(types[a] == AxisType.Explicit for a in names)


def token_sharding(mesh, axes: tuple[str, str] = DEFAULT_TOKEN_AXES) -> TokenSharding | None:
    """The token-sharding plan for `mesh` (after `resolve_mesh`), or None to run unsharded.
    axes: (batch axis, sequence axis); one missing, of size 1 or already Manual (inside the
    caller's shard_map) is not used."""
    mesh = resolve_mesh(mesh)
    if mesh is None:
        return None
    sizes = dict(zip(mesh.axis_names, mesh.axis_sizes))
    types = dict(zip(mesh.axis_names, mesh.axis_types))

    def usable(axis):
        return axis in sizes and sizes[axis] > 1 and types[axis] != AxisType.Manual

    batch_axis, seq_axis = (a if usable(a) else None for a in axes)
    if batch_axis is None and seq_axis is None:
        return None
    return TokenSharding(mesh, batch_axis, seq_axis)


def run_token_sharded(
    fn, plan: TokenSharding | None, activations: tuple, replicated: tuple, out_specs, *, check_vma: bool = True
):
    """Call `fn(*activations, *replicated)`, inside a token `shard_map` when `plan` is set.
    activations: token-major (B, S, ...) pytrees, split; replicated: passed whole. out_specs: a
    pytree prefix of fn's outputs of `TOKENS` / `REPLICATED`."""
    if plan is None:
        return fn(*activations, *replicated)
    tok, rep = plan.spec, PartitionSpec()
    if plan.explicit:
        # Explicit mesh axes: shard_map checks the inputs' sharding instead of resharding.
        tok_s, rep_s = NamedSharding(plan.mesh, tok), NamedSharding(plan.mesh, rep)
        activations = jax.tree.map(lambda a: jax.sharding.reshard(a, tok_s), activations)
        replicated = jax.tree.map(lambda a: jax.sharding.reshard(a, rep_s), replicated)
    specs_out = jax.tree.map(lambda s: tok if s is TOKENS else rep, out_specs)
    mapped = jax.shard_map(
        fn,
        mesh=plan.mesh,
        in_specs=tuple([tok] * len(activations) + [rep] * len(replicated)),
        out_specs=specs_out,
        check_vma=check_vma,
    )
    return mapped(*activations, *replicated)


class _SpecMarker:
    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return self.name


# Markers for `run_token_sharded(out_specs=...)` (leaves of a pytree prefix).
TOKENS = _SpecMarker("TOKENS")
REPLICATED = _SpecMarker("REPLICATED")
