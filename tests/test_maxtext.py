"""What the harness concludes on MaxText 0.2.5 (`make parity-maxtext`), pinned.

One run of the `maxtext` suite (the command `make parity-maxtext` runs, one process),
shared by the module; each test reads its rows. As released: the layer's reference path
fails on the gate parameters' gradients (their scales and biases rounded to bfloat16),
its kernel path and the public kernel API are `error` rows naming the tracer error, the
kernels' token-sharded lowering fails naming the missing shard_map. With the upstream
fixes applied at run time, every row passes but those of the measured defects of MaxText's
reference path that `maxtext_parity.fixes.KNOWN_DEFECTS` names (tests/test_maxtext_defects.py
measures each on its own).
"""

from __future__ import annotations

import fnmatch

import pandas as pd
import pytest

from maxtext_parity.fixes import KNOWN_DEFECTS
from tests.cli_support import run_cli

pytestmark = pytest.mark.slow

IMPLEMENTATIONS = (
    "maxtext-layer-reference",
    "maxtext-layer-kernel",
    "maxtext-kernel-api",
    "maxtext-layer-reference-upstream-pr",
    "maxtext-layer-reference-fixed",
    "maxtext-layer-kernel-fixed",
    "maxtext-kernel-fwd-fixed",
)
GATE_GRADIENTS = {f"d_{gate}_{part}" for gate in ("pre", "post", "res") for part in ("bias", "scale")}


@pytest.fixture(scope="module")
def rows(tmp_path_factory) -> pd.DataFrame:
    out = tmp_path_factory.mktemp("parity-maxtext")
    result = run_cli(
        "run",
        "--suite",
        "maxtext",
        "--impl",
        "maxtext_parity:implementations",
        "--paths",
        "reference/*",
        "maxtext-*",
        "--out",
        out,
        "--quiet",
        timeout=1800,
    )
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-3000:]  # released MaxText fails
    return pd.read_csv(out / "rows.csv", keep_default_na=False)


def _of(rows, candidate_glob: str) -> pd.DataFrame:
    return rows[[fnmatch.fnmatchcase(c, candidate_glob) for c in rows["candidate"]]]


def test_every_case_ran_every_maxtext_path_unsharded_and_sharded(rows):
    for impl in IMPLEMENTATIONS:
        mine = _of(rows, f"{impl}/*")
        assert set(mine["case"]) == set(rows["case"]), impl
        assert (mine["candidate"].str.contains("sharded\\(")).any(), impl
        assert not (mine["verdict"] == "unsupported").any(), "the maxtext suite lies inside the envelope"


def test_this_projects_reference_passes(rows):
    assert set(_of(rows, "reference/*")["verdict"]) == {"pass"}


def test_the_released_reference_fails_on_the_gate_parameters(rows):
    failed = _of(rows, "maxtext-layer-reference/*")
    failed = failed[failed["verdict"] == "fail"]
    vs_oracle = failed[failed["comparison"] == "vs_oracle"]
    # The pre and residual gates' parameter gradients, which no known defect moves: only the
    # rounded gate parameters explain their failures, and with them in float32 they pass.
    rounded_only = GATE_GRADIENTS - {leaf for defect in KNOWN_DEFECTS for leaf in defect.leaves}
    assert rounded_only & set(vs_oracle["leaf"]), sorted(set(vs_oracle["leaf"]))
    fixed = _of(rows, "maxtext-layer-reference-fixed/*")
    assert set(fixed[fixed["leaf"].isin(rounded_only)]["verdict"]) == {"pass"}


def _attributed(rows, impl: str) -> set[str]:
    """The hypotheses the rounding-attributed failing rows of `impl` name."""
    mine = _of(rows, f"{impl}/*")
    causes = mine[(mine["verdict"] == "fail") & mine["cause_id"].str.startswith("round:")]["cause_id"]
    return {name for cause in causes for name in cause.split("+")}


def test_the_released_reference_is_attributed_to_its_gate_casts_and_the_upstream_pr_to_the_residual_gate(rows):
    released = _attributed(rows, "maxtext-layer-reference")
    assert any(name.startswith("round:gate_weight/") for name in released), released
    # The upstream PR puts the pre and post gates in float32 and leaves `res_mapping`'s casts:
    # what its rows are attributed to is the residual gate, never the pre or post gate.
    pr = _attributed(rows, "maxtext-layer-reference-upstream-pr")
    gates = {name for name in pr if name.startswith("round:gate_weight/")}
    assert gates == {"round:gate_weight/residual_gate:forward:bfloat16"}, pr
    fixed = _attributed(rows, "maxtext-layer-reference-fixed")
    assert not any(name.startswith("round:gate_weight/") for name in fixed), fixed


def test_the_released_kernel_paths_are_error_rows_naming_the_tracer_error(rows):
    for impl in ("maxtext-layer-kernel", "maxtext-kernel-api"):
        mine = _of(rows, f"{impl}/*")
        mine = mine[mine["comparison"] != "lowering"]
        assert set(mine["verdict"]) == {"error"}, impl
        assert mine["reason"].str.contains("UnexpectedTracerError").all()
        assert mine["reason"].str.contains(r"\(at maxtext/kernels/mhc/").all()


def test_the_released_sharded_lowering_fails_naming_the_missing_shard_map(rows):
    lowering = _of(rows, "maxtext-kernel-api/lowering-*")
    sharded = lowering[lowering["candidate"].str.contains("sharded\\(")]
    unsharded = lowering[lowering["candidate"].str.endswith("lowering-unsharded")]
    assert len(sharded) and set(sharded["verdict"]) == {"fail"}
    assert sharded["reason"].str.contains("Mosaic kernels cannot be automatically partitioned").all()
    assert len(unsharded) and set(unsharded["verdict"]) == {"pass"}
    assert lowering["leaf"].str.endswith("(mhc_kernels_fwd)").all()  # the entry point the programs use
    fixed = _of(rows, "maxtext-kernel-fwd-fixed/lowering-*")
    assert fixed["candidate"].str.contains("sharded\\(").any() and set(fixed["verdict"]) == {"pass"}


def test_the_fixed_kernel_paths_pass_unsharded_and_sharded(rows):
    for impl in ("maxtext-layer-kernel-fixed", "maxtext-kernel-fwd-fixed"):
        mine = _of(rows, f"{impl}/*")
        assert (mine["verdict"] == "pass").sum() > 0
        others = mine[mine["verdict"] != "pass"]
        # The only rows that are not a pass: intermediates the partner (MaxText's layer) does not expose.
        assert set(others["verdict"]) <= {"skip"}, others[["case", "candidate", "leaf", "reason"]]
        assert others["reason"].str.contains("has no leaf").all()


def test_the_fixed_reference_passes_but_its_known_defects(rows):
    fixed = _of(rows, "maxtext-layer-reference-fixed/*")
    bad = fixed[fixed["verdict"] != "pass"]
    unexplained = [
        (r.case, r.candidate, r.partner, r.leaf)
        for r in bad.itertuples()
        if not any(defect.explains(r.candidate, r.leaf) for defect in KNOWN_DEFECTS)
    ]
    assert not unexplained
    assert set(bad["verdict"]) <= {"fail"}
    # Every defect shows somewhere: a row it explains fails, or its leaves still err well past this
    # project's reference while inside a bound at the stated rate. The post gate's bfloat16 reduction
    # (d_post_bias: 2.9x the model's S, 7.6x this project's reference, on bf16_inexact_gates) is such a
    # leaf: four numbers and one, whose bound at p = 1e-5 from 16 draws is q ~ 3 and ~ 6 times S.
    for defect in KNOWN_DEFECTS:
        if bad["leaf"].isin(defect.leaves).any():
            continue
        mine = fixed[fixed["leaf"].isin(defect.leaves) & fixed["partner"].str.startswith("reference/")]
        ratios = mine["cand_oracle_rms_err"].astype(float) / mine["partner_oracle_rms_err"].astype(float)
        assert (ratios > 3).any(), defect.where
    # MaxText's own kernel, fixed, matches its fixed reference on those leaves.
    kernel = _of(rows, "maxtext-layer-kernel-fixed/*")
    assert set(kernel[kernel["partner"].str.startswith("maxtext-layer-reference-fixed/")]["verdict"]) == {"pass"}
