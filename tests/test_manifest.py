"""mhc_parity.records.manifest and what trusts it (mhc_parity.reports.sources): states, differences, refusals."""

from __future__ import annotations

import dataclasses
import json

import pytest

from mhc_parity.cases.catalogue import make_case
from mhc_parity.harness.judging.policy_file import load_policy
from mhc_parity.records.code import external_code_files
from mhc_parity.records.manifest import (
    COMPLETE,
    INTERRUPTED,
    RUNNING,
    CaseRecord,
    Manifest,
    ManifestError,
    foreign_folder_problem,
    read_manifest,
    write_manifest,
)
from mhc_parity.records.project_code import in_code_dirs
from mhc_parity.reports import ReportInputError, load_run
from mhc_parity.reports.samples import run_request as request
from mhc_parity.reports.samples import sample_rows, write_sample_run
from tests.cli_support import scale_one_metric_in_report

CASES = [make_case(streams=3, batch=1, sequence=32), make_case(batch=2, sequence=64, mesh=(2, 4), block_tokens=8)]


def manifest(cases=CASES, **changes) -> Manifest:
    return Manifest.new(
        request=request(**changes),
        cases=cases,
        path_names=["reference/unsharded"],
        policy=load_policy(),
        command_line="mhc-parity run --out x",
    )


def test_a_manifest_round_trips_through_its_file(tmp_path):
    made = manifest().with_case(CaseRecord(CASES[0].name, 3, "ab" * 32))
    write_manifest(tmp_path, made)
    assert read_manifest(tmp_path) == made
    assert read_manifest(tmp_path / "elsewhere") is None
    (tmp_path / "manifest.json").write_text('{"format": "something else"}')
    with pytest.raises(ManifestError, match="not an mhc-parity manifest"):
        read_manifest(tmp_path)


def test_states_running_interrupted_complete():
    running = manifest()
    assert running.state == RUNNING and not running.is_complete
    with pytest.raises(ManifestError, match=r"running, or killed, 0 of 2 cases done.*--out x --resume"):
        running.require_complete("out/parity")
    stopped = running.with_case(CaseRecord(CASES[0].name, 3, "ab" * 32)).interrupted("SIGINT")
    assert stopped.state == INTERRUPTED
    with pytest.raises(ManifestError, match=r"interrupted \(SIGINT\), 1 of 2 cases done"):
        stopped.require_complete("out/parity")
    done = running.with_cases(CaseRecord(c.name, 20, "ab" * 32) for c in CASES).completed(rows=40)
    assert done.state == COMPLETE and done.is_complete and done.rows == 40
    done.require_complete("out/parity")
    again = done.resumed_as(manifest())
    assert again.state == RUNNING and again.run_id == done.run_id and len(again.resumed) == 1


def test_differences_name_what_changed():
    base = manifest()
    assert base.differences(manifest()) == []
    other = manifest(cases=CASES[:1], paths=("interpret/*",), seed=3)
    found = " | ".join(base.differences(other))
    assert "cases: 2 -> 1 cases, dropped" in found
    assert "paths: ['*'] -> ['interpret/*']" in found and "seed: None -> 3" in found
    edited = [dataclasses.replace(CASES[0], batch=2), CASES[1]]  # same name, another spec
    assert base.differences(manifest(cases=edited)) == ["case specs differ under the same names (an edited case file?)"]
    files = dict(base.code_files)
    files["mhc_parity/mhc/layer.py"] = "0" * 64
    changed = dataclasses.replace(base, code_files=tuple(files.items()), code_digest="x")
    assert base.differences(changed) == ["code under test: mhc_parity/mhc/layer.py changed"]
    assert changed.changed_code_files() == ["mhc_parity/mhc/layer.py"]
    assert base.changed_code_files() == []


def test_code_files_are_the_namespace_s_code_packages_by_project_relative_path():
    """Module `mhc_parity.harness.x` is the file `mhc_parity/harness/x.py`: a manifest keys the
    project's sources so, and a run recorded before the packages moved under `mhc_parity/`
    (with top-level keys) has all its recorded project files changed, never matched."""
    keys = set(dict(manifest().code_files))
    assert {key.split("/")[1] for key in keys} == {"mhc", "cases", "records", "harness"}
    assert all(key.startswith("mhc_parity/") and in_code_dirs(key) for key in keys)
    old_top = "harness"  # the package's top-level name before the move
    assert not in_code_dirs("mhc_parity/reports/gate/rule.py") and not in_code_dirs(f"{old_top}/cli.py")
    assert not in_code_dirs("mhc_parity/harness.py"), "a folder's name, not a prefix of a file's"
    files = {key.removeprefix("mhc_parity/"): sha for key, sha in manifest().code_files}
    before_the_move = dataclasses.replace(manifest(), code_files=tuple(files.items()))
    assert f"{old_top}/cli.py" in files and set(before_the_move.changed_code_files()) >= set(files)


def test_code_digest_covers_the_packages_and_external_modules(tmp_path):
    module = tmp_path / "my_impl.py"
    module.write_text("x = 1\n")
    with_external = Manifest.new(
        request=request(),
        cases=CASES,
        path_names=[],
        policy=load_policy(),
        extra_code_files=external_code_files("my_impl", module),
        command_line="",
    )
    keys = dict(with_external.code_files)
    assert {"mhc_parity/mhc/layer.py", "mhc_parity/cases/spec.py", "mhc_parity/harness/engine/runner.py"} <= set(keys)
    assert module.resolve().as_posix() in keys
    assert with_external.code_digest != manifest().code_digest


# ----------------------------------------------------------------------------- mhc_parity.reports.sources


@pytest.fixture
def run_folder(tmp_path):
    rows = [r for r in sample_rows() if r["verdict"] == "pass"]
    write_sample_run(rows, tmp_path / "run", rendered=False)
    return tmp_path / "run"


def test_a_complete_folder_loads_with_its_manifest(run_folder):
    run = load_run(run_folder, require_current_code=True)
    assert run.manifest.is_complete and len(run) == run.manifest.rows


@pytest.mark.parametrize(
    "spoil, message",
    [
        (lambda folder: (folder / "manifest.json").unlink(), "no manifest.json"),
        (
            lambda folder: write_manifest(folder, dataclasses.replace(read_manifest(folder), state=RUNNING)),
            "unfinished run",
        ),
        (
            lambda folder: write_manifest(folder, dataclasses.replace(read_manifest(folder), run_id="newer")),
            "stale report",
        ),
        (lambda folder: (folder / "report.json").unlink(), "report.json is missing"),
        (lambda folder: write_manifest(folder, dataclasses.replace(read_manifest(folder), rows=1)), "do not add up"),
        (lambda folder: scale_one_metric_in_report(folder / "report.json", 1.5), "rows are not those the run"),
    ],
    ids=["no-manifest", "running", "another-run", "no-report", "row-count", "flipped-digit"],
)
def test_a_folder_that_is_not_one_complete_run_is_refused(run_folder, spoil, message):
    spoil(run_folder)
    with pytest.raises(ReportInputError, match=message):
        load_run(run_folder)


def test_a_report_json_carries_its_manifest_and_is_refused_without_one(run_folder, tmp_path):
    copied = tmp_path / "copy.json"  # a report copied away from its folder still proves itself
    copied.write_text((run_folder / "report.json").read_text())
    assert load_run(copied).manifest.is_complete
    document = json.loads(copied.read_text())
    del document["manifest"]
    copied.write_text(json.dumps(document))
    with pytest.raises(ReportInputError, match="carries no run manifest"):
        load_run(copied)


def test_only_a_new_empty_or_run_folder_may_take_a_run(tmp_path):
    """`foreign_folder_problem`: a folder holding files but no run manifest is someone's own
    (a run would replace its summary.md and rows.csv without a word); a missing or empty
    folder (a writer's lock and space reserve aside) and a run folder of any state are not."""
    assert foreign_folder_problem(tmp_path / "new") == ""
    (tmp_path / ".writer.lock").write_text("")
    assert foreign_folder_problem(tmp_path) == ""
    write_manifest(tmp_path, manifest())  # "running": an unfinished run folder
    (tmp_path / "summary.md").write_text("mine\n")
    assert foreign_folder_problem(tmp_path) == ""
    for content in ('{"format": "web-app"}', "not json"):
        (tmp_path / "manifest.json").write_text(content)
        assert foreign_folder_problem(tmp_path) == (
            f"{tmp_path} holds files (manifest.json, summary.md) but no run manifest (manifest.json of "
            "mhc-parity), so a run would replace them; choose a new or empty folder"
        )


def test_an_unfinished_copied_folder_names_itself_in_the_command_that_finishes_it(tmp_path):
    """The hint of an unfinished run read from a folder it was copied to names that folder as
    `--out`: the recorded command would resume (or clobber) the original instead."""
    made = Manifest.new(
        request=request(),
        cases=CASES,
        path_names=["reference/unsharded"],
        policy=load_policy(),
        command_line="mhc-parity run --suite smoke --out out/parity --quiet",
    )
    copy = tmp_path / "my copy"
    write_manifest(copy, made)
    with pytest.raises(ReportInputError) as caught:
        load_run(copy)
    assert f"Finish it with `mhc-parity run --suite smoke --out '{copy}' --quiet --resume`" in str(caught.value)
    assert made.resume_command() == "mhc-parity run --suite smoke --out out/parity --quiet --resume"
    defaulted = dataclasses.replace(made, command_line="mhc-parity baseline --impl k:f --resume")
    assert defaulted.resume_command(copy) == f"mhc-parity baseline --impl k:f --resume --out '{copy}'"
