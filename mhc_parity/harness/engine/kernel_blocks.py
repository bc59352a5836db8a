"""A row's `kernel_blocks` column: the blocks this project's kernels ran, as they resolve them for the
path's shard of the tokens (Mosaic's fitted to VMEM, interpret mode's the case's own, clamped to the
batch), e.g. ``block_tokens=128 block_tokens_bwd=64 block_features=512``; "" on every other row."""

from __future__ import annotations

import jax.numpy as jnp

from mhc_parity.harness.engine.implementations import Implementation, is_builtin
from mhc_parity.mhc.common import UnsupportedInputError
from mhc_parity.mhc.kernels.api import resolved_blocks
from mhc_parity.mhc.kernels.config import KernelConfig

BLOCK_FIELDS = ("block_tokens", "block_tokens_bwd", "block_features")


def blocks_label(case, *, interpret: bool, mesh: tuple[int, int] | None) -> str:
    """The blocks this project's kernels run for `case` (interpret mode or Mosaic), unsharded
    (mesh None) or on each shard of a (data, fsdp) token mesh; "" where the kernels refuse them."""
    kernel = KernelConfig(interpret=interpret, **case.block_sizes)
    try:
        blocks = resolved_blocks(
            kernel, case.mhc_config(), jnp.dtype(case.dtype), case.batch, case.sequence, tuple(mesh or (1, 1))
        )
    except UnsupportedInputError:
        return ""
    return " ".join(f"{field}={getattr(blocks, field)}" for field in BLOCK_FIELDS)


def path_blocks(case, impl: Implementation, mesh: tuple[int, int] | None) -> str:
    """`blocks_label` of a path of `impl` ("" unless `impl` is this project's kernels)."""
    if not (impl.kernel and is_builtin(impl)):
        return ""
    return blocks_label(case, interpret=impl.interpret, mesh=mesh)
