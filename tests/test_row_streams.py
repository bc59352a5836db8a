"""A run folder's rows are bound to its manifest: each finished case's row count and digest
(`mhc_parity.records.store.case_records`) are recorded, and `--resume`, `gate`, `render` and
`baseline --from` refuse a stream or report whose rows are not the recorded ones.

Each hostile edit is one a careless or hostile user was seen to make: a cut stream, ten
duplicated lines, one flipped digit, a kill between a new manifest and the removal of the
old stream (by a seam: `RowStore.start_fresh` raises), duplicated row keys.
"""

from __future__ import annotations

import json
import shutil

import pytest

from mhc_parity.harness.cli import main as cli_main
from mhc_parity.records.manifest import read_manifest
from mhc_parity.records.store import RowStore, case_records
from mhc_parity.reports.samples import sample_rows, write_sample_run
from tests.cli_support import (
    assert_one_line_error,
    cheap_run_args,
    load_jsonl,
    run_cli,
    scale_one_metric_in_report,
    without_timing,
)

SHARED = pytest.mark.xdist_group("row_streams")


@pytest.fixture(scope="module")
def complete(case_file, tmp_path_factory):
    """A complete run of two cheap cases through the reference paths."""
    out = tmp_path_factory.mktemp("complete") / "run"
    proc = run_cli(*cheap_run_args(case_file, out))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return out


@pytest.fixture
def used(complete, tmp_path):
    """A copy of the complete run to spoil."""
    out = tmp_path / "run"
    shutil.copytree(complete, out)
    return out


def flip_a_digit(stream) -> None:
    """One digit of one metric in the stream changed, nothing else."""
    lines = stream.read_text().splitlines(keepends=True)
    for index, line in enumerate(lines):
        row = json.loads(line)
        if isinstance(row["cand_oracle_max_err"], float) and row["cand_oracle_max_err"] > 0:
            row["cand_oracle_max_err"] *= 1.25
            lines[index] = json.dumps(row) + "\n"
            break
    stream.write_text("".join(lines))


def readers(out, tmp_path) -> dict:
    """Every command that reads a run folder, run on `out`."""
    baseline = tmp_path / "b.csv"
    return {
        "gate": run_cli("gate", "--baseline", out, "--current", out),
        "render": run_cli("render", "--rows", out, "--out", tmp_path / "rendered"),
        "baseline --from": run_cli("baseline", "--from", out, "--to", baseline),
    }


@SHARED
@pytest.mark.parametrize(
    "spoil, fragment",
    [
        (flip_a_digit, "rows differ from the recorded ones"),
        (
            lambda stream: stream.write_text(stream.read_text() + "".join(stream.read_text().splitlines(True)[:10])),
            "recorded)",
        ),
        (lambda stream: stream.write_text("".join(stream.read_text().splitlines(True)[:-3])), "recorded)"),
    ],
    ids=["flipped-digit", "ten-duplicated-lines", "cut"],
)
def test_a_spoiled_stream_is_refused_by_resume_and_by_every_reader(case_file, used, tmp_path, spoil, fragment):
    spoil(used / "rows.jsonl")
    resumed = run_cli(*cheap_run_args(case_file, used, "--resume"))
    assert_one_line_error(resumed, "its row stream does not match its manifest", fragment)
    for proc in readers(used, tmp_path).values():
        assert_one_line_error(proc, "rows.jsonl: its rows are not those the run")
    assert not (tmp_path / "b.csv").exists()


@SHARED
def test_a_flipped_digit_in_the_report_is_refused_though_the_stream_is_intact(used, tmp_path):
    scale_one_metric_in_report(used / "report.json", 1.25)
    for proc in readers(used, tmp_path).values():
        assert_one_line_error(proc, "report.json: its rows are not those the run")


class KilledHere(BaseException):
    """Stands for a kill -9 at the seam: nothing after it runs, no handler sees it."""


@SHARED
def test_a_kill_between_the_new_manifest_and_the_old_streams_removal_leaves_nothing_to_trust(
    case_file, complete, used, tmp_path, monkeypatch
):
    """The window of `RowStore.start_fresh`: a new run's manifest beside the old run's rows.
    `--resume` must redo every case, not keep the old run's rows as this run's."""
    fresh = tmp_path / "fresh"
    assert run_cli(*cheap_run_args(case_file, fresh, "--seed", "7")).returncode == 0

    def killed(self):
        raise KilledHere

    monkeypatch.setattr(RowStore, "start_fresh", killed)
    with pytest.raises(KilledHere):
        cli_main([str(a) for a in cheap_run_args(case_file, used, "--seed", "7")])
    monkeypatch.undo()
    assert read_manifest(used).cases_done == 0 and (used / "rows.jsonl").exists()
    gate = run_cli("gate", "--baseline", complete, "--current", used)
    assert_one_line_error(gate, "unfinished run")

    resumed = run_cli(*cheap_run_args(case_file, used, "--seed", "7", "--resume"))
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-2000:]
    rows = without_timing(load_jsonl(used / "rows.jsonl"))
    assert rows == without_timing(load_jsonl(fresh / "rows.jsonl"))
    assert rows != without_timing(load_jsonl(complete / "rows.jsonl")), "seed 7 must change the rows"


@SHARED
def test_resume_redoes_a_finished_case_its_manifest_did_not_record(case_file, complete, used):
    """A kill after a case's rows were written and before the manifest recorded it."""
    manifest = read_manifest(used)
    from mhc_parity.records.manifest import write_manifest

    write_manifest(used, manifest.with_cases(manifest.case_records[:1]).interrupted("SIGKILL"))
    resumed = run_cli(*cheap_run_args(case_file, used, "--resume"))
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-2000:]
    assert without_timing(load_jsonl(used / "rows.jsonl")) == without_timing(load_jsonl(complete / "rows.jsonl"))
    assert read_manifest(used).is_complete


def test_baseline_from_a_run_with_duplicated_row_keys_is_one_line(tmp_path):
    rows = sample_rows()
    write_sample_run(rows + rows[:2], tmp_path / "run", rendered=False)
    made = run_cli("baseline", "--from", tmp_path / "run", "--to", tmp_path / "b.csv")
    assert_one_line_error(made, "share a row key")
    assert not (tmp_path / "b.csv").exists()


def test_a_case_digest_ignores_row_order_and_storage_but_not_a_count_or_a_digit():
    rows = [r for r in sample_rows() if r["case"] == sample_rows()[0]["case"]]
    case = rows[0]["case"]
    digest = case_records(rows)[case]
    assert case_records(list(reversed(rows)))[case] == digest
    stored = [{k: (str(v) if isinstance(v, float) else v) for k, v in r.items()} for r in rows]
    assert case_records(stored)[case] == digest  # as a CSV cell holds it
    assert case_records(rows + rows[:1])[case].rows == digest.rows + 1
    changed = [dict(rows[0], cand_oracle_max_err=rows[0]["cand_oracle_max_err"] * 1.25)] + rows[1:]
    assert case_records(changed)[case].digest != digest.digest
    assert case_records([], [case])[case].rows == 0
