"""The built-in cases and suites: smoke ⊂ default ⊂ full; tpu and maxtext separate; adversarial
and sharded derived (every case with a non-default init family / with a mesh).

`default` runs in Pallas interpret mode on a 2-core CPU, so shapes stay small, and most
init-family cases share a plain case's shape so its compiled program is reused. Shapes obey
`KernelConfig`'s limits. Names are stable: a changed spec gets a new name, never a reused one.
"""

from __future__ import annotations

from mhc_parity.cases.spec import MULTI_BLOCK_TAG, REFERENCE_ONLY_TAG, TPU_TAG, Case, standard_name

# Substrings of the UnsupportedInputError messages expected for the rejected shapes.
REASON_EMBEDDING = "multiple of 128"
REASON_TOKEN_BLOCK = "must be divisible by block_tokens"
REASON_LITE_STREAMS = "at most 5 streams"

# The standard suites and what they promise. The catalogue fills them.
STANDARD_SUITES = {
    "smoke": "the quick check: one token block of each dtype, a multi-block case of each dtype and the "
    "gate- and epsilon-stressing init families",
    "default": "what `make parity` runs: every dtype, branch, variant, mesh and init family, "
    "kept small enough for interpret mode on a 2-core CPU",
    "full": "the default suite plus more shapes and combinations (CPU, slower)",
    "adversarial": "every catalogue case with a non-default init family",
    "sharded": "every catalogue case with a token-sharded mesh",
    "tpu": "large shapes only worth running with compiled kernels",
    "maxtext": "inside MaxText 0.2.5's kernel envelope (bfloat16, 4 streams, block-aligned tokens) and "
    "stressing it: several embeddings, multi-block grids, meshes, gate-sensitive init families "
    "(`make parity-maxtext`)",
}


def make_case(
    *,
    streams: int = 4,
    embedding: int = 128,
    batch: int = 2,
    sequence: int = 64,
    dtype: str = "float32",
    weight_dtype: str = "float32",
    variant: str = "lite",
    branch: str = "identity",
    init: str = "default",
    seed: int = 0,
    mesh: tuple[int, int] | None = None,
    block_tokens: int | None = None,
    block_tokens_bwd: int | None = None,
    block_features: int | None = None,
    matmul_precision: str = "highest",
    tags: tuple[str, ...] = (),
    expect_reason: str = "",
) -> Case:
    """A case with its `standard_name` and the Sinkhorn / multi-block tags; a non-empty
    `expect_reason` makes it expect "unsupported"."""
    fields = dict(
        streams=streams,
        embedding=embedding,
        batch=batch,
        sequence=sequence,
        dtype=dtype,
        weight_dtype=weight_dtype,
        variant=variant,
        branch=branch,
        init=init,
        seed=seed,
        mesh=mesh,
        block_tokens=block_tokens,
        block_tokens_bwd=block_tokens_bwd,
        block_features=block_features,
        matmul_precision=matmul_precision,
    )
    extra = []
    if variant == "sinkhorn":
        extra.append(REFERENCE_ONLY_TAG)  # the Pallas kernels implement mHC-lite only
    if (block_tokens or block_tokens_bwd or block_features) and not expect_reason:
        extra.append(MULTI_BLOCK_TAG)
    return Case(
        name=standard_name(**fields),
        tags=tuple(dict.fromkeys(tuple(tags) + tuple(extra))),
        expect="unsupported" if expect_reason else "supported",
        expect_reason=expect_reason,
        **fields,
    )


F32, BF16 = "float32", "bfloat16"

# The smoke (and default) case the maxtext suite shares (8 forward / 16 backward token blocks).
MAXTEXT_SHARED_DEFAULT = dict(batch=4, sequence=128, dtype=BF16, branch="mlp", block_tokens=64, block_tokens_bwd=32)


def smoke_cases() -> list[Case]:
    """Small cases that run in seconds (all also in `default`): one block of each dtype, plus
    what a kernel gets wrong only past one grid step or on hard inputs (a multi-block case per
    dtype; the epsilon- and gate-stressing init families)."""
    return [
        make_case(dtype=F32),
        make_case(dtype=BF16),
        make_case(dtype=F32, branch="mlp"),
        make_case(dtype=BF16, init="bf16_inexact_gates"),
        make_case(variant="sinkhorn", dtype=F32),
        make_case(embedding=96, expect_reason=REASON_EMBEDDING),
        # several kernel blocks: 8 token blocks and 2 feature blocks; 8 fwd / 16 bwd blocks
        make_case(embedding=256, batch=2, sequence=128, dtype=F32, block_tokens=32, block_features=128),
        make_case(**MAXTEXT_SHARED_DEFAULT),
        # the epsilons and the gates
        make_case(dtype=F32, init="saturated_gates"),
        make_case(dtype=F32, branch="mlp", init="near_zero_rms"),
    ]


def default_only_cases() -> list[Case]:
    """The rest of `default` beyond `smoke_cases()`."""
    return [
        # dtypes and branches at the base shape (2×64 tokens, n=4, C=128/256)
        make_case(dtype=BF16, weight_dtype=BF16),
        make_case(dtype=F32, branch="tanh"),
        make_case(embedding=256, dtype=BF16, branch="mlp"),
        make_case(embedding=256, dtype=BF16, weight_dtype=BF16, branch="mlp"),
        # other stream counts
        make_case(streams=2, dtype=F32),
        make_case(streams=3, dtype=BF16),
        make_case(streams=3, dtype=F32, weight_dtype=BF16, branch="mlp"),
        # wide embedding, few tokens
        make_case(embedding=1024, batch=1, sequence=128, dtype=F32),
        make_case(embedding=1024, batch=1, sequence=128, dtype=BF16, branch="mlp"),
        # Sinkhorn (reference and oracle only)
        make_case(variant="sinkhorn", embedding=256, dtype=BF16, branch="mlp"),
        # token-sharded meshes; 64 tokens per shard
        make_case(batch=2, sequence=256, dtype=F32, mesh=(2, 4), block_tokens=64),
        make_case(batch=8, sequence=64, dtype=BF16, branch="mlp", mesh=(8, 1), block_tokens=64),
        make_case(embedding=256, batch=1, sequence=512, dtype=BF16, weight_dtype=BF16, mesh=(1, 8), block_tokens=64),
        # one or more case of every init family, at the base shape
        make_case(dtype=BF16, init="peaky_permutation"),
        make_case(dtype=F32, init="large_magnitude"),
        make_case(dtype=BF16, init="large_magnitude"),
        make_case(dtype=BF16, branch="mlp", init="mixed_signs"),
        # expected-unsupported shapes
        make_case(batch=1, sequence=96, block_tokens=64, expect_reason=REASON_TOKEN_BLOCK),
        make_case(streams=6, batch=1, sequence=128, expect_reason=REASON_LITE_STREAMS),
    ]


def full_only_cases() -> list[Case]:
    """More shapes and combinations for `full`."""
    return [
        make_case(dtype=BF16, branch="tanh"),
        make_case(dtype=BF16, weight_dtype=BF16, branch="mlp"),
        make_case(streams=2, embedding=256, dtype=BF16, branch="mlp"),
        make_case(streams=2, dtype=F32, weight_dtype=BF16, branch="tanh"),
        make_case(streams=3, embedding=384, dtype=F32, branch="tanh"),
        make_case(streams=5, dtype=F32),
        make_case(streams=5, dtype=BF16, branch="mlp"),
        make_case(embedding=512, batch=2, sequence=128, dtype=BF16, branch="mlp"),
        make_case(embedding=1024, batch=2, sequence=128, dtype=BF16, weight_dtype=BF16, branch="mlp"),
        make_case(batch=4, sequence=512, dtype=F32),
        make_case(
            embedding=512, batch=2, sequence=128, dtype=F32, block_tokens=16, block_tokens_bwd=64, block_features=128
        ),
        make_case(dtype=F32, seed=1),
        make_case(dtype=BF16, branch="mlp", seed=1),
        make_case(variant="sinkhorn", streams=2, dtype=BF16),
        make_case(variant="sinkhorn", streams=3, dtype=F32, branch="tanh"),
        make_case(variant="sinkhorn", dtype=BF16, init="saturated_gates"),
        make_case(variant="sinkhorn", dtype=BF16, init="bf16_inexact_gates"),
        make_case(dtype=BF16, init="saturated_gates"),
        make_case(dtype=BF16, init="near_zero_rms"),
        make_case(dtype=F32, branch="mlp", init="peaky_permutation"),
        make_case(streams=3, dtype=BF16, branch="mlp", init="bf16_inexact_gates"),
        make_case(streams=2, dtype=BF16, init="bf16_inexact_gates"),
        make_case(dtype=F32, init="mixed_signs"),
        make_case(dtype=BF16, branch="mlp", init="large_magnitude"),
        make_case(batch=2, sequence=256, dtype=BF16, init="bf16_inexact_gates", mesh=(2, 4), block_tokens=64),
        make_case(batch=8, sequence=64, dtype=F32, init="mixed_signs", mesh=(8, 1), block_tokens=64),
        make_case(batch=1, sequence=512, dtype=BF16, init="near_zero_rms", mesh=(1, 8), block_tokens=64),
        make_case(streams=3, batch=2, sequence=256, dtype=F32, branch="mlp", mesh=(2, 4), block_tokens=32),
        make_case(embedding=64, dtype=BF16, expect_reason=REASON_EMBEDDING),
        make_case(batch=3, sequence=40, block_tokens=48, expect_reason=REASON_TOKEN_BLOCK),
        # the backend's default matmul precision (on a CPU: the same as "highest")
        make_case(dtype=F32, branch="mlp", matmul_precision="default"),
        make_case(dtype=BF16, branch="mlp", matmul_precision="default"),
    ]


def tpu_cases() -> list[Case]:
    """Large shapes only worth running with compiled (Mosaic) kernels."""
    tags = (TPU_TAG,)
    return [
        make_case(embedding=1024, batch=4, sequence=2048, dtype=BF16, branch="mlp", tags=tags),
        make_case(embedding=2048, batch=2, sequence=1024, dtype=BF16, tags=tags),
        make_case(embedding=4096, batch=1, sequence=1024, dtype=BF16, weight_dtype=BF16, tags=tags),
        make_case(embedding=1024, batch=4, sequence=2048, dtype=F32, block_tokens=512, tags=tags),
        make_case(embedding=1024, batch=8, sequence=1024, dtype=BF16, branch="mlp", mesh=(2, 4), tags=tags),
        make_case(embedding=1024, batch=4, sequence=2048, dtype=BF16, init="bf16_inexact_gates", tags=tags),
        make_case(embedding=1024, batch=4, sequence=2048, dtype=BF16, init="large_magnitude", tags=tags),
        make_case(
            embedding=1024, batch=4, sequence=2048, dtype=F32, branch="mlp", matmul_precision="default", tags=tags
        ),
    ]


# Two maxtext-suite cases the compile rows name too (`COMPILED_MAXTEXT_CASES`): its smallest
# unsharded case and its 2x4 token mesh.
MAXTEXT_SMALLEST = dict(
    batch=2, sequence=128, dtype=BF16, init="bf16_inexact_gates", block_tokens=64, block_tokens_bwd=32
)
MAXTEXT_2X4 = dict(
    batch=2, sequence=256, dtype=BF16, init="bf16_inexact_gates", mesh=(2, 4), block_tokens=64, block_tokens_bwd=32
)


def maxtext_cases() -> list[Case]:
    """The `maxtext` suite beyond the default case it shares: inside MaxText's kernel envelope
    (`mhc_parity.maxtext_parity.envelope`), with its default blocks or explicit ones dividing
    each device's tokens."""
    return [
        make_case(**MAXTEXT_SMALLEST),
        make_case(embedding=256, batch=2, sequence=128, dtype=BF16, branch="mlp"),
        make_case(
            embedding=384,
            batch=1,
            sequence=256,
            dtype=BF16,
            branch="mlp",
            init="saturated_gates",
            block_tokens=128,
            block_tokens_bwd=64,
        ),
        make_case(
            embedding=1024,
            batch=1,
            sequence=256,
            dtype=BF16,
            weight_dtype=BF16,
            branch="mlp",
            block_tokens=128,
            block_tokens_bwd=64,
            block_features=512,
        ),
        make_case(**MAXTEXT_2X4),
        make_case(
            embedding=256,
            batch=8,
            sequence=64,
            dtype=BF16,
            branch="mlp",
            init="peaky_permutation",
            mesh=(8, 1),
            block_tokens=64,
            block_tokens_bwd=32,
        ),
    ]


# The default-suite cases that get compile rows besides the `tpu` suite's (`compiles_case`): the
# cheapest with a token mesh per activation dtype, so every (TPU target, 1 / 8 chips, dtype) is
# compiled once.
COMPILED_DEFAULT_CASES = frozenset(
    make_case(**fields).name
    for fields in (
        dict(batch=2, sequence=256, dtype=F32, mesh=(2, 4), block_tokens=64),
        dict(batch=8, sequence=64, dtype=BF16, branch="mlp", mesh=(8, 1), block_tokens=64),
    )
)

# The maxtext-suite cases that get compile rows (`compiles_case`): the 2x4 token mesh, where the
# released kernels, called bare, meet XLA's partitioner, and the smallest unsharded case.
COMPILED_MAXTEXT_CASES = frozenset(make_case(**fields).name for fields in (MAXTEXT_2X4, MAXTEXT_SMALLEST))


def build_catalogue(registry):
    """Register every built-in case into `registry` and fill the standard suites; returns it."""
    for suite, description in STANDARD_SUITES.items():
        registry.define_suite(suite, description)
    for case in smoke_cases():
        registry.register(case, ("smoke", "default", "full"), origin="mhc_parity.cases.catalogue")
    for case in default_only_cases():
        registry.register(case, ("default", "full"), origin="mhc_parity.cases.catalogue")
    for case in full_only_cases():
        registry.register(case, ("full",), origin="mhc_parity.cases.catalogue")
    for case in tpu_cases():
        registry.register(case, ("tpu",), origin="mhc_parity.cases.catalogue")
    for case in maxtext_cases():
        registry.register(case, ("maxtext",), origin="mhc_parity.cases.catalogue")
    registry.add_to_suite("maxtext", [make_case(**MAXTEXT_SHARED_DEFAULT).name])
    registry.add_to_suite("adversarial", [c.name for c in registry if c.init != "default"])
    registry.add_to_suite("sharded", [c.name for c in registry if c.mesh is not None])
    return registry
