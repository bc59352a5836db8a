"""A row's `allowed_error` is the number its bound's usage divides, as a column of its own.

The `bound` column names the rule in words and a failing row's `reason` shows the limit
inside a sentence; `allowed_error` (with `bound_metric`, the column it limits) carries the
very limit `mhc_parity.harness.judging.bounds` computed, so bound_usage = |row[bound_metric]| /
allowed_error holds on every judged row of a real run, in rows.csv and report.json alike,
and rows no bound judged (skip, unsupported, error, lowering) have NaN and "". Files
written before the columns existed still load, with the columns empty.
"""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest

import mhc_parity.harness
from mhc_parity.harness.judging.bounds import usage_of
from mhc_parity.records.rows import load_rows, to_frame
from mhc_parity.records.schema import LATER_COLUMNS, ROW_COLUMNS
from mhc_parity.reports.sources import load_report_json
from tests.cli_support import CASE_NAMES

NEW_COLUMNS = ("allowed_error", "bound_metric")


@pytest.fixture(scope="module")
def run_folder(case_file, tmp_path_factory):
    """A real run of the two cheapest unsharded cases: the reference and interpret paths
    against the oracle and each other (oracle-ratio bounds: their max, RMS, direct and
    systematic criteria bind on one leaf or another), and the rows no bound judges: the
    Mosaic path skipped on a CPU, the lowering rows."""
    out = tmp_path_factory.mktemp("allowed-error")
    paths = ["reference/*", "interpret/*", "mosaic/*", "lowering/*"]
    mhc_parity.harness.run_parity(
        case_files=[case_file], cases=list(CASE_NAMES[:2]), paths=paths, lowering=True, out=out
    )
    return out


def _judged(frame: pd.DataFrame) -> pd.DataFrame:
    return frame[frame["verdict"].isin(["pass", "fail"]) & (frame["comparison"] != "lowering")]


def _check_allowed_error(frame: pd.DataFrame) -> None:
    judged = _judged(frame)
    assert len(judged) > 20 and set(judged["comparison"]) >= {"vs_oracle", "vs_reference"}
    for row in judged.to_dict(orient="records"):
        where = (row["candidate"], row["partner"], row["leaf"], row["bound_metric"])
        assert row["bound_metric"] in ROW_COLUMNS, where
        measured = abs(float(row[row["bound_metric"]]))
        assert math.isfinite(row["allowed_error"]) and row["allowed_error"] >= 0, where
        assert usage_of(measured, row["allowed_error"]) == pytest.approx(row["bound_usage"], rel=1e-12), where
    unjudged = frame.drop(judged.index)
    assert len(unjudged) and unjudged["allowed_error"].isna().all() and (unjudged["bound_metric"] == "").all()


def test_allowed_error_is_the_limit_the_bound_usage_divides_in_rows_csv(run_folder):
    _check_allowed_error(load_rows(run_folder / "rows.csv"))


def test_allowed_error_is_the_limit_the_bound_usage_divides_in_report_json(run_folder):
    document = json.loads((run_folder / "report.json").read_text())
    assert set(NEW_COLUMNS) <= set(document["schema_columns"])
    _check_allowed_error(to_frame(document["rows"]))


def test_the_new_columns_are_later_columns_so_older_files_load(run_folder, tmp_path):
    assert set(NEW_COLUMNS) <= set(LATER_COLUMNS)
    old_csv = tmp_path / "rows.csv"
    pd.read_csv(run_folder / "rows.csv", dtype=str, keep_default_na=False).drop(columns=list(NEW_COLUMNS)).to_csv(
        old_csv, index=False, lineterminator="\n"
    )
    loaded = load_rows(old_csv)
    assert list(loaded.columns) == list(ROW_COLUMNS)
    assert loaded["allowed_error"].isna().all() and (loaded["bound_metric"] == "").all()

    document = json.loads((run_folder / "report.json").read_text())
    document["rows"] = [{k: v for k, v in row.items() if k not in NEW_COLUMNS} for row in document["rows"]]
    document["schema_columns"] = [c for c in document["schema_columns"] if c not in NEW_COLUMNS]
    old_json = tmp_path / "report.json"
    old_json.write_text(json.dumps(document))
    frame, _, _ = load_report_json(old_json)
    assert len(frame) == len(loaded) and frame["allowed_error"].isna().all()
