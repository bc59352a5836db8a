"""pytest plugin (the `pytest11` entry point): the parity matrix as parametrised tests, one per case x
comparison, each also gated against the implementation's committed baseline.

Off unless an implementation is given (`--parity-impl`, ini `parity_impl`, or `parity_builtin`). The hooks
only; their parts are in `mhc_parity.harness.plugin`. docs/external-implementations.md describes the
options, the baseline loop and how one regression is one failure.
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

# Keys of: a worker's rows (`config.workeroutput`), a test's gate counts and its skip for another
# test's regressions (report user_properties), and pytest's summary-line count of failed writes.
WORKER_ROWS_KEY = "mhc_parity_rows"
GATE_PROPERTY = "mhc_parity_gate"
ELSEWHERE_PROPERTY = "mhc_parity_reported_elsewhere"
SESSION_ERROR_STAT = "mhc-parity error"
STATE = pytest.StashKey[ParitySession]()


def _set_up_process(config) -> None:
    """`checked_settings`, then `ensure_host_devices`; a refused setting or an unsupported JAX is a usage
    error."""
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
    """The XLA flags, when the plugin is on, before the repository's conftest.py files are imported: one may
    start JAX's backend (MaxText's asks `jax.devices()`), leaving XLA without them. An installed plugin that
    is off sets nothing."""
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
    """Sums what the parity tests' reports carry (an xdist controller gets its workers'): gate counts and
    skips for another test's regressions."""

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
