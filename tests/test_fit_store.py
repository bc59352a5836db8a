"""The fits' store (`mhc_parity.harness.engine.fit_store`): a stored solution gives the solved fit
bit for bit without solving, any change of what a fit is computed from misses, and the declared
sources cover every file a fit runs."""

from __future__ import annotations

import numpy as np
import pytest

from mhc_parity.cases import registry
from mhc_parity.cases.fixtures import make_fixture
from mhc_parity.harness.engine import fit_store
from mhc_parity.harness.engine.causes import HypothesisOracle, fitted_in_units, leaf_scales
from mhc_parity.harness.engine.fit_store import FitStore
from mhc_parity.harness.engine.oracle_path import run_oracle_path
from mhc_parity.harness.judging import attribution
from mhc_parity.harness.judging.attribution import fitted_errors
from tests.support import project_files_run

CASE = "lite-n4-c128-b2s64-f32-w32-identity-default"


@pytest.fixture(scope="module")
def setting():
    """The case, its fixture, the oracle's leaves and σ per leaf, and a candidate's scaled
    errors: a per-token error of the RMS statistic (which the fits explain) plus noise."""
    case = registry.get(CASE)
    fixture = make_fixture(case)
    answer = run_oracle_path(case, fixture)
    scales = leaf_scales(answer.leaves, answer.sensitivity)
    (h, response), *_ = HypothesisOracle().fitted(case, fixture)
    plain = fitted_in_units(h, response, scales)
    p = 1e-2 * np.random.default_rng(3).standard_normal(response.shape)
    rng = np.random.default_rng(4)
    errors = {leaf: z + 0.1 * rng.standard_normal(z.shape) for leaf, z in plain.apply(p).items()}
    return case, fixture, scales, h, response, errors


def _fitted(setting, store, scales=None):
    case, fixture, default_scales, h, response, _ = setting
    scales = default_scales if scales is None else scales
    solutions = HypothesisOracle(fits=store).fit_solutions(case, fixture, h, response, scales)
    return fitted_in_units(h, response, scales, solutions)


def _assert_same(fit, expected):
    assert fit.name == expected.name and list(fit.errors) == list(expected.errors)
    for leaf, value in expected.errors.items():
        np.testing.assert_array_equal(fit.errors[leaf], value, err_msg=leaf)


def test_a_stored_solution_gives_the_solved_fit_bit_for_bit_without_solving(setting, tmp_path, monkeypatch):
    *_, errors = setting
    solved = fitted_errors(_fitted(setting, None), errors)  # no store: solved, as ever
    store = FitStore(tmp_path)
    _assert_same(fitted_errors(_fitted(setting, store), errors), solved)
    assert (store.store.hits, store.store.misses) == (0, 1) and len(list(tmp_path.glob("fit-*.bin"))) == 1

    def unsolvable(h, candidate_errors):
        raise AssertionError("a stored solution is loaded, not solved again")

    monkeypatch.setattr(attribution, "_solve", unsolvable)
    reloaded = FitStore(tmp_path)  # another process's store: the entry on disk
    _assert_same(fitted_errors(_fitted(setting, reloaded), errors), solved)
    assert reloaded.counts() == {"fits_stored_loaded": 1, "fits_stored_missed": 0}


def test_other_errors_scales_or_hypotheses_miss(setting, tmp_path):
    case, fixture, scales, h, response, errors = setting
    store = FitStore(tmp_path)
    fitted_errors(_fitted(setting, store), errors)
    one_bit = {leaf: value.copy() for leaf, value in errors.items()}
    leaf = next(iter(one_bit))
    one_bit[leaf].flat[0] = np.nextafter(one_bit[leaf].flat[0], np.inf)
    solutions = _fitted(setting, store).solutions
    assert solutions.get(errors) is not None and solutions.get(one_bit) is None
    assert _fitted(setting, store, {**scales, leaf: np.nextafter(scales[leaf], 0.0)}).solutions.get(errors) is None
    other, other_response = HypothesisOracle().fitted(case, fixture)[1]
    assert other.name != h.name
    assert store.solutions(case, fixture, other.name, other_response.shape, scales).get(errors) is None
    reseeded = case.replace(seed=case.seed + 1)
    assert store.solutions(reseeded, make_fixture(reseeded), h.name, response.shape, scales).get(errors) is None


def test_a_corrupt_entry_is_solved_again_and_replaced(setting, tmp_path):
    *_, errors = setting
    store = FitStore(tmp_path)
    solved = fitted_errors(_fitted(setting, store), errors)
    (entry,) = tmp_path.glob("fit-*.bin")
    data = bytearray(entry.read_bytes())
    data[-5] ^= 0x01
    entry.write_bytes(bytes(data))
    again = FitStore(tmp_path)
    _assert_same(fitted_errors(_fitted(setting, again), errors), solved)
    assert again.store.rejected == 1
    assert _fitted(setting, FitStore(tmp_path)).solutions.get(errors) is not None  # replaced


def test_the_sources_cover_every_file_a_fit_runs(setting, tmp_path):
    """A fit, solved and stored, runs project code only from `fit_sources()` (besides
    mhc_parity/cases/spec.py, whose values are key material, and the store's own modules):
    an edit anywhere else cannot change a solution, so the store may keep it."""
    *_, errors = setting
    fitted = _fitted(setting, FitStore(tmp_path))
    ran = project_files_run(lambda: fitted_errors(fitted, errors))
    assert "mhc_parity/harness/judging/attribution.py" in ran and "mhc_parity/mhc/oracle_fits.py" in ran
    keeping = {
        "mhc_parity/harness/engine/fit_store.py",
        "mhc_parity/records/artifact_store.py",
        "mhc_parity/records/files.py",
        "mhc_parity/records/foreign_code.py",
        "mhc_parity/harness/engine/oracle_cache.py",
        "mhc_parity/harness/engine/store_keys.py",
        "mhc_parity/cases/spec.py",
        "mhc_parity/harness/engine/run_info.py",
        "tests/test_fit_store.py",
    }
    sources = set(fit_store.fit_sources())
    assert ran - keeping <= sources, f"a fit ran code from {sorted(ran - keeping - sources)}"


def test_a_fault_injected_leaves_the_store_open(setting, tmp_path):
    """The kill matrix names a logic fault's cause while the fault is injected: the fits'
    store stays open then (no seam is in `fit_sources`, tests/test_faults.py), while the
    stores of what a patch can reach are shut (`code_patched`)."""
    from mhc_parity.harness.faults import FAULTS
    from mhc_parity.records import foreign_code

    *_, errors = setting
    with FAULTS["reference.post_gate_factor_lost"].injected():
        assert not foreign_code.stores_open()
        store = FitStore(tmp_path)
        fitted_errors(_fitted(setting, store), errors)
        assert store.store.misses == 1 and len(list(tmp_path.glob("fit-*.bin"))) == 1
        again = FitStore(tmp_path)
        fitted_errors(_fitted(setting, again), errors)
        assert again.store.hits == 1
