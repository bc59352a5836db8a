"""bench/tpu_suite_check.sh's merge part (issue 55): the shards' packs from separate device calls
become one run, its baseline and a passing gate against it. Its shard part needs a TPU; here the
packs are made from two shards of a cheap run, packed as the shard part packs them."""

import os
import subprocess
import sys
import tarfile

import pytest

from mhc_parity.records.manifest import read_manifest
from tests.cli_support import ROOT, cheap_run_args, run_cli

SCRIPT = ROOT / "bench" / "tpu_suite_check.sh"


def _pack(run, pack, k: int) -> None:
    """`run` packed as the shard part packs out/tpu-suite-K."""
    with tarfile.open(pack, "w:gz") as archive:
        archive.add(run, arcname=f"out/tpu-suite-{k}")


@pytest.mark.slow
def test_merge_joins_the_packed_shards_writes_their_baseline_and_gates(case_file, tmp_path):
    packs = tmp_path / "dir"
    packs.mkdir()
    for k in (1, 2):
        run = tmp_path / f"made-{k}"
        proc = run_cli(*cheap_run_args(case_file, run, "--shard", f"{k}/2"))
        assert proc.returncode == 0, proc.stderr[-2000:]
        _pack(run, packs / f"shard-{k}.tgz", k)
    cli = tmp_path / "mhc-parity"
    cli.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m mhc_parity.harness "$@"\n')
    cli.chmod(0o755)
    merged, baseline = tmp_path / "merged", tmp_path / "baseline.csv"
    env = {**os.environ, "CLI": str(cli), "MERGED": str(merged), "BASELINE": str(baseline)}
    done = subprocess.run(
        ["bash", str(SCRIPT), "merge", str(packs)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout + done.stderr
    steps = (packs / "steps.txt").read_text()
    assert all(f"{name}: exit 0" in steps for name in ("merge", "baseline", "gate", "speed")), steps
    assert (packs / "speed-tpu.csv").read_text().startswith("case,") and (packs / "speed-tpu.md").is_file()
    manifest = read_manifest(merged)
    selection = read_manifest(tmp_path / "made-1").shard_of
    assert len(selection) == 2 and manifest.is_complete and manifest.cases == selection and not manifest.shard
    assert baseline.read_text().startswith("# mhc-parity baseline")
    assert (packs / "merge.tgz").exists()


def test_merge_without_packs_says_so(tmp_path):
    done = subprocess.run(
        ["bash", str(SCRIPT), "merge", str(tmp_path)],
        cwd=ROOT,
        env={**os.environ, "MERGED": str(tmp_path / "merged")},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "to merge" in done.stderr, done.stdout + done.stderr


def test_shards_left_no_time_starts_none_and_packs_the_logs(tmp_path):
    """Several shards in one device call: one started with a minute or less of the call left could
    not pack its results, so none is, and the logs go into one file (8 files come back)."""
    done = subprocess.run(
        ["bash", str(SCRIPT), "shards", "7 8", "8", str(tmp_path)],
        cwd=ROOT,
        env={**os.environ, "PART_BUDGET_S": "45"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    steps = (tmp_path / "steps.txt").read_text()
    assert "shard-7: not started" in steps and "shard-8: not started" in steps, steps
    assert sorted(p.name for p in tmp_path.iterdir()) == ["logs.tgz", "steps.txt"]
    with tarfile.open(tmp_path / "logs.tgz") as archive:
        assert {"logs", "steps.txt"} <= set(archive.getnames())
