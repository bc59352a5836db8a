"""One identity for every stored verdict (`mhc_parity.records.identity`), and the refusals it drives:
a gate against a baseline that does not cover the run (issue 66 item 3) or was made on another
backend (item 8), a baseline narrowed by a run of fewer paths (item 4), a resume in another
environment (item 7), a `run --baseline` the gate refuses (issue 68 item 1), and a baseline of
implementations a run did not test (item 8, MaxText not installed)."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest

from mhc_parity.harness.commands.baseline import main as baseline_main
from mhc_parity.harness.commands.gate import gate_parser
from mhc_parity.harness.commands.gate import main as gate_main
from mhc_parity.harness.engine.implementations import BUILTIN
from mhc_parity.harness.engine.run_info import identity_environment
from mhc_parity.harness.engine.store_keys import environment_material
from mhc_parity.records.identity import (
    BUILTIN_IMPLEMENTATIONS,
    ENVIRONMENT_KEYS,
    HOST_ENVIRONMENT_KEYS,
    Selection,
    settings_record,
)
from mhc_parity.records.manifest import read_manifest
from mhc_parity.records.schema import row_key
from mhc_parity.reports import load_baseline, write_baseline
from mhc_parity.reports.gate.baseline_file import BASELINE_FORMAT_VERSION
from mhc_parity.reports.gate.comparability import comparability_refusal
from mhc_parity.reports.gate.judgement import Judgement, judge
from mhc_parity.reports.samples import sample_manifest, sample_rows, write_sample_run
from mhc_parity.reports.sources import LoadedRun, baseline_as_run, load_run
from mhc_parity.reports.terminal import exit_code
from tests.cli_support import assert_one_line, cheap_run_args, run_cli
from tests.support import older_format_copy

# A float32 output row of a case the narrowed baselines below lack, grown x5 over its baseline.
GROWN = ("f32_small", "interpret/unsharded", "reference/unsharded", "out")
SHARDED = "interpret/sharded(data=2,fsdp=4)"


def passing_rows() -> list[dict]:
    return [dict(r) for r in sample_rows() if r["verdict"] in ("pass", "skip", "unsupported")]


def grown(rows: list[dict], factor: float = 5.0) -> list[dict]:
    current = [dict(r) for r in rows]
    for row in current:
        if row_key(row) == GROWN:
            row["cand_oracle_max_err"] *= factor
            row["cand_oracle_rms_err"] *= factor
    return current


def run_folder(folder: Path, rows: list[dict], **manifest_changes) -> Path:
    manifest = dataclasses.replace(sample_manifest(rows, policy_digest="p1"), **manifest_changes)
    write_sample_run(rows, folder, metadata={"policy_hash": "p1"}, manifest=manifest, rendered=False)
    return folder


def gate_code(capsys, baseline: Path, current: Path) -> tuple[int, str, str]:
    code = gate_main(["--baseline", str(baseline), "--current", str(current)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_the_regression_is_caught_against_the_whole_baseline(tmp_path, capsys):
    """The control of the next test: the whole baseline sees the grown row."""
    baseline = run_folder(tmp_path / "whole", passing_rows())
    code, out, _ = gate_code(capsys, baseline, run_folder(tmp_path / "run", grown(passing_rows())))
    assert code == 1 and "regression" in out and GROWN[-1] in out


def test_a_shard_or_a_narrowed_run_cannot_judge_the_cases_it_lacks(tmp_path, capsys):
    """Item 3: one shard or a --cases-narrowed run as the baseline read every other case as new rows (PASS)."""
    current = run_folder(tmp_path / "run", grown(passing_rows()))
    narrow_rows = [r for r in passing_rows() if r["case"] == "bf16_small"]
    narrowed = run_folder(tmp_path / "narrowed", narrow_rows)
    cases = tuple(dict.fromkeys(r["case"] for r in passing_rows()))
    shard = run_folder(tmp_path / "shard", narrow_rows, shard="1/3", shard_of=cases, shard_of_digest="sample")
    as_file = write_baseline(load_run(narrowed), tmp_path / "narrowed.csv")
    for baseline in (narrowed, shard, as_file):
        code, _, err = gate_code(capsys, baseline, current)
        assert_one_line(code, err, "does not cover this run", "f32_small")


def test_a_baseline_without_a_path_cannot_judge_that_path(tmp_path, capsys):
    """Item 4's gate: a baseline of fewer paths read the run's other paths as new rows."""
    current = run_folder(tmp_path / "run", passing_rows())
    fewer = run_folder(tmp_path / "fewer", [r for r in passing_rows() if r["candidate"] != SHARDED])
    code, _, err = gate_code(capsys, fewer, current)
    assert_one_line(code, err, "does not cover this run", "paths interpret/sharded")


def test_a_narrower_run_does_not_overwrite_a_wider_baseline(tmp_path, capsys):
    """Item 4: `baseline --from <run of fewer paths> --to <baseline>` narrowed it, and the gate then passed."""
    target = tmp_path / "baseline.csv"
    assert baseline_main(["--from", str(run_folder(tmp_path / "whole", passing_rows())), "--to", str(target)]) == 0
    before = target.read_bytes()
    fewer = run_folder(tmp_path / "fewer", [r for r in passing_rows() if r["candidate"] != SHARDED])
    capsys.readouterr()
    code = baseline_main(["--from", str(fewer), "--to", str(target)])
    assert_one_line(code, capsys.readouterr().err, "covers more than these rows", "--allow-narrower")
    assert target.read_bytes() == before, "a refused baseline is left as it was"
    assert baseline_main(["--from", str(fewer), "--to", str(target), "--allow-narrower"]) == 0


def test_a_baseline_records_what_it_covers(tmp_path):
    """Format 5 records the implementations, lowering and envelope; format 4 is read with the
    implementations its rows name and the rest unrecorded."""
    run = run_folder(tmp_path / "run", passing_rows())
    path = tmp_path / "b.csv"
    assert baseline_main(["--from", str(run), "--to", str(path)]) == 0
    header = path.read_text().splitlines()[0]
    assert f"format={BASELINE_FORMAT_VERSION} " in header and " implementations=none lowering=yes " in header
    assert load_baseline(path).selection.lowering is True
    committed = Path(__file__).resolve().parents[1] / "baselines" / "tpu-v5e-tpu.csv"
    chip, legacy = load_baseline(committed), load_baseline(older_format_copy(committed, tmp_path / "4.csv", 4))
    assert chip.format_version == BASELINE_FORMAT_VERSION and chip.selection.lowering is False
    assert legacy.format_version == 4 and legacy.selection.lowering is None
    fixed = ("maxtext-kernel-fwd-fixed", "maxtext-layer-kernel-fixed", "maxtext-layer-reference-fixed")
    assert chip.selection.implementations == legacy.selection.implementations == fixed


def test_a_baseline_of_implementations_the_run_did_not_test_judges_the_rest(tmp_path):
    """Item 8: a baseline with built-in and external rows failed a run without the external one
    (e.g. MaxText not installed) on its missing rows; it now judges the rows the run can make."""
    rows = passing_rows()
    external = [dict(r, candidate=r["candidate"].replace("interpret/", "maxtext-x/")) for r in rows]
    external = [r for r in external if r["candidate"].startswith("maxtext-x/")]
    baseline = load_baseline(write_baseline(rows + external, tmp_path / "b.csv", policy_hash="p1"))
    current = load_run(run_folder(tmp_path / "run", grown(rows)))
    judgement = judge(_as_run(baseline), current)
    assert judgement.verdict == "FAIL" and not judgement.result.missing, judgement.refusal
    assert any("maxtext-x: this run did not test them" in line for line in judgement.scope)
    assert [f.key for f in judgement.result.regressions] == [GROWN]
    assert baseline.selection.implementations == ("maxtext-x",)


def test_a_baseline_of_another_backend_is_refused_and_another_chip_noted(tmp_path, capsys):
    """Item 8: the gate compared neither backend nor device kind."""
    rows = passing_rows()
    run = run_folder(tmp_path / "run", rows)
    current = load_run(run)
    current = dataclasses.replace(current, metadata=dict(current.metadata, backend="tpu", device_kind="TPU v6 lite"))
    tpu_rows = dict(backend="tpu", device_kind="TPU v5 lite", matmul_precision="highest=float32")
    base = _as_run(load_baseline(write_baseline(rows, tmp_path / "b.csv", policy_hash="p1")))
    on_cpu = dataclasses.replace(base, metadata={"backend": "cpu", "device_kind": "cpu"})
    assert "made on backend cpu" in judge(on_cpu, current).refusal
    noted = judge(dataclasses.replace(base, metadata=tpu_rows), current)
    assert noted.verdict == "PASS" and "TPU v5 lite" in noted.isa_note and "TPU v6 lite" in noted.isa_note


def test_a_refusal_names_the_command_that_has_its_override(tmp_path):
    """`run --baseline` refuses before the run with the gate's words, which said "or pass
    --allow-policy-change", an option only `mhc-parity gate` has."""
    rows = passing_rows()
    current = load_run(run_folder(tmp_path / "run", rows))
    other_policy = _as_run(load_baseline(write_baseline(rows, tmp_path / "b.csv", policy_hash="p0")))
    on_tpu = dataclasses.replace(current, metadata=dict(current.metadata, backend="tpu", device_kind="TPU v5 lite"))
    on_cpu = dataclasses.replace(other_policy, policy_hash=current.policy_hash, metadata={"backend": "cpu"})
    for refusal, option in (
        (comparability_refusal(other_policy, current), "--allow-policy-change"),
        (comparability_refusal(on_cpu, on_tpu), "--allow-precision-change"),
    ):
        assert f"`mhc-parity gate {option}`" in refusal, refusal
        assert option in gate_parser()._option_string_actions


def test_a_refused_judgement_exits_2():
    """Issue 68 item 1 (in process): a run --baseline that the gate refuses exited 0."""
    refused = Judgement("b.csv", None, refusal="baseline b.csv belongs to implementation 'x'")
    assert exit_code(passing_rows(), refused) == 2


@pytest.fixture(scope="module")
def default_isa_run(case_file, tmp_path_factory):
    """A complete cheap run at XLA's default ISA (its folder)."""
    out = tmp_path_factory.mktemp("default_isa") / "run"
    made = run_cli(*cheap_run_args(case_file, out), env_extra={"XLA_FLAGS": ""})
    assert made.returncode == 0, made.stdout[-2000:] + made.stderr[-2000:]
    return out


def test_run_with_a_baseline_that_cannot_judge_it_exits_2_before_any_case_runs(case_file, tmp_path):
    """Issue 68 item 1: `run --baseline <an implementation's baseline>` exited 0, "not judged";
    then it was refused only once every case had run."""
    out = tmp_path / "run"
    foreign = Path(__file__).resolve().parents[1] / "examples" / "external_kernel" / "baselines" / "my_mhc.csv"
    made = run_cli(*cheap_run_args(case_file, out, "--baseline", foreign))
    assert made.returncode == 2, made.stdout[-2000:] + made.stderr[-2000:]
    assert "--baseline cannot judge this run" in made.stderr and "belongs to implementation 'my_mhc'" in made.stderr
    assert not (out / "manifest.json").exists() and not (out / "rows.jsonl").exists()


def test_resume_in_another_environment_is_refused(case_file, default_isa_run, tmp_path):
    """Item 7: a run resumed under another --xla_cpu_max_isa was continued and labelled with the new ISA."""
    out = tmp_path / "run"
    shutil.copytree(default_isa_run, out)
    resumed = run_cli(*cheap_run_args(case_file, out, "--resume"), env_extra={"XLA_FLAGS": "--xla_cpu_max_isa=SSE4_2"})
    assert resumed.returncode == 2, resumed.stdout[-2000:] + resumed.stderr[-2000:]
    assert "holds another run" in resumed.stderr and "environment xla_cpu_isa" in resumed.stderr
    assert dict(read_manifest(out).environment)["xla_cpu_isa"] != "SSE4_2", "a refused resume changes nothing"


def test_the_identity_names_every_difference_once():
    first = Selection(cases=("a",), paths=("reference/unsharded",), implementations=(), lowering=True)
    manifest = sample_manifest(passing_rows())
    environment = tuple((key, "1") for key in ENVIRONMENT_KEYS)
    before = dataclasses.replace(manifest, environment=environment)
    after = dataclasses.replace(manifest, environment=(*environment[:-1], (ENVIRONMENT_KEYS[-1], "2")))
    assert before.differences(after) == [f"environment {ENVIRONMENT_KEYS[-1]}: 1 -> 2"]
    assert before.differences(before) == []
    assert "environment: the earlier records none" in manifest.differences(before)[0]
    assert first.uncovered(dataclasses.replace(first, cases=("a", "b"))) == ["1 of its 2 cases (b)"]
    assert settings_record({"XLA_FLAGS": "x", "LIBTPU_INIT_ARGS": "y"}) == {"xla_flags": "x", "libtpu_init_args": "y"}


def test_the_built_in_implementations_are_the_engines():
    assert set(BUILTIN) <= set(BUILTIN_IMPLEMENTATIONS)


def test_the_program_stores_key_holds_libtpu_and_its_flags(monkeypatch):
    """Item 8: the program store's key held neither the libtpu version nor LIBTPU_INIT_ARGS."""
    monkeypatch.delenv("LIBTPU_INIT_ARGS", raising=False)
    before, host_before = environment_material(), environment_material(devices=False)
    monkeypatch.setenv("LIBTPU_INIT_ARGS", "--xla_tpu_enable_latency_hiding_scheduler=false")
    assert environment_material() != before and "libtpu_version" in before["identity"]
    assert environment_material(devices=False) != host_before and "libtpu_version" in host_before["identity"]


def test_every_stores_key_holds_the_runs_identity_record():
    """The environment part of every store's key is the record a manifest keeps (what a `--resume`
    compares), the host's part of it for the oracle's answers (computed on the host CPU)."""
    assert environment_material()["identity"] == identity_environment()
    host = environment_material(devices=False)["identity"]
    assert tuple(host) == HOST_ENVIRONMENT_KEYS and set(HOST_ENVIRONMENT_KEYS) < set(ENVIRONMENT_KEYS)
    assert host == {key: identity_environment()[key] for key in HOST_ENVIRONMENT_KEYS}
    assert {"backend", "device_kind", "device_count"}.isdisjoint(host), "the oracle's own process has the CPU alone"


def _as_run(baseline) -> LoadedRun:
    return baseline_as_run(baseline)
