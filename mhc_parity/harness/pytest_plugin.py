"""pytest plugin: the parity matrix as parametrised tests, one per case x comparison, each
also gated against the implementation's committed baseline.

Installed as the `pytest11` entry point `mhc_parity.harness.pytest_plugin` of the `mhc-parity`
distribution (pyproject.toml), so any repository whose environment has mhc-parity
installed gets it; it is named like its module, so a `pytest_plugins =
["mhc_parity.harness.pytest_plugin"]` line (this repo's conftest.py, or a run with plugin autoload
off) never registers it twice. It does nothing unless asked:

    pytest --parity-impl my_pkg.kernels:factory [--parity-suite smoke] [--parity-dtype bf16]
           [--parity-report=DIR] [--parity-baseline=FILE] [--parity-update-baseline]
           [--parity-allow-legacy-baseline]

(a value after "=": pytest chooses its rootdir before it loads plugins, and a value written as
a separate word that moved it is a usage error, `refuse_value_taken_as_path`; so is any
`--parity-*` option of a session with no implementation to check)

(each but --parity-update-baseline also an ini option: `parity_impl`, `parity_suite`,
..., `parity_allow_legacy_baseline = true` in `[tool.pytest.ini_options]`, paths
relative to the ini file's folder; the command line wins). This repository sets
`parity_builtin = true` instead: the built-in paths, as `mhc-parity run` without `--impl`.
A test that asks for the `parity_check` fixture is parametrised over the cases of the
suite (default: $MHC_PARITY_SUITE, else `smoke`) and the comparisons each case makes;
test ids are `<case name>::<comparison>`, so `pytest -k bf16` or `-k vs_unsharded`
select as expected, and pytest-xdist's `--dist loadscope` keeps a case's tests on one
worker (the scope of a test id ends at its last "::"). The test's body is
`check_parity(parity_check)`, or `parity_check.check()`, which imports nothing. With an
implementation, a test judges that implementation's rows (`<name>/...` candidates; each
implementation's, when the factory gives several, which then cannot have a baseline); the
reference runs as its `vs_reference` partner. Each case runs once per process, through
`mhc_parity.harness.api.PreparedRun` (the engine of `mhc-parity run`). When the plugin is on it sets the
XLA flags (`mhc_parity.harness.env.ensure_host_devices`) before the repository's conftest.py files are
imported, which may start JAX's backend.

One regression is one failure: a leaf of a path that fails in several comparisons (against
the oracle and against the reference, say; `mhc_parity.harness.plugin.regressions`) fails the test of
the first of them the session selected, whose message lists every comparison that saw the
leaf with its numbers and bound, and its cause once; another test that saw nothing else
is skipped, naming that test, and the summary counts those skips.

The baseline loop (as pytest-regressions' `--force-regen` or syrupy's `--snapshot-update`):

- `pytest --parity-update-baseline` writes the baseline (the `parity_baseline` file;
  without one, `baselines/<name>.csv` in the ini file's folder, the path
  `mhc_parity.harness.api.ParityRun.write_baseline` uses; the built-in paths need one named) from the
  rows of the session, and says in its summary what changed against the old file:
  created, up to date, or rows added / removed / changed, a few named. Rows of the cases
  the session ran replace theirs; when it ran only some of its cases (`-k`, a test path),
  the old file's rows of the others are kept, unless the old file could not judge this run
  (see below: it is then replaced whole, and the summary says why). The session is not
  gated; its tests still judge their rows, so failing rows fail them, and the baseline is
  written anyway with a warning (as `mhc-parity baseline` does: the gate fails on those rows
  until they pass). Nothing is written after an interruption. Under pytest-xdist the
  controller writes it once, from the rows its workers sent.
- With a `parity_baseline`, every parity test also gates its rows (its case and
  comparison) against the baseline's rows of that case, by the rules of `mhc_parity.reports.gate`
  (as `mhc-parity gate --only-current-cases`: baseline rows of cases the session did not run
  are not judged; a test of a case the baseline has no row of is not gated, and the
  summary counts it so, with the command that adds its rows). A finding fails the test
  that reports its leaf (as above); its message names the leaf and, for a regression, the
  growth and the allowed factor.
  The summary counts the tests and rows gated. The verdict is pytest's own: the session
  never fails after its tests passed, except when its report folder or baseline cannot
  be written at the end (counted as an "mhc-parity error" in pytest's summary line).
- A configured baseline that does not exist, cannot be read, or cannot judge the run
  (another implementation's, another tolerance policy's or matmul precision's:
  `mhc_parity.reports.comparability`) stops pytest before any test with a one-line usage error
  naming the command that writes it. So does a baseline in a legacy format, whose header
  or rows no digest covers (`mhc_parity.reports.baseline`), unless `--parity-allow-legacy-baseline`
  lets it judge the session: the summary then says what went unverified. An update never
  keeps a legacy file's rows: it replaces the file whole.

With `--parity-report DIR` the session writes the run folder `mhc-parity run --out DIR`
writes (manifest, rows, CSV, JSON, HTML, Markdown) for the cases it ran; under
pytest-xdist each worker sends its rows to the controller when it finishes, and the
controller writes the folder (and the updated baseline) once.
"""

from __future__ import annotations

import pytest

from mhc_parity.harness.env import ensure_host_devices
from mhc_parity.harness.errors import ConfigurationError, checked_settings
from mhc_parity.harness.plugin.checks import ParityCheck, check_params, check_parity, leaf_table
from mhc_parity.harness.plugin.options import (
    LEGACY_INI,
    LEGACY_OPTION,
    UPDATE_OPTION,
    add_options,
    enabled,
    enabled_early,
    refuse_options_without_implementation,
    refuse_value_taken_as_path,
    update_command,
)
from mhc_parity.harness.plugin.session import ParitySession
from mhc_parity.jax_support import UnsupportedJaxError

# What tests, docs and users' test modules import from here (the entry point).
__all__ = [
    "LEGACY_INI",
    "LEGACY_OPTION",
    "UPDATE_OPTION",
    "ParityCheck",
    "ParitySession",
    "check_parity",
    "leaf_table",
    "update_command",
]

# Key of the rows a pytest-xdist worker sends its controller (`config.workeroutput`).
WORKER_ROWS_KEY = "mhc_parity_rows"
# Key of a parity test's gate counts in its report's user_properties (they travel to an xdist controller).
GATE_PROPERTY = "mhc_parity_gate"
# Key of the mark, in a parity test's report, that it was skipped for regressions another test reports.
ELSEWHERE_PROPERTY = "mhc_parity_reported_elsewhere"
# The key of pytest's summary-line count of what failed at the end of the session (a write).
SESSION_ERROR_STAT = "mhc-parity error"
STATE = pytest.StashKey[ParitySession]()


def _set_up_process(config) -> None:
    """The `MHC_PARITY_*` settings checked, then `ensure_host_devices`; a refused setting or an
    unsupported JAX a usage error (one line, no traceback)."""
    try:
        for note in checked_settings():
            config.issue_config_time_warning(pytest.PytestConfigWarning(f"mhc-parity: {note}"), stacklevel=2)
        ensure_host_devices()
    except (UnsupportedJaxError, ConfigurationError) as exc:
        raise pytest.UsageError(f"mhc-parity: {exc}") from None


def pytest_addoption(parser):
    add_options(parser)


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config, parser, args):
    """The XLA flags, when the plugin is on, before the repository's conftest.py files are
    imported: a conftest that starts JAX's backend at import (MaxText's tests/conftest.py asks
    `jax.devices()` whether a TPU is there) would otherwise leave XLA without them, and
    `pytest_configure` could then only refuse the session. An installed plugin that is off
    sets nothing: the flags change how every program of the process computes. First, a
    `--parity-<name> VALUE` whose value pytest took for a test path when it chose its
    configuration file is refused (`refuse_value_taken_as_path`)."""
    refuse_value_taken_as_path(early_config, parser)
    if enabled_early(early_config):
        _set_up_process(early_config)


def pytest_configure(config):
    if not enabled(config):
        refuse_options_without_implementation(config)  # a --parity-* option of a session that checks nothing
        return
    _set_up_process(config)
    session = ParitySession(config)
    if session.implementation or session.baseline or session.update:
        _ = session.prepared  # a bad --parity-impl is a usage error before collection
    session.settle_baseline(config.rootpath)
    session.settle_report()
    config.stash[STATE] = session
    config.addinivalue_line("markers", "sharded: runs token-sharded on the 8 simulated host devices")
    if not config.pluginmanager.hasplugin("xdist"):
        # The parity tests carry xdist_group marks (`check_params`); without pytest-xdist nobody
        # declares that mark, and a repository's --strict-markers (MaxText's pytest.ini) would
        # make each of them a collection error.
        config.addinivalue_line("markers", "xdist_group(name): the parity tests of one case (pytest-xdist's mark)")
    config.pluginmanager.register(_ReportTally(session), "mhc-parity-gate-tally")
    if config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(_XdistRows(session), "mhc-parity-xdist-rows")


class _ReportTally:
    """Sums what the parity tests' reports carry (an xdist controller gets its workers'):
    their gate counts, and whether they were skipped for another test's regressions."""

    def __init__(self, session: ParitySession):
        self.session = session

    def pytest_runtest_logreport(self, report):
        if report.when != "call":
            return
        for name, value in report.user_properties:
            if name == GATE_PROPERTY:
                self.session.tally.add(value)
            elif name == ELSEWHERE_PROPERTY:
                self.session.skipped_for_others += 1


class _XdistRows:
    """Under pytest-xdist: each worker's rows travel to the controller when it finishes."""

    def __init__(self, session: ParitySession):
        self.session = session

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node, error):
        payload = getattr(node, "workeroutput", {}).get(WORKER_ROWS_KEY)
        if payload:
            self.session.add_worker_rows(payload)


def _is_worker(config) -> bool:
    return hasattr(config, "workerinput")


def _check_of(item) -> ParityCheck | None:
    check = getattr(getattr(item, "callspec", None), "params", {}).get("parity_check")
    return check if isinstance(check, ParityCheck) else None


def pytest_collection_finish(session):
    """Note the parity tests selected, once collection (`-k`, `--lf`, node ids) has chosen them."""
    state = session.config.stash.get(STATE, None)
    if state is not None:
        checks = [check for check in map(_check_of, session.items) if check is not None]
        state.select((check.case.name, check.comparison) for check in checks)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """What a parity test counted goes into its report (to the xdist controller with it)."""
    check = _check_of(item)
    if call.when == "call" and check is not None:
        counts = check.session.gate_counts.pop(check.id, None)
        if counts is not None:
            item.user_properties.append((GATE_PROPERTY, counts))
        if check.id in check.session.reported_elsewhere:
            check.session.reported_elsewhere.discard(check.id)
            item.user_properties.append((ELSEWHERE_PROPERTY, 1))
    return (yield)


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session, exitstatus):
    state = session.config.stash.get(STATE, None)
    if state is None:
        return
    if _is_worker(session.config):
        session.config.workeroutput[WORKER_ROWS_KEY] = state.worker_payload()
        return
    state.errors = state.finish(interrupted=exitstatus == pytest.ExitCode.INTERRUPTED)
    if state.errors:  # a write at the end failed: pytest's summary line counts it, so it agrees with the exit code
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.stats.setdefault(SESSION_ERROR_STAT, []).extend(state.errors)
        if session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    state = config.stash.get(STATE, None)
    lines = state.summary() if state is not None else []
    if not lines:
        return
    terminalreporter.section("mhc-parity")
    for line in lines:
        terminalreporter.write_line(line)


def pytest_generate_tests(metafunc):
    if "parity_check" not in metafunc.fixturenames:
        return
    state = metafunc.config.stash.get(STATE, None)
    if state is None:
        reason = (
            "mhc-parity: no implementation to check; pass --parity-impl MODULE:FACTORY "
            "(or set parity_impl in the pytest configuration)"
        )
        metafunc.parametrize("parity_check", [pytest.param(None, id="off", marks=pytest.mark.skip(reason=reason))])
        return
    metafunc.parametrize("parity_check", check_params(state))
