"""Programs of external implementations in the program store: keyed by what they compute.

An external implementation's program is keyed by its lowered program
(`mhc_parity.harness.engine.program_store.program_digest`), and a process that loaded one (an
`--impl` module, MaxText's) stores its programs under a key that also covers that code
(`mhc_parity.records.foreign_code`): the files of the module and of what it imports under its
root, by content; the installed distributions it imports, by version and installed-files
record; the sources of the libraries it imports that the project does not pin, by content;
every installed distribution's version. So the next run of the same command loads them
without compiling anything, and an edited module, an edited library file or another version
of a library is a miss; what the code reads besides its files is tests/test_program_keys.py's.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import sys

import jax
import pytest

from mhc_parity.cases import registry
from mhc_parity.cases.fixtures import make_fixture
from mhc_parity.harness.engine import program_store
from mhc_parity.harness.engine.devices import path_placement
from mhc_parity.harness.engine.implementations import REFERENCE, load_external, load_implementations
from mhc_parity.harness.engine.lowering_rows import implementation_lowering_rows, lowering_rows
from mhc_parity.harness.engine.paths import Path, _build_program, _place, _trace_signature, effective_precision
from mhc_parity.harness.engine.program_cache import ProgramCache
from mhc_parity.harness.engine.program_store import ProgramStore
from mhc_parity.records import distributions, foreign_code
from tests.cli_support import ROOT, cheap_run_args, load_jsonl, run_cli, without_timing
from tests.support import project_files_run

CASE = registry.get("lite-n4-c128-b2s64-f32-w32-identity-default")

# A scratch external implementation: this project's reference under another name (times 1.0,
# so that its program is not the reference's own: the store would serve one for the other),
# beside a helper module it imports and a library installed beside it (a distribution of its own).
KERNEL = """
import fakelib
from scratch import tuning
from tests.external_impls import ScaledKernel


def factory():
    return ScaledKernel(name="scratch_reference", scale=1.0)
"""


def _scratch_code(tmp_path: pathlib.Path, version: str = "1.0") -> pathlib.Path:
    """A folder holding the package `scratch` (its `kernel` and `tuning`) and the installed
    distribution `fakelib` `version` (its module and its metadata), for sys.path."""
    root = tmp_path / "code"
    (root / "scratch").mkdir(parents=True, exist_ok=True)
    (root / "scratch" / "__init__.py").write_text("")
    (root / "scratch" / "kernel.py").write_text(KERNEL)
    (root / "scratch" / "tuning.py").write_text("SCALE = 1.0\n")
    (root / "fakelib").mkdir(exist_ok=True)
    (root / "fakelib" / "__init__.py").write_text("VALUE = 1\n")
    _install_fakelib(root, version)
    return root


def _install_fakelib(root: pathlib.Path, version: str) -> None:
    for old in root.glob("fakelib-*.dist-info"):
        for file in old.iterdir():
            file.unlink()
        old.rmdir()
    info = root / f"fakelib-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: fakelib\nVersion: {version}\n")
    (info / "RECORD").write_text(f"fakelib/__init__.py,,\nfakelib-{version}.dist-info/METADATA,,\n")
    (info / "top_level.txt").write_text("fakelib\n")


def _new_process(monkeypatch) -> None:
    """What a new process starts with: no records of code read, no distribution map."""
    monkeypatch.setattr(foreign_code, "_RECORDS", {})
    monkeypatch.setattr(foreign_code, "_INSTALLED", [])
    distributions._distributions_of_modules.cache_clear()


def _material(impl) -> dict | None:
    """The program store's key material of `impl`'s unsharded program for `CASE`, the program
    lowered as `mhc_parity.harness.engine.program_cache.ProgramCache` lowers it to look it up."""
    path = Path(impl)
    placement = path_placement(path)
    args = _place(make_fixture(CASE), path, placement)
    precision = effective_precision(CASE, placement)
    with jax.default_device(placement.devices[0]):
        traced = jax.jit(_build_program(path, CASE, placement, precision)).trace(*args)
    computed, _ = program_store.computed_material(traced, lambda t: t.lower())
    return ProgramStore.material(path, _trace_signature(CASE, precision), args, placement, computed)


def _key(impl) -> dict:
    """The program store's key of `impl`'s unsharded program for `CASE`, as this process writes it."""
    return foreign_code.write_key(_material(impl))


@pytest.fixture
def scratch(tmp_path, monkeypatch):
    """The scratch implementation loaded from a fresh folder on sys.path (the distribution map
    cleared around it)."""
    root = _scratch_code(tmp_path)
    monkeypatch.syspath_prepend(str(root))
    _new_process(monkeypatch)
    for name in [n for n in sys.modules if n.split(".")[0] in ("scratch", "fakelib")]:  # another test's copy
        monkeypatch.delitem(sys.modules, name)
    yield root, load_external("scratch.kernel:factory")
    distributions._distributions_of_modules.cache_clear()
    for name in [n for n in sys.modules if n.split(".")[0] in ("scratch", "fakelib")]:
        del sys.modules[name]


def test_an_external_program_s_key_covers_its_module_its_imports_and_their_libraries(scratch, monkeypatch):
    root, impl = scratch
    key = _key(impl)
    record = foreign_code.code_record("scratch.kernel")
    assert (root / "scratch" / "tuning.py").resolve().as_posix() in record.files, "a module it imports, by content"
    assert "distribution:fakelib" in record.files and record.libraries["fakelib"], "its library: version and files"
    assert "jax" not in record.libraries, "a library the project pins is keyed by its version"
    assert key[foreign_code.FOREIGN_KEY]["modules"]["scratch.kernel"] == record.digest()
    assert key["jaxpr"] == _material(impl)["jaxpr"], "what it computes: its traced program"
    assert key[foreign_code.FOREIGN_KEY]["loaded"] == ["scratch.kernel:factory"]
    _new_process(monkeypatch)
    assert _key(impl) == key, "the same code, the same key"


@pytest.mark.parametrize(
    "change",
    ["edit its module", "edit a module it imports", "edit its library in place", "another version of its library"],
)
def test_a_change_of_the_code_an_external_program_can_run_is_a_miss(scratch, monkeypatch, change):
    root, impl = scratch
    before = _key(impl)
    if change == "edit its module":
        (root / "scratch" / "kernel.py").write_text(KERNEL + "# edited\n")
    elif change == "edit a module it imports":
        (root / "scratch" / "tuning.py").write_text("SCALE = 1.0 + 3e-6\n")
    elif change == "edit its library in place":
        (root / "fakelib" / "__init__.py").write_text("VALUE = 2\n")
    else:
        _install_fakelib(root, "1.1")
    _new_process(monkeypatch)  # the next run reads the code anew
    after = _key(impl)
    assert after != before
    assert after[foreign_code.FOREIGN_KEY]["modules"] != before[foreign_code.FOREIGN_KEY]["modules"]
    assert after["jaxpr"] == before["jaxpr"], "the program it computes is the same"


def test_a_built_in_program_of_a_process_with_foreign_code_is_keyed_by_that_code_too(scratch):
    material = _material(REFERENCE)
    assert "jaxpr" in material, "foreign code may have patched it: keyed by what it computes"
    assert foreign_code.read_keys(material)[0] == material, "the project's own entry is read first"
    assert foreign_code.write_key(material) != material, "it writes only under its foreign code's key"


def test_an_external_implementation_whose_code_cannot_be_read_is_not_stored(monkeypatch):
    unreadable = dataclasses.replace(REFERENCE, name="mine", spec="pkg.mod:factory", module="pkg.mod")
    path = Path(unreadable)
    placement = path_placement(path)
    args = _place(make_fixture(CASE), path, placement)
    assert ProgramStore.material(path, _trace_signature(CASE, "highest"), args, placement) is None, "not lowered"
    material = _material(unreadable)  # keyed by its program, which covers what it computes ...
    monkeypatch.setattr(foreign_code, "_LOADED", [("pkg.mod:factory", "pkg.mod")])
    assert foreign_code.write_key(material) is None, "... but a process that loaded it writes nothing"


def test_a_program_keyed_by_what_it_computes_is_traced_once_a_lookup_and_counted(scratch, tmp_path):
    """A warm lookup of a program keyed by what it computes traces it once, and does not lower
    it (its jaxpr keys it), then loads it; the store says how many it traced (and lowered) to key
    and in how many seconds: the work a warm run of external code costs, which `paths_s` alone
    hid (issue 56, 8)."""
    _, impl = scratch
    path, fixture = Path(impl), make_fixture(CASE)
    counts = []
    for _ in ("cold", "warm"):
        store = ProgramStore(tmp_path / "programs")
        cache = ProgramCache(store=store)
        cache.run(path, CASE, fixture)
        cache.run(path, CASE, fixture)  # the same program again: neither lowered nor loaded again
        counts.append(store.counts())
    cold, warm = counts
    assert cold["programs_stored_missed"] == 1 and warm["programs_stored_loaded"] == 1
    assert cold["programs_traced_to_key"] == warm["programs_traced_to_key"] == 1
    assert cold["programs_lowered_to_key"] == warm["programs_lowered_to_key"] == 0, "its jaxpr keys it"
    assert warm["program_keys_s"] > 0


def test_a_program_keyed_by_its_sources_is_not_lowered_to_key(tmp_path):
    """In a process without foreign code a built-in program is looked up without tracing it."""
    store = ProgramStore(tmp_path / "programs")
    ProgramCache(store=store).run(Path(REFERENCE), CASE, make_fixture(CASE))
    counts = store.counts()
    assert counts["programs_traced_to_key"] == counts["programs_lowered_to_key"] == counts["program_keys_s"] == 0


# ------------------------------------------------------------------ across processes


def _metadata(out: pathlib.Path) -> dict:
    return json.loads((out / "report.json").read_text())["metadata"]


@pytest.mark.slow
def test_a_stored_external_program_is_loaded_by_the_next_run_and_an_edit_misses(case_file, tmp_path):
    root = _scratch_code(tmp_path)
    env = {"MHC_PARITY_CACHE": str(tmp_path / "cache"), "PYTHONPATH": f"{root}:{ROOT}"}
    # One case (a later --cases wins): its two programs, the reference's and the scratch code's,
    # show the store's miss, load and miss after an edit as the two cases' four did, in three runs
    # of half the work.
    extra = ("--impl", "scratch.kernel:factory", "--paths", "reference/*", "scratch_reference/*", "--cases", "cli-a-*")
    runs = {}
    for name in ("first", "second", "edited"):
        if name == "edited":
            (root / "scratch" / "tuning.py").write_text("SCALE = 1.0  # edited\n")
        proc = run_cli(*cheap_run_args(case_file, tmp_path / name, *extra), env_extra=env)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        runs[name] = _metadata(tmp_path / name)
    first, second, edited = runs["first"], runs["second"], runs["edited"]
    assert first["programs_stored_missed"] == 2 and first["programs_stored_loaded"] == 0
    assert second["programs_stored_loaded"] == 2 and second["programs_stored_missed"] == 0
    assert second["programs_compiled"] == 0, "nothing traced or compiled"
    assert second["oracle_cached"] == 1 and second["oracle_computed"] == 0
    assert edited["programs_stored_loaded"] == 0 and edited["programs_stored_missed"] == 2, "its code changed"
    rows = [without_timing(load_jsonl(tmp_path / name / "rows.jsonl")) for name in runs]
    assert rows[0] == rows[1] == rows[2]


# ------------------------------------------------------------------ MaxText's programs

MAXTEXT_CASE = "lite-n4-c128-b2s128-bf16-w32-identity-bf16_inexact_gates-bt64-btb32"


@pytest.mark.slow
@pytest.mark.parametrize("name", ["maxtext-layer-reference-fixed", "maxtext-layer-kernel-fixed"])
def test_maxtext_programs_run_no_project_file_outside_their_key(name):
    """Tracing a MaxText path runs project code only from its key's files: the built-in
    program sources and the files `mhc_parity.maxtext_parity` imports (its `CodeRecord`); its
    MaxText files are all in the key (the library's sources, by content)."""
    pytest.importorskip("maxtext")
    impl = next(i for i in load_implementations("mhc_parity.maxtext_parity:implementations") if i.name == name)
    case = registry.get(MAXTEXT_CASE)
    path = Path(impl)
    placement = path_placement(path)
    args = _place(make_fixture(case), path, placement)

    def lower():
        program = _build_program(path, case, placement, effective_precision(case, placement))
        with jax.default_device(placement.devices[0]):
            jax.jit(program).lower(*args)

    ran = project_files_run(lower) - {"tests/test_foreign_program_store.py"}
    record = foreign_code.code_record(impl.module, impl.source_file)
    covered = set(program_store.program_sources(True)) | set(record.files)
    assert ran <= covered, sorted(ran - covered)
    assert "maxtext" in record.libraries and record.libraries["maxtext"]


def test_a_lowering_path_the_plan_does_not_select_is_not_lowered():
    """`--paths 'reference/*' 'maxtext-*'` (make parity-maxtext) selects no `lowering/*` path:
    this project's kernels are not lowered for it (the rows were dropped after lowering before)."""

    class Store:
        def lower(self, arguments, compute):
            raise AssertionError("lowered a path the plan does not select")

        lower_implementation = lower

    impl = dataclasses.replace(REFERENCE, name="mine", lower=lambda case, mesh: pytest.fail("lowered"))
    assert list(lowering_rows(CASE, Store(), lambda name: False)) == []
    assert list(implementation_lowering_rows(CASE, impl, Store(), lambda name: not name.startswith("mine/"))) == []
