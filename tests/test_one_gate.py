"""`mhc_parity.harness.gate` is `mhc-parity gate`, refusals included (issue 49, 3).

Both take `mhc_parity.reports.gate.judgement.gate_run`. The refusal the API lacked: a run of an
implementation whose code changed since it ran (the baseline written from it, then the module
edited) is refused by both, on disk or in memory, unless the code change is allowed.
"""

from __future__ import annotations

import sys

import pytest

import mhc_parity.harness
from mhc_parity.harness.cli import main as cli_main

CASE = "lite-n4-c128-b2s64-f32-w32-identity-default"
KERNEL = """
from tests.external_impls import ScaledKernel


def factory():
    return ScaledKernel(name="edited_kernel", scale=1.0)
"""


@pytest.fixture
def scratch_module(tmp_path, monkeypatch):
    """The file of a scratch implementation `edited_kernel:factory`, importable from tmp_path."""
    (tmp_path / "edited_kernel.py").write_text(KERNEL)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path / "edited_kernel.py"
    sys.modules.pop("edited_kernel", None)


def test_the_api_gate_refuses_a_run_of_code_changed_since_as_the_cli_does(scratch_module, tmp_path, capsys):
    run = mhc_parity.harness.run_parity("edited_kernel:factory", cases=CASE, paths=["reference/*", "edited_kernel/*"])
    assert run.passed
    run.write_reports(tmp_path / "run")
    baseline = run.write_baseline(tmp_path / "edited_kernel.csv")
    assert mhc_parity.harness.gate(run, baseline).ok, "the same code: judged"

    scratch_module.write_text(KERNEL + "# edited after the run\n")
    assert cli_main(["gate", "--baseline", str(baseline), "--current", str(tmp_path / "run")]) == 2
    assert "made by other code than this checkout" in capsys.readouterr().err
    for current in (run, tmp_path / "run"):
        with pytest.raises(mhc_parity.harness.BaselineError, match=r"made by other code .* allow_code_change=True"):
            mhc_parity.harness.gate(current, baseline)
        assert mhc_parity.harness.gate(current, baseline, allow_code_change=True).ok


def test_the_api_gate_checks_its_parameters_as_the_cli_does(tmp_path, capsys):
    """A negative noise floor: the CLI exits 2, the API raises ConfigurationError (it judged before)."""
    with pytest.raises(
        mhc_parity.harness.ConfigurationError, match="noise_floor_ulps must be a finite number, 0 or more"
    ):
        mhc_parity.harness.gate(tmp_path / "run", tmp_path / "base.csv", noise_floor_ulps=-1.0)
    args = ["gate", "--baseline", str(tmp_path / "base.csv"), "--current", str(tmp_path / "run")]
    assert cli_main([*args, "--noise-floor-ulps", "-1"]) == 2
    assert "--noise-floor-ulps: must be a finite number, 0 or more" in capsys.readouterr().err
