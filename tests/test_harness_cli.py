"""The parity CLI end to end: exit codes, streaming and resume, external implementations."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from mhc_parity.harness.cli import main as cli_main
from mhc_parity.records.schema import ROW_COLUMNS
from mhc_parity.records.store import RowStore
from mhc_parity.reports.samples import write_sample_run
from tests.cli_support import BROKEN_IMPL_RUN, load_jsonl, run_cli


@pytest.mark.slow
def test_run_passes_writes_every_format_and_resume_adds_nothing(case_file, tmp_path):
    out = tmp_path / "run"
    proc = run_cli(
        "run",
        "--case-file",
        case_file,
        "--cases",
        "cli-a-*",
        "cli-b-*",
        "--out",
        out,
        "--paths",
        "reference/*",
        "interpret/*",
        "lowering/*",
        "--quiet",
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for name in ("manifest.json", "rows.jsonl", "rows.csv", "report.json", "report.html", "summary.md"):
        assert (out / name).exists(), name
    assert f"HTML report: {out / 'report.html'}" in proc.stdout
    rows = load_jsonl(out / "rows.jsonl")
    assert {r["case"] for r in rows} == {"cli-a-f32", "cli-b-bf16"}
    assert all(set(r) == set(ROW_COLUMNS) for r in rows)
    assert {r["comparison"] for r in rows} == {"vs_oracle", "vs_reference", "lowering"}
    assert (out / "cases-done.txt").read_text().split() == ["cli-a-f32", "cli-b-bf16"]
    # Resuming a finished run redoes nothing and keeps every row.
    again = run_cli(
        "run",
        "--case-file",
        case_file,
        "--cases",
        "cli-a-*",
        "cli-b-*",
        "--out",
        out,
        "--paths",
        "reference/*",
        "interpret/*",
        "lowering/*",
        "--quiet",
        "--resume",
    )
    assert again.returncode == 0, again.stderr[-3000:]
    assert load_jsonl(out / "rows.jsonl") == rows


@pytest.mark.slow
def test_external_implementation_runs_through_the_matrix(case_file, tmp_path):
    out = tmp_path / "external"
    proc = run_cli(
        "run",
        "--case-file",
        case_file,
        "--cases",
        "cli-a-*",
        "cli-c-*",
        "--out",
        out,
        "--impl",
        "tests.external_impls:good",
        "--paths",
        "reference/*",
        "wrapped_reference/*",
        "--no-lowering",
        "--quiet",
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = load_jsonl(out / "rows.jsonl")
    mine = [r for r in rows if r["candidate"].startswith("wrapped_reference/")]
    assert {r["comparison"] for r in mine} == {"vs_oracle", "vs_reference", "vs_unsharded"}
    assert {r["candidate"] for r in mine} == {"wrapped_reference/unsharded", "wrapped_reference/sharded(data=2,fsdp=4)"}
    assert {r["leaf"] for r in mine} >= {"out", "h_res", "d_x", "d_pre_bias"}
    assert all(r["verdict"] == "pass" for r in mine)


@pytest.mark.slow
def test_a_broken_external_implementation_fails_with_exit_1(case_file, tmp_path):
    """`--no-causes`: the failing rows' cause search (most of a failing run's time) does not
    change a verdict or the exit code (`run --help`); the tests of causes run it."""
    out = tmp_path / "broken"
    proc = run_cli(
        "run",
        "--case-file",
        case_file,
        "--out",
        out,
        *BROKEN_IMPL_RUN,
        "--no-causes",
    )
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
        (["run", "--heartbeat", "0"], "--heartbeat: must be a finite number of seconds > 0"),
        (["run", "--heartbeat", "inf"], "--heartbeat: must be a finite number of seconds > 0"),
        (["run", "--heartbeat", "nan"], "--heartbeat: must be a finite number of seconds > 0"),
    ],
)
def test_usage_errors_exit_2_with_a_message(argv, message, tmp_path, capsys):
    assert cli_main(argv + ["--out", str(tmp_path / "out")]) == 2
    assert message in capsys.readouterr().err


def test_unknown_option_exits_2(capsys):
    assert cli_main(["run", "--no-such-option"]) == 2


def test_resume_refuses_rows_without_a_manifest(tmp_path, capsys):
    store = RowStore(tmp_path)
    store.start_fresh()
    (tmp_path / "rows.jsonl").write_text('{"not": "a row"}\n{"x": 1}\n')
    (tmp_path / "cases-done.txt").write_text("x\n")
    assert (
        cli_main(["run", "--cases", "lite-n4-c128-b2s64-f32-w32-identity-default", "--out", str(tmp_path), "--resume"])
        == 2
    )
    assert "holds rows but no manifest.json" in capsys.readouterr().err


def test_resume_refuses_a_stream_that_is_not_rows(tmp_path):
    store = RowStore(tmp_path)
    store.start_fresh()
    (tmp_path / "rows.jsonl").write_text('{"not": "a row"}\n{"x": 1}\n')
    (tmp_path / "cases-done.txt").write_text("x\n")
    with pytest.raises(ValueError, match="do not match the row schema"):
        store.finished()


@pytest.mark.slow
def test_a_policy_gap_the_plan_missed_stops_the_run_as_a_configuration_error(tmp_path, capsys, monkeypatch):
    """The backstop behind the up-front coverage check: judging a leaf without a rule
    stops the run with exit 2 and an interrupted manifest, never a traceback or exit 1."""
    import mhc_parity.harness.engine.selection
    from mhc_parity.records.manifest import read_manifest
    from tests.cli_support import REFERENCE_ONLY_CASE

    monkeypatch.setattr(mhc_parity.harness.engine.selection, "uncovered_judgements", lambda policy, cases, plan: [])
    policy = tmp_path / "policy.toml"
    policy.write_text(
        'version = 2\n[[rule]]\ncomparison = "vs_oracle"\ndtype = "*"\nleaf_kind = "output"\n'
        'kind = "ulps_of_max"\nmax_rel_ulps = 4\nrationale = "only outputs"\n'
    )
    out = tmp_path / "out"
    code = cli_main(
        [
            "run",
            "--cases",
            REFERENCE_ONLY_CASE,
            "--paths",
            "reference/*",
            "--no-lowering",
            "--quiet",
            "--policy",
            str(policy),
            "--out",
            str(out),
        ]
    )
    assert code == 2
    assert "no tolerance rule" in capsys.readouterr().err
    manifest = read_manifest(out)
    assert manifest.state == "interrupted" and manifest.reason.startswith("configuration error")


def test_the_command_line_lists_its_commands_and_refuses_an_unknown_one(capsys):
    assert cli_main(["--help"]) == 0
    listing = capsys.readouterr().out
    assert all(command in listing for command in ("run", "gate", "baseline", "render", "policy", "faults"))
    assert cli_main([]) == 2
    assert cli_main(["bless"]) == 2
    assert "unknown command 'bless'" in capsys.readouterr().err


def test_the_baseline_command_refuses_an_empty_run(tmp_path, capsys):
    write_sample_run([], tmp_path / "run", rendered=False)
    assert cli_main(["baseline", "--from", str(tmp_path / "run"), "--to", str(tmp_path / "b.csv")]) == 2
    assert "refusing to write an empty baseline" in capsys.readouterr().err
    assert not (tmp_path / "b.csv").exists()


def test_a_second_run_into_a_folder_being_written_exits_2_naming_the_holder(tmp_path):
    from mhc_parity.records.outputs import WRITER_LOCK_FILE, WriterLock
    from tests.cli_support import REFERENCE_ONLY_CASE

    out = tmp_path / "out"
    with WriterLock(out, "the first run"):
        second = run_cli(
            "run", "--cases", REFERENCE_ONLY_CASE, "--paths", "reference/*", "--no-lowering", "--out", out, "--quiet"
        )
        assert second.returncode == 2, second.stdout[-2000:] + second.stderr[-2000:]
        assert "being written by another run (pid" in second.stderr and "the first run" in second.stderr
        assert len(second.stderr.strip().splitlines()) == 1
        assert not (out / "manifest.json").exists()  # refused before it wrote anything
    # Released (as it is when its process dies): the run goes ahead and records itself as the holder.
    third = run_cli(
        "run", "--cases", REFERENCE_ONLY_CASE, "--paths", "reference/*", "--no-lowering", "--out", out, "--quiet"
    )
    assert third.returncode == 0, third.stdout[-2000:] + third.stderr[-2000:]
    assert "mhc-parity run" in (out / WRITER_LOCK_FILE).read_text()


def test_the_api_refuses_to_write_reports_into_a_folder_being_written(tmp_path):
    from mhc_parity.harness.api import ParityRun
    from mhc_parity.harness.errors import ReportError
    from mhc_parity.records.outputs import WriterLock

    run = ParityRun.__new__(ParityRun)  # only write_reports' refusal is exercised: nothing is written
    object.__setattr__(run, "manifest", type("M", (), {"command_line": "test"})())
    with WriterLock(tmp_path, "another writer"), pytest.raises(ReportError, match="another writer"):
        run.write_reports(tmp_path)


def _reference_only_run_args(out) -> tuple:
    from tests.cli_support import REFERENCE_ONLY_CASE

    return ("run", "--cases", REFERENCE_ONLY_CASE, "--paths", "reference/*", "--no-lowering", "--out", out, "--quiet")


@pytest.fixture(scope="module")
def complete_reference_only_run(tmp_path_factory):
    """A complete run of the cheapest case, made once: each test edits its own copy."""
    out = tmp_path_factory.mktemp("complete") / "out"
    proc = run_cli(*_reference_only_run_args(out))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return out


@pytest.mark.parametrize("edit", ["cut", "duplicated"])
def test_resume_of_a_complete_run_refuses_a_stream_its_manifest_did_not_count(
    complete_reference_only_run, tmp_path, edit
):
    import shutil

    out = tmp_path / "out"
    shutil.copytree(complete_reference_only_run, out)
    args = _reference_only_run_args(out)
    stream = out / "rows.jsonl"
    lines = stream.read_text().splitlines(keepends=True)
    stream.write_text("".join(lines[: len(lines) // 2] if edit == "cut" else lines + lines[1:11]))
    resumed = run_cli(*args, "--resume")
    assert resumed.returncode == 2, resumed.stdout[-2000:] + resumed.stderr[-2000:]
    assert "its row stream does not match its manifest" in resumed.stderr


# ----------------------------------------------------- hostile inputs: the lock, --heartbeat, a closed pipe


def _planted_lock(out, target, how: str) -> None:
    """`out`'s writer lock made a link to `target` (or a file of someone else's), as a hostile
    folder could hold."""
    from mhc_parity.records.outputs import WRITER_LOCK_FILE

    out.mkdir()
    lock = out / WRITER_LOCK_FILE
    if how == "symlink":
        lock.symlink_to(target)
    elif how == "hard link":
        os.link(target, lock)
    else:  # a regular file with content no writer lock has
        lock.write_text(target.read_text())


@pytest.mark.parametrize("how", ["symlink", "hard link", "foreign content"])
def test_a_writer_lock_that_is_not_ours_is_refused_and_its_target_untouched(tmp_path, capsys, how):
    from mhc_parity.records.outputs import WRITER_LOCK_FILE
    from tests.cli_support import REFERENCE_ONLY_CASE, assert_one_line

    target = tmp_path / "precious.txt"
    target.write_text("someone's notes\n")
    out = tmp_path / "out"
    _planted_lock(out, target, how)
    code = cli_main(
        ["run", "--cases", REFERENCE_ONLY_CASE, "--paths", "reference/*", "--no-lowering", "--quiet", "--out", str(out)]
    )
    assert_one_line(code, capsys.readouterr().err, WRITER_LOCK_FILE)
    assert target.read_text() == "someone's notes\n"
    assert not (out / "manifest.json").exists()  # refused before the folder changed


@pytest.mark.parametrize("value", ["inf", "-inf", "nan", "0", "-1", "twenty"])
def test_heartbeat_must_be_a_finite_positive_number_of_seconds(value, capsys):
    from mhc_parity.harness.commands.run import run_parser

    with pytest.raises(SystemExit) as stopped:
        run_parser().parse_args([f"--heartbeat={value}"])  # with "=": argparse reads "-inf" as an option
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert [line for line in err.splitlines() if "error:" in line] == [
        f"mhc-parity: error: argument --heartbeat: must be a finite number of seconds > 0, got {value!r}"
    ]
    assert run_parser().parse_args(["--heartbeat", "0.5"]).heartbeat == 0.5


def _closed_stdout_run(command: list[str]):
    """`command` run with a stdout pipe whose reader is gone before it writes a byte (what
    `| head -1` leaves a long output); stderr captured."""
    from tests.cli_support import ROOT

    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run(command, cwd=ROOT, stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=300)
    finally:
        os.close(write_end)


@pytest.fixture
def failing_gate(tmp_path) -> list[str]:
    """`gate` arguments whose verdict is FAIL: one leaf's oracle error tripled since the baseline."""
    from mhc_parity.reports import write_baseline
    from mhc_parity.reports.samples import sample_rows

    passing = [dict(r) for r in sample_rows() if r["verdict"] in ("pass", "skip", "unsupported")]
    baseline = write_baseline(passing, tmp_path / "baseline.csv", policy_hash="p1")
    (grown,) = [  # 3 eps in the baseline: tripled, well past the noise floor
        r
        for r in passing
        if (r["case"], r["leaf"], r["comparison"], r["candidate"])
        == ("bf16_small", "d_x", "vs_reference", "interpret/unsharded")
    ]
    grown["cand_oracle_max_err"] *= 3.0
    write_sample_run(passing, tmp_path / "run", metadata={"policy_hash": "p1"}, policy_digest="p1", rendered=False)
    arguments = ["gate", "--baseline", str(baseline), "--current", str(tmp_path / "run")]
    assert cli_main(arguments) == 1  # through an open stdout: the gate fails
    return arguments


@pytest.mark.parametrize("command", ["gate FAIL", "policy --table", "cases list", "--help"])
def test_a_closed_stdout_pipe_ends_quietly_with_141_never_0(command, failing_gate):
    from tests.cli_support import harness_command

    arguments = {"gate FAIL": failing_gate, "policy --table": ["policy", "--table"], "--help": ["--help"]}
    if command == "cases list":
        argv = [sys.executable, "-m", "mhc_parity.cases", "list", "--suite", "default"]
    else:
        argv = harness_command(*arguments[command])
    proc = _closed_stdout_run(argv)
    assert proc.returncode == 141, (proc.returncode, proc.stderr[-3000:])
    assert "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr and "Exception ignored" not in proc.stderr


def test_version_prints_the_installed_version_and_exits_0(capsys):
    import importlib.metadata
    import pathlib

    import mhc_parity
    from tests.cli_support import harness_command

    expected = f"mhc-parity {importlib.metadata.version('mhc-parity')}\n"
    assert cli_main(["--version"]) == 0
    assert capsys.readouterr().out == expected
    assert f"mhc-parity {mhc_parity.__version__}\n" == expected
    script = pathlib.Path(sys.executable).with_name("mhc-parity")  # the console script, where installed
    for argv in (harness_command("--version"), [str(script), "--version"] if script.exists() else None):
        if argv is not None:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=120)
            assert (proc.returncode, proc.stdout) == (0, expected), proc.stderr[-2000:]


def test_version_falls_back_to_the_checkout_s_pyproject_when_not_installed(monkeypatch, tmp_path):
    import importlib.metadata
    import tomllib

    import mhc_parity
    from mhc_parity import version
    from tests.cli_support import ROOT

    def not_installed(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", not_installed)
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert pyproject["name"] == version.DISTRIBUTION
    assert version.PYPROJECT == ROOT / "pyproject.toml"
    assert version.version() == mhc_parity.__version__ == pyproject["version"]
    assert version.pyproject_version(tmp_path / "pyproject.toml") == "unknown"


def test_the_command_imports_from_the_working_directory_first_as_python_m_does(monkeypatch, tmp_path):
    """The `mhc-parity` script's sys.path starts with its bin folder, not the working directory:
    `--impl my_module:factory` from the repository holding `my_module` needs it put there."""
    import os
    import types

    from mhc_parity.harness import cli

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if os.path.abspath(p or os.curdir) != str(tmp_path)])
    cli.import_from_working_directory()
    assert sys.path[0] == str(tmp_path)
    cli.import_from_working_directory()
    assert sys.path.count(str(tmp_path)) == 1, "already there: not added again"
    monkeypatch.setattr(sys, "path", [""] + sys.path[1:])  # `python -c`'s spelling of the working directory
    cli.import_from_working_directory()
    assert str(tmp_path) not in sys.path
    monkeypatch.setattr(sys, "path", sys.path[1:])
    monkeypatch.setattr(sys, "flags", types.SimpleNamespace(safe_path=True))  # python -P: left off, as for -m
    cli.import_from_working_directory()
    assert str(tmp_path) not in sys.path and "" not in sys.path


def test_out_refuses_a_folder_of_files_that_is_not_a_run(tmp_path, capsys):
    """`--out` into a folder that holds the user's own files but no run manifest stops before
    anything is written (exit 2, one line): a run would replace its summary.md and rows.csv."""
    mine = {"summary.md": "my notes\n", "rows.csv": "a,b\n1,2\n"}
    for name, text in mine.items():
        (tmp_path / name).write_text(text)
    argv = ["run", "--cases", "lite-n4-c128-b2s64-f32-w32-identity-default", "--paths", "reference/*"]
    assert cli_main([*argv, "--no-lowering", "--quiet", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [
        f"mhc-parity: error: --out: {tmp_path} holds files (rows.csv, summary.md) but no run manifest "
        "(manifest.json of mhc-parity), so a run would replace them; choose a new or empty folder"
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(mine)  # not even a lock file left
    assert all((tmp_path / name).read_text() == text for name, text in mine.items())
