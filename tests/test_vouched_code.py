"""Every store and every run a verdict rests on is vouched for by the code that made it.

Issue 34's reproductions: an `--impl` that patches the fixture generator at import poisoned
the fixture cache for every later run; a fixture generator edited without a version bump
was served from the cache; a run whose `--impl` module (or a module it imports) changed was
still gated and made into a baseline. Each test here drives what a user did, and checks the
stores hold nothing such a process made and that `gate` / `baseline --from` name the file.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from mhc_parity.cases import fixtures, registry
from mhc_parity.cases.fixtures import cache_key, cache_path, make_fixture
from mhc_parity.harness.cli import main as cli_main
from mhc_parity.harness.engine.implementations import load_external
from mhc_parity.harness.engine.oracle_cache import OracleCache
from mhc_parity.harness.engine.oracle_path import OracleOutputs
from mhc_parity.harness.judging.confidence import Sensitivity
from mhc_parity.records import foreign_code
from mhc_parity.records.artifact_store import ArtifactStore
from mhc_parity.records.code import external_code_files, import_closure
from mhc_parity.records.distributions import distribution_key, distributions_of
from mhc_parity.records.manifest import read_manifest
from tests.cli_support import ROOT, assert_one_line_error, cheap_run_args, run_cli
from tests.support import copy_project

CASE = registry.get("lite-n4-c128-b2s64-f32-w32-identity-default")

# An --impl whose import replaces the fixture generator by one that zeroes every input:
# the project's reference behind it, so the run itself is cheap and passes.
POISONING_IMPL = """
import mhc_parity.cases.fixtures as fixtures
from tests.external_impls import good

_generate = fixtures.generate_fixture


def _zeroed(case):
    fixture = _generate(case)
    zero = lambda a: a * 0
    return fixtures.Fixture(
        case=case,
        x=zero(fixture.x),
        weights=dict(fixture.weights),
        branch_params={k: zero(v) for k, v in fixture.branch_params.items()},
        cotangent=zero(fixture.cotangent),
    )


fixtures.generate_fixture = _zeroed
factory = good
"""


def _stored_entries(cache: pathlib.Path) -> list[str]:
    return sorted(
        p.relative_to(cache).as_posix() for p in cache.rglob("*") if p.is_file() and "jax-compilation" not in p.parts
    )


def _entry_key(path: pathlib.Path) -> dict:
    """The key material a store entry was written under (its header's `key`)."""
    if path.suffix == ".npz":  # a fixture or an oracle answer
        with np.load(path, allow_pickle=False) as archive:
            return json.loads(bytes(archive["__header__"]).decode())["key"]
    if path.suffix == ".json":  # the backend's arithmetic table (its key, and the foreign code's record)
        data = json.loads(path.read_text())
        return {**data["key"], **{k: v for k, v in data.items() if k == foreign_code.FOREIGN_KEY}}
    data = path.read_bytes()  # a program or a lowering (`mhc_parity.records.artifact_store`)
    length = int.from_bytes(data[:8], "little")
    return json.loads(data[8 : 8 + length].decode())["key"]


def test_a_process_that_loaded_an_impl_writes_only_under_keys_that_cover_it(case_file, tmp_path, monkeypatch, capsys):
    module_dir = tmp_path / "impls"
    module_dir.mkdir()
    (module_dir / "poisoner.py").write_text(POISONING_IMPL)
    cache = tmp_path / "cache"
    env = {"MHC_PARITY_CACHE": str(cache), "PYTHONPATH": f"{module_dir}:{ROOT}"}
    # One case in both runs (the later --cases wins): each store's keys are checked per entry,
    # and one case writes a fixture, an oracle answer and programs as two do.
    one_case = ("--cases", "cli-a-*")
    proc = run_cli(*cheap_run_args(case_file, tmp_path / "run", "--impl", "poisoner:factory", *one_case), env_extra=env)
    # The reference-only paths compare nothing of the implementation (exit 2), but the run
    # loaded it and stored what it made.
    assert proc.returncode == 2 and "nothing was compared of implementation" in proc.stderr, (
        proc.stdout[-2000:] + proc.stderr[-2000:]
    )
    poisoned = _stored_entries(cache)
    assert any(p.startswith("fixtures/") for p in poisoned), "its fixtures are stored, under its own key"
    for entry in poisoned:
        key = _entry_key(cache / entry)
        record = key[foreign_code.FOREIGN_KEY]
        assert record["loaded"] == ["poisoner:factory"] and set(record["modules"]) == {"poisoner"}, (entry, key)
    # A clean run on that cache reads none of it and stores its own, correct, fixtures: in this
    # process (`mhc_parity.harness.cli.main`), which never imported the poisoner; what it reads
    # is the cache on disk, as a process of its own would.
    monkeypatch.setenv("MHC_PARITY_CACHE", str(cache))
    code = cli_main(cheap_run_args(case_file, tmp_path / "clean", *one_case))
    assert code == 0, capsys.readouterr().err[-2000:]
    metadata = json.loads((tmp_path / "clean" / "report.json").read_text())["metadata"]
    assert metadata["programs_stored_loaded"] == 0 and metadata["oracle_cached"] == 0, metadata
    stored = [p for p in _stored_entries(cache) if p.startswith("fixtures/") and p not in poisoned]
    assert stored, "the clean run stores its fixtures"
    assert all(foreign_code.FOREIGN_KEY not in _entry_key(cache / p) for p in stored)


def test_only_code_from_outside_the_project_counts_as_foreign():
    load_external("mhc_parity.harness.faults.independent_mhc:factory")  # the project's own: vouched for
    assert foreign_code.write_key({"k": 1}) == {"k": 1}
    load_external("tests.external_impls:good")
    assert foreign_code.foreign_code() == ("tests.external_impls:good",)
    written = foreign_code.write_key({"k": 1})
    assert written["k"] == 1 and written[foreign_code.FOREIGN_KEY]["loaded"] == ["tests.external_impls:good"]
    assert foreign_code.read_keys({"k": 1}) == ({"k": 1}, written), "the project's own entries are read first"


def test_a_module_is_the_project_s_own_by_its_full_name_and_its_file():
    """Only the namespace's code packages are the project's: a user's own `harness` package,
    a copy of this project's module elsewhere, or its `reports` (no number comes from it) are not."""
    harness_file = ROOT / "mhc_parity" / "harness" / "faults" / "independent_mhc.py"
    assert foreign_code.is_project_module("mhc_parity.harness.faults.independent_mhc", str(harness_file))
    assert foreign_code.is_project_module("mhc_parity.mhc", None)
    old_top = "harness"  # a user's own package of this name, as the project's was before the move
    assert not foreign_code.is_project_module(f"{old_top}.faults.independent_mhc", str(harness_file))
    assert not foreign_code.is_project_module("mhc_parity.harness.faults.independent_mhc", "/elsewhere/x.py")
    assert not foreign_code.is_project_module("mhc_parity.reports.gate", None)
    assert not foreign_code.is_project_module("mhc_parity_extra.harness", None)


def test_the_import_closure_maps_module_names_to_the_namespace_s_files():
    files = import_closure(("mhc_parity.records.manifest",))
    assert {"mhc_parity/__init__.py", "mhc_parity/version.py", "mhc_parity/records/__init__.py"} <= set(files)
    assert "mhc_parity/records/manifest.py" in files and all(f.startswith("mhc_parity/") for f in files)


def test_each_store_writes_nothing_once_foreign_code_it_cannot_read_was_loaded(tmp_path):
    foreign_code.note_foreign_code("my.kernel:factory", "my.kernel")  # no such module: no file to record
    fixture = make_fixture(CASE, tmp_path / "fixtures")
    assert not cache_path(CASE, tmp_path / "fixtures").exists()
    answer = OracleOutputs(leaves={"out": np.zeros(3)}, sensitivity={}, execute_s=0.0)
    oracle = OracleCache(tmp_path / "oracle", compute=lambda case, fixture: answer)
    assert oracle(CASE, fixture).leaves is answer.leaves
    assert not (tmp_path / "oracle").exists() or not any((tmp_path / "oracle").iterdir())
    store = ArtifactStore(tmp_path / "programs", "program")
    store.save({"key": 1}, b"payload")
    assert store.load({"key": 1}) is None
    assert not any(tmp_path.rglob("*.npz")) and not any(tmp_path.rglob("*.bin"))


def test_each_store_keys_what_a_process_with_foreign_code_writes_by_that_code(tmp_path, monkeypatch):
    """Fixtures, oracle answers and artifact entries a process that loaded foreign code computes are
    stored under keys that cover it: it reads them back; a process without it does not see them."""
    module_dir = tmp_path / "impls"
    module_dir.mkdir()
    (module_dir / "recorded.py").write_text("from tests.external_impls import good as factory\n")
    monkeypatch.syspath_prepend(str(module_dir))
    load_external("recorded:factory")
    answer = OracleOutputs(
        leaves={"out": np.zeros(3)}, sensitivity={"out": Sensitivity(1e-3, 1e-4, 1e-6, 12.0, 300.0, 16)}, execute_s=0.0
    )
    oracle = OracleCache(tmp_path / "oracle", compute=lambda case, fixture: answer)
    store = ArtifactStore(tmp_path / "programs", "program")
    fixture = make_fixture(CASE, tmp_path / "fixtures")
    oracle(CASE, fixture)
    store.save({"key": 1}, b"payload")
    assert not cache_path(CASE, tmp_path / "fixtures").exists(), "not under the project's own key"
    assert fixtures.load_cached_fixture(CASE, tmp_path / "fixtures").digest() == fixture.digest()
    assert oracle(CASE, fixture) is not None and (oracle.hits, oracle.misses) == (1, 1)
    assert store.load({"key": 1}) == b"payload"
    monkeypatch.setattr(foreign_code, "_LOADED", [])  # a process without it
    assert fixtures.load_cached_fixture(CASE, tmp_path / "fixtures") is None
    clean = OracleCache(tmp_path / "oracle", compute=lambda case, fixture: answer)
    clean(CASE, fixture)
    assert (clean.hits, clean.misses) == (0, 1)
    assert ArtifactStore(tmp_path / "programs", "program").load({"key": 1}) is None


def test_an_edited_fixture_generator_is_a_cache_miss(tmp_path):
    """The fixture key holds the digest of the generator's code: in a copy of the project, one
    added line in mhc_parity/cases/init_families.py keys the same case's fixture anew (no version to bump)."""
    copy = copy_project(tmp_path / "project", ("cases", "mhc", "records"))
    code = f"from mhc_parity.cases import registry, fixtures; print(fixtures.cache_key(registry.get({CASE.name!r})))"

    def key_in_copy() -> str:
        proc = subprocess.run([sys.executable, "-c", code], cwd=copy, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr[-2000:]
        return proc.stdout.strip()

    before = key_in_copy()
    assert before == cache_key(CASE)
    families = copy / "mhc_parity" / "cases" / "init_families.py"
    families.write_text(families.read_text() + "\nEDITED = True\n")
    assert key_in_copy() != before


# --------------------------------------------------------------- the code a run records


SIBLING_IMPL = """
from tests.external_impls import good


def factory():
    from myk import tuning  # imported when called: still code under test

    return good()
"""


def _external_package(tmp_path) -> pathlib.Path:
    root = tmp_path / "ext"
    (root / "myk").mkdir(parents=True)
    (root / "myk" / "__init__.py").write_text("")
    (root / "myk" / "kernel.py").write_text(SIBLING_IMPL)
    (root / "myk" / "tuning.py").write_text("import numpy\nSCALE = 1.0\n")
    return root


def test_external_code_covers_the_modules_it_imports_and_their_distributions(tmp_path):
    root = _external_package(tmp_path)
    files = external_code_files("myk.kernel", root / "myk" / "kernel.py")
    for name in ("myk/__init__.py", "myk/kernel.py", "myk/tuning.py"):
        assert (root / name).resolve().as_posix() in files
    assert distribution_key("numpy") in files and files[distribution_key("numpy")]
    assert all(not key.startswith("distribution:mhc") for key in files), "the project records itself by file"
    assert distributions_of(["no_such_module_anywhere"]) == []


def test_an_implementation_installed_in_site_packages_records_the_libraries_beside_it_as_distributions(
    tmp_path, monkeypatch
):
    # An install folder: distributions' metadata, the implementation's package and a library
    # beside it. The library is recorded by its distribution, not read file by file (reading
    # every library of a site-packages folder cost seconds per run start).
    site = _external_package(tmp_path)
    (site / "myk-1.0.dist-info").mkdir()
    (site / "numpy").mkdir()
    (site / "numpy" / "__init__.py").write_text("import numpy.core\n")
    (site / "numpy" / "core.py").write_text("")
    providers = {"myk": ["myk"], "numpy": ["numpy"]}
    monkeypatch.setattr(
        "mhc_parity.records.code.distributions_of",
        lambda tops: sorted({d for top in tops for d in providers.get(top, ())}),
    )
    files = external_code_files("myk.kernel", site / "myk" / "kernel.py")
    assert (site / "myk" / "tuning.py").resolve().as_posix() in files
    assert not any("numpy/" in key for key in files), sorted(files)
    assert distribution_key("numpy") in files
    # Outside an install folder (a repository) every module under the root is followed.
    (site / "myk-1.0.dist-info").rmdir()
    assert (site / "numpy" / "core.py").resolve().as_posix() in external_code_files(
        "myk.kernel", site / "myk" / "kernel.py"
    )


@pytest.mark.slow
def test_gate_and_baseline_refuse_a_run_whose_impl_code_changed(case_file, tmp_path):
    root = _external_package(tmp_path)
    env = {"PYTHONPATH": f"{root}:{ROOT}"}
    out, baseline = tmp_path / "run", tmp_path / "baseline.csv"
    # One case (the later --cases wins): the code record is the run's, whatever it computed.
    paths = ("--paths", "reference/*", "wrapped_reference/*")
    proc = run_cli(
        *cheap_run_args(case_file, out, "--impl", "myk.kernel:factory", *paths, "--cases", "cli-a-*"), env_extra=env
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    recorded = dict(read_manifest(out).code_files)
    assert (root / "myk" / "tuning.py").resolve().as_posix() in recorded
    made = run_cli("baseline", "--from", out, "--to", baseline, "--impl", "myk.kernel:factory", env_extra=env)
    assert made.returncode == 0, made.stderr
    # The module the factory imports inside a function changes after the run.
    (root / "myk" / "tuning.py").write_text("import numpy\nSCALE = 1.0 + 3e-6\n")
    gate = run_cli("gate", "--baseline", baseline, "--current", out, env_extra=env)
    assert_one_line_error(gate, "other code than this checkout", "myk/tuning.py")
    again = run_cli(
        "baseline", "--from", out, "--to", tmp_path / "again.csv", "--impl", "myk.kernel:factory", env_extra=env
    )
    assert_one_line_error(again, "other code than this checkout", "myk/tuning.py")
    report = json.loads((out / "report.json").read_text())
    assert report["manifest"]["code_files"] == recorded, "the report carries the same record"
