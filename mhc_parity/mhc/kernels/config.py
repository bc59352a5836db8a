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

    block_tokens: tokens per grid step of the forward kernels (multiple of 8).
    block_tokens_bwd: tokens per grid step of the backward kernels (multiple of 8); the
        weight-gradient accumulators stay resident across these steps.
    block_features: embedding columns per grid step of the post-apply kernel (multiple
        of 128 dividing the embedding).
    A block larger than the tokens or the embedding is clamped to it; a block that does
    not divide them is an UnsupportedInputError. Token blocks are clamped to the tokens
    of a shard in Mosaic mode, but to the tokens of the whole batch in interpret mode:
    there a shard with fewer tokens than the block is padded to one block, so every
    shard compiles the same block shape as the unsharded program (bit-identical
    per-token results on XLA CPU; see `mhc_parity.mhc.kernels.api._resolve_blocks`).
    interpret: run in Pallas interpret mode (the only mode on CPU); False compiles with
        Mosaic (TPU) — also what `mhc_parity.mhc.kernels.lowering` uses.
    tpu_interpreter: with interpret=False, run the Mosaic-mode program (per-shard blocks,
        zero-fill at the first step, `shard_map(check_vma=True)`) in Pallas's TPU
        interpreter (`pltpu.InterpretParams`) instead of compiling it: Mosaic's
        semantics on any backend (slower than interpret mode).
    vmem_limit_bytes: scoped VMEM limit handed to Mosaic (ignored in interpret mode).
    """

    block_tokens: int = 256
    block_tokens_bwd: int = 128
    block_features: int = 512
    interpret: bool = True
    tpu_interpreter: bool = False
    vmem_limit_bytes: int = 32 * 1024 * 1024
