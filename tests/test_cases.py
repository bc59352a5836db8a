"""mhc_parity.cases.spec, .registry, .catalogue and `python -m mhc_parity.cases`: specs, selection, coverage."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest

from mhc_parity.cases import catalogue, registry
from mhc_parity.cases.__main__ import main as cases_main
from mhc_parity.cases.branches import BRANCHES
from mhc_parity.cases.init_families import INIT_FAMILIES
from mhc_parity.cases.registry import DuplicateCaseError, Registry, UnknownCaseError
from mhc_parity.cases.spec import (
    BRANCH_NAMES,
    INIT_FAMILY_NAMES,
    REFERENCE_ONLY_TAG,
    Case,
    CaseSpecError,
    normalize_dtype,
    standard_name,
)
from mhc_parity.records.project_code import PROJECT_ROOT

BASE = dict(name="t", batch=2, sequence=64, streams=4, embedding=128)


# -- Case ---------------------------------------------------------------------------


def test_case_is_frozen_hashable_and_derives_its_properties():
    case = Case(**BASE, dtype="bfloat16", mesh=[2, 4], tags=["a"], block_tokens=32)
    assert case.mesh == (2, 4) and case.tags == ("a",)  # lists normalised to tuples
    assert hash(case) == hash(Case(**BASE, dtype="bfloat16", mesh=(2, 4), tags=("a",), block_tokens=32))
    with pytest.raises(dataclasses.FrozenInstanceError):
        case.batch = 3
    assert case.tokens == 128
    assert case.shape == (2, 64, 4, 128)
    assert case.shape_name == "2x64x4x128"
    assert case.mesh_name == "data=2,fsdp=4" and case.mesh_devices == 8
    assert Case(**BASE).mesh_name == ""
    assert case.block_sizes == {"block_tokens": 32}
    assert case.all_tags[:1] == ("a",)
    assert {"bf16", "w32", "lite", "identity", "default", "sharded"} <= set(case.all_tags)
    config = case.mhc_config()
    assert (config.streams, config.embedding, config.variant) == (4, 128, "lite")
    assert case.replace(seed=3).seed == 3


def test_registries_of_names_agree_with_the_implementations():
    from mhc_parity.mhc.common import VARIANTS

    assert set(BRANCH_NAMES) == set(BRANCHES)
    assert set(INIT_FAMILY_NAMES) == set(INIT_FAMILIES)
    from mhc_parity.cases import spec

    assert spec.VARIANTS == VARIANTS


@pytest.mark.parametrize(
    "changes, field",
    [
        (dict(batch=0), "batch"),
        (dict(sequence=True), "sequence"),
        (dict(embedding=12.5), "embedding"),
        (dict(dtype="float16"), "dtype"),
        (dict(weight_dtype="bf16"), "weight_dtype"),  # aliases only through normalize_dtype
        (dict(variant="sparse"), "variant"),
        (dict(branch="attention"), "branch"),
        (dict(init="zeros"), "init"),
        (dict(seed=-1), "seed"),
        (dict(mesh=(2,)), "mesh"),
        (dict(mesh=(2, 0)), "mesh"),
        (dict(block_tokens=0), "block_tokens"),
        (dict(tags=("has space",)), "tags"),
        (dict(tags="single"), "tags"),
        (dict(tags=("a", "a")), "tags"),
        (dict(expect="maybe"), "expect"),
        (dict(expect="unsupported"), "expect_reason"),
        (dict(expect_reason="why"), "expect_reason"),
        (dict(name="bad name"), "name"),
        (dict(name=""), "name"),
    ],
)
def test_invalid_fields_are_rejected_naming_case_and_field(changes, field):
    fields = {**BASE, "name": "my-case", **changes}
    with pytest.raises(CaseSpecError) as info:
        Case(**fields)
    message = str(info.value)
    assert f"field {field!r}" in message
    assert "case " in message


def test_normalize_dtype_accepts_aliases_and_names_the_field():
    assert normalize_dtype("bf16") == "bfloat16" and normalize_dtype("F32") == "float32"
    with pytest.raises(CaseSpecError, match="--dtype"):
        normalize_dtype("half", field="--dtype")


def test_standard_name_spells_out_the_spec():
    name = standard_name(
        variant="lite",
        streams=4,
        embedding=256,
        batch=2,
        sequence=64,
        dtype="bfloat16",
        weight_dtype="float32",
        branch="mlp",
        init="default",
    )
    assert name == "lite-n4-c256-b2s64-bf16-w32-mlp-default"
    name = standard_name(
        variant="lite",
        streams=4,
        embedding=128,
        batch=2,
        sequence=256,
        dtype="float32",
        weight_dtype="bfloat16",
        branch="identity",
        init="default",
        mesh=(2, 4),
        block_tokens=64,
        seed=7,
    )
    assert name == "lite-n4-c128-b2s256-f32-wbf16-identity-default-m2x4-bt64-s7"


# -- registry -----------------------------------------------------------------------


def _small_registry() -> Registry:
    reg = Registry()
    reg.register(Case(**{**BASE, "name": "alpha-f32"}), ("smoke",))
    reg.register(Case(**{**BASE, "name": "alpha-bf16", "dtype": "bfloat16", "tags": ("x",)}), ("smoke", "big"))
    reg.register(Case(**{**BASE, "name": "beta-bf16", "dtype": "bfloat16", "mesh": (2, 4)}), ("big",))
    return reg


def test_registry_rejects_duplicate_names():
    reg = _small_registry()
    with pytest.raises(DuplicateCaseError, match="alpha-f32"):
        reg.register(Case(**{**BASE, "name": "alpha-f32", "seed": 5}))


def test_unknown_names_and_suites_fail_with_did_you_mean():
    reg = _small_registry()
    with pytest.raises(UnknownCaseError) as info:
        reg.get("alpha-f23")
    assert "unknown case 'alpha-f23'" in str(info.value) and "did you mean 'alpha-f32'" in str(info.value)
    with pytest.raises(UnknownCaseError, match="did you mean 'smoke'"):
        reg.select(suite="smoek")
    with pytest.raises(UnknownCaseError, match="did you mean"):
        reg.select(names=["beta-bf61"])
    with pytest.raises(UnknownCaseError, match="matches no registered case"):
        reg.select(names="gamma-*")
    with pytest.raises(UnknownCaseError, match="did you mean"):
        registry.get("lite-n4-c128-b2s64-f32-w32-identity-defualt")


def test_select_intersects_suite_globs_tags_and_dtype():
    reg = _small_registry()
    names = lambda cases: [c.name for c in cases]  # noqa: E731
    assert names(reg.select()) == ["alpha-f32", "alpha-bf16", "beta-bf16"]
    assert names(reg.select(suite="smoke")) == ["alpha-f32", "alpha-bf16"]
    assert names(reg.select(names="alpha-*")) == ["alpha-f32", "alpha-bf16"]
    assert names(reg.select(names="alpha-f32,beta-*")) == ["alpha-f32", "beta-bf16"]
    assert names(reg.select(suite="big", names=["alpha-*"])) == ["alpha-bf16"]
    assert names(reg.select(tags="x")) == ["alpha-bf16"]
    assert names(reg.select(tags=["bf16", "sharded"])) == ["beta-bf16"]
    assert names(reg.select(tags="!sharded")) == ["alpha-f32", "alpha-bf16"]
    assert names(reg.select(dtype="bf16")) == ["alpha-bf16", "beta-bf16"]
    assert reg.suites_of("alpha-bf16") == ("smoke", "big")


# -- catalogue ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def reg() -> Registry:
    return registry.default_registry()


def test_catalogue_names_are_unique_standard_and_stable(reg):
    for case in reg:
        fields = {
            f: getattr(case, f)
            for f in (
                "variant",
                "streams",
                "embedding",
                "batch",
                "sequence",
                "dtype",
                "weight_dtype",
                "branch",
                "init",
                "mesh",
                "block_tokens",
                "block_tokens_bwd",
                "block_features",
                "seed",
                "matmul_precision",
            )
        }
        assert case.name == standard_name(**fields)
    # A few names pinned: they key stored baselines and must never change meaning.
    assert reg.get("lite-n4-c256-b2s64-bf16-w32-mlp-default").shape == (2, 64, 4, 256)
    assert reg.get("lite-n4-c128-b2s64-bf16-w32-identity-bf16_inexact_gates").weight_dtype == "float32"


def test_suites_hold_what_they_claim(reg):
    smoke, default, full = (set(reg.suite(s)) for s in ("smoke", "default", "full"))
    tpu = set(reg.suite("tpu"))
    # At most 10: one block of each dtype, the multi-block and stressing cases of
    # `test_the_quick_check_reaches_past_one_block_and_into_the_hard_inputs`.
    assert 3 <= len(smoke) <= 10 and smoke <= default <= full
    assert 20 <= len(default) <= 32
    assert not tpu & full and all("tpu" in c.tags for c in tpu)
    assert set(reg.suite("adversarial")) == {c for c in reg if c.init != "default"}
    assert set(reg.suite("sharded")) == {c for c in reg if c.mesh is not None}
    assert all(c.tokens * c.embedding * c.streams <= 4 * 128 * 1024 for c in smoke)
    # every case lives in at least one suite
    assert all(reg.suites_of(c.name) for c in reg)


def _grid_steps(case) -> tuple[int, int, int]:
    """(forward token blocks, backward token blocks, feature blocks) of the unsharded kernels
    at the case's blocks (the kernel defaults where unset; Mosaic may only halve them)."""
    from mhc_parity.mhc.kernels.config import KernelConfig

    default = KernelConfig()
    fwd = min(case.block_tokens or default.block_tokens, case.tokens)
    bwd = min(case.block_tokens_bwd or default.block_tokens_bwd, case.tokens)
    features = min(case.block_features or default.block_features, case.embedding)
    return case.tokens // fwd, case.tokens // bwd, case.embedding // features


def test_the_quick_check_reaches_past_one_block_and_into_the_hard_inputs(reg):
    """A kernel that errs only after its first grid step, or only where an epsilon or a
    saturated gate decides, must fail the smoke suite (what accelerator_check.sh runs)."""
    kernel_cases = [c for c in reg.suite("smoke") if c.variant == "lite" and not c.expects_unsupported]
    for dtype in ("float32", "bfloat16"):
        steps = [_grid_steps(c) for c in kernel_cases if c.dtype == dtype]
        assert any(fwd > 1 and bwd > 1 for fwd, bwd, _ in steps), dtype
    assert any(features > 1 for *_, features in map(_grid_steps, kernel_cases))
    assert {"near_zero_rms", "saturated_gates", "bf16_inexact_gates"} <= {c.init for c in kernel_cases}


def test_default_suite_covers_the_required_matrix(reg):
    default = reg.suite("default")
    assert {c.dtype for c in default} == {"float32", "bfloat16"}
    assert {c.weight_dtype for c in default} == {"float32", "bfloat16"}
    assert {2, 3, 4} <= {c.streams for c in default}
    embeddings = {c.embedding for c in default if not c.expects_unsupported}
    assert min(embeddings) == 128 and max(embeddings) == 1024
    assert set(BRANCHES) == {c.branch for c in default}
    assert set(INIT_FAMILIES) == {c.init for c in default}
    assert {(2, 4), (8, 1), (1, 8)} <= {c.mesh for c in default}
    assert any(c.mesh is None for c in default)
    sinkhorn = [c for c in default if c.variant == "sinkhorn"]
    assert sinkhorn and all(REFERENCE_ONLY_TAG in c.tags for c in sinkhorn)
    reasons = {c.expect_reason for c in default if c.expects_unsupported}
    assert {catalogue.REASON_EMBEDDING, catalogue.REASON_TOKEN_BLOCK, catalogue.REASON_LITE_STREAMS} <= reasons
    # several kernel blocks along tokens (forward and backward) and features
    assert any(c.block_tokens and c.tokens // c.block_tokens >= 4 for c in default)
    assert any(c.block_tokens_bwd and c.tokens // c.block_tokens_bwd >= 4 for c in default)
    assert any(c.block_features and c.embedding // c.block_features >= 2 for c in default)
    # interpret-mode budget: modest token counts, embedding 1024 only with few tokens
    assert all(64 <= c.tokens <= 512 for c in default)
    assert all(c.tokens <= 128 for c in default if c.embedding >= 1024)


def test_supported_catalogue_cases_fit_the_kernel_constraints(reg):
    """Shapes the kernels must accept (mhc_parity.mhc.kernels block rules) for every expect='supported' case."""
    from mhc_parity.mhc.kernels.config import LANES, SUBLANES, KernelConfig

    defaults = KernelConfig()
    for case in reg:
        if case.expects_unsupported:
            continue
        data, fsdp = case.mesh or (1, 1)
        assert case.batch % data == 0 and case.sequence % fsdp == 0, case.name
        local_tokens = (case.batch // data) * (case.sequence // fsdp)
        if case.variant == "lite":
            assert case.embedding % LANES == 0, case.name
            for requested in (
                case.block_tokens or defaults.block_tokens,
                case.block_tokens_bwd or defaults.block_tokens_bwd,
            ):
                block = min(requested, local_tokens)
                assert block % SUBLANES == 0 and local_tokens % block == 0, case.name
                unsharded = min(requested, case.tokens)
                assert case.tokens % unsharded == 0, case.name
            features = min(case.block_features or defaults.block_features, case.embedding)
            assert case.embedding % features == 0, case.name
        else:
            assert REFERENCE_ONLY_TAG in case.tags, case.name


def test_expected_unsupported_cases_are_rejected_with_their_reason(reg):
    """Each expect_reason is a substring of what mhc actually raises for that shape."""
    from mhc_parity.mhc.common import UnsupportedInputError
    from mhc_parity.mhc.kernels.api import _check_config, token_block

    for case in reg:
        if not case.expects_unsupported:
            continue
        with pytest.raises(UnsupportedInputError) as info:
            config = case.mhc_config()
            _check_config(config)
            token_block(case.tokens, case.block_tokens or 256, "block_tokens")
        assert case.expect_reason in str(info.value), (case.name, str(info.value))


# -- python -m mhc_parity.cases ----------------------------------------------------------------


def test_cli_list_prints_the_selection(capsys):
    assert cases_main(["list", "--suite", "smoke"]) == 0
    out = capsys.readouterr().out
    smoke = registry.select(suite="smoke")
    for case in smoke:
        assert case.name in out
    for column in ("name", "shape", "dtype", "weights", "mesh", "tags", "expect"):
        assert column in out.splitlines()[0]
    assert f"{len(smoke)} case(s)" in out


def test_cli_reports_usage_errors(capsys):
    assert cases_main(["list", "--suite", "defualt"]) == 2
    assert "did you mean 'default'" in capsys.readouterr().err
    assert cases_main(["suites"]) == 0
    assert "adversarial" in capsys.readouterr().out


def test_cli_runs_as_a_module():
    result = subprocess.run(
        [sys.executable, "-m", "mhc_parity.cases", "list", "--suite", "sharded", "--dtype", "bf16"],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "data=8,fsdp=1" in result.stdout


def test_a_name_or_tag_with_a_trailing_newline_is_refused():
    # `$` matches before a final newline: the whole name must match.
    with pytest.raises(CaseSpecError, match="field 'name'"):
        Case(**{**BASE, "name": "trail\n"})
    with pytest.raises(CaseSpecError, match="tags"):
        Case(**BASE, tags=("smoke\n",))


def test_a_name_longer_than_the_limit_is_refused_with_its_length():
    from mhc_parity.cases.spec import MAX_NAME_LENGTH

    Case(**{**BASE, "name": "a" * MAX_NAME_LENGTH})
    with pytest.raises(CaseSpecError, match=rf"\(100000 characters\).*at most {MAX_NAME_LENGTH}"):
        Case(**{**BASE, "name": "a" * 100_000})


def test_every_case_field_says_what_it_changes():
    """The fixture key (`DATA_FIELDS`) and a compiled program's key (`PROGRAM_FIELDS`) are
    derived from these marks: a field added unmarked would be in neither, and a program
    compiled for one value would be reused for another."""
    from mhc_parity.cases.spec import DATA, LABEL, PLACEMENT, PROGRAM, ROLES

    known = {DATA, PROGRAM, PLACEMENT, LABEL}
    for field in dataclasses.fields(Case):
        roles = field.metadata.get(ROLES)
        assert roles and roles <= known, f"Case.{field.name} is not marked with what it changes ({sorted(known)})"
        assert LABEL not in roles or roles == {LABEL}, f"Case.{field.name}: a label changes nothing else"


def test_the_program_key_follows_the_program_fields_and_nothing_else():
    from mhc_parity.cases.spec import PROGRAM_FIELDS
    from mhc_parity.harness.engine.paths import _trace_signature

    case = catalogue.make_case(streams=4, embedding=128, batch=2, sequence=64)
    signature = _trace_signature(case, "highest")
    changed = {
        "batch": 1,
        "sequence": 32,
        "streams": 3,
        "embedding": 256,
        "dtype": "bfloat16",
        "weight_dtype": "bfloat16",
        "variant": "sinkhorn",
        "branch": "tanh",
        "block_tokens": 32,
        "block_tokens_bwd": 32,
        "block_features": 128,
    }
    assert set(changed) == set(PROGRAM_FIELDS)
    for name, value in changed.items():
        assert _trace_signature(dataclasses.replace(case, **{name: value}), "highest") != signature, name
    for name, value in {"name": "other", "seed": 3, "init": "saturated_gates", "tags": ("x",)}.items():
        assert _trace_signature(dataclasses.replace(case, **{name: value}), "highest") == signature, name
    assert _trace_signature(case, "default") != signature
