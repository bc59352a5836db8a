"""A large case's oracle in a process of its own (issue 55: every case's peak host memory stated
beside its case-memory estimate): the answer is the run's own bit for bit, its peak is measured
and kept with it, and children run side by side only as far as the memory allows."""

import math
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from mhc_parity.cases import registry
from mhc_parity.cases.fixtures import make_fixture
from mhc_parity.cases.spec import Case
from mhc_parity.harness.engine import oracle_cache, oracle_process
from mhc_parity.harness.engine.case_memory import oracle_memory_bytes
from mhc_parity.harness.engine.implementations import REFERENCE
from mhc_parity.harness.engine.oracle_cache import OracleCache
from mhc_parity.harness.engine.oracle_path import oracle_units, run_oracle_path
from mhc_parity.harness.engine.runner import PathPlan, Runner
from mhc_parity.harness.judging.policy_file import load_policy
from mhc_parity.records import foreign_code
from mhc_parity.records.rows import to_frame
from mhc_parity.reports.markdown import render_markdown
from mhc_parity.reports.summary import case_memories, memory_line

CASE = Case(name="oracle-process-small", batch=1, sequence=16, streams=2, embedding=128, branch="tanh")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A private cache folder (the child finds the fixture there) and every oracle apart."""
    monkeypatch.setenv("MHC_PARITY_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv(oracle_process.OWN_PROCESS_ENV_VAR, "always")
    return tmp_path / "cache"


@pytest.mark.slow
def test_an_answer_computed_apart_is_the_runs_own_bit_for_bit_and_keeps_its_peak(cache):
    fixture = make_fixture(CASE)
    oracle = OracleCache(cache / "oracle", apart=oracle_process.compute_apart)
    apart = oracle(CASE, fixture)
    here = run_oracle_path(CASE, fixture)
    assert apart.leaves.keys() == here.leaves.keys()
    for name in here.leaves:
        np.testing.assert_array_equal(apart.leaves[name], here.leaves[name])
    np.testing.assert_equal(
        {k: v.as_dict() for k, v in apart.sensitivity.items()}, {k: v.as_dict() for k, v in here.sensitivity.items()}
    )
    assert here.peak_bytes is None  # computed among other work: no figure
    # the child's whole process at its peak: more than the interpreter alone, within the budget
    assert 100e6 < apart.peak_bytes <= oracle_memory_bytes(CASE)
    again = OracleCache(cache / "oracle", apart=oracle_process.compute_apart)
    assert again(CASE, fixture).peak_bytes == apart.peak_bytes and again.hits == 1  # the header keeps it


@pytest.mark.slow
def test_a_case_computed_apart_states_its_peak_and_budget_in_rows_and_summaries(cache, monkeypatch):
    monkeypatch.setenv(oracle_process.IN_FLIGHT_ENV_VAR, "2")
    monkeypatch.setenv("MHC_PARITY_ORACLE_CHUNK_TOKENS", "5")  # 4 chunks, 2 at a time
    runner = Runner(load_policy())  # the default oracle: the cache with its apart hook
    rows = list(runner.run_case(CASE, PathPlan((REFERENCE,), lowering=False)))
    # the budget it ran under: two chunks' working sets
    assert rows and all(row["oracle_budget_bytes"] == oracle_memory_bytes(CASE, 5, 2) for row in rows)
    peaks = {row["oracle_peak_bytes"] for row in rows}
    assert len(peaks) == 1 and math.isfinite(peaks.pop())
    memories = case_memories(rows)
    assert [m.case for m in memories] == [CASE.name] and memories[0].within
    assert "each within its case-memory estimate" in memory_line(memories)
    assert "<summary>Host memory" in render_markdown(to_frame(rows))


def test_only_the_tpu_suites_cases_go_apart_unless_told(monkeypatch):
    monkeypatch.delenv(oracle_process.OWN_PROCESS_ENV_VAR, raising=False)
    assert all(oracle_process.own_process(case) for case in registry.select(suite="tpu"))
    assert not any(oracle_process.own_process(case) for case in registry.select(suite="default"))
    monkeypatch.setenv(oracle_process.OWN_PROCESS_ENV_VAR, "never")
    assert not oracle_process.own_process(registry.select(suite="tpu")[0])
    monkeypatch.setenv(oracle_process.OWN_PROCESS_ENV_VAR, "sometimes")
    with pytest.raises(ValueError, match="always"):
        oracle_process.own_process(CASE)


def test_a_child_runs_one_chunk_at_a_time_unless_told_more(monkeypatch):
    case = registry.select(suite="tpu")[0]  # 8192 tokens of 4 x 1024: 64 chunks of 128
    monkeypatch.delenv(oracle_process.IN_FLIGHT_ENV_VAR, raising=False)
    assert oracle_process.chunks_in_flight(case, 128) == 1
    monkeypatch.setenv(oracle_process.IN_FLIGHT_ENV_VAR, "3")
    assert oracle_process.chunks_in_flight(case, 128) == 3
    assert oracle_process.chunks_in_flight(case, 4096) == 2  # no more than the chunks
    for raw in ("three", "0", "-1"):
        monkeypatch.setenv(oracle_process.IN_FLIGHT_ENV_VAR, raw)
        with pytest.raises(ValueError, match="positive integer"):
            oracle_process.chunks_in_flight(case, 128)


def test_the_child_keeps_the_memory_it_frees_unless_glibc_is_set(monkeypatch):
    """Each chunk reuses the last one's pages (2.4x faster on the lent TPU VM): the child's
    environment sets glibc so, unless the parent has set glibc's allocator itself."""
    for name in [n for n in os.environ if n.startswith("MALLOC_") or n == "GLIBC_TUNABLES"]:
        monkeypatch.delenv(name)
    environment = oracle_process.child_environment()
    assert environment["JAX_PLATFORMS"] == "cpu"
    assert {name: environment[name] for name in oracle_process.KEEP_FREED_MEMORY} == oracle_process.KEEP_FREED_MEMORY
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.hugetlb=1")
    environment = oracle_process.child_environment()
    assert environment["GLIBC_TUNABLES"] == "glibc.malloc.hugetlb=1"
    assert not set(oracle_process.KEEP_FREED_MEMORY) & set(environment)


def test_a_chunk_joins_those_running_only_while_the_memory_holds_two_more(monkeypatch):
    available = [10_000]
    monkeypatch.setattr(oracle_process, "available_memory_bytes", lambda: available[0])
    room = oracle_process.room_for_a_chunk(5_000)
    assert room()
    available[0] = 9_999  # what the machine counts in use grew (gVisor: memory freed, still counted)
    assert not room()
    available[0] = None  # unknown: the plan made at the start stands
    assert room()


def test_a_child_killed_for_memory_is_out_of_memory_and_one_that_fails_falls_back(monkeypatch, tmp_path):
    def killed(*args, **kwargs):
        return subprocess.CompletedProcess(args, -9, b"", b"")

    monkeypatch.setattr(oracle_process.subprocess, "run", killed)
    with pytest.raises(MemoryError, match="killed"):
        oracle_process.compute_in_own_process(CASE, {"chunk_tokens": 16}, None, tmp_path / "entry.npz")

    def failed(*args, **kwargs):
        return subprocess.CompletedProcess(args, 1, b"", b"Traceback\nValueError: no such branch\n")

    monkeypatch.setattr(oracle_process.subprocess, "run", failed)
    with pytest.raises(RuntimeError, match="no such branch"):
        oracle_process.compute_in_own_process(CASE, {"chunk_tokens": 16}, None, tmp_path / "entry.npz")
    # a child that cannot run: the answer is computed in the run's process instead (the numbers
    # first, the cache's own path), admitted against the memory as the child would have been
    monkeypatch.setenv(oracle_process.OWN_PROCESS_ENV_VAR, "always")
    monkeypatch.setenv("MHC_PARITY_CACHE", str(tmp_path / "cache"))
    admitted = []
    computed_here = oracle_cache.run_oracle_path

    def watched(*args, **kwargs):
        admitted.append(oracle_process.ADMISSION._held)
        return computed_here(*args, **kwargs)

    monkeypatch.setattr(oracle_cache, "run_oracle_path", watched)  # still "the project's oracle"
    fixture = make_fixture(CASE)
    oracle = OracleCache(tmp_path / "oracle", compute=watched, apart=oracle_process.compute_apart)
    answer = oracle(CASE, fixture)
    assert admitted == [oracle_memory_bytes(CASE)] and oracle_process.ADMISSION._held == 0
    assert answer.peak_bytes is None  # computed among the run's work: no figure
    here = computed_here(CASE, fixture)
    for name in here.leaves:
        np.testing.assert_array_equal(answer.leaves[name], here.leaves[name])
    assert OracleCache(tmp_path / "oracle")(CASE, fixture).peak_bytes is None  # stored, read as any entry


@pytest.mark.slow
def test_a_run_that_loaded_foreign_code_has_its_answer_made_apart_as_the_projects_own(cache, monkeypatch):
    """An `--impl` run's large case (MaxText's beside the project's kernels on the chip) gets its
    answer from the child, which loads none of that code: stored under the project's key, with its
    peak; not computed in the run's process beside the foreign code, unmeasured and unadmitted."""
    monkeypatch.setattr(foreign_code, "_LOADED", [(f"{__name__}:factory", __name__)])
    fixture = make_fixture(CASE)
    apart = OracleCache(cache / "oracle", apart=oracle_process.compute_apart)(CASE, fixture)
    assert apart.peak_bytes is not None  # measured: its own process
    monkeypatch.setattr(foreign_code, "_LOADED", [])
    own = OracleCache(cache / "oracle")
    assert own(CASE, fixture).peak_bytes == apart.peak_bytes and own.hits == 1  # the project's own entry


def test_a_child_refuses_a_key_its_own_process_would_not_make(cache, tmp_path):
    """The child states the key's code, versions and compiler only where they are its own."""
    fixture = make_fixture(CASE)
    key = oracle_cache.key_material(CASE, fixture, "another project's oracle sources")
    with pytest.raises(RuntimeError, match="differs from the run's in oracle_sources"):
        oracle_process.compute_in_own_process(CASE, key, oracle_units(CASE), tmp_path / "entry.npz")
    assert not (tmp_path / "entry.npz").exists()


def test_children_start_in_order_and_together_only_within_the_memory(monkeypatch):
    admission = oracle_process._Admission()
    monkeypatch.setattr(oracle_process, "memory_for_a_case", lambda: 100)
    started = []

    def child(name, need, hold_s):
        admission.acquire(need)
        started.append(name)
        time.sleep(hold_s)
        admission.release(need)

    big = threading.Thread(target=child, args=("big", 60, 0.3))
    big.start()
    time.sleep(0.05)
    # 60 + 30 > 85 (the admitted share of 100): the second waits, and the small third, though
    # it would fit beside the first, waits its turn behind it
    second = threading.Thread(target=child, args=("second", 30, 0.0))
    second.start()
    time.sleep(0.05)
    third = threading.Thread(target=child, args=("third", 10, 0.0))
    third.start()
    time.sleep(0.1)
    assert started == ["big"]
    for thread in (big, second, third):
        thread.join(5)
    assert started == ["big", "second", "third"]
    # alone, a child is admitted whatever its budget (a case that cannot fit was refused up front)
    admission.acquire(1000)
    admission.release(1000)


def test_without_a_high_water_mark_the_peak_is_the_largest_resident_memory_sampled(monkeypatch):
    """gVisor (the lent TPU VM) has VmRSS in /proc/self/status and no VmHWM: the oracle's own
    process then samples VmRSS, and its peak is the largest reading, not the memory at the end."""
    readings = {"VmRSS": 100}
    monkeypatch.setattr(oracle_process, "_status_bytes", lambda field: readings.get(field))
    monkeypatch.setattr(oracle_process, "_sampled_peak", {"started": False, "bytes": 0})
    monkeypatch.setattr(oracle_process.resource, "getrusage", lambda _: pytest.fail("ru_maxrss is the parent's"))
    oracle_process.sample_resident_peak()
    readings["VmRSS"] = 5000
    deadline = time.monotonic() + 5
    while oracle_process._sampled_peak["bytes"] < 5000 and time.monotonic() < deadline:
        time.sleep(oracle_process.RESIDENT_SAMPLE_S)
    readings["VmRSS"] = 300  # freed since
    assert oracle_process.peak_resident_bytes() == 5000
    readings["VmHWM"] = 7000  # where the kernel keeps one, it decides
    assert oracle_process.peak_resident_bytes() == 7000


def test_a_childs_peak_is_its_own_not_its_parents():
    """Linux carries `ru_maxrss` across the exec from the forked parent: a run holding 1.5 GB
    would have given every oracle child 1.5 GB more than it used (make test's workers did)."""
    held = np.ones(1_500_000_000 // 8)  # touched: resident in this process
    code = "from mhc_parity.harness.engine.oracle_process import peak_resident_bytes as p; print(p())"
    child = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=oracle_process.child_environment(),
        check=True,
    )
    assert held.sum() > 0 and int(child.stdout) < 1e9, child.stdout
