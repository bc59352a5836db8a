"""The oracle's disk cache: hits compute nothing, any change of inputs or oracle code misses,
and a corrupt entry is recomputed, never trusted."""

import dataclasses
import io
import json
import shutil

import numpy as np
import pytest

from mhc_parity.cases.fixtures import Fixture, make_fixture
from mhc_parity.cases.spec import Case
from mhc_parity.harness.engine import oracle_cache
from mhc_parity.harness.engine.oracle_cache import OracleCache
from mhc_parity.harness.engine.oracle_path import OracleOutputs, run_oracle_path
from mhc_parity.harness.judging.confidence import Sensitivity
from mhc_parity.records.project_code import PROJECT_ROOT
from tests.support import project_files_run

CASE = Case(name="oracle-cache-small", batch=1, sequence=16, streams=2, embedding=128, branch="tanh")


class CountingOracle:
    """A stand-in oracle that counts its calls and answers with arrays derived from the fixture."""

    def __init__(self):
        self.calls = []

    def __call__(self, case, fixture):
        self.calls.append(case.name)
        x = fixture.x.astype(np.float64)
        return OracleOutputs(
            leaves={"out": x * 3.0, "d_x": -x, "h_pre": x[..., 0]},
            sensitivity={
                "out": Sensitivity(1.5e-3, 2.5e-4, 3e-6, 12.0, 300.5, 16),
                "d_x": Sensitivity(float("nan"), 0.0, 0.0, 1.0, 1.0, 16),
                "h_pre": Sensitivity(3e-7, 1e-7, 1e-9, 2.5, 7.0, 16),
            },
            execute_s=1.0,
            systematic={"out": 1.25, "h_pre": 0.5},
        )


@pytest.fixture
def fixture(tmp_path):
    return make_fixture(CASE, tmp_path / "fixtures")


def _assert_same(a: OracleOutputs, b: OracleOutputs):
    assert a.leaves.keys() == b.leaves.keys()
    for name in a.leaves:
        np.testing.assert_array_equal(a.leaves[name], b.leaves[name])
    np.testing.assert_equal(
        {k: v.as_dict() for k, v in a.sensitivity.items()}, {k: v.as_dict() for k, v in b.sensitivity.items()}
    )
    assert dict(a.systematic) == dict(b.systematic)


def _entries(folder):
    return sorted(folder.glob("oracle-*.npz"))


def test_a_second_lookup_computes_nothing_and_returns_the_same_answer(tmp_path, fixture):
    compute = CountingOracle()
    first = OracleCache(tmp_path / "oracle", compute)(CASE, fixture)
    cache = OracleCache(tmp_path / "oracle", compute)  # a new process would start like this
    again = cache(CASE, fixture)
    assert compute.calls == [CASE.name]
    assert (cache.hits, cache.misses, cache.rejected) == (1, 0, 0)
    _assert_same(first, again)
    assert len(_entries(tmp_path / "oracle")) == 1


def test_a_changed_oracle_source_misses(tmp_path, fixture):
    compute = CountingOracle()
    OracleCache(tmp_path / "oracle", compute)(CASE, fixture)
    edited = tmp_path / "project"
    for name in oracle_cache.oracle_sources():
        (edited / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(PROJECT_ROOT / name, edited / name)
    assert oracle_cache.oracle_source_digest(edited) == oracle_cache.oracle_source_digest()
    with (edited / "mhc_parity/mhc/oracle.py").open("a") as handle:
        handle.write("\n# an edit\n")
    cache = OracleCache(tmp_path / "oracle", compute, source_root=edited)
    cache(CASE, fixture)
    assert compute.calls == [CASE.name] * 2 and cache.misses == 1
    assert len(_entries(tmp_path / "oracle")) == 2


def test_a_changed_fixture_misses(tmp_path, fixture):
    compute = CountingOracle()
    cache = OracleCache(tmp_path / "oracle", compute)
    cache(CASE, fixture)
    x = fixture.x.copy()
    x.flat[0] = np.nextafter(x.flat[0], np.float32(np.inf))  # one bit of one input
    changed = dataclasses.replace(fixture, x=x)
    assert isinstance(changed, Fixture) and changed.digest() != fixture.digest()
    answer = cache(CASE, changed)
    assert cache.misses == 2 and len(compute.calls) == 2
    assert answer.leaves["out"].flat[0] == 3.0 * np.float64(x.flat[0])
    other_seed = CASE.replace(seed=CASE.seed + 1)
    cache(other_seed, make_fixture(other_seed, tmp_path / "fixtures"))
    assert cache.misses == 3


def test_other_xla_flags_miss(tmp_path, fixture, monkeypatch):
    # The float64 program's last bits follow how XLA compiles it (e.g. with or without FMA).
    compute = CountingOracle()
    cache = OracleCache(tmp_path / "oracle", compute)
    cache(CASE, fixture)
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_max_isa=AVX512")
    cache(CASE, fixture)
    assert cache.misses == 2 and len(compute.calls) == 2


def _rewrite(path, edit):
    """Rewrite an entry as a valid archive with `edit(members)` applied (no zip-level damage)."""
    with np.load(path) as archive:
        members = {name: archive[name].copy() for name in archive.files}
    edit(members)
    buffer = io.BytesIO()
    np.savez(buffer, **members)
    path.write_bytes(buffer.getvalue())


def _tamper_header(members):
    header = json.loads(bytes(members["__header__"]).decode())
    header["sensitivity"]["out"]["max"] = 1.0  # a looser bound, if it were trusted
    members["__header__"] = np.frombuffer(json.dumps(header, sort_keys=True).encode(), np.uint8)


def _flip_leaf_bit(members):
    members["leaf.out"].flat[3] ^= 1


CORRUPTIONS = {
    "truncated": lambda path: path.write_bytes(path.read_bytes()[: path.stat().st_size // 2]),
    "empty": lambda path: path.write_bytes(b""),
    "header_tampered": lambda path: _rewrite(path, _tamper_header),
    "leaf_bit_flipped": lambda path: _rewrite(path, _flip_leaf_bit),
    "leaf_missing": lambda path: _rewrite(path, lambda members: members.pop("leaf.d_x")),
}


@pytest.mark.parametrize("corruption", sorted(CORRUPTIONS))
def test_a_corrupt_entry_is_recomputed_and_replaced(tmp_path, fixture, corruption):
    compute = CountingOracle()
    good = OracleCache(tmp_path / "oracle", compute)(CASE, fixture)
    (entry,) = _entries(tmp_path / "oracle")
    CORRUPTIONS[corruption](entry)
    cache = OracleCache(tmp_path / "oracle", compute)
    answer = cache(CASE, fixture)
    assert (cache.hits, cache.misses, cache.rejected) == (0, 1, 1)
    assert len(compute.calls) == 2
    _assert_same(answer, good)
    # the entry was replaced by a good one
    again = OracleCache(tmp_path / "oracle", compute)
    _assert_same(again(CASE, fixture), good)
    assert again.hits == 1 and len(compute.calls) == 2


def test_an_unwritable_folder_still_answers(tmp_path, fixture):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    compute = CountingOracle()
    cache = OracleCache(blocker / "oracle", compute)
    assert cache(CASE, fixture).leaves["out"].shape == fixture.x.shape
    assert cache.misses == 1


@pytest.mark.slow
def test_the_real_oracle_round_trips_bit_for_bit(tmp_path, fixture):
    counted = []

    def compute(case, fx):
        counted.append(case.name)
        return run_oracle_path(case, fx)

    computed = OracleCache(tmp_path / "oracle", compute)(CASE, fixture)
    cached = OracleCache(tmp_path / "oracle", compute)(CASE, fixture)
    assert counted == [CASE.name]
    _assert_same(computed, cached)


def test_the_oracle_sources_cover_every_file_an_answer_is_computed_with():
    """Tracing and running the oracle (a shape no other test uses, so it is traced here)
    runs project code only from `oracle_sources()`, besides mhc_parity/cases/spec.py, whose values
    (dtypes, math configuration) are key material: an edit anywhere else cannot change an
    answer, so the cache may keep it."""
    case = Case(name="oracle-sources", batch=1, sequence=12, streams=3, embedding=40, branch="mlp", seed=5)
    fixture = make_fixture(case)
    ran = project_files_run(lambda: run_oracle_path(case, fixture))
    assert (
        "mhc_parity/mhc/oracle.py" in ran and "mhc_parity/cases/branches.py" in ran
    )  # control: the profile sees the oracle
    # mhc_parity/cases/spec.py: key material; mhc_parity/harness/engine/run_info.py: JAX's compile-event listener (it
    # counts compiles) when another test of this process registered it.
    sources = set(oracle_cache.oracle_sources())
    assert (
        ran - {"mhc_parity/cases/spec.py", "mhc_parity/harness/engine/run_info.py", "tests/test_oracle_cache.py"}
        <= sources
    ), (
        f"the oracle ran code from {sorted(ran - sources)}, which mhc_parity.harness.engine.oracle_path "
        f"does not import at import time (or the operation lists as a program's only: PROGRAM_MODULES)"
    )
