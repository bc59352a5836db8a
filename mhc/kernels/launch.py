"""One `pallas_call` wrapper with the plumbing every mHC kernel needs.

* Output structs come from `mhc.sharding.token_out_shape`, so a kernel called inside
  `shard_map(check_vma=True)` declares the manual axes its outputs vary on.
* Every operand is passed through `mhc.sharding.to_varying`: replicated weights and
  compile-time constants must be varying before they meet activations in a kernel.
* Interpret mode: each output is aliased to a zeros input (varying like `like`). The
  interpreter carries whole output buffers through a `while_loop`; the aliased zeros
  give that buffer a defined value and type, and are the initial value of accumulator
  outputs, so the interpret kernels need no `pl.when(step == 0)` zero-fill (which lost
  the varying type in the interpreter under check_vma). Interpret kernels inside a
  shard_map run with check_vma=False; see `mhc.sharding`.
* Mosaic mode (interpret=False): no aliases; a kernel zero-fills its accumulators at
  the first grid step itself (an output block is never read from HBM on TPU); see
  `zero_fill_at_first_step`.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from mhc.kernels.config import KernelConfig
from mhc.sharding import to_varying, token_out_shape


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
    out_shape = [token_out_shape(o.shape, o.dtype, like) for o in outputs]
    out_specs = [o.spec for o in outputs]
    n_in, n_out = len(arrays), len(outputs)
    aliases = {}
    kernel_fn = body
    compiler_params = None
    if kernel.interpret:
        zeros = [to_varying(jnp.zeros(o.shape, o.dtype), like) for o in outputs]
        aliases = {n_in + k: k for k in range(n_out)}
        arrays = arrays + zeros
        in_specs = in_specs + out_specs

        def kernel_fn(*refs):  # drop the alias inputs: the body sees only its own refs
            body(*refs[:n_in], *refs[n_in + n_out:])
    else:
        compiler_params = pltpu.CompilerParams(
            dimension_semantics=semantics, vmem_limit_bytes=kernel.vmem_limit_bytes
        )
    return pl.pallas_call(
        kernel_fn,
        grid=grid,
        in_specs=in_specs,
        out_specs=out_specs,
        out_shape=out_shape,
        input_output_aliases=aliases,
        interpret=kernel.interpret,
        compiler_params=compiler_params,
        name=name,
    )(*arrays)


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
