"""What the machine lacks is exit 2 and one line, never a traceback or exit 1 (which CI reads
as a parity failure): a full disk, a file-size limit, an unwritable cache, a case that
exhausts memory; and a malformed input to `render` or `baseline`. After such an exit the
manifest says "failed", never "running", and `--resume` finishes the run once mended.

A full disk is a seam (`RowStore.append_case` or `mhc_parity.reports.writers.write_frame` raising
ENOSPC), a double of a small disk (`FullDisk`: writes past its capacity go to /dev/full),
or a real 200K tmpfs where the user may mount one in a namespace of its own; a file-size
limit is real (`RLIMIT_FSIZE` in the child: Python ignores SIGXFSZ, so the write fails with
EFBIG); memory is exhausted by an implementation that raises what XLA raises, at a stage
of its own choosing, and a case too large for the machine is refused before it runs (under
a real `ulimit -v`).
"""

from __future__ import annotations

import errno
import io
import os
import pathlib
import shlex
import shutil
import subprocess
import sys

import pytest

from mhc_parity.harness.cli import main as cli_main
from mhc_parity.harness.commands.merge import main as merge_main
from mhc_parity.records.manifest import read_manifest
from mhc_parity.records.store import RowStore
from tests.cli_support import (
    ROOT,
    assert_one_line,
    assert_one_line_error,
    cheap_run_args,
    load_jsonl,
    run_cli,
    without_timing,
)

SHARED = pytest.mark.xdist_group("clean_exits")
# A per-file size limit that fits the manifest (16 KB) and the row stream (66 KB) of
# `run_args`' two cases, not report.json (88 KB; measured with the compile-row, quantile and
# timing columns).
REPORT_SIZE_LIMIT = 80_000


@pytest.fixture(scope="module")
def complete(case_file, tmp_path_factory):
    """A complete run (it also fills the caches, so the limited runs below write no cache file)."""
    out = tmp_path_factory.mktemp("complete") / "run"
    proc = run_cli(*cheap_run_args(case_file, out))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return out


def full_disk(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device", "rows.jsonl")


@SHARED
def test_a_full_disk_while_appending_rows_fails_the_run_and_resume_finishes_it(
    case_file, complete, tmp_path, monkeypatch, capsys
):
    out = tmp_path / "run"
    monkeypatch.setattr(RowStore, "append_case", full_disk)
    code = cli_main(cheap_run_args(case_file, out))
    assert_one_line(code, capsys.readouterr().err, "cannot write rows.jsonl: No space left on device", "--resume")
    manifest = read_manifest(out)
    assert manifest.state == "failed" and "No space left" in manifest.reason
    monkeypatch.undo()
    gate = run_cli("gate", "--baseline", complete, "--current", out)
    assert_one_line_error(gate, "failed (cannot write rows.jsonl")
    resumed = run_cli(*cheap_run_args(case_file, out, "--resume"))
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert without_timing(load_jsonl(out / "rows.jsonl")) == without_timing(load_jsonl(complete / "rows.jsonl"))


@SHARED
def test_a_file_size_limit_while_writing_reports_fails_the_run(case_file, complete, tmp_path):
    out = tmp_path / "run"
    limited = (
        "import os, resource, sys; "
        f"resource.setrlimit(resource.RLIMIT_FSIZE, ({REPORT_SIZE_LIMIT}, {REPORT_SIZE_LIMIT})); "
        "os.execv(sys.executable, [sys.executable, '-m', 'mhc_parity.harness', *sys.argv[1:]])"
    )
    proc = subprocess.run(
        [sys.executable, "-c", limited, *cheap_run_args(case_file, out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert_one_line_error(proc, "File too large")
    manifest = read_manifest(out)
    assert manifest.state == "failed" and manifest.cases_done == 2, manifest


@SHARED
def test_a_full_disk_during_merge_is_one_line_and_the_folder_says_failed(
    case_file, complete, tmp_path, monkeypatch, capsys
):
    shards = [tmp_path / f"shard{k}" for k in (1, 2)]
    for k, folder in enumerate(shards, 1):
        # In this process (the full disk is the merge's, not the shards' runs): no interpreter
        # and JAX start of its own for each.
        assert cli_main(cheap_run_args(case_file, folder, "--shard", f"{k}/2")) == 0, capsys.readouterr().err[-2000:]
    capsys.readouterr()  # the shards' output is not the merge's
    import mhc_parity.reports.writers

    monkeypatch.setattr(mhc_parity.reports.writers, "write_frame", full_disk)
    code = merge_main([str(tmp_path / "merged"), *map(str, shards)])
    assert_one_line(code, capsys.readouterr().err, "No space left on device")
    assert read_manifest(tmp_path / "merged").state == "failed"


def test_an_unwritable_cache_is_a_usage_error_before_the_run_starts(case_file, tmp_path):
    not_a_folder = tmp_path / "cache-file"
    not_a_folder.write_text("")
    out = tmp_path / "run"
    proc = run_cli(*cheap_run_args(case_file, out), env_extra={"MHC_PARITY_CACHE": str(not_a_folder)})
    assert_one_line_error(proc, "MHC_PARITY_CACHE", "is a file, not a folder")
    assert not (out / "manifest.json").exists()


@SHARED
def test_a_case_that_exhausts_memory_names_itself_and_its_size(case_file, complete, tmp_path):
    out = tmp_path / "run"
    proc = run_cli(
        *cheap_run_args(
            case_file,
            out,
            "--impl",
            "tests.external_impls:exhausts_memory",
            "--paths",
            "reference/*",
            "exhausts_memory/*",
        )
    )
    assert_one_line_error(
        proc,
        "case cli-a-f32 (",
        "fixture elements) ran out of memory in exhausts_memory/unsharded: RESOURCE_EXHAUSTED",
    )
    manifest = read_manifest(out)
    assert manifest.state == "failed" and manifest.cases_done == 0


def test_render_refuses_metadata_that_is_not_an_object_and_its_own_folder(complete, tmp_path):
    listed = tmp_path / "meta.json"
    listed.write_text("[1, 2]")
    proc = run_cli("render", "--rows", complete, "--out", tmp_path / "r", "--metadata", listed)
    assert_one_line_error(proc, "expected a JSON object, got a list")
    copy = tmp_path / "copy"
    shutil.copytree(complete, copy)
    before = {p.name: p.read_bytes() for p in copy.iterdir()}
    proc = run_cli("render", "--rows", copy, "--out", copy)
    assert_one_line_error(proc, "holds the run being rendered")
    assert {p.name: p.read_bytes() for p in copy.iterdir()} == before


def test_a_rendered_folder_is_a_complete_run_copy(complete, tmp_path):
    proc = run_cli("render", "--rows", complete, "--out", tmp_path / "r")
    assert proc.returncode == 0, proc.stderr
    gate = run_cli("gate", "--baseline", complete, "--current", tmp_path / "r")
    assert gate.returncode == 0 and "gate PASS" in gate.stdout, gate.stdout + gate.stderr
    copied, original = (without_timing(load_jsonl(folder / "rows.jsonl")) for folder in (tmp_path / "r", complete))
    assert copied == original


# -- memory: what XLA raises when a case does not fit, at any stage, and cases refused up front


@SHARED
@pytest.mark.parametrize(
    ("factory", "said"),
    [
        ("placement_exhausts_memory", "RESOURCE_EXHAUSTED: Out of memory allocating 536870912 bytes"),
        ("dispatch_out_of_memory", "INTERNAL: Error dispatching computation: Out of memory allocating"),
    ],
    ids=["placing-inputs-ahead", "dispatch-says-out-of-memory"],
)
def test_xla_running_out_of_memory_anywhere_in_a_case_fails_the_run_with_one_line(
    case_file, complete, tmp_path, factory, said
):
    """Placing a case's inputs for the programs compiled ahead (`ProgramCache.compile_ahead`)
    once let XLA's error escape as a traceback (exit 1, the manifest left "running"); an XLA
    error that says "Out of memory" without RESOURCE_EXHAUSTED was an `error` row (exit 1)."""
    out = tmp_path / "run"
    proc = run_cli(
        *cheap_run_args(
            case_file, out, "--impl", f"tests.external_impls:{factory}", "--paths", "reference/*", f"{factory}/*"
        )
    )
    assert_one_line_error(
        proc, "case cli-a-f32 (", f"fixture elements) ran out of memory in {factory}/unsharded: {said}"
    )
    manifest = read_manifest(out)
    assert manifest.state == "failed" and manifest.cases_done == 0, manifest


BIG_CASES = """
[[case]]
name = "eight-by-2048"
batch = 8
sequence = 2048
streams = 4
embedding = 2048

[[case]]
name = "beyond-any-fixture"
batch = 1048576
sequence = 1048576
streams = 4
embedding = 128
"""
# `python -c ADDRESS_SPACE_LIMITED ARGS...` runs `mhc-parity ARGS...` under `ulimit -v` 6 GiB.
ADDRESS_SPACE_LIMITED = (
    "import os, resource, sys; "
    "resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30)); "
    "os.execv(sys.executable, [sys.executable, '-m', 'mhc_parity.harness', *sys.argv[1:]])"
)


def test_a_case_too_large_for_the_machine_is_refused_up_front_with_its_size(tmp_path):
    """Under `ulimit -v` the 8x2048x4x2048 case once ran until XLA failed to place its inputs
    (a traceback, exit 1, the manifest "running"); now its size is checked against the memory
    the process can get before anything runs, and the folder is left as it was."""
    cases, out = tmp_path / "big.toml", tmp_path / "run"
    cases.write_text(BIG_CASES)
    args = ["run", "--case-file", cases, "--cases", "eight-*", "--paths", "reference/*", "--no-lowering", "--quiet"]
    proc = subprocess.run(
        [sys.executable, "-c", ADDRESS_SPACE_LIMITED, *map(str, args), "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert_one_line_error(
        proc,
        "case eight-by-2048 (8x2048x4x2048, 268,705,827 fixture elements) needs at least",
        "GiB of memory",
        "this process can get",
    )
    assert not (out / "manifest.json").exists()


def test_a_case_beyond_the_fixture_limit_is_refused_up_front_with_its_size(tmp_path):
    """A 1048576x1048576 case was a `fail` row ("reference rejected a supported case"), exit 1."""
    cases, out = tmp_path / "big.toml", tmp_path / "run"
    cases.write_text(BIG_CASES)
    args = ["run", "--case-file", cases, "--cases", "beyond-*", "--paths", "reference/*", "--no-lowering", "--quiet"]
    proc = run_cli(*args, "--out", out)
    assert_one_line_error(
        proc, "case beyond-any-fixture (1048576x1048576x4x128,", "fixture elements", "elements a fixture may hold"
    )
    assert not (out / "manifest.json").exists()


# -- a full disk: the final manifest is written whatever filled the disk, and no temporary file stays


class FullDisk:
    """The run folder `folder` on a disk of `capacity` bytes, as a test double: a file opened
    for writing there (by path or by descriptor, as `os.fdopen` does) while the folder's files
    hold `capacity` bytes or more is created as opening makes it but writes into /dev/full, so
    the kernel answers its first write with ENOSPC. Found full, the disk holds exactly what
    the folder holds (a real one would have cut the last file there), and deleting files
    makes room again."""

    def __init__(self, folder: pathlib.Path, capacity: int, monkeypatch):
        self.folder, self.capacity = folder, capacity
        self._open = io.open
        self._full = os.open("/dev/full", os.O_WRONLY)
        monkeypatch.setattr(io, "open", self.open)
        monkeypatch.setattr("builtins.open", self.open)

    def used(self) -> int:
        return sum(p.stat().st_size for p in self.folder.iterdir() if p.is_file()) if self.folder.is_dir() else 0

    def open(self, file, mode="r", *args, **kwargs):
        handle = self._open(file, mode, *args, **kwargs)
        if set(mode) & set("wax+"):
            where = pathlib.Path(os.readlink(f"/proc/self/fd/{handle.fileno()}"))
            used = self.used()
            if where.parent == self.folder.resolve() and used >= self.capacity:
                self.capacity = used
                os.dup2(self._full, handle.fileno())
        return handle


@SHARED
@pytest.mark.skipif(not os.path.exists("/dev/full") or not os.path.exists("/proc/self/fd"), reason="needs Linux")
def test_a_disk_that_fills_up_while_reports_are_written_ends_the_run_failed_with_no_temporary_file(
    case_file, complete, tmp_path, monkeypatch, capsys
):
    """The disk of the issue's 300K tmpfs: it fills while the reports are written, after the
    rows. The run's final manifest once could not be written any more: the folder said
    "running" and held a 0-byte manifest.json.tmp. The run keeps room for it."""
    out = tmp_path / "run"
    capacity = sum(p.stat().st_size for p in complete.iterdir() if p.is_file()) * 3 // 4
    FullDisk(out, capacity, monkeypatch)
    code = cli_main(cheap_run_args(case_file, out))
    monkeypatch.undo()
    assert_one_line(code, capsys.readouterr().err, "No space left on device", "--resume")
    _assert_failed_for_space_then_resumes(case_file, out, complete)


def _assert_failed_for_space_then_resumes(case_file, out, complete) -> None:
    """`out` ended "failed" for a full disk with no temporary or reserve file left, and
    `--resume` then finishes it with the rows of the uninterrupted run `complete`."""
    manifest = read_manifest(out)
    assert manifest.state == "failed" and "No space left" in manifest.reason, manifest
    assert sorted(p.name for p in out.iterdir() if ".tmp" in p.name or "reserve" in p.name) == []
    resumed = run_cli(*cheap_run_args(case_file, out, "--resume"))
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert without_timing(load_jsonl(out / "rows.jsonl")) == without_timing(load_jsonl(complete / "rows.jsonl"))


def _mounts_tmpfs() -> bool:
    """Whether this user can mount a tmpfs in a user namespace of its own (`unshare -Urm`)."""
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(
        ["unshare", "-Urm", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt"], capture_output=True, timeout=30
    )
    return probe.returncode == 0


@SHARED
@pytest.mark.skipif(not _mounts_tmpfs(), reason="cannot mount a tmpfs in a user namespace here")
def test_a_200k_tmpfs_as_out_ends_the_run_failed_and_resume_finishes_it(case_file, complete, tmp_path):
    """The issue's reproduction itself, on a real small filesystem (mounted in a user namespace
    of the test's own, no root needed): exit 2 and one line, the manifest "failed", no
    temporary file; copied out, the folder resumes."""
    mount, copy = tmp_path / "mnt", tmp_path / "copy"
    mount.mkdir()
    run = " ".join(
        shlex.quote(a) for a in [sys.executable, "-m", "mhc_parity.harness", *cheap_run_args(case_file, mount / "run")]
    )
    script = (
        f"mount -t tmpfs -o size=200k tmpfs {shlex.quote(str(mount))} || exit 99; {run}; code=$?; "
        f"cp -a {shlex.quote(str(mount / 'run'))} {shlex.quote(str(copy))}; exit $code"
    )
    proc = subprocess.run(
        ["unshare", "-Urm", "sh", "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert_one_line_error(proc, "No space left on device", "--resume")
    _assert_failed_for_space_then_resumes(case_file, copy, complete)


def _no_space(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


@pytest.mark.parametrize("failing", ["os.fsync", "os.replace", "os.fchmod"])
@pytest.mark.parametrize("writer", ["atomic_write", "write_manifest", "RowStore.keep"])
def test_a_failed_atomic_write_leaves_the_old_file_and_no_temporary_file(tmp_path, monkeypatch, writer, failing):
    """The writer of the manifest once left `manifest.json.tmp` behind when its write failed
    (0 bytes on the issue's full tmpfs), and so did the row stream's `keep`."""
    from mhc_parity.records.files import atomic_write
    from mhc_parity.records.manifest import manifest_path, write_manifest
    from mhc_parity.reports.samples import sample_manifest, sample_rows

    if writer == "atomic_write":
        target, write = tmp_path / "file.json", lambda: atomic_write(tmp_path / "file.json", b"new")
    elif writer == "write_manifest":
        target, write = manifest_path(tmp_path), lambda: write_manifest(tmp_path, sample_manifest(sample_rows()))
    else:
        target, write = tmp_path / "rows.jsonl", lambda: RowStore(tmp_path).keep([], [])
    target.write_bytes(b"old")
    monkeypatch.setattr(failing, _no_space)
    with pytest.raises(OSError, match="No space left"):
        write()
    monkeypatch.undo()
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir() if p.name != target.name] == []


def test_a_full_disk_while_appending_a_case_cuts_the_stream_back_to_the_cases_before(
    case_file, complete, tmp_path, monkeypatch
):
    """A case's rows half-appended when the disk filled once stayed in `rows.jsonl`, a torn
    line in the middle of the stream once the next run appends after it."""
    store = RowStore(tmp_path)
    store.start_fresh()
    rows, _ = RowStore(complete).finished()
    first, second = sorted({r["case"] for r in rows})
    store.append_case(first, [r for r in rows if r["case"] == first])
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    monkeypatch.setattr("os.fsync", _no_space)
    with pytest.raises(OSError, match="No space left"):
        store.append_case(second, [r for r in rows if r["case"] == second])
    monkeypatch.undo()
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
