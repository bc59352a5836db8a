"""No stale, partial or mistyped run can pass: the run manifest, honest exit codes, the gate
on partial runs. Each test drives the CLI in a subprocess, as a user or CI does, but those of
configuration errors refused while the command reads its options (run in this process).

The runs use the cheapest cases (tests/cli_support.py): three tiny cases through the
reference paths only, or the registry case where only the reference path runs. Tests
that share the finished run are kept on one xdist worker.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import time

import pytest

from mhc_parity.records.manifest import read_manifest, write_manifest
from mhc_parity.reports.gate.baseline_file import BASELINE_COLUMNS
from tests.cli_support import (
    CASE_NAMES,
    REFERENCE_ONLY_CASE,
    ROOT,
    assert_one_line_error,
    harness_command,
    load_jsonl,
    run_cli,
    without_timing,
)

SHARED = pytest.mark.xdist_group("finished_run")
CHEAP_PATHS = ("--paths", "reference/*", "--no-lowering")


def run_args(case_file, out, *extra) -> list[str]:
    return ["run", "--case-file", case_file, *CHEAP_PATHS, "--out", out, *extra]


@pytest.fixture(scope="module")
def finished(case_file, tmp_path_factory):
    """An uninterrupted run of the three cases (with a 0.2 s heartbeat) and its baseline."""
    root = tmp_path_factory.mktemp("finished")
    out, baseline = root / "run", root / "baseline.csv"
    proc = run_cli(*run_args(case_file, out, "--heartbeat", "0.2"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    made = run_cli("baseline", "--from", out, "--to", baseline)
    assert made.returncode == 0, made.stderr
    return {"out": out, "baseline": baseline, "stderr": proc.stderr, "rows": load_jsonl(out / "rows.jsonl")}


def start_run(case_file, out, cold_cache) -> subprocess.Popen:
    """A run to stop mid-way, started the way a parent that ignores SIGINT starts it (as
    pytest-xdist workers were seen to): the run must handle Ctrl-C itself. With the caches
    warm its last cases take well under a second, so under load the run could end before
    the signal lands; an empty cache folder (`cold_cache`) makes each case compute its oracle."""
    env = {**os.environ, "MHC_PARITY_CACHE": str(cold_cache)}
    command = shlex.join(map(str, harness_command(*run_args(case_file, out, "--quiet"))))
    return subprocess.Popen(
        ["sh", "-c", f"trap '' INT; exec {command}"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for_finished_cases(proc: subprocess.Popen, out, since_ns: int, timeout: float = 300) -> None:
    """Until this run has finished a case and is still running (cases-done.txt written after `since_ns`)."""
    done = out / "cases-done.txt"
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        if done.exists() and done.stat().st_mtime_ns > since_ns and done.read_text().split():
            return
        time.sleep(0.02)
    raise AssertionError(f"the run ended (exit {proc.poll()}) before it could be stopped mid-way")


# ------------------------------------------------------------------ 1. stale reports


@SHARED
@pytest.mark.slow
def test_kill_9_mid_run_then_gate_refuses_and_resume_matches_an_uninterrupted_run(case_file, finished, tmp_path):
    out = tmp_path / "used"
    shutil.copytree(finished["out"], out)  # an earlier complete run: its reports would pass
    since = time.time_ns()
    proc = start_run(case_file, out, tmp_path / "cold-cache")
    wait_for_finished_cases(proc, out, since)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert 1 <= len((out / "cases-done.txt").read_text().split()) < len(CASE_NAMES)

    for current in (out, out / "rows.jsonl"):
        gate = run_cli("gate", "--baseline", finished["baseline"], "--current", current)
        assert_one_line_error(gate, "unfinished run", "--resume")
    assert not (out / "report.json").exists(), "a fresh run removes the earlier run's reports"
    made = run_cli("baseline", "--from", out, "--to", tmp_path / "b.csv")
    assert_one_line_error(made, "unfinished run")

    with (out / "rows.jsonl").open("a") as stream:  # as if killed in the middle of a row
        stream.write('{"case": "cli-c-shar')
    resumed = run_cli(*run_args(case_file, out, "--quiet", "--resume"))
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert without_timing(load_jsonl(out / "rows.jsonl")) == without_timing(finished["rows"])
    assert read_manifest(out).is_complete
    gate = run_cli("gate", "--baseline", finished["baseline"], "--current", out)
    assert gate.returncode == 0 and "gate PASS" in gate.stdout, gate.stdout + gate.stderr


@pytest.mark.slow
def test_ctrl_c_exits_130_says_how_to_resume_and_the_gate_refuses(case_file, tmp_path):
    out = tmp_path / "interrupted"
    since = time.time_ns()
    proc = start_run(case_file, out, tmp_path / "cold-cache")
    wait_for_finished_cases(proc, out, since)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 130, stderr[-3000:]
    assert "Traceback" not in stderr and "--resume" in stderr
    manifest = read_manifest(out)
    assert manifest.state == "interrupted" and manifest.reason == "SIGINT"
    gate = run_cli("gate", "--baseline", ROOT / "baselines" / "default.csv", "--current", out)
    assert_one_line_error(gate, "interrupted (SIGINT)")


# ------------------------------------------------------------------ 2. selections that select nothing


def test_a_mistyped_paths_glob_is_a_usage_error_with_a_hint(tmp_path):
    proc = run_cli("run", "--cases", REFERENCE_ONLY_CASE, "--paths", "interpet/*", "--out", tmp_path / "out")
    assert_one_line_error(proc, "'interpet/*' selects no path", "did you mean 'interpret/*'")
    assert not (tmp_path / "out" / "manifest.json").exists()


@pytest.mark.slow
def test_a_run_that_compares_nothing_never_passes(tmp_path):
    # Off a TPU the mosaic path is a skip: every row is skip, nothing is compared.
    proc = run_cli(
        "run",
        "--cases",
        REFERENCE_ONLY_CASE,
        "--paths",
        "mosaic/*",
        "--no-lowering",
        "--quiet",
        "--out",
        tmp_path / "out",
    )
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "PASS" not in proc.stdout and "parity: NOTHING COMPARED" in proc.stdout
    assert "nothing was compared" in proc.stderr and "Traceback" not in proc.stderr


# ------------------------------------------------------------------ 3. --resume checks the run


@SHARED
@pytest.mark.slow
def test_resume_refuses_another_selection_policy_or_code(case_file, finished, tmp_path):
    out = tmp_path / "resumed"
    shutil.copytree(finished["out"], out)
    policy = tmp_path / "policy.toml"
    policy.write_text((ROOT / "mhc_parity" / "harness" / "judging" / "tolerances.toml").read_text() + "\n# edited\n")
    other = run_cli(
        "run",
        "--case-file",
        case_file,
        "--cases",
        "cli-a-*",
        "--paths",
        "reference/unsharded",
        "--no-lowering",
        "--seed",
        "5",
        "--policy",
        policy,
        "--out",
        out,
        "--resume",
    )
    assert_one_line_error(
        other,
        "holds another run",
        "cases: 3 -> 1 cases",
        "paths: ['reference/*'] -> ['reference/unsharded']",
        "seed: None -> 5",
        "policy:",
    )
    assert load_jsonl(out / "rows.jsonl") == finished["rows"], "a refused resume changes nothing"

    # As if mhc_parity/mhc/layer.py had been edited since the run: its recorded hash no longer matches.
    manifest = read_manifest(out)
    files = dict(manifest.code_files, **{"mhc_parity/mhc/layer.py": "0" * 64})
    edited_manifest = dataclasses.replace(manifest, code_files=tuple(files.items()), code_digest="edited")
    write_manifest(out, edited_manifest)
    report = json.loads((out / "report.json").read_text())
    report["manifest"] = edited_manifest.to_json()
    (out / "report.json").write_text(json.dumps(report))
    edited = run_cli(*run_args(case_file, out, "--resume"))
    assert_one_line_error(edited, "code under test: mhc_parity/mhc/layer.py changed")
    # The same stale run no longer passes the gate either (the code it measured is gone).
    gate = run_cli("gate", "--baseline", finished["baseline"], "--current", out)
    assert_one_line_error(gate, "other code than this checkout", "mhc_parity/mhc/layer.py")
    allowed = run_cli("gate", "--baseline", finished["baseline"], "--current", out, "--allow-code-change")
    assert allowed.returncode == 0, allowed.stderr


# ------------------------------------------------------------------ 4. configuration errors exit 2


MINIMAL_POLICY = """
version = 2
[[rule]]
comparison = "vs_oracle"
dtype = "*"
leaf_kind = "output"
kind = "ulps_of_max"
max_rel_ulps = 4
rationale = "a policy that forgot every other leaf kind"
"""


@pytest.mark.parametrize(
    "argv, fragments",
    [
        (["run", "--out", "{file}/sub"], ["--out", "Not a directory"]),
        (["run", "--impl", "broken_syntax:factory"], ["'broken_syntax' failed at ", "broken_syntax.py:1: SyntaxError"]),
        (
            ["run", "--impl", "raises_on_import:factory"],
            ["'raises_on_import' failed at ", "raises_on_import.py:1: RuntimeError"],
        ),
        (["run", "--policy", "{policy}"], ["cannot judge", "no tolerance rule", "leaf_kind=intermediate"]),
        (["run", "--seed", "-1"], ["--seed must be an integer in [0,"]),
        (
            ["run", "--impl", "tests.external_impls:good", "--impl", "tests.external_impls:good"],
            ["given more than once"],
        ),
    ],
    ids=[
        "unwritable-out",
        "impl-syntax-error",
        "impl-import-exception",
        "policy-without-rule",
        "negative-seed",
        "duplicate-impl",
    ],
)
@pytest.mark.slow
def test_run_configuration_errors_exit_2_before_any_compute(argv, fragments, tmp_path, monkeypatch, capsys):
    """In this process (`mhc_parity.harness.cli.main`, the command's own entry): each is refused
    while the command reads its options, before a process of its own would matter; the
    implementations' modules are imported from `tmp_path` put first on sys.path, as the
    command's PYTHONPATH did."""
    from mhc_parity.harness.cli import main as cli_main
    from tests.cli_support import assert_one_line

    (tmp_path / "file").write_text("")
    (tmp_path / "broken_syntax.py").write_text("def factory(:\n")
    (tmp_path / "raises_on_import.py").write_text("raise RuntimeError('not configured')\n")
    (tmp_path / "policy.toml").write_text(MINIMAL_POLICY)
    monkeypatch.syspath_prepend(str(tmp_path))
    out = tmp_path / "out"
    argv = [a.format(file=tmp_path / "file", policy=tmp_path / "policy.toml") for a in argv]
    if "--out" not in argv:
        argv += ["--out", str(out)]
    code = cli_main([*argv, "--cases", REFERENCE_ONLY_CASE, *CHEAP_PATHS])
    assert_one_line(code, capsys.readouterr().err, *fragments)
    assert not (out / "manifest.json").exists(), "refused before the run started"


@pytest.mark.slow
@SHARED
@pytest.mark.parametrize("command", ["baseline", "gate"])
def test_unwritable_baseline_or_markdown_target_exits_2(command, finished, tmp_path):
    (tmp_path / "file").write_text("")
    target = tmp_path / "file" / "out.txt"
    if command == "baseline":
        proc = run_cli("baseline", "--from", finished["out"], "--to", target)
    else:
        proc = run_cli("gate", "--baseline", finished["baseline"], "--current", finished["out"], "--markdown", target)
    assert_one_line_error(proc, "cannot write file", "is a file, not a folder")


# ------------------------------------------------------------------ 5. partial runs, strict baselines, heartbeat


@SHARED
@pytest.mark.slow
def test_a_partial_run_gets_a_missing_summary_and_can_gate_its_own_cases(case_file, finished, tmp_path):
    out = tmp_path / "partial"
    proc = run_cli(*run_args(case_file, out, "--quiet", "--cases", "cli-a-*"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    gate = run_cli("gate", "--baseline", finished["baseline"], "--current", out)
    assert gate.returncode == 1, gate.stdout + gate.stderr
    missing = sum(r["case"] != "cli-a-f32" for r in finished["rows"])
    assert f"missing ({missing} rows in 2 cases, 2 case/path groups):" in gate.stdout
    assert "cli-b-bf16     (every path)" in gate.stdout and "--only-current-cases" in gate.stdout
    assert len(gate.stdout.splitlines()) < missing, "one line per case and path, not per row"
    only = run_cli("gate", "--baseline", finished["baseline"], "--current", out, "--only-current-cases")
    assert only.returncode == 0, only.stdout + only.stderr
    assert "gating only the current run's cases: 1 of 3 baseline cases" in only.stdout


@pytest.mark.slow
@SHARED
@pytest.mark.parametrize("keep_line_ending", [True, False], ids=["malformed-number", "cut-file"])
def test_a_baseline_cut_in_its_last_number_is_rejected(keep_line_ending, finished, tmp_path):
    text = finished["baseline"].read_text()
    body, last = text.rstrip("\n").rsplit("\n", 1)
    number = last.rsplit(",", 1)[1]
    assert "." in number, number
    cut = tmp_path / "cut.csv"
    cut.write_text(
        body + "\n" + last[: len(last) - len(number)] + number.split(".")[0] + "." + ("\n" if keep_line_ending else "")
    )
    line = text.count("\n")
    gate = run_cli("gate", "--baseline", cut, "--current", finished["out"])
    assert_one_line_error(gate, f"line {line}, column {BASELINE_COLUMNS[-1]!r}", "is not a complete number")


@pytest.mark.slow
@SHARED
def test_without_a_terminal_a_heartbeat_names_the_running_case_and_path(case_file, tmp_path):
    # From an empty cache folder, so that a case takes longer than the 0.2 s heartbeat
    # (with stored programs and oracle answers a case can finish in milliseconds).
    proc = run_cli(
        *run_args(case_file, tmp_path / "run", "--heartbeat", "0.2", "--cases", "cli-a-f32"),
        env_extra={"MHC_PARITY_CACHE": str(tmp_path / "cold-cache")},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    beats = [line for line in proc.stderr.splitlines() if line.startswith("... still running ")]
    assert beats, proc.stderr[-2000:]
    step = r"(fixture|oracle|compiling programs|lowering|compile|(reference|interpret)/unsharded)"
    # Before the case reports its first step (a beat can land there under load), it is "starting".
    pattern = re.compile(rf"\.\.\. still running (starting|{step}) for \d+s: case cli-a-f32 \(0/1 cases done\)")
    assert any("starting" not in line for line in beats), beats
    assert all(pattern.fullmatch(line) for line in beats), beats
