"""VMEM per grid step of the Mosaic kernels (an upper bound: double-buffered blocks in whole
tiles, plus float32 working values), and `fit_blocks`, which halves blocks until a step fits
the scoped limit. Only Mosaic blocks are fitted (interpret numbers must not depend on a TPU's
memory); a fitted block changes only the order backward kernels sum weight gradients in.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from mhc_parity.mhc.common import UnsupportedInputError
from mhc_parity.mhc.kernels.config import LANES, SUBLANES, KernelConfig
from mhc_parity.mhc.types import MhcConfig

_F32 = np.dtype(np.float32)
# The kernels' programs by the block field that sets their token block.
FORWARD_KERNELS = ("pre_forward", "post_forward")
BACKWARD_KERNELS = ("pre_backward", "post_backward")
# Float32 working values of a step, in units of the kernel's widest per-token block.
# pre: v in float32, v*v and the normalised product; backward: also d_v, d_x3 and their sum.
# post: the float32 residual mix and gate product (and their cotangents backward).
_WORKING_COPIES = {"pre_forward": 3, "pre_backward": 5, "post_forward": 2, "post_backward": 5}


def _sublanes(dtype: np.dtype) -> int:
    """Rows of a VMEM tile: 8 for 32-bit values, 16 for 16-bit ones (two to a word)."""
    return SUBLANES * max(1, 4 // dtype.itemsize)


def tile_bytes(shape: tuple[int, ...], dtype) -> int:
    """Bytes of a VMEM buffer: the last two dims rounded up to a (sublanes, 128) tile; 1-D is one row."""
    dtype = np.dtype(dtype)
    *lead, rows, cols = (1, *shape) if len(shape) == 1 else shape
    padded = math.ceil(rows / _sublanes(dtype)) * _sublanes(dtype) * math.ceil(cols / LANES) * LANES
    return math.prod(lead) * padded * dtype.itemsize


@dataclasses.dataclass(frozen=True)
class StepBytes:
    """VMEM of one grid step of a kernel, in bytes: `blocks` (double-buffered token blocks),
    `resident` (double-buffered blocks the same at every step) and `working` (float32 values
    of the body); `total` is their sum."""

    blocks: int
    resident: int
    working: int

    @property
    def total(self) -> int:
        return self.blocks + self.resident + self.working


def step_bytes(kernel: str, config: MhcConfig, dtype, block: int, block_features: int = 0) -> StepBytes:
    """The estimated VMEM of one grid step of `kernel` ("pre_forward", ...) for activation
    `dtype`; block_features: post_forward's feature block only."""
    act = np.dtype(dtype)
    n, c = config.streams, config.embedding
    nc, p = n * c, config.dims.projection_width
    coefficients = [((block, n), _F32), ((block, n), _F32), ((block, n, n), _F32)]
    weights = [((nc, p), act), ((math.factorial(n), n * n), _F32)] + [((1, n), _F32)] * 6
    if kernel == "pre_forward":
        blocks = [((block, nc), act), ((block, c), act), *coefficients]
        resident, widest = weights, block * nc
    elif kernel == "pre_backward":
        blocks = [((block, nc), act), ((block, c), act), *coefficients, ((block, nc), act)]
        resident, widest = weights + [((nc, p), _F32)] + [((1, n), _F32)] * 6, block * nc
    elif kernel == "post_forward":
        f = block_features
        blocks = [((block, n, f), act), *coefficients[1:], ((block, f), act), ((block, n, f), act)]
        resident, widest = [], block * n * f
    elif kernel == "post_backward":
        blocks = [((block, n, c), act), *coefficients[1:], ((block, c), act), ((block, n, c), act)]
        blocks += [((block, n, c), act), *coefficients[1:], ((block, c), act)]
        resident, widest = [], block * nc
    else:
        raise ValueError(f"no VMEM estimate for kernel {kernel!r}")
    return StepBytes(
        blocks=2 * sum(tile_bytes(s, d) for s, d in blocks),
        resident=2 * sum(tile_bytes(s, d) for s, d in resident),
        working=_WORKING_COPIES[kernel] * widest * _F32.itemsize,
    )


def _halvings(block: int, tokens: int):
    """`block`, then each half of it that is still a multiple of 8 and divides `tokens`."""
    while True:
        yield block
        if block % 2 or (block // 2) % SUBLANES or tokens % (block // 2):
            return
        block //= 2


def _mib(value: int) -> str:
    return f"{value / 2**20:.2f} MiB"


def _fitted(kernels, config, dtype, tokens: int, block: int, limit: int, field: str, block_features: int = 0) -> int:
    need = None
    for candidate in _halvings(block, tokens):
        need = max((step_bytes(k, config, dtype, candidate, block_features) for k in kernels), key=lambda s: s.total)
        if need.total <= limit:
            return candidate
    if need.resident + need.working > limit or candidate == block:
        raise UnsupportedInputError(
            f"{field}: a Mosaic grid step needs {_mib(need.total)} of VMEM at {candidate} tokens "
            f"({_mib(need.resident)} of it weights and accumulators held at every step), over the "
            f"scoped limit of {_mib(limit)} (vmem_limit_bytes)"
        )
    raise UnsupportedInputError(
        f"{field}={block}: no token block down to {candidate} that divides the {tokens} tokens of a shard "
        f"fits the scoped VMEM limit of {_mib(limit)} (the smallest needs {_mib(need.total)})"
    )


def fit_blocks(kernel: KernelConfig, config: MhcConfig, dtype, local_tokens: int) -> KernelConfig:
    """`kernel` (blocks resolved for one shard's `local_tokens`) with token and feature blocks
    halved until every kernel's step fits `vmem_limit_bytes`; UnsupportedInputError naming
    both figures when no block dividing the tokens fits."""
    limit = kernel.vmem_limit_bytes
    features = min(kernel.block_features, config.embedding)
    # The feature block first: it is the post-apply kernel's only other dimension.
    while (
        step_bytes("post_forward", config, dtype, kernel.block_tokens, features).total > limit
        and (features // 2) % LANES == 0
        and config.embedding % (features // 2) == 0
    ):
        features //= 2
    forward = _fitted(FORWARD_KERNELS[:1], config, dtype, local_tokens, kernel.block_tokens, limit, "block_tokens")
    forward = _fitted(FORWARD_KERNELS[1:], config, dtype, local_tokens, forward, limit, "block_tokens", features)
    backward = _fitted(
        BACKWARD_KERNELS, config, dtype, local_tokens, kernel.block_tokens_bwd, limit, "block_tokens_bwd"
    )
    return dataclasses.replace(kernel, block_tokens=forward, block_tokens_bwd=backward, block_features=features)
