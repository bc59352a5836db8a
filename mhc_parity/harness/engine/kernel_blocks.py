"""Which kernel blocks a row's program ran: its `kernel_blocks` column.

The Mosaic kernels do not always run the blocks a case asks for: the VMEM fitter
(`mhc_parity.mhc.kernels.vmem.fit_blocks`) halves the token and feature blocks until a grid step
fits the scoped VMEM limit, so at real sizes the chip runs other grids and other accumulation
orders than the case's name says. Interpret mode runs the case's own blocks, clamped to the whole
batch. A row of this project's kernels (the `interpret` and `mosaic` paths, their lowering and
compile rows) states the blocks as the kernels resolve them for the path's shard of the tokens
(`mhc_parity.mhc.kernels.api.resolved_blocks`), e.g. ``block_tokens=128 block_tokens_bwd=64
block_features=512``; every other row (the reference, external implementations, whose blocks are
their own) leaves it empty, as does a case whose blocks the kernels refuse (its rows say why).
"""

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
