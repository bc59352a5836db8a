"""The disk stores of compiled programs and TPU lowering results: a stored program gives
bit-identical leaves, any change of what it is made of misses, a corrupt entry is
recompiled, and the declared sources cover every file a built-in program is traced from."""

import dataclasses
import json
import os
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest

from mhc_parity.cases.fixtures import make_fixture
from mhc_parity.cases.spec import Case
from mhc_parity.harness.cli import main as cli_main
from mhc_parity.harness.engine import program_store, store_keys
from mhc_parity.harness.engine.devices import path_placement
from mhc_parity.harness.engine.implementations import INTERPRET, REFERENCE
from mhc_parity.harness.engine.paths import Path, _build_program, _place, _trace_signature, effective_precision
from mhc_parity.harness.engine.program_cache import ProgramCache
from mhc_parity.harness.engine.program_store import LoweringStore, ProgramStore
from mhc_parity.mhc.common import UnsupportedInputError
from mhc_parity.mhc.kernels.lowering import LoweringResult
from mhc_parity.records import foreign_code
from mhc_parity.records.artifact_store import ArtifactStore, CorruptEntry, decode_entry, encode_entry
from mhc_parity.records.code import closure_digest, import_closure
from mhc_parity.records.project_code import PROJECT_ROOT
from tests.cli_support import CASE_FILE, load_jsonl, run_cli, without_timing
from tests.support import copy_project, project_files_run

CASE = Case(name="program-store-small", batch=1, sequence=16, streams=2, embedding=128, branch="mlp")
SHARDED = Case(name="program-store-sharded", batch=2, sequence=16, streams=2, embedding=128, branch="mlp", mesh=(2, 1))


# ------------------------------------------------------------------ the entry format


def test_an_entry_round_trips_and_any_damage_is_rejected():
    material = {"key": 1, "names": ["a", "b"]}
    entry = encode_entry(material, b"payload bytes")
    assert decode_entry(entry, material) == b"payload bytes"
    flipped = bytearray(entry)
    flipped[-3] ^= 0x01
    damaged = {
        "payload byte flipped": bytes(flipped),
        "truncated": entry[:-4],
        "header only": entry[:20],
        "empty": b"",
    }
    for why, data in damaged.items():
        with pytest.raises(CorruptEntry):
            decode_entry(data, material)
        assert why
    with pytest.raises(CorruptEntry, match="stale"):
        decode_entry(entry, {"key": 2, "names": ["a", "b"]})


def test_the_store_counts_hits_misses_and_rejected_entries(tmp_path):
    store = ArtifactStore(tmp_path, "thing")
    assert store.load({"k": 1}) is None
    store.save({"k": 1}, b"one")
    assert store.load({"k": 1}) == b"one"
    # an entry copied under another key's name is stale, not used
    shutil.copy(store.entry_path({"k": 1}), store.entry_path({"k": 2}))
    assert store.load({"k": 2}) is None
    assert (store.hits, store.misses, store.rejected) == (1, 2, 1)


# ------------------------------------------------------------------ compiled programs


def _run(case, path, store):
    return ProgramCache(store=store).run(path, case, make_fixture(case))


@pytest.mark.parametrize("impl", [REFERENCE, INTERPRET], ids=lambda i: i.name)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_stored_program_gives_the_plain_compiles_leaves_bit_for_bit(tmp_path, impl, dtype):
    """Compiled for the store (`ProgramStore.compile`'s options), saved and loaded, a program
    computes exactly what `jax.jit` compiles from the same code (bfloat16: where XLA's
    excess-precision setting would show)."""
    case, path = dataclasses.replace(CASE, dtype=dtype), Path(impl)
    plain = _run(case, path, None)
    _run(case, path, ProgramStore(tmp_path))
    store = ProgramStore(tmp_path)  # a new process would start like this
    loaded = _run(case, path, store)
    assert (store.store.hits, store.store.misses) == (1, 0)
    assert loaded.leaves.keys() == plain.leaves.keys()
    for name, value in plain.leaves.items():
        np.testing.assert_array_equal(loaded.leaves[name], value, err_msg=name)


@pytest.mark.slow
def test_a_stored_sharded_program_gives_bit_identical_leaves(tmp_path):
    path = Path(INTERPRET, mesh=(2, 1))
    compiled = _run(SHARDED, path, ProgramStore(tmp_path))
    store = ProgramStore(tmp_path)
    loaded = _run(SHARDED, path, store)
    assert store.store.hits == 1
    for name, value in compiled.leaves.items():
        np.testing.assert_array_equal(loaded.leaves[name], value, err_msg=name)


def test_a_corrupt_program_entry_is_recompiled_and_replaced(tmp_path):
    path = Path(REFERENCE)
    expected = _run(CASE, path, ProgramStore(tmp_path))
    (entry,) = tmp_path.glob("program-*.bin")
    data = bytearray(entry.read_bytes())
    data[len(data) // 2] ^= 0xFF
    entry.write_bytes(bytes(data))
    store = ProgramStore(tmp_path)
    again = _run(CASE, path, store)
    assert (store.store.hits, store.store.rejected) == (0, 1)
    np.testing.assert_array_equal(again.leaves["out"], expected.leaves["out"])
    reloaded = ProgramStore(tmp_path)
    _run(CASE, path, reloaded)
    assert reloaded.store.hits == 1, "the recompiled program replaced the corrupt entry"


def test_a_rejected_input_is_stored_and_raised_again_without_tracing(tmp_path, monkeypatch):
    """A program whose tracing rejects its input (the kernels do not take embedding 96) is
    stored as that rejection: the next run raises the same error and traces nothing."""
    case, path = dataclasses.replace(CASE, embedding=96), Path(INTERPRET)
    with pytest.raises(UnsupportedInputError) as first:
        _run(case, path, ProgramStore(tmp_path))
    import mhc_parity.harness.engine.paths

    def no_tracing(*args, **kwargs):
        raise AssertionError("the stored rejection should have answered")

    monkeypatch.setattr(mhc_parity.harness.engine.paths, "_build_program", no_tracing)
    store = ProgramStore(tmp_path)
    with pytest.raises(UnsupportedInputError) as again:
        _run(case, path, store)
    assert str(again.value) == str(first.value) and store.store.hits == 1


def _material(case, path):
    placement = path_placement(path)
    args = _place(make_fixture(case), path, placement)
    return ProgramStore.material(path, _trace_signature(case, effective_precision(case, placement)), args, placement)


def test_the_key_changes_with_shapes_dtypes_and_devices_and_unreadable_external_code_is_not_stored():
    base = _material(CASE, Path(REFERENCE))
    assert _material(CASE, Path(REFERENCE)) == base
    assert _material(dataclasses.replace(CASE, sequence=32), Path(REFERENCE)) != base
    assert _material(dataclasses.replace(CASE, dtype="bfloat16"), Path(REFERENCE)) != base
    assert _material(CASE, Path(INTERPRET))["sources"] != base["sources"]
    # An external implementation's programs are keyed by what they compute, their lowering
    # (tests/test_foreign_program_store.py, tests/test_program_keys.py): not lowered, not stored.
    external = dataclasses.replace(REFERENCE, name="mine", spec="pkg.mod:factory", module="pkg.mod")
    assert _material(CASE, Path(external)) is None


def test_without_readable_sources_programs_are_compiled_and_not_stored(tmp_path, monkeypatch):
    def unreadable(*args, **kwargs):
        raise FileNotFoundError("no source file for module 'mhc_parity.harness.engine.paths'")

    monkeypatch.setattr(store_keys, "closure_digest", unreadable)
    store_keys.traced_sources_digest.cache_clear()
    try:
        store = ProgramStore(tmp_path)
        outputs = _run(CASE, Path(REFERENCE), store)
    finally:
        store_keys.traced_sources_digest.cache_clear()
    assert outputs.leaves["out"].size and not list(tmp_path.glob("program-*.bin"))


def test_a_kernel_edit_changes_the_kernel_programs_key_only(tmp_path):
    copy_project(tmp_path, ("mhc", "cases", "records", "harness"))

    def digest(kernel: bool) -> str:
        return closure_digest(program_store.PROGRAM_ENTRY, program_store._not_traced(kernel), tmp_path)

    before = {kernel: digest(kernel) for kernel in (False, True)}
    assert before[True] == store_keys.traced_sources_digest(
        program_store.PROGRAM_ENTRY, program_store._not_traced(True)
    ), "the copy is the project's code"
    kernel_file = tmp_path / "mhc_parity/mhc/kernels/forward.py"
    kernel_file.write_text(kernel_file.read_text() + "\n# edited\n")
    assert digest(False) == before[False]
    assert digest(True) != before[True]
    oracle_file = tmp_path / "mhc_parity/mhc/oracle.py"
    oracle_file.write_text(oracle_file.read_text() + "\n# edited\n")
    assert digest(False) == before[False], "the oracle is not traced"
    common = tmp_path / "mhc_parity/mhc/common.py"
    common.write_text(common.read_text() + "\n# edited\n")
    assert digest(False) != before[False]


def test_a_new_module_a_program_imports_joins_its_key_without_a_declaration(tmp_path):
    """The sources are the imports' closure: a module split out of one the paths import is
    covered with no list to update."""
    copy_project(tmp_path, ("mhc", "cases", "records", "harness"))
    before = closure_digest(program_store.PROGRAM_ENTRY, program_store._not_traced(False), tmp_path)
    (tmp_path / "mhc_parity/mhc/split_out.py").write_text("SCALE = 1.0\n")
    common = tmp_path / "mhc_parity/mhc/common.py"
    common.write_text("from mhc_parity.mhc.split_out import SCALE  # noqa: F401\n" + common.read_text())
    files = import_closure(program_store.PROGRAM_ENTRY, program_store._not_traced(False), tmp_path)
    assert "mhc_parity/mhc/split_out.py" in files
    (tmp_path / "mhc_parity/mhc/split_out.py").write_text("SCALE = 2.0\n")
    assert closure_digest(program_store.PROGRAM_ENTRY, program_store._not_traced(False), tmp_path) != before


def _files_run_while_tracing(case, path) -> set[str]:
    """Project files (relative) whose Python code ran while `path`'s program was built and lowered."""
    placement = path_placement(path)
    precision = effective_precision(case, placement)
    args = _place(make_fixture(case), path, placement)

    def lower():
        with jax.default_device(placement.devices[0]):
            jax.jit(_build_program(path, case, placement, precision)).lower(*args)

    return project_files_run(lower)


@pytest.mark.slow
@pytest.mark.parametrize(
    "case, path",
    [
        (CASE, Path(REFERENCE)),
        (CASE, Path(INTERPRET)),
        (SHARDED, Path(REFERENCE, mesh=(2, 1))),
        (SHARDED, Path(INTERPRET, mesh=(2, 1))),
    ],
    ids=lambda v: getattr(v, "name", ""),
)
def test_the_sources_cover_every_file_a_program_is_traced_from(case, path):
    ran = _files_run_while_tracing(case, path)
    sources = set(program_store.program_sources(path.impl.kernel))
    assert ran - {"tests/test_program_store.py"} <= sources, (
        f"{path.name}'s program ran code from {sorted(ran - sources)}, which the module that builds "
        f"programs does not import at import time: import it at the top (mhc_parity.harness.engine.paths' closure)"
    )
    kernels = set(program_store.program_sources(True)) - set(program_store.program_sources(False))
    if path.impl.kernel:
        assert ran & kernels, "control: the profile sees the kernels' code"
    else:
        assert not ran & kernels


# ------------------------------------------------------------------ TPU lowering results


def test_a_stored_lowering_is_not_recomputed_and_other_arguments_miss(tmp_path):
    calls = []

    def compute():
        calls.append(1)
        return [LoweringResult("pre_forward", True, "", 0.5), LoweringResult("post_forward", False, "Err: no", 0.25)]

    arguments = {"config": {"streams": 4}, "batch": 2}
    first = LoweringStore(tmp_path).lower(arguments, compute)
    store = LoweringStore(tmp_path)
    again = store.lower(arguments, compute)
    assert len(calls) == 1 and store.store.hits == 1
    assert [(r.program, r.ok, r.error) for r in again] == [(r.program, r.ok, r.error) for r in first]
    store.lower({**arguments, "batch": 4}, compute)
    assert len(calls) == 2


# ------------------------------------------------------------------ across processes

_PLAIN_COMPILES = """
import sys
from mhc_parity.harness.env import ensure_host_devices
ensure_host_devices()
from mhc_parity.cases.fixtures import make_fixture
from mhc_parity.cases.toml_cases import load_case_file
from mhc_parity.harness.engine.implementations import INTERPRET, REFERENCE
from mhc_parity.harness.engine.paths import Path
from mhc_parity.harness.engine.program_cache import ProgramCache
from mhc_parity.harness.engine.run_info import enable_compilation_cache
enable_compilation_cache()
for case in load_case_file(sys.argv[1]):
    for impl in (REFERENCE, INTERPRET):
        ProgramCache().run(Path(impl), case, make_fixture(case))
"""


@pytest.mark.slow
def test_programs_stored_by_one_run_load_in_the_next_even_when_jax_cached_them_first(tmp_path):
    """JAX's persistent cache holding the same programs (here from a process without the
    store) must not leak into the store: an executable JAX loaded does not serialise whole
    on the pinned jaxlib and failed in the next process ("Function ... not found")."""
    case_file = tmp_path / "cases.toml"
    # One unsharded case through the reference and interpret paths: any program JAX's cache
    # loaded shows the leak, a kernel's and a reference's alike (more cases add only repeats).
    case_file.write_text(CASE_FILE.split('[[case]]\nname = "cli-b-bf16"')[0])
    env = {"MHC_PARITY_CACHE": str(tmp_path / "cache")}
    plain = subprocess.run(
        [sys.executable, "-c", _PLAIN_COMPILES, str(case_file)],
        cwd=PROJECT_ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert plain.returncode == 0, plain.stderr[-3000:]
    runs = []
    for name in ("first", "second"):
        result = run_cli(
            "run",
            "--case-file",
            case_file,
            "--cases",
            "cli-*",
            "--no-lowering",
            "--quiet",
            "--out",
            tmp_path / name,
            env_extra=env,
        )
        assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
        runs.append(json.loads((tmp_path / name / "report.json").read_text())["metadata"])
    assert runs[0]["programs_stored_missed"] > 0 and runs[0]["programs_stored_loaded"] == 0
    assert runs[1]["programs_stored_loaded"] == runs[0]["programs_stored_missed"]
    assert runs[1]["programs_stored_missed"] == 0
    first, second = (load_jsonl(tmp_path / name / "rows.jsonl") for name in ("first", "second"))
    assert without_timing(first) == without_timing(second)
    assert all(row["verdict"] in ("pass", "skip") for row in second), {row["verdict"] for row in second}


PATCHING_IMPL = '''
"""An external implementation whose import patches this project's reference path."""
import mhc_parity.mhc.reference as reference

_original_pre = reference.pre


def _doubled_pre(x, weights, *, config):
    layer_input, context = _original_pre(x, weights, config=config)
    return layer_input * 2, context


reference.pre = _doubled_pre


class Patcher:
    name = "patcher"

    def pre(self, x, weights, *, config):
        return _original_pre(x, weights, config=config)

    def post(self, layer_output, context, *, config):
        return reference.post(layer_output, context, config=config)


def factory():
    return Patcher()
'''


@pytest.mark.slow
def test_a_process_that_loaded_an_external_implementation_cannot_poison_the_program_store(
    tmp_path, monkeypatch, capsys
):
    """Its import may patch any module: a built-in program it traced is stored only under a key
    that covers its code (`mhc_parity.records.foreign_code`), so it never reaches a later run
    without that code, which traces its own."""
    from tests.cli_support import REFERENCE_ONLY_CASE, run_cli

    (tmp_path / "patcher.py").write_text(PATCHING_IMPL)
    env = {
        "MHC_PARITY_CACHE": str(tmp_path / "cache"),
        "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
    }
    common = ("--cases", REFERENCE_ONLY_CASE, "--paths", "reference/*", "--no-lowering", "--quiet")
    # --no-causes: the failing run's cause search stores no program (its hypotheses run the
    # float64 oracle, kept under causes/ and comparisons/, not programs/), so every program
    # the patched process stores is still here to have its key checked; the verdicts are the same.
    patched_run = ("run", *common, "--no-causes", "--impl", "patcher:factory", "--out", tmp_path / "patched")
    patched = run_cli(*patched_run, env_extra=env)
    assert patched.returncode == 1, patched.stdout[-2000:] + patched.stderr[-2000:]  # the patch shows
    stored = list((tmp_path / "cache" / "programs").glob("program-*.bin"))
    assert stored, "the patched process stores its programs, under its own keys"
    for entry in stored:
        data = entry.read_bytes()
        key = json.loads(data[8 : 8 + int.from_bytes(data[:8], "little")].decode())["key"]
        assert key["foreign_code"]["loaded"] == ["patcher:factory"], key
    # The clean run in this process (`mhc_parity.harness.cli.main`), which never imported the
    # patcher: it reads the store on disk as a process of its own would.
    monkeypatch.setenv("MHC_PARITY_CACHE", env["MHC_PARITY_CACHE"])
    code = cli_main(["run", *common, "--out", str(tmp_path / "clean")])
    assert code == 0, capsys.readouterr().err[-2000:]
    metadata = json.loads((tmp_path / "clean" / "report.json").read_text())["metadata"]
    assert metadata["programs_stored_loaded"] == 0 and metadata["programs_stored_missed"] > 0


def _entries(folder) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(folder.glob("program-*"))}


def test_while_a_fault_is_injected_no_program_is_loaded_or_stored(tmp_path):
    """The kill matrix's clean passes use the store, its perturbed passes must not: a program
    traced under a fault is not stored (it would pass for the clean code's), and a stored clean
    program is not loaded for patched code (the fault would vanish). An injection shuts the store
    (`mhc_parity.records.foreign_code.code_patched`) for whoever asks, and it opens again afterwards."""
    from mhc_parity.harness.faults import FAULTS

    fault, path = FAULTS["reference.post_gate_factor_lost"], Path(REFERENCE, None)
    with fault.injected():  # an empty store first: nothing the patch traces lands in it
        patched_store = ProgramStore(tmp_path)
        patched = _run(CASE, path, patched_store).leaves
    assert not _entries(tmp_path) and (patched_store.store.hits, patched_store.store.misses) == (0, 0)
    assert foreign_code.stores_open()

    clean_store = ProgramStore(tmp_path)
    clean = _run(CASE, path, clean_store).leaves
    stored = _entries(tmp_path)
    assert len(stored) == 1 and clean_store.store.misses == 1
    assert any(not np.array_equal(clean[leaf], patched[leaf]) for leaf in clean), "the fault changes the leaves"
    plain = ProgramCache().run(path, CASE, make_fixture(CASE)).leaves
    for leaf, value in clean.items():
        np.testing.assert_array_equal(value, plain[leaf], err_msg=leaf)

    with fault.injected():  # the clean program is stored now: the patched run must not load it
        again_store = ProgramStore(tmp_path)
        again = _run(CASE, path, again_store).leaves
    assert (again_store.store.hits, again_store.store.misses) == (0, 0) and _entries(tmp_path) == stored
    for leaf, value in patched.items():
        np.testing.assert_array_equal(again[leaf], value, err_msg=leaf)
    reopened = ProgramStore(tmp_path)
    _run(CASE, path, reopened)
    assert reopened.store.hits == 1
