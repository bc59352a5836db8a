"""The parity CLI end to end: exit codes, streaming and resume, external implementations."""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

from harness.cli import main as cli_main
from harness.schema import ROW_COLUMNS
from harness.store import RowStore

ROOT = pathlib.Path(__file__).resolve().parent.parent

# Small cases (fast to compile in interpret mode): one unsharded, one on a 2x4 mesh.
CASE_FILE = """
[defaults]
batch = 1
sequence = 16
streams = 2
embedding = 128
dtype = "float32"

[[case]]
name = "cli-a-f32"

[[case]]
name = "cli-b-bf16"
dtype = "bf16"
branch = "tanh"

[[case]]
name = "cli-c-sharded"
batch = 2
sequence = 32
mesh = [2, 4]
block_tokens = 8
"""


@pytest.fixture(scope="module")
def case_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("cases") / "cli_cases.toml"
    path.write_text(CASE_FILE)
    return path


def run_cli(*args, timeout=600):
    env = dict(os.environ)
    return subprocess.run(
        [sys.executable, "-m", "harness", *map(str, args)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout,
    )


def load_jsonl(path):
    return [json.loads(line) for line in pathlib.Path(path).read_text().splitlines()]


@pytest.mark.slow
def test_run_passes_writes_every_format_and_resume_adds_nothing(case_file, tmp_path):
    out = tmp_path / "run"
    proc = run_cli("run", "--case-file", case_file, "--cases", "cli-a-*", "cli-b-*", "--out", out,
                   "--paths", "reference/*", "interpret/*", "lowering/*", "--quiet")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for name in ("rows.jsonl", "rows.csv", "report.json", "report.html", "summary.md"):
        assert (out / name).exists(), name
    assert f"HTML report: {out / 'report.html'}" in proc.stdout
    rows = load_jsonl(out / "rows.jsonl")
    assert {r["case"] for r in rows} == {"cli-a-f32", "cli-b-bf16"}
    assert all(set(r) == set(ROW_COLUMNS) for r in rows)
    assert {r["comparison"] for r in rows} == {"vs_oracle", "vs_reference", "lowering"}
    assert (out / "cases-done.txt").read_text().split() == ["cli-a-f32", "cli-b-bf16"]
    # Resuming a finished run redoes nothing and keeps every row.
    again = run_cli("run", "--case-file", case_file, "--cases", "cli-a-*", "cli-b-*", "--out", out,
                    "--paths", "reference/*", "interpret/*", "lowering/*", "--quiet", "--resume")
    assert again.returncode == 0, again.stderr[-3000:]
    assert load_jsonl(out / "rows.jsonl") == rows


@pytest.mark.slow
def test_resume_after_a_kill_finishes_the_run(case_file, tmp_path):
    out = tmp_path / "killed"
    args = [sys.executable, "-m", "harness", "run", "--case-file", str(case_file), "--out", str(out),
            "--paths", "reference/*", "--no-lowering", "--quiet"]
    proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    done = out / "cases-done.txt"
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        if done.exists() and done.read_text().split():
            break
        time.sleep(0.05)
    assert proc.poll() is None, "the run finished before it could be killed"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    finished = done.read_text().split()
    assert 1 <= len(finished) < 3
    kept = [r for r in load_jsonl(out / "rows.jsonl") if r["case"] in finished]
    # Simulate a kill in the middle of writing a row: a torn last line.
    with (out / "rows.jsonl").open("a") as f:
        f.write('{"case": "cli-c-shar')
    resumed = subprocess.run(args + ["--resume"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    rows = load_jsonl(out / "rows.jsonl")
    assert {r["case"] for r in rows} == {"cli-a-f32", "cli-b-bf16", "cli-c-sharded"}
    assert rows[: len(kept)] == kept  # finished cases were not redone
    assert sorted(done.read_text().split()) == ["cli-a-f32", "cli-b-bf16", "cli-c-sharded"]
    assert {r["comparison"] for r in rows} == {"vs_oracle", "vs_unsharded"}


@pytest.mark.slow
def test_external_implementation_runs_through_the_matrix(case_file, tmp_path):
    out = tmp_path / "external"
    proc = run_cli("run", "--case-file", case_file, "--cases", "cli-a-*", "cli-c-*", "--out", out,
                   "--impl", "tests.external_impls:good", "--paths", "reference/*", "wrapped_reference/*",
                   "--no-lowering", "--quiet")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = load_jsonl(out / "rows.jsonl")
    mine = [r for r in rows if r["candidate"].startswith("wrapped_reference/")]
    assert {r["comparison"] for r in mine} == {"vs_oracle", "vs_reference", "vs_unsharded"}
    assert {r["candidate"] for r in mine} == {"wrapped_reference/unsharded", "wrapped_reference/sharded(data=2,fsdp=4)"}
    assert {r["leaf"] for r in mine} >= {"out", "h_res", "d_x", "d_pre_bias"}
    assert all(r["verdict"] == "pass" for r in mine)


@pytest.mark.slow
def test_a_broken_external_implementation_fails_with_exit_1(case_file, tmp_path):
    out = tmp_path / "broken"
    proc = run_cli("run", "--case-file", case_file, "--cases", "cli-a-*", "--out", out,
                   "--impl", "tests.external_impls:broken", "--paths", "reference/*", "loses_post_gate_factor/*",
                   "--no-lowering", "--quiet")
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    failed = {(r["comparison"], r["leaf"]) for r in load_jsonl(out / "rows.jsonl") if r["verdict"] == "fail"}
    assert ("vs_reference", "out") in failed and ("vs_oracle", "out") in failed
    assert "parity: FAIL" in proc.stdout


@pytest.mark.parametrize(
    "argv, message",
    [
        (["run", "--cases", "no-such-case"], "no-such-case"),
        (["run", "--suite", "no-such-suite"], "no-such-suite"),
        (["run", "--dtype", "float16"], "float16"),
        (["run", "--impl", "not_a_spec"], "module.path:factory"),
        (["run", "--impl", "tests.external_impls:raises"], "factory failed on purpose"),
        (["run", "--impl", "tests.external_impls:missing"], "no callable 'missing'"),
        (["run", "--policy", "no/such/policy.toml"], "policy.toml"),
        (["run", "--case-file", "no/such/cases.toml"], "cases.toml"),
        (["run", "--baseline", "no/such/baseline.csv"], "baseline.csv"),
    ],
)
def test_usage_errors_exit_2_with_a_message(argv, message, tmp_path, capsys):
    assert cli_main(argv + ["--out", str(tmp_path / "out")]) == 2
    assert message in capsys.readouterr().err


def test_unknown_option_exits_2(capsys):
    assert cli_main(["run", "--no-such-option"]) == 2


def test_resume_refuses_a_stream_that_is_not_rows(tmp_path, capsys):
    store = RowStore(tmp_path)
    store.start_fresh()
    (tmp_path / "rows.jsonl").write_text('{"not": "a row"}\n{"x": 1}\n')
    (tmp_path / "cases-done.txt").write_text("x\n")
    assert cli_main(["run", "--cases", "lite-n4-c128-b2s64-f32-w32-identity-default", "--out", str(tmp_path),
                     "--resume"]) == 2
    assert "do not match the row schema" in capsys.readouterr().err
