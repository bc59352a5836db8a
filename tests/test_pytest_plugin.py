"""The pytest plugin's baseline loop in pieces: the command a missing baseline names, and
what an update says changed (`reports.baseline.diff_baselines`). The loop itself runs in a
user's repository in tests/test_external_project.py."""

from __future__ import annotations

import pathlib
import types

import pandas as pd
import pytest

from harness.pytest_plugin import _ini_overrides, update_command
from reports.baseline import diff_baselines, render_baseline
from reports.samples import sample_rows


def _config(options=None, ini=None, args=(), rootpath=pathlib.Path("/repo")):
    options, ini = options or {}, ini or {}
    return types.SimpleNamespace(
        getoption=lambda name: options.get(name),
        getini=lambda name: ini.get(name),
        invocation_params=types.SimpleNamespace(args=tuple(args), dir=rootpath),
        rootpath=rootpath,
    )


def test_the_update_command_of_an_ini_configured_baseline_is_the_flag_alone(monkeypatch):
    monkeypatch.delenv("MHC_PARITY_SUITE", raising=False)
    config = _config(ini={"parity_impl": "my_mhc.kernel:factory", "parity_baseline": "baselines/my_mhc.csv"})
    assert update_command(config) == "pytest --parity-update-baseline"


def test_the_update_command_carries_the_parity_options_overrides_and_environment_suite(monkeypatch):
    monkeypatch.setenv("MHC_PARITY_SUITE", "default")
    options = {"--parity-impl": "pkg.k:factory", "--parity-baseline": "my dir/b.csv", "--parity-report": "out"}
    args = ["-k", "f32", "-o", "parity_dtype=bf16", "-oparity_x=1", "--override-ini=parity_y=2", "-o", "other=3"]
    assert update_command(_config(options, args=args)) == (
        "pytest --parity-impl pkg.k:factory --parity-baseline 'my dir/b.csv' -o parity_dtype=bf16 "
        "-o parity_x=1 -o parity_y=2 --parity-suite default --parity-update-baseline"
    )
    monkeypatch.delenv("MHC_PARITY_SUITE")
    assert _ini_overrides(["--override-ini", "parity_z=", "-p", "no:cacheprovider"]) == ["-o", "parity_z="]


@pytest.fixture
def rows() -> list[dict]:
    return [dict(r) for r in sample_rows()]


def test_a_baseline_diff_names_rows_added_removed_changed_and_the_header(rows):
    old = render_baseline(rows[1:], policy_hash="p1")
    changed = [dict(r) for r in rows]
    changed[5]["cand_oracle_max_err"] = changed[5]["cand_oracle_max_err"] * 3 + 1e-3
    new = render_baseline(changed[:-1], policy_hash="p2")
    diff = diff_baselines(old, new)
    key = lambda row: (row["case"], row["candidate"], row["partner"], row["leaf"])  # noqa: E731
    assert diff.added == (key(rows[0]),) and diff.removed == (key(rows[-1]),)
    assert [k for k, _ in diff.changed] == [key(rows[5])]
    assert [column for column, _, _ in diff.changed[0][1]] == ["cand_oracle_max_err"]
    assert diff.header == (("policy_hash", "p1", "p2"),)  # the row count and body digest are the rows' own
    assert diff.rows == len(rows) - 1 and not diff.unchanged
    assert diff_baselines(old, old).unchanged


def test_a_legacy_baseline_stops_the_session_unless_the_plugin_option_allows_it(tmp_path, rows):
    """The plugin took a baseline set by hand to format 1 (no digest) as the gate did: now it
    is a usage error naming the plugin's option, and with the option the summary says what
    went unverified."""
    from harness.pytest_plugin import LEGACY_INI, LEGACY_OPTION, ParitySession
    from reports.baseline import write_baseline
    from reports.sources import LoadedRun
    from tests.cli_support import as_format_1

    passing = [r for r in rows if r["verdict"] in ("pass", "skip", "unsupported")]
    legacy = as_format_1(write_baseline(passing, tmp_path / "new.csv", policy_hash="p1"), tmp_path / "old.csv")
    options = {"--parity-baseline": str(legacy)}
    session = ParitySession(_config(options, rootpath=tmp_path))
    refused = (
        rf"{legacy}: baseline format 1 is a legacy format .* read only with {LEGACY_OPTION} \(or {LEGACY_INI} = true\)"
    )
    with pytest.raises(pytest.UsageError, match=refused + "; recreate it with: pytest "):
        session.settle_baseline(tmp_path)
    current = LoadedRun(pd.DataFrame(passing), pathlib.Path("<session>"), "p1", {}, False)
    prepared = types.SimpleNamespace(
        implementation_names=(), result=lambda records: types.SimpleNamespace(loaded=lambda: current)
    )
    for config in (
        _config({**options, LEGACY_OPTION: True}, rootpath=tmp_path),
        _config(options, {LEGACY_INI: True}, rootpath=tmp_path),
    ):
        session = ParitySession(config)
        session._prepared = prepared  # what `prepare` gives, without loading the engine
        session.settle_baseline(tmp_path)
        assert len(session.baseline_run.frame) == len(passing)
        assert session.summary_lines == [
            f"mhc-parity: note: baseline {legacy} is in legacy format 1: its rows and header are covered by no digest"
        ]
