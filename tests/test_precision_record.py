"""The matmul precision as a case axis and as part of a run's record.

mhc_parity.mhc.precision's rules; Case / TOML / MhcConfig fields; the effective precision of a
"default" case on this CPU (rows, metadata); the baseline header and the gate's refusal
to compare runs made at different precisions.
"""

from __future__ import annotations

import textwrap

import jax
import numpy as np
import pandas as pd
import pytest

from mhc_parity.cases import spec
from mhc_parity.cases.fixtures import cache_key
from mhc_parity.cases.registry import Registry
from mhc_parity.cases.spec import Case, CaseSpecError
from mhc_parity.cases.toml_cases import CaseFileError, register_case_file
from mhc_parity.harness.commands.gate import main as gate_main
from mhc_parity.harness.engine.implementations import INTERPRET, REFERENCE
from mhc_parity.harness.engine.run_info import run_metadata
from mhc_parity.harness.engine.runner import PathPlan, Runner
from mhc_parity.harness.judging.policy_file import load_policy
from mhc_parity.mhc import precision
from mhc_parity.mhc.precision import dot_precision, effective_matmul_precision, operand_rounding
from mhc_parity.mhc.types import MhcConfig
from mhc_parity.records.environment import (
    LEGACY_MATMUL_PRECISION,
    format_precision_record,
    precision_conflicts,
    run_precision,
)
from mhc_parity.reports import load_baseline, load_rows, to_frame, write_baseline
from mhc_parity.reports.samples import sample_rows, write_sample_run
from mhc_parity.reports.sources import load_baseline_or_run, load_run

Precision = jax.lax.Precision
BASE = dict(batch=1, sequence=16, streams=2, embedding=128)


# ------------------------------------------------------------------------ mhc_parity.mhc.precision


def test_dot_precision_follows_the_setting_for_float32_is_default_for_bfloat16_and_highest_for_float64():
    assert dot_precision(np.float32) == dot_precision(np.float32, "highest") == Precision.HIGHEST
    assert dot_precision(np.float32, "default") == Precision.DEFAULT
    # Two bfloat16 operands: exact products, float32 accumulation; Mosaic rejects HIGHEST for them.
    bf16 = jax.numpy.bfloat16
    assert dot_precision(bf16, "highest") == dot_precision(bf16, "default") == Precision.DEFAULT
    # Their transposes multiply the float32 cotangent: the float32 rule.
    assert precision.cotangent_dot_precision(bf16, "highest") == Precision.HIGHEST
    assert precision.cotangent_dot_precision(bf16, "default") == Precision.DEFAULT
    assert dot_precision(np.float64, "default") == Precision.HIGHEST
    assert precision.accumulation_dtype(jax.numpy.bfloat16) == np.float32
    assert precision.accumulation_dtype(np.float64) == np.float64
    with pytest.raises(ValueError, match="operand dtype int32"):
        dot_precision(np.int32)
    with pytest.raises(ValueError, match="matmul_precision must be one of"):
        dot_precision(np.float32, "fast")


def test_operand_rounding_per_backend():
    assert operand_rounding("default", "cpu").name == "float32"
    assert operand_rounding("highest", "tpu").name == "bfloat16x6"
    tpu_default = operand_rounding("default", "tpu")
    assert tpu_default.name == "bfloat16" and tpu_default.unit_roundoff == 2.0**-8
    assert operand_rounding("default", "gpu", "8.0").name == "tensorfloat32"
    assert operand_rounding("default", "gpu", "9.0").unit_roundoff == 2.0**-11
    assert operand_rounding("default", "gpu", "7.0").name == "float32"
    assert operand_rounding("default", "gpu", None).name == "tensorfloat32"
    assert operand_rounding("highest", "gpu", "9.0").name == "float32"
    assert not operand_rounding("highest", "tpu").rounds_operands
    with pytest.raises(ValueError, match="no matmul precision model for platform 'metal'"):
        operand_rounding("highest", "metal")
    assert effective_matmul_precision("default", "cpu") == "highest"
    assert effective_matmul_precision("default", "tpu") == "default"


def test_the_case_spec_mirrors_the_precision_settings():
    assert spec.MATMUL_PRECISIONS == precision.MATMUL_PRECISIONS
    assert spec.MATMUL_PRECISIONS[0] == precision.DEFAULT_MATMUL_PRECISION


def test_the_legacy_record_is_what_an_old_cpu_run_did():
    assert LEGACY_MATMUL_PRECISION == format_precision_record({"highest": operand_rounding("highest", "cpu").name})


# -------------------------------------------------------------------------- case axis


def test_the_precision_is_an_optional_case_field_named_only_when_not_the_default():
    case = Case(name="c", **BASE)
    assert case.matmul_precision == "highest" and case.mhc_config().matmul_precision == "highest"
    twin = case.replace(name="c-default", matmul_precision="default")
    assert twin.mhc_config().matmul_precision == "default"
    assert twin.describe()["precision"] == "default"
    assert "matmul_default" in twin.all_tags and not any(t.startswith("matmul") for t in case.all_tags)
    assert cache_key(twin) == cache_key(case)  # the fixture's data key is unaffected
    names = dict(
        variant="lite",
        streams=2,
        embedding=128,
        batch=1,
        sequence=16,
        dtype="float32",
        weight_dtype="float32",
        branch="mlp",
        init="default",
    )
    assert spec.standard_name(**names) == "lite-n2-c128-b1s16-f32-w32-mlp-default"
    assert spec.standard_name(**names, matmul_precision="default").endswith("-mlp-default-matmul_default")
    with pytest.raises(CaseSpecError, match="field 'matmul_precision' must be one of"):
        Case(name="bad", matmul_precision="fastest", **BASE)
    with pytest.raises(ValueError, match="matmul_precision must be one of"):
        MhcConfig(2, 128, matmul_precision="tf32")


def test_toml_case_files_accept_and_check_the_precision(tmp_path):
    good = tmp_path / "good.toml"
    good.write_text(
        textwrap.dedent("""
        [[case]]
        name = "mine-default"
        batch = 1
        sequence = 16
        streams = 2
        embedding = 128
        matmul_precision = "default"
    """)
    )
    registry = Registry()
    register_case_file(good, registry)
    assert registry.get("mine-default").matmul_precision == "default"
    for value, message in (('"fast"', "must be one of"), ("1", "must be a string")):
        bad = tmp_path / "bad.toml"
        bad.write_text(good.read_text().replace('"default"', value))
        with pytest.raises(CaseFileError, match=f"matmul_precision.*{message}|{message}.*matmul_precision"):
            register_case_file(bad, Registry())


# ------------------------------------------------------ effective precision on this CPU


@pytest.mark.slow
@pytest.mark.skipif(jax.default_backend() != "cpu", reason="a CPU's default precision is what this checks")
def test_a_default_precision_case_runs_as_highest_on_the_cpu_and_says_so():
    highest = Case(name="prec-highest", branch="mlp", **BASE)
    default = highest.replace(name="prec-default", matmul_precision="default")
    runner = Runner(load_policy())
    plan = PathPlan((REFERENCE, INTERPRET), lowering=False)
    rows = {c.matmul_precision: list(runner.run_case(c, plan)) for c in (highest, default)}
    assert {r["matmul_precision"] for r in rows["highest"]} == {"highest"}
    assert {r["matmul_precision"] for r in rows["default"]} == {
        "highest (default requested; cpu default is full float32)"
    }
    assert {r["devices"] for r in rows["default"]} == {"cpu:0"}
    assert {r["verdict"] for r in rows["default"]} == {"pass"}
    numbers = ["max_abs_err", "cand_oracle_max_err", "cand_oracle_rms_err"]
    frames = [pd.DataFrame(rows[s]).set_index(["candidate", "partner", "leaf"])[numbers] for s in rows]
    pd.testing.assert_frame_equal(frames[0], frames[1])  # the same program on a CPU


def test_the_oracles_rounding_model_takes_the_operand_rounding_of_the_paths_backend(monkeypatch):
    from mhc_parity.harness.engine import oracle_path

    highest = Case(name="prec-highest", **BASE)
    default = highest.replace(name="prec-default", matmul_precision="default")
    assert oracle_path.matmul_operand_roundoff(highest) == oracle_path.matmul_operand_roundoff(default) == 0.0  # a CPU

    class FakeTpu:
        platform = "tpu"

    monkeypatch.setattr(jax, "devices", lambda *args: [FakeTpu()])
    assert oracle_path.matmul_operand_roundoff(default) == 2.0**-8, "bfloat16 operands at a TPU's default precision"
    assert oracle_path.matmul_operand_roundoff(highest) == 0.0


def test_run_metadata_records_backend_device_and_precision():
    device = jax.devices()[0]
    rounding = {
        s: operand_rounding(s, device.platform, precision.device_compute_capability(device)).name
        for s in precision.MATMUL_PRECISIONS
    }
    plain = run_metadata()
    assert plain["backend"] == jax.default_backend() and plain["device_kind"] == device.device_kind
    assert plain["host_cpu_devices"] == 8
    assert plain["matmul_precision"] == f"highest={rounding['highest']}"
    mixed = run_metadata([Case(name="m", matmul_precision="default", **BASE), Case(name="h", **BASE)])
    assert mixed["matmul_precision"] == f"default={rounding['default']},highest={rounding['highest']}"
    assert "matmul_precision_note" not in plain
    if device.platform == "cpu":
        assert mixed["matmul_precision_note"].startswith("default ran as highest: on cpu (cpu)")


# ------------------------------------------------------------------- baseline and gate


def _passing() -> list[dict]:
    return [dict(r) for r in sample_rows() if r["verdict"] in ("pass", "skip", "unsupported")]


def _report(tmp_path, name: str, **metadata):
    """A complete run folder of passing sample rows whose metadata records `metadata`."""
    paths = write_sample_run(
        _passing(), tmp_path / name, metadata={"policy_hash": "p1", **metadata}, policy_digest="p1", rendered=False
    )
    return paths["json"]


def test_the_baseline_header_carries_backend_device_kind_and_precision(tmp_path):
    source = _report(
        tmp_path,
        "tpu",
        backend="tpu",
        device_kind="TPU v5 lite",
        matmul_precision="default=bfloat16,highest=bfloat16x6",
    )
    baseline = write_baseline(load_run(source), tmp_path / "tpu.csv")
    header = baseline.read_text().splitlines()[0]
    # The environment keys, then the body's record (rows, digest).
    assert (
        " backend=tpu device_kind=TPU%20v5%20lite matmul_precision=default=bfloat16,highest=bfloat16x6 rows=" in header
    )
    loaded = load_baseline(baseline)
    assert loaded.policy_hash == "p1"
    assert dict(loaded.environment) == {
        "backend": "tpu",
        "device_kind": "TPU v5 lite",
        "matmul_precision": "default=bfloat16,highest=bfloat16x6",
    }
    assert run_precision(load_baseline_or_run(baseline)) == "default=bfloat16,highest=bfloat16x6"


def test_headers_without_the_precision_follow_the_legacy_rule(tmp_path):
    legacy = write_baseline(_passing(), tmp_path / "legacy.csv", policy_hash="p1")
    assert "matmul_precision" not in legacy.read_text().splitlines()[0]
    assert run_precision(load_baseline_or_run(legacy)) == LEGACY_MATMUL_PRECISION
    old_tpu_report = _report(tmp_path, "old-tpu", backend="tpu")
    assert run_precision(load_run(old_tpu_report)) is None
    assert precision_conflicts("highest=float32", None) == []
    assert precision_conflicts("highest=float32", "default=bfloat16,highest=bfloat16x6") == [
        "highest: float32 vs bfloat16x6"
    ]
    assert precision_conflicts("highest=float32", "default=bfloat16") == []


def test_the_gate_refuses_another_precision_unless_allowed(tmp_path, capsys):
    baseline = write_baseline(
        load_run(_report(tmp_path, "cpu", backend="cpu", matmul_precision="highest=float32")), tmp_path / "cpu.csv"
    )
    tpu = _report(tmp_path, "tpu", backend="tpu", matmul_precision="highest=bfloat16x6")
    code = gate_main(["--baseline", str(baseline), "--current", str(tpu)])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "highest=float32 (cpu)" in err and "highest=bfloat16x6 (tpu)" in err and "--allow-precision-change" in err
    assert gate_main(["--baseline", str(baseline), "--current", str(tpu), "--allow-precision-change"]) == 0
    same = _report(tmp_path, "cpu2", backend="cpu", matmul_precision="highest=float32")
    assert gate_main(["--baseline", str(baseline), "--current", str(same)]) == 0
    assert "precision match not checked" not in capsys.readouterr().out
    old_tpu = _report(tmp_path, "old-tpu", backend="tpu")  # written before the precision was recorded
    # Its backend alone refuses it (issue 66: a CPU baseline cannot judge a TPU run's numbers) ...
    assert gate_main(["--baseline", str(baseline), "--current", str(old_tpu)]) == 2
    assert "made on backend cpu" in capsys.readouterr().err
    # ... and the same option allows it, saying what went unchecked.
    assert gate_main(["--baseline", str(baseline), "--current", str(old_tpu), "--allow-precision-change"]) == 0
    assert "matmul precision not recorded on both sides" in capsys.readouterr().out


def test_a_legacy_baseline_gates_a_cpu_run_but_refuses_a_tpu_one(tmp_path, capsys):
    legacy = write_baseline(_passing(), tmp_path / "legacy.csv", policy_hash="p1")
    cpu = _report(tmp_path, "cpu", backend="cpu", matmul_precision="highest=float32")
    assert gate_main(["--baseline", str(legacy), "--current", str(cpu)]) == 0
    tpu = _report(tmp_path, "tpu", backend="tpu", matmul_precision="highest=bfloat16x6")
    assert gate_main(["--baseline", str(legacy), "--current", str(tpu)]) == 2
    assert "--allow-precision-change" in capsys.readouterr().err


def test_rows_written_before_the_precision_and_devices_columns_stay_readable(tmp_path):
    from mhc_parity.records.schema import LATER_COLUMNS, ROW_COLUMNS

    old = tmp_path / "old.jsonl"
    old.write_text(
        "".join(pd.Series({k: v for k, v in r.items() if k not in LATER_COLUMNS}).to_json() + "\n" for r in _passing())
    )
    frame = load_rows(old)
    assert list(frame.columns) == list(ROW_COLUMNS)
    assert set(frame["matmul_precision"]) == set(frame["devices"]) == {""}
    with pytest.raises(Exception, match="unknown columns \\['extra'\\]"):
        to_frame([{**_passing()[0], "extra": 1}])
