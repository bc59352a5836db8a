"""The pytest plugin in pieces: the command a missing baseline names, what an update says
changed (`mhc_parity.reports.gate.comparability.diff_baselines`), and one failure per regression (an inner
pytest run of the plugin over made-up rows, `pytester`). The baseline loop itself runs in a
user's repository in tests/test_external_project.py."""

from __future__ import annotations

import dataclasses
import os
import pathlib
import re
import subprocess
import sys
import types

import pandas as pd
import pytest

from mhc_parity.harness import pytest_plugin
from mhc_parity.harness.plugin.options import ini_overrides
from mhc_parity.harness.pytest_plugin import UPDATE_OPTION, ParitySession, update_command
from mhc_parity.reports.gate.baseline_file import render_baseline
from mhc_parity.reports.gate.comparability import diff_baselines
from mhc_parity.reports.gate.drift import NO_GAIN_NOTE
from mhc_parity.reports.samples import measured_row, sample_rows
from mhc_parity.reports.sources import LoadedRun
from tests.cli_support import ROOT

pytest_plugins = ["pytester"]  # the inner pytest runs of the plugin


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
        "pytest --parity-impl=pkg.k:factory '--parity-baseline=my dir/b.csv' -o parity_dtype=bf16 "
        "-o parity_x=1 -o parity_y=2 --parity-suite=default --parity-update-baseline"
    )
    monkeypatch.delenv("MHC_PARITY_SUITE")
    assert ini_overrides(["--override-ini", "parity_z=", "-p", "no:cacheprovider"]) == ["-o", "parity_z="]


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
    from mhc_parity.harness.pytest_plugin import LEGACY_INI, LEGACY_OPTION
    from mhc_parity.reports.gate.baseline_file import write_baseline
    from mhc_parity.reports.sources import LoadedRun
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
            f"mhc-parity: note: baseline {legacy} is in legacy format 1: its rows and header are covered by no digest",
            f"mhc-parity: {NO_GAIN_NOTE}",  # format 1 keeps no gain either
        ]


# --- One failure per regression -------------------------------------------------------------

IMPL = "my_mhc"
BOTH, ONE = "lite-n4-c128-b2s64-f32-w32-identity-default", "lite-n4-c128-b2s64-f32-w32-mlp-default"
LOGIC_ERROR = "not explained by any rounding: look for a logic error"


@dataclasses.dataclass(frozen=True)
class _Case:
    name: str
    mesh: object = None


@dataclasses.dataclass(frozen=True)
class _Prepared:
    """What `mhc_parity.harness.api.prepare` gives the plugin, with the rows of each case made up."""

    rows: dict
    implementation_names: tuple = (IMPL,)

    @property
    def plan(self):
        return types.SimpleNamespace(lowering=False)

    @property
    def cases(self):
        return tuple(_Case(name) for name in self.rows)

    def run_case(self, case):
        return [dict(r) for r in self.rows[case.name]]

    def result(self, records):
        """The session's run as `settle_baseline` reads it: every row, under policy "p1"."""
        frame = pd.DataFrame([r for rows in self.rows.values() for r in rows])
        return types.SimpleNamespace(loaded=lambda: LoadedRun(frame, pathlib.Path("<session>"), "p1", {}, False))


def _failing(row: dict, usage: float, cause: str, cause_id: str) -> dict:
    reason = f"cand_oracle_max_err={usage * 1e-6:.3g} > 2*max(...)={1e-6:.3g}"
    return {**row, "verdict": "fail", "bound_usage": usage, "reason": reason, "cause": cause, "cause_id": cause_id}


def _case_rows(case: str, failing: dict, impl: str = IMPL) -> list[dict]:
    """A float32 case's rows of `impl` vs the oracle and vs the reference; `failing`: (leaf,
    comparison) -> (usage, cause, cause_id) of the rows that fail."""
    rows = []
    for index, (leaf, kind) in enumerate((("out", "output"), ("h_pre", "intermediate"), ("d_x", "activation_grad"))):
        for partner, comparison in (("oracle", "vs_oracle"), ("reference/unsharded", "vs_reference")):
            row = measured_row(case, f"{impl}/unsharded", partner, comparison, leaf, kind, "float32", 1.0 + index)
            if (leaf, comparison) in failing:
                row = _failing(row, *failing[leaf, comparison])
            rows.append(row)
    return rows


def _inner_run(pytester, monkeypatch, rows: dict, ini: str = "", names: tuple = (IMPL,)):
    """An inner pytest project whose plugin checks IMPL over `rows` (case -> its rows): a
    function of the extra pytest arguments giving its `inline_run` recorder. `names`: the
    implementations the factory gives."""
    # What `prepare` gives, without loading the engine (the session's property calls it).
    monkeypatch.setattr(ParitySession, "prepared", property(lambda session: _Prepared(rows, names)))
    pytester.makeini(f"[pytest]\nparity_impl = {IMPL}.kernel:factory\n{ini}")
    pytester.makepyfile(
        test_parity="from mhc_parity.harness.pytest_plugin import check_parity\n\n"
        "def test_parity(parity_check):\n    check_parity(parity_check)\n"
    )
    return lambda *args: pytester.inline_run("-p", "no:cacheprovider", "-p", "no:xdist", *args)


@pytest.fixture
def made_up_run(pytester, monkeypatch):
    """An inner run over made-up rows: in BOTH, `out` fails against the oracle and against
    the reference (one regression); in ONE, `h_pre` fails against the reference only."""
    rows = {
        BOTH: _case_rows(
            BOTH,
            {
                ("out", c): (3.5 if c == "vs_oracle" else 2.5, LOGIC_ERROR, "unexplained")
                for c in ("vs_oracle", "vs_reference")
            },
        ),
        ONE: _case_rows(ONE, {("h_pre", "vs_reference"): (1.5, "within its rounding model", "within_model")}),
    }
    return _inner_run(pytester, monkeypatch, rows)


def _outcomes(recorder) -> dict[str, str]:
    """test id (`<case>::<comparison>`) -> its outcome."""
    return {
        r.nodeid.partition("[")[2].rstrip("]"): r.outcome
        for r in recorder.getreports("pytest_runtest_logreport")
        if r.when == "call"
    }


def _message(recorder, test_id: str) -> str:
    (report,) = [
        r
        for r in recorder.getreports("pytest_runtest_logreport")
        if r.nodeid.endswith(f"[{test_id}]") and r.when == "call"
    ]
    return report.longreprtext


def test_a_leaf_failing_in_two_comparisons_is_one_failure_naming_both(made_up_run):
    """The vs_oracle and vs_reference tests of a case used to fail both, with the same leaf:
    now the first comparison that saw it fails, listing every comparison with its numbers and
    bound and the cause once; the other test is skipped, naming it."""
    recorder = made_up_run()
    assert _outcomes(recorder) == {
        f"{BOTH}::vs_oracle": "failed",
        f"{BOTH}::vs_reference": "skipped",
        f"{ONE}::vs_oracle": "passed",
        f"{ONE}::vs_reference": "failed",  # a row failing in one comparison only still fails
    }
    message = _message(recorder, f"{BOTH}::vs_oracle")
    table = [line.split() for line in message.splitlines() if line.split()[:1] == ["out"]]
    assert [(words[2], words[3]) for words in table] == [
        ("vs_oracle", "oracle"),
        ("vs_reference", "reference/unsharded"),
    ]
    assert "cand_oracle_max_err=3.5e-06" in message and "cand_oracle_max_err=2.5e-06" in message
    assert message.count(LOGIC_ERROR) == 1 and message.count("ratio <= 2 or <= 4 ulp (float32)") == 2
    skipped = recorder.getreports("pytest_runtest_logreport")
    reason = next(r for r in skipped if r.nodeid.endswith(f"[{BOTH}::vs_reference]") and r.when == "call").longrepr[2]
    assert f"reported by {BOTH}::vs_oracle" in reason and "out of my_mhc/unsharded" in reason
    assert "h_pre" in _message(recorder, f"{ONE}::vs_reference")


def test_the_first_selected_comparison_reports_the_regression(made_up_run):
    """With only the vs_reference tests selected, the leaf fails there, still naming vs_oracle's rows."""
    recorder = made_up_run("-k", "vs_reference")
    assert _outcomes(recorder) == {f"{BOTH}::vs_reference": "failed", f"{ONE}::vs_reference": "failed"}
    message = _message(recorder, f"{BOTH}::vs_reference")
    assert "vs_oracle" in message and "cand_oracle_max_err=3.5e-06" in message and message.count(LOGIC_ERROR) == 1


def test_a_passing_session_shows_every_comparison_as_its_own_test(pytester, monkeypatch):
    run = _inner_run(pytester, monkeypatch, {BOTH: _case_rows(BOTH, {}), ONE: _case_rows(ONE, {})})
    recorder = run()
    assert _outcomes(recorder) == {f"{c}::{k}": "passed" for c in (BOTH, ONE) for k in ("vs_oracle", "vs_reference")}


def test_every_implementation_of_a_factory_of_several_is_judged(pytester, monkeypatch):
    """A factory that gives two implementations (`mhc_parity.maxtext_parity:fixed` gives three): the
    second's failing row fails its test, as the first's would (only the first's were judged)."""
    rows = {BOTH: _case_rows(BOTH, {}) + _case_rows(BOTH, {("out", "vs_oracle"): (3.0, LOGIC_ERROR, "x")}, "second")}
    recorder = _inner_run(pytester, monkeypatch, rows, names=(IMPL, "second"))()
    assert _outcomes(recorder) == {f"{BOTH}::vs_oracle": "failed", f"{BOTH}::vs_reference": "passed"}
    assert re.search(r"out +second/unsharded +vs_oracle +oracle +fail", _message(recorder, f"{BOTH}::vs_oracle"))


def test_a_baseline_of_a_factory_of_several_is_a_usage_error(tmp_path):
    """A baseline file holds one implementation's rows: gating or writing one for a factory of
    several stops the session before any test, naming them."""
    prepared = _Prepared({BOTH: _case_rows(BOTH, {})}, (IMPL, "second"))
    impl = {"--parity-impl": "pkg.k:both"}
    gated, update = {**impl, "--parity-baseline": str(tmp_path / "b.csv")}, {**impl, UPDATE_OPTION: True}
    for config in (_config(gated, rootpath=tmp_path), _config(update, rootpath=tmp_path)):
        session = ParitySession(config)
        session._prepared = prepared
        with pytest.raises(pytest.UsageError, match=rf"pkg.k:both gives 2 \({IMPL}, second\): name a factory of one"):
            session.settle_baseline(tmp_path)


# What the inner project's conftest.py saw of the XLA flags when it was imported (as
# MaxText's tests/conftest.py starts JAX's backend there); the plugin's recorder sets it.
FLAGS_SEEN = "PARITY_TEST_FLAGS_SEEN"
CONFTEST = f"import os\nos.environ[{FLAGS_SEEN!r} + '_AT_CONFTEST'] = os.environ.get({FLAGS_SEEN!r}, 'unset')\n"


def test_the_xla_flags_are_set_before_the_repository_s_conftest_is_imported(pytester, monkeypatch):
    """On: set by `pytest_load_initial_conftests`, before a conftest that would start JAX's
    backend. Off (no implementation): never set, in any hook."""
    monkeypatch.setattr(pytest_plugin, "ensure_host_devices", lambda: os.environ.__setitem__(FLAGS_SEEN, "set"))
    for ini, seen in (f"parity_impl = {IMPL}.kernel:factory", "set"), ("", "unset"):
        monkeypatch.delenv(FLAGS_SEEN, raising=False)
        pytester.makeini(f"[pytest]\n{ini}\n")
        pytester.makeconftest(CONFTEST)
        pytester.makepyfile(test_nothing="def test_nothing():\n    pass\n")
        monkeypatch.setattr(ParitySession, "prepared", property(lambda session: _Prepared({})))
        pytester.inline_run("-p", "no:cacheprovider", "-p", "no:xdist")
        assert os.environ.pop(FLAGS_SEEN + "_AT_CONFTEST") == seen
        assert os.environ.get(FLAGS_SEEN, "unset") == seen


def test_without_pytest_xdist_its_mark_is_declared_for_strict_markers(tmp_path):
    """The parity tests carry pytest-xdist's `xdist_group` mark: a repository with
    --strict-markers (MaxText's) and no pytest-xdist collects them all the same. A pytest of
    its own (in this process, `pytest.mark` remembers the marks this session declared)."""
    (tmp_path / "pytest.ini").write_text("[pytest]\nparity_impl = tests.external_impls:good\nparity_dtype = f32\n")
    (tmp_path / "test_parity.py").write_text("def test_parity(parity_check):\n    parity_check.check()\n")
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "PYTEST_ADDOPTS", "PYTEST_XDIST_WORKER")}
    env["PYTHONPATH"] = str(ROOT)  # this checkout's plugin and its tests.external_impls
    words = ["-p", "no:cacheprovider", "-p", "no:xdist", "--strict-markers", "--collect-only", "-q"]
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", *words], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert re.search(r"^\d+ tests collected", proc.stdout, flags=re.M), proc.stdout[-3000:]


def test_a_test_module_that_imports_nothing_calls_the_check_it_is_given(pytester, monkeypatch):
    """`parity_check.check()` is `check_parity(parity_check)`: a failing row fails the test."""
    run = _inner_run(pytester, monkeypatch, {BOTH: _case_rows(BOTH, {("out", "vs_oracle"): (3.0, LOGIC_ERROR, "x")})})
    pytester.makepyfile(test_parity="def test_parity(parity_check):\n    parity_check.check()\n")
    assert _outcomes(run()) == {f"{BOTH}::vs_oracle": "failed", f"{BOTH}::vs_reference": "passed"}


def _grown(rows: list[dict], leaf: str, factor: float) -> list[dict]:
    """`rows` with `leaf`'s error against the oracle `factor` times larger, in every comparison (still passing)."""
    grown = lambda r: {k: r[k] * factor for k in ("cand_oracle_max_err", "cand_oracle_rms_err")}  # noqa: E731
    return [{**r, **grown(r)} if r["leaf"] == leaf else r for r in rows]


def test_a_gate_regression_seen_in_two_comparisons_is_one_failure(pytester, monkeypatch, tmp_path):
    """A leaf grown 3x against the oracle is the same number on its vs_oracle and
    vs_reference rows: one failure, its gate table naming both comparisons."""
    from mhc_parity.reports.gate.baseline_file import write_baseline

    committed = [{**r, "cand_oracle_max_err": 1e-5, "cand_oracle_rms_err": 3e-6} for r in _case_rows(BOTH, {})]
    write_baseline(committed, tmp_path / "b.csv", policy_hash="p1", implementation=IMPL)
    run = _inner_run(
        pytester, monkeypatch, {BOTH: _grown(committed, "out", 3.0)}, f"parity_baseline = {tmp_path / 'b.csv'}\n"
    )
    recorder = run()
    assert _outcomes(recorder) == {f"{BOTH}::vs_oracle": "failed", f"{BOTH}::vs_reference": "skipped"}
    message = _message(recorder, f"{BOTH}::vs_oracle")
    assert "failing row" not in message  # every row is inside its bound
    assert re.search(
        rf"{BOTH}::vs_oracle: gate FAIL against \S+: leaf out \({IMPL}/unsharded vs oracle\) grew x3", message
    )
    assert "1 regression, seen by vs_oracle and vs_reference (growth factor x2" in message
    table = [line.split()[:5] for line in message.splitlines() if line.split()[:1] == ["regression"]]
    assert table == [
        ["regression", "out", f"{IMPL}/unsharded", "vs_oracle", "oracle"],
        ["regression", "out", f"{IMPL}/unsharded", "vs_reference", "reference/unsharded"],
    ]


def _row(candidate: str, partner: str, comparison: str, leaf: str = "out", **fields) -> dict:
    return measured_row(BOTH, candidate, partner, comparison, leaf, "output", "float32", 1.0, **fields)


def test_a_regression_is_one_leaf_of_one_path_in_every_comparison_that_saw_it():
    """A sharded path's `out` failing against the oracle, the reference and its unsharded run
    is one regression; its error rows (leaf `*`) another; a leaf that fails once is its own."""
    from mhc_parity.harness.plugin.regressions import find_regressions

    sharded, unsharded = f"{IMPL}/sharded(data=2,fsdp=4)", f"{IMPL}/unsharded"
    error = {"verdict": "error", "reason": "ValueError: boom"}
    rows = [
        _row(sharded, f"{IMPL}/unsharded", "vs_unsharded", verdict="fail"),
        _row(sharded, "reference/sharded(data=2,fsdp=4)", "vs_reference", verdict="fail"),
        _row(sharded, "oracle", "vs_oracle", verdict="fail"),
        _row(sharded, "oracle", "vs_oracle", leaf="d_x"),
        _row(unsharded, "oracle", "vs_oracle", leaf="*", **error),
        _row(unsharded, "reference/unsharded", "vs_reference", leaf="*", **error),
        _row(unsharded, "oracle", "vs_oracle", leaf="h_pre", verdict="fail"),
    ]
    found = find_regressions(rows)
    assert [(g.candidate, g.leaf, g.comparisons) for g in found] == [
        (sharded, "out", ("vs_oracle", "vs_reference", "vs_unsharded")),
        (unsharded, "*", ("vs_oracle", "vs_reference")),
        (unsharded, "h_pre", ("vs_oracle",)),
    ]
    assert [r["comparison"] for r in found[0].rows] == ["vs_oracle", "vs_reference", "vs_unsharded"]
    # The first selected comparison that saw it reports it; none when none of them is selected.
    assert found[0].reporter({"vs_reference", "vs_unsharded"}) == "vs_reference"
    assert found[0].reporter({"lowering"}) is None


def test_a_path_within_its_model_failing_against_a_broken_partner_is_the_partners_regression():
    """The kernel holds its bound against the oracle, the reference does not: the kernel's
    failing row against the reference (cause `within_model`) is the reference's regression.
    Where the partner holds its own bound, the row is a regression of its own."""
    from mhc_parity.harness.engine.causes import WITHIN_MODEL_ID
    from mhc_parity.harness.plugin import regressions

    assert regressions.WITHIN_MODEL_ID == WITHIN_MODEL_ID  # the plugin's copy of the engine's name
    within = {"verdict": "fail", "cause_id": WITHIN_MODEL_ID}
    rows = [
        _row("reference/unsharded", "oracle", "vs_oracle", verdict="fail", cause_id="unexplained"),
        _row("interpret/unsharded", "oracle", "vs_oracle"),
        _row("interpret/unsharded", "reference/unsharded", "vs_reference", **within),
        _row("interpret/unsharded", "reference/unsharded", "vs_reference", leaf="d_x", **within),
    ]
    found = regressions.find_regressions(rows)
    assert [(g.candidate, g.leaf, g.comparisons, len(g.rows)) for g in found] == [
        ("reference/unsharded", "out", ("vs_oracle", "vs_reference"), 2),
        ("interpret/unsharded", "d_x", ("vs_reference",), 1),
    ]


def _project(pytester, ini: str) -> pathlib.Path:
    """An inner project in a folder of its own (`project`), its pytest.ini holding `ini`."""
    project = pytester.mkdir("project")
    (project / "pytest.ini").write_text(f"[pytest]\n{ini}\n")
    (project / "test_parity.py").write_text("def test_parity(parity_check):\n    parity_check.check()\n")
    return project


def test_a_parity_option_value_taken_for_a_test_path_is_a_usage_error(pytester, monkeypatch):
    """pytest chooses its rootdir and configuration file before it loads plugins, so the value
    of `--parity-baseline PATH` (a separate word naming a file outside the project) counted as a
    test path there: the rootdir moved, the project's parity_impl was never read and the session
    skipped its one test (exit 0). It is a usage error naming the `=` form, which gates."""
    monkeypatch.setattr(ParitySession, "prepared", property(lambda session: _Prepared({BOTH: _case_rows(BOTH, {})})))
    settled = []
    monkeypatch.setattr(ParitySession, "settle_baseline", lambda session, root: settled.append(session.baseline))
    project = _project(pytester, f"parity_impl = {IMPL}.kernel:factory")
    baseline = pytester.path / "b.csv"
    baseline.write_text("made up\n")
    monkeypatch.chdir(project)
    words = ("-p", "no:cacheprovider", "-p", "no:xdist")
    for value in ("../b.csv", str(baseline)):
        result = pytester.runpytest_inprocess(*words, "--parity-baseline", value)
        assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str()[-2000:]
        (line,) = [line for line in result.stderr.lines if line.strip()]
        assert line.startswith("ERROR: mhc-parity: pytest took the value of --parity-baseline"), line
        assert line.endswith(f"write --parity-baseline={value}"), line
        assert str(project / "pytest.ini") in line
    result = pytester.runpytest_inprocess(*words, "--parity-baseline=../b.csv")
    result.assert_outcomes(passed=2)  # the project's configuration read: one case x two comparisons
    assert settled == ["../b.csv"]


def test_a_parity_option_without_an_implementation_to_check_is_a_usage_error(pytester, monkeypatch):
    """Each `--parity-*` option given to a session that checks nothing stops pytest (exit 4)
    naming it, instead of a skipped test and exit 0."""
    monkeypatch.chdir(_project(pytester, ""))
    for option in ("--parity-suite=smoke", "--parity-baseline=b.csv", "--parity-report=out", UPDATE_OPTION):
        result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-p", "no:xdist", option)
        assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str()[-2000:]
        name = option.partition("=")[0]
        assert f"ERROR: mhc-parity: {name}: no implementation to check" in result.stderr.str()
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-p", "no:xdist", "-rs")
    result.assert_outcomes(skipped=1)  # nothing asked: the plugin stays off
