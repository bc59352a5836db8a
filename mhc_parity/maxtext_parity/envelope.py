"""What MaxText 0.2.5's mHC supports, declared up front (an `Envelope`).

The kernels' own checks (`validate_inputs` and the block-size checks): bfloat16, mHC-lite with 4 streams, an
embedding a multiple of 128 (and of the backward feature block past it), per-device tokens divisible by the
token blocks. The reference is plain JAX; only mHC-lite is declared (its Sinkhorn variant is not what the
oracle computes).
"""

from __future__ import annotations

import math

from maxtext.kernels.mhc import api

from mhc_parity.harness.engine.envelope import Envelope

# The layer's fallbacks in its `__call__` for unset `mhc_pallas_kernel_*_block_size`.
LAYER_BLOCK_DEFAULTS = {"block_tokens": 256, "block_tokens_bwd": 128, "block_features": 1024}


def api_block_defaults() -> dict[str, int]:
    config = api.MhcKernelConfig()
    return {
        "block_tokens": config.block_size,
        "block_tokens_bwd": config.bwd_block_size,
        "block_features": config.bwd_feature_block_size,
    }


def block_sizes(case, defaults: dict[str, int]) -> dict[str, int]:
    return {**defaults, **case.block_sizes}


def kernel_envelope(defaults: dict[str, int]) -> Envelope:
    """The kernels' envelope with `defaults` for the blocks a case leaves unset."""

    def token_multiple(case) -> int:
        blocks = block_sizes(case, defaults)
        return math.lcm(blocks["block_tokens"], blocks["block_tokens_bwd"])

    def embedding_multiple(case) -> int:
        feature_block = min(case.embedding, block_sizes(case, defaults)["block_features"])
        return math.lcm(128, feature_block)

    return Envelope(
        act_dtypes=("bfloat16",),
        streams=(4,),
        variants=("lite",),
        embedding_multiple=embedding_multiple,
        token_multiple=token_multiple,
    )


REFERENCE_ENVELOPE = Envelope(variants=("lite",))
