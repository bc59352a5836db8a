"""One `pallas_call` wrapper with the plumbing every mHC kernel needs.

* Output structs come from `mhc_parity.mhc.sharding.token_out_shape`, so a kernel called inside
  `shard_map(check_vma=True)` declares the manual axes its outputs vary on.
* Every operand is passed through `mhc_parity.mhc.sharding.to_varying`: replicated weights and
  compile-time constants must be varying before they meet activations in a kernel.
* Interpret mode: each output is aliased to a zeros input (varying like `like`). The
  interpreter carries whole output buffers through a `while_loop`; the aliased zeros
  give that buffer a defined value and type, and are the initial value of accumulator
  outputs, so the interpret kernels need no `pl.when(step == 0)` zero-fill (which lost
  the varying type in the interpreter under check_vma). Interpret kernels inside a
  shard_map run with check_vma=False; see `mhc_parity.mhc.sharding`.
* Interpret mode compiles a grid step the same way whatever the number of steps
  (`opaque_grid`, `_pad_single_step`): XLA would otherwise delete a one-step loop and
  fuse its body with the rest of the program, so a shard holding one block would round
  differently from the same block in the unsharded program.
* Mosaic mode (interpret=False): no aliases; a kernel zero-fills its accumulators at
  the first grid step itself (an output block is never read from HBM on TPU); see
  `zero_fill_at_first_step`. `KernelConfig.tpu_interpreter` runs that same program in
  Pallas's TPU interpreter, which (unlike the HLO interpreter above) accepts
  `shard_map(check_vma=True)`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from mhc_parity.mhc.kernels.config import KernelConfig
from mhc_parity.mhc.sharding import to_varying, token_out_shape


@dataclasses.dataclass(frozen=True)
class Output:
    """One kernel output: full (per-shard) shape, dtype and its BlockSpec."""

    shape: tuple[int, ...]
    dtype: object
    spec: pl.BlockSpec


def launch(
    body: Callable,
    *,
    name: str,
    grid: tuple[int, ...],
    inputs: Sequence[tuple[jax.Array, pl.BlockSpec]],
    outputs: Sequence[Output],
    like: jax.Array,
    kernel: KernelConfig,
    semantics: tuple[str, ...],
):
    """Run `body(*input_refs, *output_refs)` over `grid`; returns the list of outputs.

    like: the token-major activation whose manual axes every output varies on.
    semantics: Mosaic dimension semantics per grid axis ("parallel" / "arbitrary").
    """
    arrays = [to_varying(jnp.asarray(a), like) for a, _ in inputs]
    in_specs = [s for _, s in inputs]
    if not kernel.interpret:
        compiler_params = pltpu.CompilerParams(dimension_semantics=semantics, vmem_limit_bytes=kernel.vmem_limit_bytes)
        out_shape = [token_out_shape(o.shape, o.dtype, like) for o in outputs]
        return pl.pallas_call(
            body,
            grid=grid,
            in_specs=in_specs,
            out_specs=[o.spec for o in outputs],
            out_shape=out_shape,
            compiler_params=compiler_params,
            name=name,
            interpret=pltpu.InterpretParams() if kernel.tpu_interpreter else False,
        )(*arrays)

    # Interpret mode. One grid step must compile like any other (see `opaque_grid` and
    # `_pad_single_step`): sharded and unsharded runs of a token differ only in how many
    # steps their loop takes, so their per-token results are bit-identical.
    single = bool(grid) and grid[0] == 1
    pad = lambda a, spec: _pad_single_step(a, spec, len(grid)) if single else a  # noqa: E731
    arrays = [pad(a, spec) for a, spec in zip(arrays, in_specs)]
    padded_outputs = [
        dataclasses.replace(o, shape=pad(jax.ShapeDtypeStruct(o.shape, o.dtype), o.spec).shape) for o in outputs
    ]
    out_shape = [token_out_shape(o.shape, o.dtype, like) for o in padded_outputs]
    out_specs = [o.spec for o in outputs]
    n_in, n_out = len(arrays), len(outputs)
    zeros = [to_varying(jnp.zeros(o.shape, o.dtype), like) for o in padded_outputs]

    def kernel_fn(*refs):  # drop the alias inputs: the body sees only its own refs
        body(*refs[:n_in], *refs[n_in + n_out :])

    results = pl.pallas_call(
        kernel_fn,
        grid=opaque_grid(grid),
        in_specs=in_specs + out_specs,
        out_specs=out_specs,
        out_shape=out_shape,
        input_output_aliases={n_in + k: k for k in range(n_out)},
        interpret=True,
        name=name,
    )(*arrays, *zeros)
    return [r if r.shape == o.shape else r[: o.shape[0]] for r, o in zip(results, outputs)]


def opaque_grid(grid: tuple[int, ...]) -> tuple:
    """`grid` with its first extent hidden from XLA behind an optimization barrier.

    The interpreter runs the grid as a `while_loop`. With a static extent XLA knows the
    trip count, and a one-step loop (e.g. one token block per shard) is deleted and its
    body inlined into the surrounding program, where it is fused with its neighbours
    (other kernels' bodies, CSE'd broadcasts, YNNPACK fusions) differently from the
    same body inside a multi-step loop, which changes float rounding by an ulp. A
    runtime extent keeps a real loop for every step count.
    """
    if not grid:
        return grid
    return (jax.lax.optimization_barrier(jnp.int32(grid[0])), *grid[1:])


def _moves_along_first_axis(spec: pl.BlockSpec, rank: int) -> bool:
    """True if `spec`'s block changes with grid axis 0 (token-major operands)."""
    rest = (0,) * (rank - 1)
    return tuple(spec.index_map(0, *rest)) != tuple(spec.index_map(1, *rest))


def _pad_single_step(a, spec: pl.BlockSpec, rank: int):
    """Append one block of zero rows to a token-major operand of a one-step grid.

    Inside the interpreter's loop each step reads its block with a `dynamic_slice` of
    the whole buffer (and writes it with a `dynamic_update_slice`). When the block *is*
    the whole buffer XLA replaces both with the buffer itself, so the step's body
    differs from a multi-step one and fuses differently. A buffer two blocks long keeps
    the slices; the padded rows are never computed (the loop runs one step) and the
    padded output rows are sliced off. `a` may be an array or a ShapeDtypeStruct (then
    only its padded shape is returned, as a struct).
    """
    if not _moves_along_first_axis(spec, rank):
        return a
    rows = spec.block_shape[0]
    padded = (a.shape[0] + rows, *a.shape[1:])
    if isinstance(a, jax.ShapeDtypeStruct):
        return jax.ShapeDtypeStruct(padded, a.dtype)
    return jnp.concatenate([a, jnp.zeros((rows, *a.shape[1:]), a.dtype)], axis=0)


def full_block(shape: tuple[int, ...]) -> pl.BlockSpec:
    """A block that is the whole array, the same at every grid step (weights, accumulators)."""
    zeros = (0,) * len(shape)
    return pl.BlockSpec(shape, lambda *_: zeros)


def zero_fill_at_first_step(kernel: KernelConfig, refs: Sequence, axis: int = 0) -> None:
    """Zero accumulator refs at grid step 0 (Mosaic); interpret mode starts from aliased zeros."""
    if kernel.interpret:
        return

    @pl.when(pl.program_id(axis) == 0)
    def _():
        for r in refs:
            r[...] = jnp.zeros(r.shape, r.dtype)
