"""A stored program is keyed by what it computes, never by who wrote it (issue 49, 1).

An external implementation's program may depend on more than its files: a field of the
object handed to the API, a tuning table, an environment variable read by its factory. Keyed
by its name, spec, type and code, a program stored for one of them was loaded for another,
and a wrong implementation passed on a warm cache (it failed on an empty one). Keyed by its
lowered program (`mhc_parity.harness.engine.program_store.program_digest`), each computes its own.
"""

from __future__ import annotations

import json

import pytest

from mhc_parity.harness.api import run_parity
from mhc_parity.harness.cli import main as cli_main
from tests.external_impls import SCALE_VARIABLE, ScaledKernel

CASE = "lite-n4-c128-b2s64-f32-w32-identity-default"
# The unsharded paths only: the program store is what is tested, not the sharding.
PATHS = ("reference/unsharded", "scaled_kernel/unsharded")


@pytest.mark.slow
def test_an_api_run_of_another_scale_does_not_load_the_first_scale_s_program(tmp_path, monkeypatch):
    """`ScaledKernel(scale=1.0)`, then `ScaledKernel(scale=1.05)` (one code, one type, one name): the
    second fails as it does on an empty cache; the first's program still loads for it."""
    monkeypatch.setenv("MHC_PARITY_CACHE", str(tmp_path / "cache"))
    correct = run_parity(ScaledKernel(scale=1.0), cases=CASE, paths=PATHS)
    assert correct.passed and correct.metadata["programs_stored_missed"] == 2
    wrong = run_parity(ScaledKernel(scale=1.05), cases=CASE, paths=PATHS)
    assert not wrong.passed and len(wrong.failures), "the x1.05 program ran, not the stored x1.0 one"
    assert wrong.metadata["programs_stored_loaded"] == 1, "the reference's program is the same"
    again = run_parity(ScaledKernel(scale=1.0), cases=CASE, paths=PATHS)
    assert again.passed and again.metadata["programs_stored_loaded"] == 2


@pytest.mark.slow
def test_a_cli_run_whose_factory_reads_another_scale_from_the_environment_fails(tmp_path, monkeypatch, capsys):
    """`--impl` of a factory reading its scale from an environment variable: 1.0 passes and
    stores its program; 1.05 then fails (exit 1), as on an empty cache. The command runs in
    this process (`mhc_parity.harness.cli.main`, the environment set for each run): the store
    on disk is what the second run reads, as a second process would (the API test's runs too)."""
    common = ("run", "--impl", "tests.external_impls:scaled_by_environment", "--cases", CASE, "--paths", *PATHS)
    # --no-causes: the exit codes and the program store's counts are checked; the failing run's
    # cause search stores no program and changes no verdict.
    common += ("--no-lowering", "--no-causes", "--jobs", "1", "--quiet")
    codes = {}
    monkeypatch.setenv("MHC_PARITY_CACHE", str(tmp_path / "cache"))
    for scale in ("1.0", "1.05"):
        monkeypatch.setenv(SCALE_VARIABLE, scale)
        codes[scale] = cli_main([*common, "--out", str(tmp_path / scale)])
        captured = capsys.readouterr()
        assert codes[scale] in (0, 1), captured.out[-2000:] + captured.err[-2000:]
    assert codes == {"1.0": 0, "1.05": 1}
    metadata = json.loads((tmp_path / "1.05" / "report.json").read_text())["metadata"]
    assert metadata["programs_stored_loaded"] == 1 and metadata["programs_stored_missed"] == 1
