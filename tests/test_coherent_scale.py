"""Issue 66 item 1: a coherent scale of a bfloat16 leaf, 1% of `out` or 0.3% of `d_x`, fails
the judging (the gain criterion, which `direct` cannot rescue) and the gate against the
committed baseline, while the same case's clean rows pass both. The faults are the catalogue's
(`mhc_parity.harness.faults.coherent_faults`), so the kill matrix shows them too."""

from __future__ import annotations

from pathlib import Path

import pytest

from mhc_parity.harness.faults import FAULTS, passes
from mhc_parity.harness.faults import matrix as kill_matrix
from mhc_parity.harness.judging.policy_file import load_policy
from mhc_parity.reports import load_baseline
from mhc_parity.reports.gate.rule import gate

REPO = Path(__file__).resolve().parents[1]
# The case issue 66 measured the 1% output change on.
CASE = "lite-n4-c128-b2s64-bf16-w32-identity-default"


@pytest.mark.slow
def test_a_coherent_bfloat16_scale_fails_the_judging_and_the_gate():
    from mhc_parity.cases import registry

    case = registry.get(CASE)
    impls = [i for i in kill_matrix.implementations() if i.name in ("reference", "interpret")]
    policy, shared, memo = load_policy(None), passes.SharedInputs(), {}
    baseline = [r for r in load_baseline(REPO / "baselines" / "default.csv").frame.to_dict("records")]
    baseline = [r for r in baseline if r["case"] == CASE and r["candidate"].split("/")[0] in ("reference", "interpret")]
    clean = passes.run_clean_pass([case], policy, shared, memo, impls)
    assert not [r for r in clean if r["verdict"] in ("fail", "error")]
    assert gate(baseline, clean).ok
    for fault, leaf in (("kernel.output_scaled_1pct", "out"), ("kernel.activation_grad_scaled", "d_x")):
        rows = passes.perturbed_rows_of(FAULTS[fault], [case], policy, shared, memo, impls)
        failing = [r for r in rows if r["verdict"] == "fail"]
        assert {(r["leaf"], r["comparison"]) for r in failing} == {(leaf, "vs_oracle"), (leaf, "vs_reference")}
        assert all(r["bound_metric"] == "cand_oracle_gain" and r["dtype"] == "bfloat16" for r in failing)
        result = gate(baseline, rows)
        systematic = {d.key[3] for d in result.drifts if d.systematic}
        assert not result.ok and systematic == {leaf}, result.table()
