"""Processes end with their command, and one signal stops any command that writes a run
folder: a kill -9 of `run --jobs 2` leaves no worker, fork server or resource tracker
behind; one Ctrl-C stops a run whose implementation hangs (the stuck thread is abandoned);
`merge` and `baseline --impl` handle SIGINT and SIGTERM like `run`, and `baseline --impl`
streams its rows and resumes.

A hang is `tests.external_impls:hangs_once`: stuck in `pre` on its first bfloat16 input,
the reference afterwards; or `tests.external_impls:blocks_holding_the_gil`, stuck in native
code that holds the GIL, where no Python of its process runs: the run's watchdog process
and the kernel (PR_SET_PDEATHSIG) stop it then.
"""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import time
import uuid

import pytest

from mhc_parity.records.manifest import read_manifest
from tests.cli_support import ROOT, cheap_run_args, harness_command, load_jsonl, run_cli

HANGS = "tests.external_impls:hangs_once"


def processes_with(marker: str) -> list[int]:
    """Pids of the processes whose environment holds `marker` (a command and all it started)."""
    found = []
    for entry in pathlib.Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker.encode() in (entry / "environ").read_bytes():
                    found.append(int(entry.name))
            except OSError:  # ended meanwhile, or not ours to read
                pass
    return found


def wait_for(condition, timeout: float, what: str) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if condition():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")


def start(args, env_extra: dict) -> subprocess.Popen:
    return subprocess.Popen(
        harness_command(*args),
        cwd=ROOT,
        env={**os.environ, **env_extra},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.slow
@pytest.mark.skipif(not pathlib.Path("/proc/self/environ").exists(), reason="needs /proc")
def test_kill_9_of_a_run_with_workers_leaves_no_process_behind(case_file, tmp_path):
    marker = f"MHC_TEST_{uuid.uuid4().hex}"
    hang = tmp_path / "hang-marker"
    proc = start(
        [
            "run",
            "--case-file",
            case_file,
            # The two unsharded cases: a worker each, one of them stuck on its bfloat16 input
            # (the sharded case would only add compiles before the kill).
            "--cases",
            "cli-a-*",
            "cli-b-*",
            "--impl",
            HANGS,
            "--paths",
            "reference/*",
            "hangs_once/*",
            "--no-lowering",
            "--jobs",
            "2",
            "--quiet",
            "--out",
            tmp_path / "run",
        ],
        {"HANGS_MARKER": str(hang), marker: "1"},
    )
    wait_for(hang.exists, 300, "a worker to be stuck in the implementation")
    assert len(processes_with(marker)) >= 3  # the command, the fork server, the workers
    proc.kill()
    proc.wait()
    wait_for(lambda: not processes_with(marker), 30, "the fork server, workers and resource tracker to end")


@pytest.mark.slow
def test_one_ctrl_c_stops_a_run_whose_implementation_hangs(case_file, tmp_path):
    hang = tmp_path / "hang-marker"
    out = tmp_path / "run"
    proc = start(
        [
            "run",
            "--case-file",
            case_file,
            "--cases",
            "cli-a-*",
            "cli-b-*",
            "--impl",
            HANGS,
            "--paths",
            "reference/*",
            "hangs_once/*",
            "--no-lowering",
            "--quiet",
            "--out",
            out,
        ],
        {"HANGS_MARKER": str(hang)},
    )
    wait_for(hang.exists, 300, "the implementation to hang")
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr[-2000:]
    assert "Traceback" not in stderr and "--resume" in stderr
    assert read_manifest(out).state == "interrupted"


@pytest.mark.slow
def test_baseline_impl_streams_stops_on_one_signal_and_resumes(case_file, tmp_path):
    hang = tmp_path / "hang-marker"
    out, baseline = tmp_path / "run", tmp_path / "hangs_once.csv"
    args = [
        "baseline",
        "--impl",
        HANGS,
        "--case-file",
        case_file,
        "--cases",
        "cli-a-*",
        "cli-b-*",
        "--quiet",
        "--out",
        out,
        "--to",
        baseline,
    ]
    proc = start(args, {"HANGS_MARKER": str(hang)})
    done = out / "cases-done.txt"
    wait_for(
        lambda: hang.exists() and done.exists() and done.read_text().split(),
        300,
        "the float32 case to be streamed and the bfloat16 one to hang",
    )
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, stderr[-2000:]
    assert "Traceback" not in stderr and "mhc-parity baseline --impl" in stderr and "--resume" in stderr
    manifest = read_manifest(out)
    assert manifest.state == "interrupted" and manifest.reason == "SIGTERM" and manifest.cases_done == 1
    assert not baseline.exists()

    resumed = run_cli(*args, "--resume", env_extra={"HANGS_MARKER": str(hang)})
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-2000:]
    assert "baseline written" in resumed.stdout and baseline.exists()
    assert read_manifest(out).is_complete and len(load_jsonl(out / "rows.jsonl")) == read_manifest(out).rows


@pytest.fixture(scope="module")
def shards(case_file, tmp_path_factory):
    root = tmp_path_factory.mktemp("shards")
    folders = [root / f"shard{k}" for k in (1, 2)]
    for k, folder in enumerate(folders, 1):
        proc = run_cli(*cheap_run_args(case_file, folder, "--shard", f"{k}/2"))
        assert proc.returncode == 0, proc.stderr[-2000:]
    return folders


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_during_merge_is_one_line_and_the_hint_is_a_command_merge_takes(
    shards, tmp_path, monkeypatch, capsys, signum
):
    import mhc_parity.reports.writers
    from mhc_parity.harness.commands.merge import main as merge_main

    def signalled(*args, **kwargs):  # the signal lands while the merged reports are written
        os.kill(os.getpid(), signum)
        time.sleep(5)
        raise AssertionError("the signal did not interrupt the merge")

    monkeypatch.setattr(mhc_parity.reports.writers, "write_frame", signalled)
    merged = tmp_path / "merged"
    code = merge_main([str(merged), *map(str, shards)])
    err = capsys.readouterr().err
    assert code == 128 + signum, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert f"interrupted ({signal.Signals(signum).name})" in err and "--resume" not in err
    manifest = read_manifest(merged)
    assert manifest.state == "interrupted" and "--resume" not in manifest.resume_command()


# An --impl whose import takes long, in pure Python (so a signal's handler runs during it).
IMPORT_SLEEPS = """
import os
import pathlib
import time

pathlib.Path(os.environ["IMPORT_MARKER"]).write_text("importing")
time.sleep(60)

from tests.external_impls import good as factory  # noqa: E402
"""
# `python -c IGNORING_SIGINT ARGS...` execs `python ARGS...` with SIGINT ignored from the
# start, as a parent that ignores it leaves a child (nohup, `&` in a non-interactive shell).
IGNORING_SIGINT = (
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_IGN); "
    "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])"
)


def test_ctrl_c_while_an_impl_imports_stops_the_run_even_when_sigint_was_ignored(case_file, tmp_path):
    (tmp_path / "slow_import_impl.py").write_text(IMPORT_SLEEPS)
    marker, out = tmp_path / "importing", tmp_path / "run"
    command = harness_command(*cheap_run_args(case_file, out, "--impl", "slow_import_impl:factory"))
    python_path = os.pathsep.join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH", "")) if p)
    proc = subprocess.Popen(
        [command[0], "-c", IGNORING_SIGINT, *command[1:]],
        cwd=ROOT,
        env={**os.environ, "IMPORT_MARKER": str(marker), "PYTHONPATH": python_path},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(marker.exists, 120, "the --impl module to start importing")
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=30)  # the import alone would take 60 s more
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, stderr[-2000:]
    assert "Traceback" not in stderr and len(stderr.strip().splitlines()) == 1, stderr[-2000:]
    assert "interrupted (SIGINT)" in stderr
    manifest = read_manifest(out) if out.is_dir() else None
    assert manifest is None or manifest.state != "running"


# An implementation stuck in native code that holds the GIL (`tests.external_impls:blocks_holding_the_gil`):
# no thread of its process runs Python for 60 s, signal handlers and watcher threads included.
BLOCKS = "tests.external_impls:blocks_holding_the_gil"


def start_blocked_run(case_file, tmp_path, *extra, env_extra=None) -> tuple[subprocess.Popen, pathlib.Path]:
    """`run` of the two unsharded cases through an implementation that blocks holding the GIL,
    and the file that exists once it has blocked."""
    marker = tmp_path / "blocked"
    proc = start(
        [
            *cheap_run_args(case_file, tmp_path / "run", "--impl", BLOCKS, "--paths", "reference/*", "blocks_*"),
            *extra,
        ],
        {"BLOCKS_MARKER": str(marker), **(env_extra or {})},
    )
    return proc, marker


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_stops_a_run_whose_implementation_blocks_holding_the_gil(case_file, tmp_path, signum):
    """One process (--jobs 1): its handlers cannot run while the implementation holds the GIL,
    so the signal once did nothing for the 60 s of the native call. The run's watchdog
    process ends it within seconds: the manifest says "interrupted", the message says how to
    resume, and the process ends by the signal itself (the shell's status is 128 + the signal
    either way: 130 / 143)."""
    proc, marker = start_blocked_run(case_file, tmp_path)
    try:
        wait_for(marker.exists, 300, "the implementation to block in native code")
        time.sleep(1)  # well inside the native call
        proc.send_signal(signum)
        _, stderr = proc.communicate(timeout=45)  # the native call alone lasts 60 s; typically 3 s here
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode in (128 + signum, -signum), (proc.returncode, stderr[-2000:])
    assert "Traceback" not in stderr and "--resume" in stderr, stderr[-2000:]
    assert f"interrupted ({signal.Signals(signum).name})" in stderr, stderr[-2000:]
    manifest = read_manifest(tmp_path / "run")
    assert manifest.state == "interrupted" and manifest.reason == signal.Signals(signum).name, manifest


@pytest.mark.skipif(not pathlib.Path("/proc/self/environ").exists(), reason="needs /proc")
def test_kill_9_of_a_run_whose_workers_block_holding_the_gil_leaves_no_process_behind(case_file, tmp_path):
    """--jobs 2: a worker's watcher (`exit_with`) is a Python thread, which cannot run while
    the implementation holds the GIL; the fork server, the resource tracker and both workers
    once outlived a kill -9 of the command by the 60 s of the native call. The kernel ends
    them now (PR_SET_PDEATHSIG: the server with the command, each worker with the server)."""
    marker = f"MHC_TEST_{uuid.uuid4().hex}"
    proc, blocked = start_blocked_run(case_file, tmp_path, "--jobs", "2", env_extra={marker: "1"})
    try:
        wait_for(blocked.exists, 300, "a worker to block in native code")
        time.sleep(1)
        assert len(processes_with(marker)) >= 4  # the command, the fork server, the workers, the resource tracker
    finally:
        proc.kill()
        proc.wait()  # not communicate(): the survivors would hold its pipes open
    wait_for(lambda: not processes_with(marker), 15, "the fork server, workers and resource tracker to end")
