"""`run --jobs N`, `run --shard K/N` and `merge`: the same rows as one run in one process."""

import csv
import dataclasses
import signal
import subprocess
import time
import types

import pytest

from mhc_parity.cases import registry
from mhc_parity.harness.cli import main as cli_main
from mhc_parity.harness.commands import merge
from mhc_parity.harness.commands.merge import ShardRun, merged_metadata, where_they_differ
from mhc_parity.harness.engine.case_cost import costliest_first
from mhc_parity.harness.processes.shards import Shard, parse_shard, shard_cases, shard_names
from mhc_parity.records.manifest import read_manifest
from tests.cli_support import (
    CASE_NAMES,
    ROOT,
    TIMING_COLUMNS,
    assert_one_line,
    cheap_run_args,
    harness_command,
    load_jsonl,
    run_cli,
)

CHEAP_PATHS = ("--paths", "reference/*", "--no-lowering")


# ------------------------------------------------------------------ the split itself


@pytest.mark.parametrize("count", [1, 2, 3, 5, 40])
def test_shards_cover_the_selection_exactly_once_in_its_order(count):
    cases = registry.default_registry().select(suite="default")
    shares = []
    for index in range(1, count + 1):
        try:
            shares.append(shard_cases(cases, Shard(index, count)))
        except ValueError as exc:  # more shards than cases: the empty ones say so
            assert count > len(cases) and "selects no case" in str(exc)
    names = [c.name for share in shares for c in share]
    assert sorted(names) == sorted(c.name for c in cases)
    for share in shares:  # each share keeps the selection's order
        assert share == [c for c in cases if c in share]
    assert max(map(len, shares)) - min(map(len, shares)) <= 1


def test_the_split_depends_on_names_only():
    cases = registry.default_registry().select(suite="default")
    reordered = list(reversed(cases))
    assert {c.name for c in shard_cases(cases, Shard(2, 3))} == {c.name for c in shard_cases(reordered, Shard(2, 3))}


@pytest.mark.parametrize("text", ["0/2", "3/2", "2", "a/b", "1/0", "-1/2", ""])
def test_a_malformed_shard_is_refused(text):
    with pytest.raises(ValueError, match="--shard"):
        parse_shard(text)


@pytest.mark.parametrize("text, jobs", [("1", 1), ("3", 3), ("auto", "auto"), (" AUTO ", "auto")])
def test_jobs_is_a_count_or_auto(text, jobs):
    from mhc_parity.harness.commands.run import parse_jobs

    assert parse_jobs(text) == jobs


@pytest.mark.parametrize(
    "text, message",
    [("0", "at least 1"), ("-2", "at least 1"), ("two", "whole number or 'auto'"), ("", "whole number or 'auto'")],
)
def test_a_bad_jobs_value_is_a_usage_error(text, message):
    from mhc_parity.harness.commands.run import parse_jobs
    from mhc_parity.harness.errors import UsageError

    with pytest.raises(UsageError, match=message):
        parse_jobs(text)


def test_auto_jobs_is_a_worker_per_core_within_memory_and_cases(monkeypatch):
    import jax

    from mhc_parity.harness.processes import parallel

    monkeypatch.setattr(parallel.os, "cpu_count", lambda: 8)
    monkeypatch.setattr(parallel, "available_memory_bytes", lambda: 100 * parallel.WORKER_MEMORY_BYTES)
    assert parallel.auto_jobs(case_count=30) == 8
    assert parallel.auto_jobs(case_count=3) == 3
    monkeypatch.setattr(parallel, "available_memory_bytes", lambda: 2 * parallel.WORKER_MEMORY_BYTES + 1)
    assert parallel.auto_jobs(case_count=30) == 2
    monkeypatch.setattr(parallel, "available_memory_bytes", lambda: parallel.WORKER_MEMORY_BYTES // 2)
    assert parallel.auto_jobs(case_count=30) == 1  # never 0
    monkeypatch.setattr(parallel, "available_memory_bytes", lambda: None)  # not known: the cores decide
    assert parallel.auto_jobs(case_count=30) == 8
    monkeypatch.setattr(jax, "default_backend", lambda: "tpu")  # one process owns an accelerator
    assert parallel.auto_jobs(case_count=30) == 1


def test_the_available_memory_is_read_on_linux():
    from mhc_parity.harness.processes.parallel import available_memory_bytes

    memory = available_memory_bytes()
    assert memory is None or memory > 0


def test_a_stated_memory_limit_caps_what_is_available(monkeypatch):
    """A machine limited from outside (the lent TPU VM: 45 GiB in /proc/meminfo, 40 GiB allowed)
    states its limit; what is in use counts against it, and a wrong value is refused by name."""
    from mhc_parity.harness.processes import worker_processes as wp

    meminfo = {"MemTotal": 45 * 2**20, "MemAvailable": 44 * 2**20}  # KiB: 1 GiB in use
    monkeypatch.setattr(wp, "_meminfo_kib", lambda: meminfo)
    monkeypatch.delenv(wp.MEMORY_LIMIT_ENV_VAR, raising=False)
    assert wp.available_memory_bytes() == 44 * 2**30
    monkeypatch.setenv(wp.MEMORY_LIMIT_ENV_VAR, "40G")
    assert wp.memory_limit_bytes() == 40 * 2**30 and wp.available_memory_bytes() == 39 * 2**30
    monkeypatch.setenv(wp.MEMORY_LIMIT_ENV_VAR, "100G")  # more than the machine shows: it decides
    assert wp.available_memory_bytes() == 44 * 2**30
    monkeypatch.setenv(wp.MEMORY_LIMIT_ENV_VAR, str(512 * 2**20))
    assert wp.available_memory_bytes() == 0  # the limit is already used up
    for wrong in ("40GB", "-3G", "lots"):
        monkeypatch.setenv(wp.MEMORY_LIMIT_ENV_VAR, wrong)
        with pytest.raises(ValueError, match=wp.MEMORY_LIMIT_ENV_VAR):
            wp.memory_limit_bytes()


# ------------------------------------------------------------------ through the CLI


def _run(case_file, out, *extra):
    proc = run_cli("run", "--case-file", case_file, "--out", out, "--quiet", *extra)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def _run_here(case_file, out, *extra) -> None:
    """`_run` in this process (`mhc_parity.harness.cli.main`): for a one-process run whose rows,
    manifest or shard are read, not its process (no interpreter and JAX start of its own)."""
    code = cli_main([str(a) for a in ("run", "--case-file", case_file, "--out", out, "--quiet", *extra)])
    assert code == 0, f"mhc-parity run exited {code} (its output is in the captured stdout and stderr)"


def _csv_without_timing(path) -> list[list[str]]:
    """rows.csv as lines of cells, timing columns dropped (everything else byte for byte)."""
    with open(path, newline="") as handle:
        lines = list(csv.reader(handle))
    keep = [i for i, name in enumerate(lines[0]) if name not in TIMING_COLUMNS]
    return [[line[i] for i in keep] for line in lines]


def _command(capsys, *argv) -> tuple[int, str, str]:
    """`mhc-parity ARGV` (merge, baseline, gate, render: commands that read and write run
    folders, no process of their own to test; a one-process run whose output is read) run in
    this process: (exit code, stdout, stderr)."""
    code = cli_main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _jsonl_without_timing(path) -> list[dict]:
    return [{k: v for k, v in row.items() if k not in TIMING_COLUMNS} for row in load_jsonl(path)]


def test_workers_are_dealt_the_costliest_cases_first_and_equal_ones_in_order():
    """A costly case dealt last keeps one worker busy while the others wait: the larger case goes
    first, and of two of one shape the sharded one (the rows are still read in the cases' order:
    `test_jobs_2_gives_the_rows_of_one_process_in_the_same_order`, whose sharded case is last)."""
    small = registry.get("lite-n4-c128-b2s64-f32-w32-identity-default")
    twin = registry.get("lite-n4-c128-b2s64-bf16-w32-identity-default")
    large = registry.get("lite-n4-c1024-b1s128-f32-w32-identity-default")
    sharded = registry.get("lite-n4-c128-b2s256-f32-w32-identity-default-m2x4-bt64")
    unsharded = dataclasses.replace(sharded, mesh=None)
    assert costliest_first([small, large]) == [large, small]
    assert costliest_first([unsharded, sharded]) == [sharded, unsharded]
    assert costliest_first([small, twin]) == [small, twin] and costliest_first([twin, small]) == [twin, small]


@pytest.fixture(scope="module")
def cheap_single(case_file, tmp_path_factory):
    out = tmp_path_factory.mktemp("single") / "run"
    _run_here(case_file, out, *CHEAP_PATHS)  # the one-process rows the others are compared with
    return out


@pytest.mark.slow
def test_jobs_2_gives_the_rows_of_one_process_in_the_same_order(case_file, tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    _run_here(case_file, one, "--no-lowering")  # one process: the rows to match (this one)
    _run(case_file, two, "--no-lowering", "--jobs", "2")
    assert _jsonl_without_timing(two / "rows.jsonl") == _jsonl_without_timing(one / "rows.jsonl")
    assert _csv_without_timing(two / "rows.csv") == _csv_without_timing(one / "rows.csv")
    manifest = read_manifest(two)
    assert manifest.is_complete and manifest.cases == CASE_NAMES
    assert {r["candidate"].split("/")[0] for r in load_jsonl(two / "rows.jsonl")} >= {"reference", "interpret"}


@pytest.mark.slow
def test_jobs_auto_runs_as_many_workers_as_auto_jobs_says(case_file, cheap_single, tmp_path):
    import json

    from mhc_parity.harness.processes.parallel import auto_jobs

    out = tmp_path / "auto"
    _run(case_file, out, *CHEAP_PATHS, "--jobs", "auto")
    assert _csv_without_timing(out / "rows.csv") == _csv_without_timing(cheap_single / "rows.csv")
    metadata = json.loads((out / "report.json").read_text())["metadata"]
    assert metadata["jobs"] == auto_jobs(len(CASE_NAMES))  # this machine's cores, memory and 3 cases


@pytest.mark.slow
def test_jobs_2_ctrl_c_exits_130_and_the_run_resumes(case_file, cheap_single, tmp_path):
    out = tmp_path / "interrupted"
    args = ["run", "--case-file", case_file, *CHEAP_PATHS, "--out", out, "--quiet", "--jobs", "2"]
    proc = subprocess.Popen(
        harness_command(*args), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None and not (out / "cases-done.txt").exists():
        time.sleep(0.02)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=300)
    if proc.returncode == 0:
        pytest.skip("the run finished before it could be interrupted")
    assert proc.returncode == 130, stderr[-3000:]
    assert "Traceback" not in stderr and "--resume" in stderr
    assert read_manifest(out).state == "interrupted"
    resumed = run_cli(*args, "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert _csv_without_timing(out / "rows.csv") == _csv_without_timing(cheap_single / "rows.csv")


@pytest.fixture(scope="module")
def shards(case_file, tmp_path_factory):
    root = tmp_path_factory.mktemp("shards")
    folders = [root / f"shard{k}" for k in (1, 2)]
    for k, folder in enumerate(folders, 1):  # a shard is a one-process run: in this process
        _run_here(case_file, folder, *CHEAP_PATHS, "--shard", f"{k}/2")
    return folders


@pytest.mark.slow
def test_shards_and_merge_give_the_rows_csv_of_one_run(shards, cheap_single, tmp_path, capsys):
    manifests = [read_manifest(folder) for folder in shards]
    assert [m.shard for m in manifests] == ["1/2", "2/2"]
    assert all(m.shard_of == CASE_NAMES for m in manifests)
    assert sorted(c for m in manifests for c in m.cases) == sorted(CASE_NAMES)
    merged = tmp_path / "merged"
    code, _, err = _command(capsys, "merge", merged, *shards)
    assert code == 0, err
    assert _csv_without_timing(merged / "rows.csv") == _csv_without_timing(cheap_single / "rows.csv")
    manifest = read_manifest(merged)
    assert manifest.is_complete and manifest.cases == CASE_NAMES and not manifest.shard
    baseline = tmp_path / "baseline.csv"
    assert _command(capsys, "baseline", "--from", cheap_single, "--to", baseline)[0] == 0
    code, out, err = _command(capsys, "gate", "--baseline", baseline, "--current", merged)
    assert code == 0 and "gate PASS" in out, out + err
    assert _command(capsys, "render", "--rows", merged, "--out", tmp_path / "rendered")[0] == 0


@pytest.mark.slow
@pytest.mark.parametrize(
    ("impl", "merged_exit"),
    [("bfloat16_only", 0), ("never_runs", 2)],
    ids=["compared-in-another-shard", "compared-in-none"],
)
def test_a_shard_comparing_nothing_of_an_implementation_leaves_that_to_the_merge(
    case_file, tmp_path, capsys, impl, merged_exit
):
    """Issue 55: the tpu suite's float32 shards compare nothing of MaxText's bfloat16-only kernels,
    and exited 2, as a whole run would. A shard is a part: it exits as its rows say and notes
    what it compared nothing of; the merged run is judged as a whole run is, by `merge`.
    The shards run in this process (`_command`): their exit codes and notes are read, no
    process of their own is tested."""
    shards = []
    for k in (1, 2):  # shard 1 holds cli-a-f32, shard 2 cli-b-bf16
        out = tmp_path / f"shard{k}"
        args = ("--impl", f"tests.external_impls:{impl}", "--paths", "reference/*", f"{impl}/*", "--shard", f"{k}/2")
        code, stdout, stderr = _command(capsys, *cheap_run_args(case_file, out, *args))
        assert code == 0, stdout[-2000:] + stderr[-2000:]
        notes = [line for line in stdout.splitlines() if line.startswith("mhc-parity: note: in shard")]
        compared_here = impl == "bfloat16_only" and k == 2
        assert len(notes) == (0 if compared_here else 1), stdout[-2000:]
        assert all(f"nothing was compared of implementation '{impl}'" in note for note in notes)
        shards.append(out)
    merged = tmp_path / "merged"
    code, out, err = _command(capsys, "merge", merged, *shards)
    assert code == merged_exit, out + err
    assert read_manifest(merged).is_complete, "the merged run is written either way"
    errors = [line for line in err.splitlines() if line.startswith("mhc-parity: error:")]
    assert len(errors) == merged_exit // 2, err
    assert all(f"nothing was compared of implementation '{impl}'" in line for line in errors)


def _assert_refused(capsys, out, folders, *fragments):
    """`merge OUT FOLDERS...` (in this process) exits 2 with one line naming each fragment."""
    code, stdout, stderr = _command(capsys, "merge", out, *folders)
    assert code == 2, (code, stdout, stderr)
    assert_one_line(code, stderr, *fragments)


@pytest.mark.slow
def test_merge_refuses_shards_that_are_not_one_whole_run(case_file, shards, cheap_single, tmp_path, capsys):
    out = tmp_path / "merged"
    _assert_refused(capsys, out, [shards[0]], "shard(s) 2/2 missing")
    _assert_refused(capsys, out, [shards[0], shards[0]], "given twice")
    _assert_refused(capsys, out, [shards[0], cheap_single], "not a shard")
    other = tmp_path / "other-paths"
    _run_here(case_file, other, "--paths", "reference/unsharded", "--no-lowering", "--shard", "2/2")
    _assert_refused(capsys, out, [shards[0], other], "request differs")
    thirds = tmp_path / "thirds"
    _run_here(case_file, thirds, *CHEAP_PATHS, "--shard", "2/3")
    _assert_refused(capsys, out, [shards[0], thirds], "shard count differs")
    _assert_refused(capsys, out, [shards[0], tmp_path / "nowhere"], "no manifest.json")
    assert not out.exists()


def test_merged_metadata_sums_work_and_keeps_the_largest_worker_peak():
    def shard(index, **metadata):
        manifest = types.SimpleNamespace(shard=f"{index}/3", run_id=f"run{index}" * 4, shard_of=CASE_NAMES)
        return ShardRun(ROOT, manifest, {"platform": "linux", **metadata}, [])

    merged = merged_metadata(
        [
            shard(1, paths_s=1.5, oracle_computed=2),
            shard(2, paths_s=2.0, worker_peak_rss_mib=900, oracle_computed=1),
            shard(3, paths_s=0.25, worker_peak_rss_mib=1200),
        ],
        "merge",
    )
    assert (merged["paths_s"], merged["oracle_computed"], merged["worker_peak_rss_mib"]) == (3.75, 3, 1200)
    # a key no shard has stays out; one the first shard alone has is that shard's
    assert "worker_peak_rss_mib" not in merged_metadata([shard(1), shard(2)], "merge")
    assert merged_metadata([shard(1, worker_peak_rss_mib=700), shard(2)], "merge")["worker_peak_rss_mib"] == 700


def test_a_differs_message_shows_where_two_long_values_part():
    common = "x" * 100
    theirs, mine = where_they_differ(common + "theirs-tail", common + "mine-tail")
    assert theirs != mine and "theirs" in theirs and "mine" in mine and theirs.startswith("...")
    assert where_they_differ("short", "shorter") == ("short", "shorter")


# What two shards of one run on this CPU record of where their rows were judged (`run_metadata`).
SHARD_ENVIRONMENT = {
    "backend": "cpu",
    "device_kind": "cpu",
    "jax_version": "0.12.0.1",
    "jaxlib_version": "0.12.0.1",
    "libtpu_version": "0.0.50.1",
    "backend_arithmetic_terms": "none",
    "backend_arithmetic_digest": "9d1c0f3a5b7e2468",
}


def _fake_shard(tmp_path, index: int, metadata: dict, *, suite: str) -> ShardRun:
    """Shard `index` of 2 of CASE_NAMES as `merge.read_shard` reads one, with `metadata`."""
    manifest = types.SimpleNamespace(
        shard=f"{index}/2",
        run_id=f"run{index}" * 4,
        shard_of=CASE_NAMES,
        shard_of_digest="selection",
        request={"suite": suite},
        policy_digest="policy",
        code_digest="code",
        cases=tuple(sorted(shard_names(CASE_NAMES, parse_shard(f"{index}/2")))),
    )
    return ShardRun(tmp_path / f"shard{index}", manifest, metadata, [])


@pytest.mark.parametrize(
    ("changed", "named"),
    [
        ({"backend_arithmetic_terms": "exp 5.6e-06, log 0.000107", "backend_arithmetic_digest": "1"}, "terms"),
        ({"backend_arithmetic_digest": "0123456789abcdef"}, "backend_arithmetic_digest"),  # alike when rounded
        ({"libtpu_version": "0.0.42.1"}, "libtpu_version"),
        ({"libtpu_version": "sha256:0123456789abcdef01234567"}, "libtpu_version"),
    ],
)
def test_merge_refuses_shards_judged_under_other_arithmetic(changed, named, tmp_path, monkeypatch, capsys):
    """Issue 56, item 3: a shard judged under the TPU's terms merged with one judged under the
    CPU's (the merged metadata claiming the first's for every row), and shards from two libtpu
    builds merged: neither was among the environment merge compares."""

    def shard(index: int, metadata: dict) -> ShardRun:
        return _fake_shard(tmp_path, index, metadata, suite="default")

    shards = {
        tmp_path / "shard1": shard(1, SHARD_ENVIRONMENT),
        tmp_path / "shard2": shard(2, {**SHARD_ENVIRONMENT, **changed}),
    }
    monkeypatch.setattr(merge, "read_shard", lambda folder: shards[folder])
    merge.check_shards([shards[tmp_path / "shard1"], shard(2, SHARD_ENVIRONMENT)])  # alike: they would merge
    out = tmp_path / "merged"
    assert merge.main([str(out), *map(str, shards)]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "environment" in error and named in error, error
    assert not out.exists()


def test_shards_of_two_device_calls_on_one_image_merge_and_another_jax_does_not(tmp_path):
    """Issue 55: the tpu suite runs one shard per device call, each maybe on a fresh machine of the
    same image: what differs between calls (times, run ids, the machine's name in `platform`, the
    work each did, the oracle's memory) must not refuse the merge; another JAX or libtpu must."""

    def shard(index: int, metadata: dict) -> ShardRun:
        return _fake_shard(tmp_path, index, metadata, suite="tpu")

    first = {
        **SHARD_ENVIRONMENT,
        "platform": "Linux-6.1.0-vm-1-x86_64",
        "start_time": "2026-12-06T08:00:00+00:00",
        "wall_seconds": 412.0,
        "oracle_s": 380.5,
        "oracle_computed": 2,
    }
    second = {
        **SHARD_ENVIRONMENT,
        "platform": "Linux-6.1.0-vm-2-x86_64",
        "start_time": "2026-12-06T08:12:00+00:00",
        "wall_seconds": 398.0,
        "oracle_s": 350.0,
        "oracle_computed": 2,
    }
    merge.check_shards([shard(1, first), shard(2, second)])
    merged = merged_metadata([shard(1, first), shard(2, second)], "merge")
    assert (merged["oracle_s"], merged["oracle_computed"]) == (730.5, 4)
    for key, other in (("jax_version", "0.10.2"), ("jaxlib_version", "0.10.2"), ("libtpu_version", "0.0.42.1")):
        with pytest.raises(merge.MergeError, match=key):
            merge.check_shards([shard(1, first), shard(2, {**second, key: other})])


def test_shards_whose_cases_used_other_matmul_settings_merge_into_the_record_of_them_all(tmp_path):
    """Issue 55: each shard records the matmul-precision settings of its own cases (on the chip,
    the tpu suite's float32 `matmul_default` case alone uses "default"): the merged run records
    every setting, as one run of the suite would, and refuses a setting given two roundings."""

    def shard(index: int, **metadata) -> ShardRun:
        return _fake_shard(tmp_path, index, {**SHARD_ENVIRONMENT, "backend": "tpu", **metadata}, suite="tpu")

    first, second = shard(1, matmul_precision="highest=bfloat16x6"), shard(2, matmul_precision="default=bfloat16")
    merge.check_shards([first, second])
    merged = merged_metadata([first, second], "merge")
    assert merged["matmul_precision"] == "default=bfloat16,highest=bfloat16x6"
    assert "matmul_precision_note" not in merged
    conflicting = shard(2, matmul_precision="default=bfloat16,highest=float32")
    with pytest.raises(merge.MergeError, match="'highest' another operand rounding .float32 vs bfloat16x6."):
        merge.check_shards([first, conflicting])
    with pytest.raises(merge.MergeError, match="records no matmul_precision"):
        merge.check_shards([first, shard(2)])
    with pytest.raises(merge.MergeError, match="malformed matmul_precision"):
        merge.check_shards([first, shard(2, matmul_precision="default")])


def test_a_cpu_shard_of_default_precision_cases_keeps_its_note_in_the_merged_run(tmp_path):
    """On a CPU "default" runs as full float32: the shard whose cases use it says so, and so does
    the merge; shards that recorded no precision (before it was recorded) merge without one."""
    note = "default ran as highest: on cpu (cpu) the default precision is full float32"

    def shard(index: int, **metadata) -> ShardRun:
        return _fake_shard(tmp_path, index, {**SHARD_ENVIRONMENT, **metadata}, suite="default")

    with_note = shard(2, matmul_precision="default=float32", matmul_precision_note=note)
    merged = merged_metadata([shard(1, matmul_precision="highest=float32"), with_note], "merge")
    assert (merged["matmul_precision"], merged["matmul_precision_note"]) == ("default=float32,highest=float32", note)
    assert "matmul_precision" not in merged_metadata([shard(1), shard(2)], "merge")
