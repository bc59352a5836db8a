"""The PR gate: its rules on hand-made baselines, the baseline file, and the CLI's exit codes."""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from mhc_parity.harness.commands.gate import main
from mhc_parity.records.schema import row_key
from mhc_parity.reports import ReportInputError, load_baseline, write_baseline
from mhc_parity.reports.gate.baseline_file import (
    BASELINE_COLUMNS,
    BASELINE_FORMAT_VERSION,
    header_line,
    render_baseline,
)
from mhc_parity.reports.gate.drift import DTYPE_EPSILON, growth, noise_floor
from mhc_parity.reports.gate.rule import gate
from mhc_parity.reports.markdown import gate_markdown
from mhc_parity.reports.samples import sample_rows, write_sample_run
from tests.cli_support import as_format_1

REPO = Path(__file__).resolve().parents[1]
BF16 = DTYPE_EPSILON["bfloat16"]


def passing_rows() -> list[dict]:
    """The sample rows without fail/error verdicts: a run the gate passes on its own."""
    return [dict(r) for r in sample_rows() if r["verdict"] in ("pass", "skip", "unsupported")]


def find(
    rows: list[dict], case: str, leaf: str, comparison: str = "vs_reference", candidate: str = "interpret/unsharded"
) -> dict:
    """The one row of `rows` with this identity (the sample set has one per combination)."""
    (row,) = [
        r
        for r in rows
        if (r["case"], r["leaf"], r["comparison"], r["candidate"]) == (case, leaf, comparison, candidate)
    ]
    return row


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def write_run(folder: Path, rows: list[dict], policy_hash: str = "p1") -> Path:
    """`rows` as a complete run folder, as `mhc-parity run` leaves one."""
    write_sample_run(rows, folder, metadata={"policy_hash": policy_hash}, policy_digest=policy_hash, rendered=False)
    return folder


# ----------------------------------------------------------------------------- rules


def test_identical_runs_pass_with_nothing_to_report():
    result = gate(passing_rows(), passing_rows())
    assert result.ok
    assert result.failing_findings() == () and result.improvements == () and result.new_rows == ()
    assert result.matched_rows == len(passing_rows())
    assert result.table().startswith("gate PASS")


def test_injected_regression_fails_and_is_printed():
    current = passing_rows()
    row = find(current, "bf16_small", "d_x")  # 3 eps in the baseline
    row["cand_oracle_max_err"] *= 3.0
    result = gate(passing_rows(), current)
    assert not result.ok
    (finding,) = result.regressions
    assert finding.key == row_key(row)
    assert finding.growth == pytest.approx(3.0)
    table = result.table()
    assert "regression (1):" in table and "d_x" in table and "(x3)" in table and "allowed x2" in table


def test_a_format_1_baseline_is_read_only_when_legacy_baselines_are_allowed(tmp_path):
    """Format 1 has no digest: read (its sensitivities as NaN) only when the reader asks for it."""
    path = write_baseline(passing_rows(), tmp_path / "new.csv", policy_hash="p1")
    assert path.read_text().startswith(f"# mhc-parity baseline format={BASELINE_FORMAT_VERSION} policy_hash=p1 rows=")
    old = as_format_1(path, tmp_path / "old.csv")
    with pytest.raises(
        ReportInputError, match=r"format 1 is a legacy format .* read only with --allow-legacy-baseline"
    ):
        load_baseline(old)
    loaded = load_baseline(old, allow_legacy=True)
    assert loaded.frame["oracle_sensitivity_max"].isna().all() and len(loaded.frame) == len(passing_rows())
    assert loaded.note.endswith("is in legacy format 1: its rows and header are covered by no digest")
    assert gate(loaded.frame, passing_rows()).ok


def test_rms_growth_alone_is_a_regression():
    current = passing_rows()
    find(current, "bf16_small", "d_branch.w")["cand_oracle_rms_err"] *= 10.0  # 1.5 eps → 15 eps
    (finding,) = gate(passing_rows(), current).regressions
    assert finding.key[3] == "d_branch.w" and "rms" in finding.detail


def test_growth_within_the_factor_passes_and_the_factor_is_configurable():
    current = passing_rows()
    find(current, "bf16_small", "d_x")["cand_oracle_max_err"] *= 1.9
    assert gate(passing_rows(), current).ok
    find(current, "bf16_small", "d_x")["cand_oracle_max_err"] *= 2.0  # now ×3.8
    assert not gate(passing_rows(), current).ok
    assert gate(passing_rows(), current, growth_factor=4.0).ok
    assert not gate(passing_rows(), current, growth_factor=1.5).ok


def test_growth_below_the_noise_floor_is_ignored():
    baseline, current = passing_rows(), passing_rows()
    find(baseline, "f32_small", "out")["cand_oracle_max_err"] = 0.1 * DTYPE_EPSILON["float32"]
    find(current, "f32_small", "out")["cand_oracle_max_err"] = 1.5 * DTYPE_EPSILON["float32"]  # ×15 raw
    assert gate(baseline, current).ok
    # ... but crossing well above the floor is measured from the floor, not from 0.1 eps.
    find(current, "f32_small", "out")["cand_oracle_max_err"] = 5.0 * DTYPE_EPSILON["float32"]
    (finding,) = gate(baseline, current).regressions
    assert finding.growth == pytest.approx(2.5)


def test_noise_floor_and_growth_formula():
    assert noise_floor("bfloat16") == 2 * BF16 and noise_floor("float32", 4) == 4 * 2.0**-23
    assert growth(0.0, 0.0, 0.0) == 1.0
    assert growth(1e-3, 3e-3, 0.0) == pytest.approx(3.0)
    assert math.isnan(growth(math.nan, 1.0, 0.0))
    assert growth(1e-3, math.nan, 0.0) == math.inf


def test_missing_row_fails():
    current = passing_rows()
    gone = current.pop(0)
    result = gate(passing_rows(), current)
    assert not result.ok
    (finding,) = result.missing
    assert finding.key == row_key(gone)
    table = result.table()
    assert "missing (1 row in 1 case, 1 case/path group):" in table
    assert f"{gone['case']}  {gone['candidate']}  1 of " in table
    assert gone["leaf"] in table  # few missing rows are also listed one by one


def test_missing_rows_are_summarised_per_case_and_path():
    """A partial run misses whole cases and paths: one line per group, not one per row."""
    baseline = passing_rows()
    current = [
        r
        for r in baseline
        if r["case"] != "bf16_small" and not (r["case"] == "f32_small" and r["candidate"] == "interpret/unsharded")
    ]
    result = gate(baseline, current)
    groups = {(g.case, g.path): (g.missing, g.baseline_rows) for g in result.missing_groups}
    bf16 = sum(r["case"] == "bf16_small" for r in baseline)
    f32 = sum(r["case"] == "f32_small" and r["candidate"] == "interpret/unsharded" for r in baseline)
    assert groups == {("bf16_small", "*"): (bf16, bf16), ("f32_small", "interpret/unsharded"): (f32, f32)}
    table = result.table(max_info_rows=5)
    assert f"missing ({bf16 + f32} rows in 2 cases, 2 case/path groups):" in table
    assert "bf16_small  (every path)" in table and f"{bf16} of {bf16}" in table
    assert len(table.splitlines()) < bf16 + f32  # not a line per row
    markdown = gate_markdown(result)
    assert "| bf16_small | (every path) |" in markdown


def test_new_nan_or_inf_fails():
    current = passing_rows()
    find(current, "f32_small", "h_pre")["nan_count"] = 2
    find(current, "bf16_small", "d_x")["inf_count"] = 1
    result = gate(passing_rows(), current)
    assert not result.ok
    assert [f.key[3] for f in result.new_nonfinite] == ["d_x", "h_pre"]
    assert "nan_count 0 -> 2" in result.table()


def test_nan_already_in_the_baseline_is_not_new():
    baseline, current = passing_rows(), passing_rows()
    find(baseline, "f32_small", "h_pre")["nan_count"] = 2
    find(current, "f32_small", "h_pre")["nan_count"] = 5
    assert gate(baseline, current).new_nonfinite == ()


def test_improvement_passes_but_is_listed():
    current = passing_rows()
    find(current, "bf16_small", "d_branch.w")["cand_oracle_max_err"] /= 2.5  # 5 eps → 2 eps
    result = gate(passing_rows(), current)
    assert result.ok
    (finding,) = result.improvements
    assert finding.key[3] == "d_branch.w"
    assert "improvement (1):" in result.table()


def test_a_fixed_failure_is_an_improvement_and_a_new_failure_fails():
    baseline = sample_rows()  # has a fail, a NaN fail and an error
    current = passing_rows() + [dict(find(sample_rows(), "bf16_small", "d_pre_alpha"), verdict="pass", bound_usage=0.9)]
    result = gate(baseline, current)
    assert any("verdict fail -> pass" in f.detail for f in result.improvements)
    assert {f.key[0] for f in result.missing} == {"bf16_nan", "<script>alert(1)</script>"}
    result = gate(passing_rows(), sample_rows())
    assert sorted(f.detail.split(":")[0] for f in result.failures) == ["error", "fail", "fail"]
    assert not result.ok


def test_an_error_row_is_a_failure_not_also_a_regression():
    current = passing_rows()
    row = find(current, "f32_small", "out")
    row.update(verdict="error", reason="boom", cand_oracle_max_err=math.nan, cand_oracle_rms_err=math.nan)
    result = gate(passing_rows(), current)
    assert [f.key for f in result.failures] == [row_key(row)] and result.regressions == ()


def test_lost_coverage_fails_and_new_rows_are_information():
    current = passing_rows()
    find(current, "f32_small", "out").update(verdict="skip", reason="disabled")
    current.append(dict(current[0], case="brand_new"))
    result = gate(passing_rows(), current)
    assert [f.key[0] for f in result.lost_coverage] == ["f32_small"]
    assert [f.key[0] for f in result.new_rows] == ["brand_new"]
    assert not result.ok
    current.pop(current.index(find(current, "f32_small", "out")))
    current.append(dict(find(passing_rows(), "f32_small", "out")))
    assert gate(passing_rows(), current).ok  # a new row alone never fails


def test_a_row_the_baseline_lost_from_a_case_and_path_it_covers_fails():
    """A baseline that lost one row of a covered case and path (a hand-edited or old file)
    would otherwise report it as a harmless new row while that row holds a regression."""
    current = passing_rows()
    lost = find(current, "f32_small", "out")
    lost["cand_oracle_max_err"] *= 1000
    baseline = [r for r in passing_rows() if row_key(r) != row_key(lost)]
    result = gate(baseline, current)
    assert [f.key for f in result.baseline_gaps] == [row_key(lost)] and result.new_rows == ()
    assert not result.ok and "1 baseline gap" in result.summary_line()
    other_case = [r for r in baseline if r["case"] != "f32_small"]
    result = gate(other_case, current)  # a case the baseline has no row of: new rows only
    assert result.baseline_gaps == () and {f.case for f in result.new_rows} == {"f32_small"}


def test_bad_inputs_raise():
    with pytest.raises(ValueError, match="growth_factor"):
        gate(passing_rows(), passing_rows(), growth_factor=1.0)
    # the one rule `mhc-parity gate` and the API check too: an infinite value would switch the check off
    with pytest.raises(ValueError, match="growth_factor must be a finite number"):
        gate(passing_rows(), passing_rows(), growth_factor=math.inf)
    with pytest.raises(ValueError, match="noise_floor_ulps must be a finite number"):
        gate(passing_rows(), passing_rows(), noise_floor_ulps=math.inf)
    doubled = passing_rows() + passing_rows()[:1]
    with pytest.raises(ReportInputError, match="share a row key"):
        gate(passing_rows(), doubled)
    with pytest.raises(ReportInputError, match="missing columns"):
        gate([{"case": "x"}], passing_rows())


def test_result_is_frozen():
    result = gate(passing_rows(), passing_rows())
    with pytest.raises(AttributeError):
        result.regressions = ()  # type: ignore[misc]


# ----------------------------------------------------------------------------- baseline file


def test_baseline_file_is_small_sorted_rounded_and_deterministic(tmp_path):
    rows = passing_rows()
    first = write_baseline(rows, tmp_path / "a.csv", policy_hash="sha256:1")
    second = write_baseline(list(reversed(rows)), tmp_path / "b.csv", policy_hash="sha256:1")
    assert first.read_bytes() == second.read_bytes()
    lines = first.read_text().splitlines()
    assert lines[0].startswith(header_line("sha256:1", rows=len(rows)) + " sha256=")
    assert lines[1] == ",".join(BASELINE_COLUMNS)
    keys = [tuple(line.split(",")[:4]) for line in lines[2:]]
    assert keys == sorted(keys) and len(keys) == len(rows)
    loaded = load_baseline(first)
    assert loaded.policy_hash == "sha256:1" and loaded.format_version == BASELINE_FORMAT_VERSION
    assert list(loaded.frame.columns) == list(BASELINE_COLUMNS)
    value = find(rows, "bf16_small", "out")["cand_oracle_rms_err"]
    stored = loaded.frame.loc[
        loaded.frame["case"].eq("bf16_small")
        & loaded.frame["leaf"].eq("out")
        & loaded.frame["comparison"].eq("vs_reference"),
        "cand_oracle_rms_err",
    ].item()
    assert stored == float(f"{value:.4g}")
    assert gate(loaded.frame, rows).ok


# ----------------------------------------------------------------------------- CLI


@pytest.fixture
def files(tmp_path) -> dict[str, Path]:
    baseline = write_baseline(passing_rows(), tmp_path / "baselines" / "default.csv", policy_hash="p1")
    current = write_run(tmp_path / "run", passing_rows())
    return {"baseline": baseline, "current": current, "dir": tmp_path}


def run_main(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_cli_pass_exits_0(files, capsys):
    code, out, _ = run_main(capsys, "--baseline", files["baseline"], "--current", files["current"])
    assert code == 0 and "gate PASS" in out


def test_cli_regression_exits_1_prints_table_and_writes_markdown(files, capsys):
    current = passing_rows()
    find(current, "bf16_small", "d_x")["cand_oracle_max_err"] *= 3.0
    write_run(files["current"], current)
    markdown = files["dir"] / "gate.md"
    code, out, _ = run_main(
        capsys, "--baseline", files["baseline"], "--current", files["current"], "--markdown", markdown
    )
    assert code == 1
    assert "gate FAIL" in out and "regression (1):" in out and "d_x" in out
    text = markdown.read_text()
    assert "### Baseline gate: ❌ FAIL" in text and "| bf16_small | interpret/unsharded |" in text
    code, _, _ = run_main(
        capsys, "--baseline", files["baseline"], "--current", files["current"], "--growth-factor", "5"
    )
    assert code == 0


def test_cli_accepts_a_finished_run_as_folder_report_json_or_rows_file_beside_its_manifest(files, capsys):
    for current in (files["current"], files["current"] / "report.json", files["current"] / "rows.csv"):
        code, out, _ = run_main(capsys, "--baseline", files["baseline"], "--current", current)
        assert code == 0 and "policy match not checked" not in out, current


def test_cli_refuses_rows_that_no_complete_manifest_vouches_for(files, capsys):
    bare = write_jsonl(files["dir"] / "rows.jsonl", passing_rows())
    code, out, err = run_main(capsys, "--baseline", files["baseline"], "--current", bare)
    assert code == 2 and "bare rows file carries no manifest" in err and out == ""
    rows_csv = files["current"] / "rows.csv"
    rows_csv.write_text("".join(rows_csv.read_text().splitlines(keepends=True)[:-1]))  # a row lost
    code, _, err = run_main(capsys, "--baseline", files["baseline"], "--current", rows_csv)
    assert code == 2 and "rows are not those the run" in err


@pytest.mark.parametrize(
    "content, message",
    [
        ("", "empty file"),
        ("\x00\x01garbage\xff", "not a UTF-8 text file"),
        (header_line("p1") + "\n", "empty file"),
        (render_baseline([], policy_hash="p1"), "has no rows"),
        (header_line("p1") + "\ncase,leaf\nx,y\n", "baseline columns do not match"),
        ("# mhc-parity baseline format=99 policy_hash=p1\n", "baseline format 99 is not supported"),
        (
            header_line("p1")
            + "\n"
            + ",".join(BASELINE_COLUMNS)
            + "\nc,a,b,out,vs_reference,output,float32,pass,zero,0,1e-7,1e-8\n",
            "line 3, column 'nan_count'",
        ),
        (header_line("p1") + "\n" + ",".join(BASELINE_COLUMNS) + '\n"unterminated,a\n', "not a readable CSV file"),
        (
            header_line("p1")
            + "\n"
            + ",".join(BASELINE_COLUMNS)
            + "\nc,a,b,out,vs_reference,output,float32,pass,0,0,1e-7,3.\n",
            "line 3, column 'cand_oracle_rms_err': '3.' is not a complete number",
        ),
        (
            header_line("p1")
            + "\n"
            + ",".join(BASELINE_COLUMNS)
            + "\nc,a,b,out,vs_reference,output,float32,pass,0,0,1e-7,3.8",
            "line 3: the file is cut",
        ),
    ],
    ids=[
        "empty",
        "binary",
        "no-columns",
        "no-rows",
        "wrong-columns",
        "future-format",
        "bad-cell",
        "truncated",
        "cut-number",
        "cut-line",
    ],
)
def test_cli_corrupt_baseline_exits_2_with_a_message(files, capsys, content, message):
    path = files["dir"] / "corrupt.csv"
    path.write_bytes(content.encode("latin-1"))
    code, out, err = run_main(capsys, "--baseline", path, "--current", files["current"])
    assert code == 2, (out, err)
    assert message in err and err.startswith("mhc-parity: error: ") and out == ""


def test_cli_policy_mismatch_exits_2_unless_allowed(files, capsys):
    report = write_run(files["dir"] / "other-policy", passing_rows(), policy_hash="p2") / "report.json"
    code, _, err = run_main(capsys, "--baseline", files["baseline"], "--current", report)
    assert code == 2 and "policy p1" in err and "make baseline" in err
    code, _, _ = run_main(capsys, "--baseline", files["baseline"], "--current", report, "--allow-policy-change")
    assert code == 0


def test_cli_usage_and_input_errors_exit_2(files, capsys):
    assert run_main(capsys, "--baseline", files["baseline"])[0] == 2
    assert run_main(capsys, "--baseline", files["baseline"], "--current", files["dir"] / "absent.jsonl")[0] == 2
    code, _, err = run_main(
        capsys, "--baseline", files["baseline"], "--current", files["current"], "--growth-factor", "0.5"
    )
    assert code == 2 and "--growth-factor" in err
    empty = write_run(files["dir"] / "empty", [])
    code, _, err = run_main(capsys, "--baseline", files["baseline"], "--current", empty)
    assert code == 2 and "has no rows" in err
    doubled = write_run(files["dir"] / "doubled", passing_rows() + passing_rows()[:1])
    code, _, err = run_main(capsys, "--baseline", files["baseline"], "--current", doubled)
    assert code == 2 and "share a row key" in err


@pytest.mark.slow
def test_one_baseline_command_and_the_gate_as_a_user_runs_them(files, tmp_path):
    """`mhc-parity baseline` is the one baseline command; `python -m mhc_parity.reports` is no command."""
    target = tmp_path / "new" / "baseline.csv"
    made = subprocess.run(
        [sys.executable, "-m", "mhc_parity.harness", "baseline", "--from", str(files["current"]), "--to", str(target)],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert made.returncode == 0, made.stderr
    assert load_baseline(target).policy_hash == "p1"
    checked = subprocess.run(
        [
            sys.executable,
            "-m",
            "mhc_parity.harness",
            "gate",
            "--baseline",
            str(target),
            "--current",
            str(files["current"]),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert checked.returncode == 0, checked.stderr
    assert "gate PASS" in checked.stdout
    assert subprocess.run([sys.executable, "-m", "mhc_parity.reports"], cwd=REPO, capture_output=True).returncode != 0


def test_loaded_runs_and_baselines_are_accepted_everywhere(files, tmp_path):
    """What load_run / load_baseline return can be passed straight to write_baseline, gate and write_all."""
    from mhc_parity.reports import load_run, write_all

    run_dir = write_run(tmp_path / "run", passing_rows(), policy_hash="p9")
    target = write_baseline(load_run(run_dir), tmp_path / "from-run.csv")
    baseline = load_baseline(target)
    assert baseline.policy_hash == "p9"
    assert gate(baseline, load_run(run_dir)).ok
    paths = write_all(load_run(run_dir), {}, tmp_path / "out", baseline=baseline)
    assert json.loads(paths["json"].read_text())["gate"]["ok"] is True


# ----------------------------------------------------------------------------- what the gate trusts


def regressed_run(files) -> Path:
    """The current run of `files` with one leaf's oracle error grown 3x: the gate fails it."""
    current = passing_rows()
    find(current, "bf16_small", "d_x")["cand_oracle_max_err"] *= 3.0
    return write_run(files["current"], current)


def grown_d_x(row: dict) -> dict:
    """A baseline row with the regressed leaf's error grown as well: the stale body a user
    would give the gate so that the regressed run passes."""
    if (row["case"], row["leaf"], row["comparison"]) == ("bf16_small", "d_x", "vs_reference"):
        row["cand_oracle_max_err"] = repr(float(row["cand_oracle_max_err"]) * 3.0)
    return row


def baseline_main(*argv) -> int:
    from mhc_parity.harness.commands.baseline import main as baseline_command

    return baseline_command([str(a) for a in argv])


def test_a_baseline_file_is_not_a_current_run(files, capsys):
    """A baseline carries no manifest, so taken as --current it skipped the manifest and code
    checks: `gate --baseline B --current B` passed in any checkout."""
    from mhc_parity.harness.commands.render import main as render_main
    from tests.cli_support import assert_one_line

    for command in (
        lambda: main(["--baseline", str(files["baseline"]), "--current", str(files["baseline"])]),
        lambda: render_main(["--rows", str(files["baseline"]), "--out", str(files["dir"] / "rendered")]),
        lambda: baseline_main("--from", files["baseline"], "--to", files["dir"] / "copy.csv"),
    ):
        code = command()
        out, err = capsys.readouterr()
        assert_one_line(code, err, f"{files['baseline']} is a baseline file, not a run", "report.json")
        assert "gate PASS" not in out
    assert not (files["dir"] / "copy.csv").exists()


def test_a_baseline_in_a_run_folder_is_not_that_run(files, capsys):
    """`baseline --to RUN/rows.csv` replaced the run's rows with a baseline, which `--current
    RUN/rows.csv` then took without its manifest's check: refused at both ends."""
    from tests.cli_support import assert_one_line

    run = regressed_run(files)
    for name in ("rows.csv", "report.json", "manifest.json"):
        before = (run / name).read_bytes()
        code = baseline_main("--from", files["current"], "--to", run / name, "--allow-code-change")
        assert_one_line(code, capsys.readouterr().err, f"is the {name} of the run folder", "outside the run folder")
        assert (run / name).read_bytes() == before
    (run / "rows.csv").write_bytes(files["baseline"].read_bytes())  # put there by hand
    code = main(["--baseline", str(files["baseline"]), "--current", str(run / "rows.csv")])
    assert_one_line(code, capsys.readouterr().err, "is a baseline file, not a run")
    assert main(["--baseline", str(files["baseline"]), "--current", str(run)]) == 1  # the run's own rows
    assert baseline_main("--from", run, "--to", files["dir"] / "elsewhere" / "rows.csv") == 0  # not a run folder


def test_baseline_from_refuses_one_shard_of_a_run(files, capsys):
    """`run --shard 1/2` then `baseline --from` wrote half the rows as the baseline, against
    which a regression in the other half passed: a shard must be merged first."""
    from mhc_parity.records.manifest import read_manifest
    from mhc_parity.reports.samples import sample_manifest
    from tests.cli_support import assert_one_line

    rows = [r for r in passing_rows() if r["case"] == "bf16_small"]
    whole = read_manifest(files["current"]).cases
    shard = dataclasses.replace(sample_manifest(rows), shard="1/2", shard_of=whole, shard_of_digest="sample")
    write_sample_run(rows, files["dir"] / "shard1", manifest=shard, rendered=False)
    code = baseline_main("--from", files["dir"] / "shard1", "--to", files["dir"] / "shard1.csv")
    assert_one_line(
        code, capsys.readouterr().err, "is shard 1/2 of a run", "merge the shards first", "mhc-parity merge"
    )
    assert not (files["dir"] / "shard1.csv").exists()
    unfinished = dataclasses.replace(sample_manifest(rows), state="interrupted", reason="SIGINT")
    write_sample_run(rows, files["dir"] / "stopped", manifest=unfinished, rendered=False)
    code = baseline_main("--from", files["dir"] / "stopped", "--to", files["dir"] / "stopped.csv")
    assert_one_line(code, capsys.readouterr().err, "holds an unfinished run")


def test_a_baseline_downgraded_to_format_1_needs_the_legacy_flag(files, capsys):
    """Set to format=1 with its sensitivity columns dropped, an edited baseline's stale digest
    was ignored and a regressed run gated 0."""
    from tests.cli_support import assert_one_line

    run = regressed_run(files)
    assert main(["--baseline", str(files["baseline"]), "--current", str(run)]) == 1
    capsys.readouterr()
    downgraded = as_format_1(files["baseline"], files["dir"] / "downgraded.csv", grown_d_x)
    code = main(["--baseline", str(downgraded), "--current", str(run)])
    assert_one_line(code, capsys.readouterr().err, "baseline format 1 is a legacy format", "--allow-legacy-baseline")
    code = main(["--baseline", str(downgraded), "--current", str(run), "--allow-legacy-baseline"])
    out = capsys.readouterr().out
    assert code == 0 and f"note: baseline {downgraded} is in legacy format 1: its rows and header" in out


def test_a_legacy_baseline_without_a_policy_says_the_policy_was_not_checked(files, capsys):
    legacy = as_format_1(files["baseline"], files["dir"] / "legacy.csv", policy_hash="-")
    other_policy = write_run(files["dir"] / "p2", passing_rows(), policy_hash="p2")
    code = main(["--baseline", str(legacy), "--current", str(other_policy), "--allow-legacy-baseline"])
    out = capsys.readouterr().out
    assert code == 0 and "it records no tolerance policy, so the policy was not checked" in out


HEADER_EDITS = {
    "policy_hash": lambda header: header.replace("policy_hash=p1", "policy_hash=p2"),
    "implementation": lambda header: header.replace(" rows=", " implementation=my_mhc rows="),
    "matmul_precision": lambda header: header.replace(" rows=", " matmul_precision=default=bfloat16 rows="),
    "backend": lambda header: header.replace(" rows=", " backend=tpu rows="),
    "format": lambda header: header.replace(f"format={BASELINE_FORMAT_VERSION}", "format=2").replace(
        " sha256=", " body_sha256="
    ),
    # format 3 is still read (sealed alike, without the gain columns): the columns then do not match
    "format_3": lambda header: header.replace(f"format={BASELINE_FORMAT_VERSION}", "format=3"),
}


@pytest.mark.parametrize("field", sorted(HEADER_EDITS))
def test_every_header_field_a_verdict_depends_on_is_inside_the_digest(files, capsys, field):
    """A header edited by hand (another policy, implementation, precision or backend than the
    rows were made under) is refused like an edited row."""
    from tests.cli_support import assert_one_line

    lines = files["baseline"].read_text().splitlines(keepends=True)
    edited = files["dir"] / "edited.csv"
    edited.write_text(HEADER_EDITS[field](lines[0]) + "".join(lines[1:]))
    refusal = "does not match the header's digest|format 2 is a legacy format|columns do not match format 3"
    with pytest.raises(ReportInputError, match=refusal):
        load_baseline(edited)
    assert_one_line(main(["--baseline", str(edited), "--current", str(files["current"])]), capsys.readouterr().err)


@pytest.mark.parametrize("policy", ["policy_hash=-", "policy_hash=", ""], ids=["dash", "empty", "missing"])
def test_a_current_format_baseline_without_a_policy_is_refused(files, capsys, policy):
    """`policy_hash=-` disabled the policy check with only a note; a baseline now always names
    its policy (sealed anew here, as a writer that left it out would)."""
    from mhc_parity.reports.gate.baseline_file import sealed
    from tests.cli_support import assert_one_line

    lines = files["baseline"].read_text().splitlines(keepends=True)
    header = lines[0].rstrip("\n").rsplit(" sha256=", 1)[0].replace(" policy_hash=p1", f" {policy}".rstrip())
    unsigned = files["dir"] / "unsigned.csv"
    unsigned.write_text(sealed(header, "".join(lines[1:])))
    other_policy = write_run(files["dir"] / "p2", passing_rows(), policy_hash="p2")
    code = main(["--baseline", str(unsigned), "--current", str(other_policy)])
    assert_one_line(code, capsys.readouterr().err, "records no tolerance policy", "make baseline")
    with pytest.raises(ReportInputError, match="records the tolerance policy"):
        write_baseline(passing_rows(), files["dir"] / "no-policy.csv")


def test_run_reads_a_legacy_baseline_only_with_the_legacy_flag(files, capsys):
    """`run --baseline` refuses a legacy file before any compute, naming the flag it accepts."""
    from mhc_parity.harness.commands.run import main as run_main
    from mhc_parity.harness.commands.run import run_parser
    from tests.cli_support import REFERENCE_ONLY_CASE, assert_one_line

    downgraded = as_format_1(files["baseline"], files["dir"] / "legacy-for-run.csv", grown_d_x)
    code = run_main(["--cases", REFERENCE_ONLY_CASE, "--baseline", str(downgraded), "--out", str(files["dir"] / "r")])
    assert_one_line(code, capsys.readouterr().err, "legacy format", "--allow-legacy-baseline")
    assert run_parser().parse_args(["--allow-legacy-baseline"]).allow_legacy_baseline


def test_an_infinite_growth_factor_or_noise_floor_is_refused_and_a_non_default_one_named(files, capsys):
    """`--growth-factor inf` or `--noise-floor-ulps inf` switched the growth check off without a
    word: each must be finite (exit 2 naming it); a value other than the default opens every
    summary of the gate (its terminal output and Markdown; the HTML report's drift section)."""
    inputs = ("--baseline", files["baseline"], "--current", files["current"])
    for option in ("--growth-factor", "--noise-floor-ulps"):
        for value in ("inf", "nan"):
            code, _, err = run_main(capsys, *inputs, option, value)
            assert code == 2 and f"argument {option}: must be a finite number" in err.strip().splitlines()[-1], err
    markdown = files["dir"] / "gate.md"
    argv = (*inputs, "--markdown", markdown)
    code, out, _ = run_main(capsys, *argv, "--growth-factor", "5", "--noise-floor-ulps", "0")
    note = (
        "The gate judged drift with growth factor ×5 (default ×2) and noise floor 0 ulps (default 2 ulps), "
        "not its defaults."
    )
    assert code == 0 and out.splitlines()[0] == note
    assert f"> {note}" in markdown.read_text()
    code, out, _ = run_main(capsys, *argv)
    assert code == 0 and "not its defaults" not in out + markdown.read_text()
