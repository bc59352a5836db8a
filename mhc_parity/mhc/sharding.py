"""Token sharding for the mHC Pallas kernels.

A Pallas TPU kernel is a Mosaic custom call that XLA cannot partition, so a kernel
whose inputs are sharded must run inside `jax.shard_map`, one instance per shard of
tokens. mHC is per token except for the weight-gradient reductions, so the plan is:

* activations (B, S, ...) are split on their batch and sequence axes, by default over
  the mesh axes ("data", "fsdp"); weights are replicated;
* every kernel call runs inside `jax.shard_map(..., check_vma=True)` on the local
  tokens; `token_out_shape` gives each `pallas_call` output the manual axes its
  token-major input varies on, `to_varying` marks replicated kernel operands (weights,
  constants) as varying so they can meet activations in the kernel;
* each per-shard weight gradient is summed with `psum_to_primal_vma` over the manual
  axes the primal weight does not vary on (the `custom_vjp` backward must return a
  cotangent of the primal's type).

Interpret mode: `mhc_parity.mhc.kernels` runs interpret-mode kernels under
`shard_map(check_vma=False)` (Mosaic ones, compiled or in the TPU interpreter, under
`check_vma=True`). In JAX 0.10.2 and still in 0.12.0.1 the
Pallas HLO interpreter evaluates the kernel jaxpr — traced with vma checks off, so its
constants are invariant — on varying blocks, and the first op mixing a constant with a
block fails ("Primitive div requires varying manual axes to match"); aliasing outputs to
varying zeros only fixes the loop-carry types. With `check_vma=False` every vma is
empty, so `to_varying` / `psum_to_primal_vma` are no-ops and the shard_map transpose
sums the replicated weights' cotangents (in float32: weights enter as float32).

Bit-identity per token (interpret mode on XLA CPU). A shard must compile each token
block exactly as the unsharded program does, or XLA's fusion choices move results by an
ulp. `mhc_parity.mhc.kernels` therefore keeps the unsharded block shape in every shard (a shard
with fewer tokens than a block is padded to one block, `mhc_parity.mhc.kernels.api._resolve_blocks`)
and keeps a real grid loop even for one step (`mhc_parity.mhc.kernels.launch.opaque_grid`). The
cotangent of x has two parts, pre's kernel d_x and post's (through `MhcContext.x`), each
a materialised kernel output; their single float add is commutative, so its place in the
program does not matter.

Mesh resolution rule (`resolve_mesh`): an explicit `mesh` argument wins; with
`mesh=None` the context mesh of `jax.set_mesh(...)` / `jax.sharding.use_abstract_mesh(...)`
(read through `jax.sharding.get_abstract_mesh()`) is used when there is one; otherwise
the kernels run unsharded. Token axes that are already `Manual` in the context (the
caller is itself inside a `shard_map`) count as unsharded: the arrays are local there.
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
    """`pallas_call` output struct varying on the same manual axes as the token-major `like`.

    Inside `shard_map(check_vma=True)` a `pallas_call` output must carry a
    `manual_axis_type`; outside it `like`'s type is empty and the struct is plain.
    """
    return jax.ShapeDtypeStruct(shape, dtype, manual_axis_type=jax.typeof(like).manual_axis_type)


def to_varying(value: jax.Array, like: jax.Array) -> jax.Array:
    """Mark a replicated operand as varying on the manual axes `like` varies on.

    A kernel mixes weights (replicated) with activations (varying); under `check_vma`
    every operand must agree. A no-op outside `shard_map`.
    """
    missing = varying_axes(like) - varying_axes(value)
    if not missing:
        return value
    return jax.lax.pcast(value, tuple(sorted(missing)), to="varying")


def psum_to_primal_vma(grad: jax.Array, primal: jax.Array) -> jax.Array:
    """Sum a per-shard gradient over the manual axes `grad` varies on and `primal` does not.

    A weight replicated across the token shards gets one partial gradient per shard; its
    cotangent is their sum. With no such axes (unsharded, or outside `shard_map`) it
    returns `grad` unchanged.
    """
    extra = varying_axes(grad) - varying_axes(primal)
    if not extra:
        return grad
    return jax.lax.psum(grad, tuple(sorted(extra)))


def resolve_mesh(mesh):
    """The mesh the kernels shard over: `mesh` if given, else the context mesh, else None."""
    if mesh is not None:
        return mesh
    context = jax.sharding.get_abstract_mesh()
    if context is None or context.empty:
        return None
    return context


@dataclasses.dataclass(frozen=True)
class TokenSharding:
    """Which mesh axes split the activation batch (axis 0) and sequence (axis 1).

    mesh: a `Mesh` or `AbstractMesh`; batch_axis / seq_axis: mesh axis names or None.
    """

    mesh: Any
    batch_axis: str | None
    seq_axis: str | None

    @property
    def spec(self) -> PartitionSpec:
        """PartitionSpec of a token-major activation (B, S, ...)."""
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

    axes: (batch mesh axis, sequence mesh axis); an axis missing from the mesh, of size
    1, or already Manual (we are inside the caller's shard_map) is not used.
    """
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

    activations: pytrees whose array leaves are token-major (B, S, ...), split by
    `plan.spec`; replicated: pytrees (weights) passed whole to every shard. out_specs:
    a pytree prefix of fn's outputs with `TOKENS` for token-major leaves and
    `REPLICATED` for the rest. With `plan=None`, `fn` is called directly.
    """
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
