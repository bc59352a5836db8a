"""What the machine lacks is exit 2 and one line, never a traceback or exit 1 (which CI reads
as a parity failure): a full disk, a file-size limit, an unwritable cache, a case that
exhausts memory; and a malformed input to `render` or `baseline`. After such an exit the
manifest says "failed", never "running", and `--resume` finishes the run once mended.

A full disk is a seam (`RowStore.append_case` or `reports.writers.write_frame` raising
ENOSPC); a file-size limit is real (`RLIMIT_FSIZE` in the child: Python ignores SIGXFSZ,
so the write fails with EFBIG); memory is exhausted by an implementation that raises what
XLA raises.
"""

from __future__ import annotations

import errno
import shutil
import subprocess
import sys

import pytest

from harness.cli import main as cli_main
from harness.commands.merge import main as merge_main
from records.manifest import read_manifest
from records.store import RowStore
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
# Fits the manifest and the row stream of `run_args`' two cases, not report.json.
REPORT_SIZE_LIMIT = 60_000


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
        "os.execv(sys.executable, [sys.executable, '-m', 'harness', *sys.argv[1:]])"
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
        proc = run_cli(*cheap_run_args(case_file, folder, "--shard", f"{k}/2"))
        assert proc.returncode == 0, proc.stderr[-2000:]
    import reports.writers

    monkeypatch.setattr(reports.writers, "write_frame", full_disk)
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
