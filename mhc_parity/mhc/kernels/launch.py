"""One `pallas_call` wrapper for every mHC kernel: output structs typed with their varying
manual axes (`token_out_shape`), operands made varying (`to_varying`).

Interpret mode aliases each output to a zeros input (the accumulators' initial value, with a
defined type), and compiles a grid step the same at any step count (`opaque_grid`,
`_pad_single_step`; docs/jax-notes.md). Mosaic mode zero-fills accumulators at step 0 itself
(`zero_fill_at_first_step`: an output block is never read from HBM on TPU).
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
    """Run `body(*input_refs, *output_refs)` over `grid`; the list of outputs. like: the
    token-major activation whose manual axes every output varies on."""
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

    # Interpret mode: a grid step compiles alike at any step count, so sharded and unsharded
    # runs are bit-identical per token.
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
    """`grid` with its first extent behind an optimization barrier: XLA would delete a one-step
    `while_loop` and fuse its body with its neighbours, rounding differently by an ulp."""
    if not grid:
        return grid
    return (jax.lax.optimization_barrier(jnp.int32(grid[0])), *grid[1:])


def _moves_along_first_axis(spec: pl.BlockSpec, rank: int) -> bool:
    """Whether `spec`'s block changes with grid axis 0 (token-major operands)."""
    rest = (0,) * (rank - 1)
    return tuple(spec.index_map(0, *rest)) != tuple(spec.index_map(1, *rest))


def _pad_single_step(a, spec: pl.BlockSpec, rank: int):
    """Append one block of zero rows to a token-major operand (array or ShapeDtypeStruct) of a
    one-step grid: a block that is the whole buffer loses its `dynamic_slice` and fuses
    differently. The padded rows are never computed and are sliced off the outputs."""
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
