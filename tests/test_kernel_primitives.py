"""A Mosaic kernel against XLA on the same backend is widened only by the primitives the two compile
differently (`mhc_parity.harness.engine.kernel_primitives`), with synthetic tables on the CPU."""

from __future__ import annotations

import dataclasses
import json
import pathlib
import runpy

import numpy as np
import pytest

from mhc_parity.cases.catalogue import make_case
from mhc_parity.cases.fixtures import make_fixture
from mhc_parity.harness.engine import kernel_primitives, oracle_path
from mhc_parity.harness.engine.implementations import INTERPRET, MOSAIC, REFERENCE, Implementation
from mhc_parity.harness.engine.kernel_primitives import (
    BLOCK_ROWS,
    KERNEL_PRIMITIVES,
    LANES,
    KernelPrimitiveTable,
    PrimitiveAgreement,
    compare_primitives,
    narrowed_terms,
    narrowing_note,
)
from mhc_parity.harness.engine.oracle_path import PairStatistics, run_oracle_path
from mhc_parity.harness.engine.path_results import PathResult
from mhc_parity.harness.engine.paths import Path, PathOutputs
from mhc_parity.harness.engine.plan import mosaic_xla_pair
from mhc_parity.harness.engine.precision_choices import DeclaredEffects
from mhc_parity.harness.engine.runner import Runner
from mhc_parity.harness.judging.policy_file import load_policy

ROOT = pathlib.Path(__file__).resolve().parent.parent
SMALL = make_case(streams=3, batch=1, sequence=32, dtype="float32")
# The TPU v5e's terms (docs/results/backend-probe-tpu-v5e.json), rounded.
V5E_TERMS = {"exp": 5.6e-6, "log": 1.07e-4, "tanh": 8.1e-5, "logistic": 1.07e-4, "rsqrt": 0.0, "dot_default": 1.7e-4}


def _agreement(name: str, identical: bool | None) -> PrimitiveAgreement:
    differing, apart = (0, 0.0) if identical else (7, 3.0)
    error = "" if identical is not None else "no lowering"
    return PrimitiveAgreement(name, identical, differing, apart, 70.0, 70.0, 5e-6, 5e-6, 1, error)


def _table(compiler="mosaic", **identical) -> KernelPrimitiveTable:
    return KernelPrimitiveTable((("backend", "tpu"),), compiler, tuple(_agreement(n, v) for n, v in identical.items()))


def test_only_the_primitives_the_kernel_computes_like_xla_are_dropped():
    table = _table(exp=True, log=None, tanh=False, logistic=True)
    narrowed = narrowed_terms(V5E_TERMS, table)
    assert narrowed["exp"] == 0.0, "bit-identical in a Mosaic kernel: the partner's error holds it"
    assert narrowed["log"] == V5E_TERMS["log"], "not measured: widened"
    assert narrowed["tanh"] == V5E_TERMS["tanh"], "differs: widened"
    assert narrowed["logistic"] == V5E_TERMS["logistic"], "the sigmoid's routes are code, not the compiler"
    assert narrowed["dot_default"] == V5E_TERMS["dot_default"], "not an elementwise primitive: not measured"
    assert table.differing() >= {"log", "tanh", "rsqrt", "softplus"}, "a primitive absent from the table differs"
    assert narrowed_terms(V5E_TERMS, None) == V5E_TERMS
    assert narrowed_terms(V5E_TERMS, _table("interpret", exp=True)) == V5E_TERMS, "interpret mode is not Mosaic"


def test_the_run_record_says_how_a_kernel_against_xla_is_widened():
    assert "widened by every backend term" in narrowing_note(V5E_TERMS, None)
    note = narrowing_note(V5E_TERMS, _table(exp=True, tanh=False))
    assert "not by exp (bit-identical in a Mosaic kernel)" in note and "tanh" in note.partition(" not by ")[0]
    assert narrowing_note(dict.fromkeys(V5E_TERMS, 0.0), None) == "", "no term (a CPU): nothing to say"
    table = _table(exp=True, log=None)
    assert KernelPrimitiveTable.from_json(json.loads(json.dumps(table.to_json()))) == table
    with pytest.raises(ValueError, match="not a kernel primitive table"):
        KernelPrimitiveTable.from_json({**table.to_json(), "compiler": "cuda"})


def test_a_mosaic_xla_pair_is_two_builtin_paths_on_the_accelerator():
    mosaic, reference, interpret = Path(MOSAIC), Path(REFERENCE), Path(INTERPRET)
    assert mosaic_xla_pair(mosaic, reference) and mosaic_xla_pair(reference, mosaic)
    assert mosaic_xla_pair(mosaic, interpret), "interpret mode runs the kernel body as XLA"
    assert not mosaic_xla_pair(interpret, reference), "two XLA programs: not measured, widened as before"
    assert not mosaic_xla_pair(mosaic, None), "vs_oracle: the oracle runs on the host in float64"
    assert not mosaic_xla_pair(Path(MOSAIC, (2, 4)), Path(REFERENCE, (2, 4), host=True)), "a host path is XLA:CPU"
    external = Implementation("maxtext-kernel", kernel=True, interpret=False)
    assert not mosaic_xla_pair(Path(external), reference), "an external kernel's compiler is its own"


def test_the_probe_runs_its_kernels_in_interpret_mode_on_a_cpu_and_says_so(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("sys.argv", ["probe", "--out", str(tmp_path), "--samples", str(BLOCK_ROWS * LANES * 2)])
    with pytest.raises(SystemExit) as exited:
        runpy.run_path(str(ROOT / "bench" / "probes" / "tpu_kernel_primitive_probe.py"), run_name="__main__")
    assert exited.value.code == 0
    assert "INTERPRET MODE on cpu" in capsys.readouterr().out
    document = json.loads((tmp_path / "kernel-primitives.json").read_text())
    assert document["interpret"] and document["table"]["compiler"] == "interpret"
    rows = {p["name"]: p for p in document["table"]["primitives"]}
    assert list(rows) == [p.name for p in KERNEL_PRIMITIVES]
    for name, row in rows.items():  # interpret mode is XLA:CPU again: the same bits, the same error
        assert row["identical"] is True and row["differing"] == 0, name
        assert row["kernel_max_ulps"] == row["xla_max_ulps"] < 8, name


def test_a_kernel_that_cannot_compute_a_primitive_is_recorded_and_widened(monkeypatch):
    def no_lowering(name, arity, rows, interpret):
        raise NotImplementedError(f"no Mosaic lowering for {name}")

    monkeypatch.setattr(kernel_primitives, "_pallas_program", no_lowering)
    table = compare_primitives(samples=BLOCK_ROWS * LANES)
    assert all(p.identical is None and "no Mosaic lowering" in p.error for p in table.primitives)
    assert table.differing() == {p.name for p in KERNEL_PRIMITIVES}
    mosaic = dataclasses.replace(table, compiler="mosaic")
    assert narrowed_terms(V5E_TERMS, mosaic) == V5E_TERMS


def test_the_oracle_draws_a_kernel_pair_without_the_terms_mosaic_shares(monkeypatch):
    """A synthetic backend whose exp errs 1e-3 (the softmax of h_res) while Mosaic's exp is XLA's:
    the kernel pair's h_res sensitivity drops to the float32 rounding's, the main one keeps it."""
    fixture = make_fixture(SMALL)
    monkeypatch.setattr(oracle_path, "backend_terms", lambda: {"exp": 1e-3, "logistic": 0.0})
    monkeypatch.setattr(oracle_path, "measured_kernel_primitives", lambda: None)
    unmeasured = run_oracle_path(SMALL, fixture)
    assert unmeasured.kernel_pair is None, "no Mosaic table: every term widens every comparison"
    monkeypatch.setattr(oracle_path, "measured_kernel_primitives", lambda: _table(exp=True))
    measured = run_oracle_path(SMALL, fixture)
    pair = measured.kernel_pair
    assert pair is not None and measured.sensitivity == unmeasured.sensitivity
    assert pair.sensitivity["h_res"].max < measured.sensitivity["h_res"].max / 100
    assert pair.sensitivity["h_pre"] == measured.sensitivity["h_pre"], "h_pre takes no exp"
    monkeypatch.setattr(oracle_path, "measured_kernel_primitives", lambda: _table(exp=False))
    assert run_oracle_path(SMALL, fixture).kernel_pair is None, "exp differs: nothing to drop"


def test_a_mosaic_row_against_the_reference_is_judged_with_the_kernel_pair_statistics():
    fixture = make_fixture(SMALL)
    oracle = run_oracle_path(SMALL, fixture)
    wide = {leaf: dataclasses.replace(s, max=s.max * 1e3, rms=s.rms * 1e3) for leaf, s in oracle.sensitivity.items()}
    pair = PairStatistics(oracle.sensitivity, oracle.systematic, oracle.backend_shift)
    oracle = dataclasses.replace(oracle, sensitivity=wide, kernel_pair=pair)
    leaves = {name: np.asarray(value, np.float32) for name, value in oracle.leaves.items()}
    outputs = PathOutputs(leaves, 0.0, 0.0, 0.0, 1)
    paths = [Path(REFERENCE), Path(INTERPRET), Path(MOSAIC)]
    results = {p.name: PathResult(outputs=outputs) for p in paths}
    runner = Runner(load_policy())
    rows = list(runner.judge.compared_rows(SMALL, paths, results, oracle, {p.name: DeclaredEffects() for p in paths}))

    def sensitivity(candidate, partner):
        row = next(r for r in rows if (r["candidate"], r["partner"], r["leaf"]) == (candidate, partner, "h_res"))
        return row["oracle_sensitivity_max"]

    assert sensitivity("mosaic/unsharded", "reference/unsharded") == pair.sensitivity["h_res"].max
    assert sensitivity("mosaic/unsharded", "oracle") == wide["h_res"].max, "vs_oracle keeps every term"
    assert sensitivity("interpret/unsharded", "reference/unsharded") == wide["h_res"].max
