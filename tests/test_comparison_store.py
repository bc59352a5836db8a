"""A case's judged rows are stored by everything they were judged from (`mhc_parity.harness.engine.comparison_store`).

A second run of the same outputs loads the rows it judged (its programs still run), and they
are the rows judging them again gives, cell for cell, with this run's timings; one bit of
one output, the policy, the case, the fixture, the code or the backend's arithmetic terms is
another key; a damaged entry is judged again; and a process that loaded foreign code keys its
rows by that code too.
"""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
from support import tpu_v5e_terms

from mhc_parity.cases.catalogue import make_case
from mhc_parity.cases.fixtures import make_fixture
from mhc_parity.harness.engine import comparison_store, oracle_path
from mhc_parity.harness.engine.collaborators import Collaborators
from mhc_parity.harness.engine.comparison_store import (
    TIMING_COLUMNS,
    ComparisonStore,
    key_material,
    path_material,
    with_timings,
)
from mhc_parity.harness.engine.implementations import BUILTIN
from mhc_parity.harness.engine.plan import PathPlan
from mhc_parity.harness.engine.program_cache import ProgramCache
from mhc_parity.harness.engine.runner import Runner
from mhc_parity.harness.judging.policy_file import load_policy
from mhc_parity.records import foreign_code

CASE = make_case(dtype="bfloat16")
PLAN = PathPlan(implementations=tuple(BUILTIN.values()), path_globs=("reference/unsharded", "interpret/unsharded"))
PROGRAMS = ProgramCache()  # compiled once for the module's runs (in memory: no store is written)


def _rows(store: ComparisonStore | None) -> list[dict]:
    runner = Runner(load_policy(), Collaborators(programs=PROGRAMS, comparison_store=store))
    return [row for row in runner.run_case(CASE, PLAN) if row["comparison"] != "lowering"]


def _without_timing(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in row.items() if k not in TIMING_COLUMNS} for row in rows]


def _same(a: list[dict], b: list[dict]) -> bool:
    """Cell for cell, NaN equal to NaN."""
    return len(a) == len(b) and all(
        x.keys() == y.keys()
        and all(
            (isinstance(x[k], float) and isinstance(y[k], float) and math.isnan(x[k]) and math.isnan(y[k]))
            or x[k] == y[k]
            for k in x
        )
        for x, y in zip(a, b)
    )


@pytest.fixture(scope="module")
def judged():
    """The case's rows judged without a store."""
    return _rows(None)


def test_a_second_run_loads_the_rows_it_judged_with_its_own_timings(tmp_path, judged):
    store = ComparisonStore(tmp_path)
    first = _rows(store)
    assert store.counts() == {"comparisons_stored_loaded": 0, "comparisons_stored_missed": 1}
    second = _rows(store)
    assert store.counts() == {"comparisons_stored_loaded": 1, "comparisons_stored_missed": 1}
    assert _same(_without_timing(first), _without_timing(judged))
    assert _same(_without_timing(second), _without_timing(judged))
    timed = [row for row in second if row["verdict"] not in ("skip", "unsupported")]
    assert timed and all(row["compile_s"] >= 0 and row["execute_s"] >= 0 for row in timed)


def test_the_comparisons_are_timed_where_judged_and_not_where_loaded(tmp_path):
    store = ComparisonStore(tmp_path)
    judging, loading = (
        Runner(load_policy(), Collaborators(programs=PROGRAMS, comparison_store=store)) for _ in range(2)
    )
    list(judging.run_case(CASE, PLAN))
    list(loading.run_case(CASE, PLAN))
    assert judging.timings["compare_s"] > 0 and loading.timings["compare_s"] == 0


def test_with_timings_retimes_timed_rows_and_leaves_status_rows():
    untimed = dict.fromkeys(TIMING_COLUMNS, math.nan)
    stored, current = (1.0, 2.0, 3.0, 5.0, 64.0), (0.5, 0.25, 0.75, 5.0, 64.0)
    rows = [
        {"candidate": "a", **dict(zip(TIMING_COLUMNS, stored))},
        {"candidate": "a", **untimed},  # a status row
        {"candidate": "b", **untimed},  # a path that did not run
    ]
    retimed = with_timings(rows, {"a": stored}, {"a": current})
    assert retimed[0] == {"candidate": "a", **dict(zip(TIMING_COLUMNS, current))}
    assert retimed[1:] == rows[1:] and rows[0]["compile_s"] == 1.0  # the stored rows are not changed


def test_every_input_of_the_judgement_is_in_the_key(monkeypatch):
    fixture = make_fixture(CASE)
    leaves = {"out": np.arange(8, dtype=np.float32), "d_x": np.ones(4, dtype=np.float32)}
    moved = dict(leaves, out=np.nextafter(leaves["out"], np.float32(np.inf)))

    def key(case=CASE, fix=fixture, policy="p", outputs=leaves, verdict=""):
        paths = [path_material("reference/unsharded", verdict=verdict, reason="", devices="cpu:0", leaves=outputs)]
        return key_material(case, fix, policy, paths)

    base = key()
    assert key() == base
    other_case = dataclasses.replace(CASE, seed=CASE.seed + 1)
    variants = [
        key(outputs=moved),
        key(outputs=None, verdict="error"),
        key(policy="q"),
        key(case=other_case),
        key(fix=make_fixture(other_case)),
    ]
    monkeypatch.setattr(comparison_store, "project_code_digest", lambda: "edited")
    variants.append(key())
    assert all(variant != base for variant in variants)


def test_the_backend_terms_and_noise_units_are_in_the_key(monkeypatch):
    fixture = make_fixture(CASE)
    paths = [path_material("reference/unsharded", verdict="", reason="", devices="cpu:0", leaves=None)]
    on_this_cpu = key_material(CASE, fixture, "p", paths)
    assert set(on_this_cpu["arithmetic"]["backend_terms"].values()) == {0.0}
    monkeypatch.setattr(oracle_path, "backend_terms", tpu_v5e_terms)
    on_the_tpu = key_material(CASE, fixture, "p", paths)
    assert on_the_tpu != on_this_cpu
    assert on_the_tpu["arithmetic"]["noise_units"] != on_this_cpu["arithmetic"]["noise_units"]
    # One term moved by one part in 10^6: another key (the rows' bounds moved with it).
    nudged = dict(tpu_v5e_terms(), exp=tpu_v5e_terms()["exp"] * (1 + 1e-6))
    monkeypatch.setattr(oracle_path, "backend_terms", lambda: nudged)
    assert key_material(CASE, fixture, "p", paths) != on_the_tpu


def test_rows_judged_under_another_backend_s_terms_are_never_replayed(tmp_path, monkeypatch, judged):
    """Issue 56, item 1: rows judged while the probe table held the TPU's terms were replayed
    after the CPU's table was put back (and the other way round)."""
    store = ComparisonStore(tmp_path / "cpu-first")
    _rows(store)  # judged under this CPU's terms (all 0)
    with monkeypatch.context() as patched:
        patched.setattr(oracle_path, "backend_terms", tpu_v5e_terms)
        wide = _rows(store)
    assert store.counts() == {"comparisons_stored_loaded": 0, "comparisons_stored_missed": 2}
    # The TPU's terms judged other bounds: replaying either for the other would be wrong.
    assert not _same(_without_timing(wide), _without_timing(judged))
    assert _same(_without_timing(_rows(store)), _without_timing(judged))
    assert store.counts()["comparisons_stored_loaded"] == 1  # this CPU's own rows, as stored

    store = ComparisonStore(tmp_path / "tpu-first")
    with monkeypatch.context() as patched:
        patched.setattr(oracle_path, "backend_terms", tpu_v5e_terms)
        _rows(store)
    assert _same(_without_timing(_rows(store)), _without_timing(judged))
    assert store.counts() == {"comparisons_stored_loaded": 0, "comparisons_stored_missed": 2}


def test_a_damaged_entry_is_judged_again(tmp_path, judged):
    store = ComparisonStore(tmp_path)
    _rows(store)
    (entry,) = tmp_path.iterdir()
    entry.write_bytes(entry.read_bytes()[:-5])
    assert _same(_without_timing(_rows(store)), _without_timing(judged))
    assert store.store.rejected == 1


def test_a_process_that_loaded_foreign_code_keys_its_rows_by_that_code(tmp_path, monkeypatch, judged):
    module = tmp_path / "patching_module.py"
    module.write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    __import__("patching_module")
    store = ComparisonStore(tmp_path / "store")
    monkeypatch.setattr(foreign_code, "_LOADED", [("patching_module:factory", "patching_module")])
    assert _same(_without_timing(_rows(store)), _without_timing(judged))
    (entry,) = (tmp_path / "store").iterdir()
    data = entry.read_bytes()
    header = json.loads(data[8 : 8 + int.from_bytes(data[:8], "little")])
    assert header["key"][foreign_code.FOREIGN_KEY]["loaded"] == ["patching_module:factory"]
    monkeypatch.setattr(foreign_code, "_LOADED", [])  # the project's own process does not read it
    _rows(store)
    assert store.counts() == {"comparisons_stored_loaded": 0, "comparisons_stored_missed": 2}
