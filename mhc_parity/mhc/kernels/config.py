"""Static tiling/compilation settings of the mHC Pallas kernels (the math lives in MhcConfig)."""

from __future__ import annotations

import dataclasses

# Mosaic's block rule: the last two block dims must be divisible by (8, 128) or equal
# the array's dims. Token blocks are the second-minor dim, features the minor one.
SUBLANES = 8
LANES = 128


@dataclasses.dataclass(frozen=True)
class KernelConfig:
    """Block sizes and mode of the kernels (hashable; a static argument).

    block_tokens / block_tokens_bwd: tokens per grid step, forward / backward (multiples of 8).
    block_features: embedding columns per post-apply step (a multiple of 128 dividing C).
    A block larger than the tokens or C is clamped to it; one that does not divide them is an
    UnsupportedInputError (token blocks: per shard in Mosaic mode, whole batch in interpret mode;
    `api._resolve_blocks`). interpret: Pallas interpret mode (the only one on CPU); False
    compiles with Mosaic. tpu_interpreter: with interpret=False, run the Mosaic-mode program in
    Pallas's TPU interpreter. vmem_limit_bytes: Mosaic's scoped VMEM limit.
    """

    block_tokens: int = 256
    block_tokens_bwd: int = 128
    block_features: int = 512
    interpret: bool = True
    tpu_interpreter: bool = False
    vmem_limit_bytes: int = 32 * 1024 * 1024
