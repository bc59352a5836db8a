"""The fault catalogue and `python -m harness faults` (kill matrix, false-positive sweep).

Fast by design: the full catalogue on the default suite is `make faults`; here every
fault is checked to patch and restore exactly its seam and to leave the other paths
bit-identical, four representative faults (reference, kernel, sharded, custom VJP) are
shown killed on small cases, the unmodified code passes a 2-seed sweep, and the CLI's
exit codes are pinned.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from cases.catalogue import make_case
from harness import faults_cli
from harness.faults import CATALOGUE, FAULTS, Fault, Seam, SeamError, select_faults
from harness.implementations import INTERPRET, REFERENCE
from harness.paths import Path, ProgramCache

# Registry cases the CLI tests select by name. The kernels reject embedding 96 before
# compiling anything (an expected-unsupported case), so only the reference path runs:
# the cheapest case a reference fault can be killed on. The lite one runs both paths.
REFERENCE_ONLY_CASE = "lite-n4-c96-b2s64-f32-w32-identity-default"
LITE_CASE = "lite-n4-c128-b2s64-f32-w32-identity-default"

# Hand-made small cases for in-process runs: one unsharded, one token-sharded over all
# 8 host devices with 16 tokens per shard (2 kernel blocks per shard).
SMALL = make_case(streams=3, batch=1, sequence=32, dtype="float32")
SMALL_SHARDED = make_case(batch=2, sequence=64, dtype="float32", mesh=(2, 4), block_tokens=8)


def _no_op_fault(name="test.no_op") -> Fault:
    """A fault that installs the original value: nothing can catch it."""
    return Fault(
        name=name, seam=Seam("mhc.reference", "compute_sigmoid_gate"),
        description="test-only: patches the reference gate with itself",
        make_replacement=lambda original: original, implementations=("reference",),
    )


# ------------------------------------------------------------------ the catalogue itself


def test_catalogue_covers_the_required_regressions():
    names = set(FAULTS)
    required = {
        "reference.gate_params_bf16", "kernel.gate_params_bf16", "kernel.pre_epsilon_dropped",
        "kernel.post_gate_factor_lost", "kernel.rms_stats_bf16", "kernel.permutation_order_changed",
        "kernel.residual_contraction_transposed", "kernel.weight_grad_not_summed", "kernel.bias_grad_zeroed",
        "kernel.token_block_skipped", "kernel.vjp_bias_grads_swapped",
    }
    assert required <= names
    assert len(names) == len(CATALOGUE), "fault names must be unique"
    for fault in CATALOGUE:
        assert fault.description and fault.seam.module.startswith("mhc.")
        prefix = "reference." if fault.implementations == ("reference",) else "kernel."
        assert fault.name.startswith(prefix), fault.name


@pytest.mark.parametrize("fault", CATALOGUE, ids=lambda f: f.name)
def test_fault_patches_its_seam_and_restores_it(fault):
    owner, attribute = fault.seam.resolve()
    original = getattr(owner, attribute)
    with fault.injected():
        assert getattr(owner, attribute) is not original
    assert getattr(owner, attribute) is original
    with pytest.raises(RuntimeError, match="boom"):
        with fault.injected():
            raise RuntimeError("boom")
    assert getattr(owner, attribute) is original


def test_missing_seam_is_reported_not_patched():
    fault = Fault(name="test.missing", seam=Seam("mhc.reference", "no_such_helper"),
                  description="test", make_replacement=lambda original: original)
    with pytest.raises(SeamError, match="no_such_helper"):
        with fault.injected():
            pass


def test_select_faults_by_glob():
    assert [f.name for f in select_faults(["kernel.vjp_*"])] == ["kernel.vjp_bias_grads_swapped"]
    assert len(select_faults(None)) == len(CATALOGUE)
    with pytest.raises(KeyError, match="no fault matches"):
        select_faults(["kernel.no_such_*"])


def test_fault_scope_by_path_and_case():
    sharded_fault = FAULTS["kernel.weight_grad_not_summed"]
    assert sharded_fault.affects_path(Path(INTERPRET, (2, 4)))
    assert not sharded_fault.affects_path(Path(INTERPRET, None))
    assert not sharded_fault.affects_case(SMALL) and sharded_fault.affects_case(SMALL_SHARDED)
    kernel_fault, reference_fault = FAULTS["kernel.gate_params_bf16"], FAULTS["reference.gate_params_bf16"]
    assert not kernel_fault.affects_path(Path(REFERENCE, None))
    assert not reference_fault.affects_path(Path(INTERPRET, None))
    sinkhorn = make_case(variant="sinkhorn")
    assert reference_fault.affects_case(sinkhorn) and not kernel_fault.affects_case(sinkhorn)
    assert not kernel_fault.affects_case(make_case(embedding=96, expect_reason="multiple of 128"))


# --------------------------------------------------------- each fault touches its path only


@pytest.fixture(scope="module")
def clean_outputs():
    """Leaves of the unmodified code: SMALL on both unsharded paths, SMALL_SHARDED on interpret."""
    from cases.fixtures import make_fixture

    cache = ProgramCache()
    runs = {
        "reference": (Path(REFERENCE, None), SMALL),
        "interpret": (Path(INTERPRET, None), SMALL),
        "interpret_unsharded_big": (Path(INTERPRET, None), SMALL_SHARDED),
    }
    return {key: cache.run(path, case, make_fixture(case)).leaves for key, (path, case) in runs.items()}


def _assert_bit_identical(leaves, expected, what):
    assert leaves.keys() == expected.keys()
    for name, value in leaves.items():
        np.testing.assert_array_equal(value, expected[name], err_msg=f"{what}: leaf {name} changed")


@pytest.mark.parametrize("fault", CATALOGUE, ids=lambda f: f.name)
def test_fault_leaves_the_paths_it_does_not_name_bit_identical(fault, clean_outputs):
    """A reference fault must not change the kernels, a kernel fault not the reference,
    a sharded-only fault not the unsharded kernel path."""
    from cases.fixtures import make_fixture

    if fault.sharded_only:
        path, case, key = Path(INTERPRET, None), SMALL_SHARDED, "interpret_unsharded_big"
    elif fault.affects_path(Path(REFERENCE, None)):
        path, case, key = Path(INTERPRET, None), SMALL, "interpret"
    else:
        path, case, key = Path(REFERENCE, None), SMALL, "reference"
    assert not fault.affects_path(path)
    with fault.injected():
        leaves = ProgramCache().run(path, case, make_fixture(case)).leaves
    _assert_bit_identical(leaves, clean_outputs[key], f"{fault.name} on {path.name}")


# ------------------------------------------------------------------ kills on small cases

REPRESENTATIVE_FAULTS = (
    "reference.gate_params_bf16",     # reference path, forward numerics
    "kernel.token_block_skipped",     # kernel forward
    "kernel.weight_grad_not_summed",  # token-sharded gradient reduction
    "kernel.vjp_bias_grads_swapped",  # custom VJP
)


@pytest.fixture(scope="module")
def representative_kills():
    from harness.policy import load_policy

    policy = load_policy(None)
    shared, memo = faults_cli._SharedInputs(), {}
    cases = [SMALL, SMALL_SHARDED]
    clean_rows = faults_cli.run_clean_pass(cases, policy, shared, memo, quiet=True)
    results = {}
    for name in REPRESENTATIVE_FAULTS:
        fault = FAULTS[name]
        targets = [c for c in cases if fault.affects_case(c)]
        rows = faults_cli.run_fault_pass(fault, targets, policy, shared, memo)
        results[name] = faults_cli.judge_fault(fault, rows, clean_rows, [c.name for c in targets], 0.0)
    return results


@pytest.mark.parametrize("name", REPRESENTATIVE_FAULTS)
def test_representative_fault_is_killed(name, representative_kills):
    result = representative_kills[name]
    assert result.killed, f"{name} survived"
    assert result.margin > 1 or result.only_errors


def test_kills_land_on_the_leaves_the_fault_models(representative_kills):
    def caught(name, comparison):
        return {c.leaf for c in representative_kills[name].catches if c.comparison == comparison}

    assert {"h_pre", "h_post", "layer_input"} & caught("reference.gate_params_bf16", "vs_oracle")
    assert {"d_pre_bias", "d_post_bias"} <= caught("kernel.vjp_bias_grads_swapped", "vs_reference")
    assert "d_x" not in caught("kernel.vjp_bias_grads_swapped", "vs_reference")
    not_summed = caught("kernel.weight_grad_not_summed", "vs_unsharded")
    assert {"d_pre_alpha", "d_pre_bias", "d_res_scale"} <= not_summed
    assert not not_summed & {"out", "d_x", "h_pre"}, "only weight gradients may change"
    assert representative_kills["kernel.weight_grad_not_summed"].cases_run == (SMALL_SHARDED.name,)
    assert "out" in caught("kernel.token_block_skipped", "vs_reference")


# -------------------------------------------------------------------- judging, headroom


def _row(verdict, usage=0.5, leaf="h_pre", comparison="vs_oracle", case="c", candidate="reference/unsharded"):
    return {"case": case, "candidate": candidate, "partner": "oracle", "leaf": leaf, "comparison": comparison,
            "leaf_kind": "intermediate", "dtype": "float32", "verdict": verdict, "bound_usage": usage,
            "reason": "", "bound": "b"}


def test_rows_failing_on_clean_code_are_not_evidence():
    fault = _no_op_fault()
    clean = [_row("pass", leaf="h_pre"), _row("fail", 3.0, leaf="h_post"), _row("pass", leaf="out")]
    faulted = [_row("fail", 40.0, leaf="h_pre"), _row("fail", 9.0, leaf="h_post"), _row("error", math.nan, leaf="out")]
    result = faults_cli.judge_fault(fault, faulted, clean, ["c"], 1.0)
    assert result.killed and result.ignored_clean_failures == 1
    assert {c.leaf for c in result.catches} == {"h_pre", "out"}
    assert result.margin == 40.0 and result.margin_text == "40.00x (+errors)"
    survived = faults_cli.judge_fault(fault, [_row("fail", 9.0, leaf="h_post")], clean, ["c"], 1.0)
    assert survived.status == "survived"
    assert faults_cli.judge_fault(fault, [], clean, [], 0.0).status == "not exercised"


def test_headroom_is_the_largest_passing_usage_per_group():
    rows = [_row("pass", 0.2), _row("pass", 0.7, case="d"), _row("fail", 5.0), _row("skip", math.nan),
            _row("pass", 0.1, comparison="vs_reference", candidate="interpret/unsharded")]
    table = {(h.comparison, h.dtype, h.leaf_kind): h for h in faults_cli.headroom_table(rows)}
    oracle = table[("vs_oracle", "float32", "intermediate")]
    assert (oracle.passing_rows, oracle.failing_rows, oracle.max_bound_usage, oracle.worst_case) == (2, 1, 0.7, "d")
    assert table[("vs_reference", "float32", "intermediate")].max_bound_usage == 0.1


def test_seeded_cases_are_renamed_and_reseeded():
    seeded = faults_cli.seeded_cases([SMALL], 3)
    assert [c.seed for c in seeded] == [0, 1, 2]
    assert [c.name for c in seeded] == [f"{SMALL.name}-seed{s}" for s in range(3)]


# ------------------------------------------------------------------------------- the CLI


def _main(argv, **kwargs):
    return faults_cli.main(argv, **kwargs)


def test_cli_exits_1_when_a_fault_survives(tmp_path, capsys):
    catalogue = (_no_op_fault(), FAULTS["reference.post_gate_factor_lost"])
    code = _main(["--cases", REFERENCE_ONLY_CASE, "--out", str(tmp_path), "--quiet"], catalogue=catalogue)
    assert code == 1
    document = json.loads((tmp_path / "kill_matrix.json").read_text())
    assert document["survivors"] == ["test.no_op"] and document["killed"] == 1
    assert "test.no_op" in capsys.readouterr().out
    markdown = (tmp_path / "kill_matrix.md").read_text()
    assert "| `reference.post_gate_factor_lost` |" in markdown and "## Surviving faults" in markdown
    header = (tmp_path / "kill_matrix.csv").read_text().splitlines()[0]
    assert header.startswith("fault,seam,status,comparison,leaf")


def test_cli_exits_0_when_every_fault_is_killed(tmp_path):
    code = _main(["--cases", REFERENCE_ONLY_CASE, "--faults", "reference.post_gate_*", "reference.residual_*",
                  "--out", str(tmp_path), "--quiet"])
    assert code == 0
    document = json.loads((tmp_path / "kill_matrix.json").read_text())
    assert document["killed"] == document["faults"] == 2


@pytest.mark.parametrize("argv", [
    ["--faults", "kernel.no_such_fault"],
    ["--cases", "no-such-case-*"],
    ["--seeds", "0"],
    ["--seeds", "2", "--faults", "kernel.*"],
    ["--no-such-option"],
])
def test_cli_usage_errors_exit_2(argv, tmp_path):
    assert _main(argv + ["--out", str(tmp_path)]) == 2


def test_unmodified_code_passes_a_two_seed_sweep(tmp_path, capsys):
    code = _main(["--seeds", "2", "--cases", LITE_CASE, "--out", str(tmp_path), "--quiet"])
    printed = capsys.readouterr().out
    assert code == 0, printed
    document = json.loads((tmp_path / "sweep.json").read_text())
    assert document["failing_rows"] == 0 and document["seeds"] == 2
    usages = [h["max_bound_usage"] for h in document["headroom"] if h["max_bound_usage"] is not None]
    assert usages and all(u <= 1 for u in usages)
    assert (tmp_path / "headroom.csv").exists() and (tmp_path / "sweep.md").exists()
