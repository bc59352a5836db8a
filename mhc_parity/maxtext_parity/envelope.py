"""What MaxText 0.2.5's mHC supports, declared up front (`mhc_parity.harness.engine.envelope.Envelope`).

The kernels' own checks (`maxtext/kernels/mhc/common.py validate_inputs`,
`validate_token_block_size`, `validate_feature_block_size`): bfloat16 activations,
mHC-lite with 4 streams, an embedding that is a multiple of 128 (and, past the backward
feature block, a multiple of that block), per-device tokens divisible by the forward and
backward token blocks. The layer's reference path is plain JAX: any dtype and shape; only
mHC-lite is declared (its Sinkhorn variant is not what this project's oracle computes).
"""

from __future__ import annotations

import math

from maxtext.kernels.mhc import api

from mhc_parity.harness.engine.envelope import Envelope

# The kernel API's block defaults are `MhcKernelConfig()`'s; the layer reads its own from
# its config (`mhc_pallas_kernel_*_block_size`), falling back to these in its `__call__`.
LAYER_BLOCK_DEFAULTS = {"block_tokens": 256, "block_tokens_bwd": 128, "block_features": 1024}


def api_block_defaults() -> dict[str, int]:
    """The kernel API's defaults, read from MaxText's `MhcKernelConfig()`."""
    config = api.MhcKernelConfig()
    return {
        "block_tokens": config.block_size,
        "block_tokens_bwd": config.bwd_block_size,
        "block_features": config.bwd_feature_block_size,
    }


def block_sizes(case, defaults: dict[str, int]) -> dict[str, int]:
    """The case's explicit block sizes, MaxText's defaults for the rest (case field names)."""
    return {**defaults, **case.block_sizes}


def kernel_envelope(defaults: dict[str, int]) -> Envelope:
    """The kernels' envelope when they run with `defaults` for the blocks a case leaves unset."""

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
