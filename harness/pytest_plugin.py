"""pytest plugin: the parity matrix as parametrised tests, one per case x comparison.

Installed as the `pytest11` entry point `harness.pytest_plugin` of the `mhc-parity`
distribution (pyproject.toml), so any repository whose environment has mhc-parity
installed gets it; it is named like its module, so a `pytest_plugins =
["harness.pytest_plugin"]` line (this repo's conftest.py, or a run with plugin autoload
off) never registers it twice. It does nothing unless asked:

    pytest --parity-impl my_pkg.kernels:factory [--parity-suite smoke] [--parity-dtype bf16]
           [--parity-report DIR] [--parity-baseline FILE]

(each also an ini option: `parity_impl`, `parity_suite`, ... in `[tool.pytest.ini_options]`;
the command line wins). This repository sets `parity_builtin = true` instead: the
built-in paths, as `harness run` without `--impl`. A test that asks for the
`parity_check` fixture is parametrised over the cases of the suite (default:
$MHC_PARITY_SUITE, else `smoke`) and the comparisons each case makes; test ids are
`<case name>::<comparison>`, so `pytest -k bf16` or `-k vs_unsharded` select as
expected, and pytest-xdist's `--dist loadscope` keeps a case's tests on one worker (the
scope of a test id ends at its last "::"). A failing test prints the leaf table. With an
implementation, a test judges that implementation's rows (`<name>/...` candidates); the
reference runs as its `vs_reference` partner.

Each case runs once per process, through `harness.api.PreparedRun` (the engine of
`harness run`). With `--parity-report DIR` the session writes the run folder `harness
run --out DIR` writes (manifest, rows, CSV, JSON, HTML, Markdown) for the cases it
ran; under pytest-xdist each worker sends its rows to the controller when it finishes,
and the controller writes the folder once. With `--parity-baseline FILE` the session
then gates those rows (`harness.api.gate`; only the cases it ran) and fails if the gate
does, printing the gate's table.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
from typing import TYPE_CHECKING

import pytest

from harness.env import ensure_host_devices
from records.rows import parse_float
from records.schema import FLOAT_COLUMNS, OK_VERDICTS
from reports.terminal import rows_table
from reports.writers import json_ready

if TYPE_CHECKING:
    from harness.api import PreparedRun

DEFAULT_SUITE = "smoke"
# Key of the rows a pytest-xdist worker sends its controller (`config.workeroutput`).
WORKER_ROWS_KEY = "mhc_parity_rows"
OPTIONS = {  # name: help; each is `--parity-<name>` on the command line and `parity_<name>` in the ini file
    "impl": "MODULE:FACTORY of the implementation whose parity the parity_check tests check",
    "suite": "case suite the parity-matrix tests run (default: $MHC_PARITY_SUITE or smoke)",
    "dtype": "keep the cases of this activation dtype only: float32|bfloat16 (f32, bf16)",
    "report": "write the run folder (manifest, rows, CSV/JSON/HTML/Markdown reports) here",
    "baseline": "gate the session's rows against this baseline; the session fails if the gate does",
}
STATE = pytest.StashKey["ParitySession"]()


@dataclasses.dataclass(frozen=True)
class ParityCheck:
    """One parametrised test: a case and one comparison kind (of the session that runs it)."""

    case: object
    comparison: str
    session: ParitySession = dataclasses.field(compare=False, repr=False)

    @property
    def id(self) -> str:
        return f"{self.case.name}::{self.comparison}"


def pytest_addoption(parser):
    group = parser.getgroup("mhc-parity", "numerical parity of an mHC implementation (mhc-parity)")
    for name, help_text in OPTIONS.items():
        group.addoption(f"--parity-{name}", default=None, help=help_text)
        parser.addini(f"parity_{name}", help=help_text, default=None)
    parser.addini(
        "parity_builtin",
        type="bool",
        default=False,
        help="without parity_impl, run the matrix over mhc-parity's own paths (its own test suite)",
    )


def _setting(config, name: str) -> str | None:
    """`--parity-<name>`, else the ini's `parity_<name>` (paths relative to the ini file's folder)."""
    value = config.getoption(f"--parity-{name}")
    if value:
        return value
    value = config.getini(f"parity_{name}")
    if value and name in ("report", "baseline"):
        return str(config.rootpath / value)
    return value or None


class ParitySession:
    """What one pytest process knows of the parity run: its configuration, and the rows of
    the cases it ran (or, on an xdist controller, the rows its workers sent)."""

    def __init__(self, config):
        self.implementation = _setting(config, "impl")
        self.suite = _setting(config, "suite") or os.environ.get("MHC_PARITY_SUITE") or DEFAULT_SUITE
        self.dtype = _setting(config, "dtype")
        self.report = _setting(config, "report")
        self.baseline = _setting(config, "baseline")
        self._prepared: PreparedRun | None = None
        self.rows_by_case: dict[str, list[dict]] = {}
        self.report_paths: dict[str, pathlib.Path] = {}
        self.gate_text = ""

    @property
    def prepared(self) -> PreparedRun:
        """The checked run configuration (prepared on first use; ParityError as a usage error)."""
        if self._prepared is None:
            # Here, not at the top: an installed plugin that is off loads no JAX into a pytest run.
            from harness.api import ParityError, prepare

            try:
                self._prepared = prepare(self.implementation, suite=self.suite, dtype=self.dtype)
            except ParityError as exc:
                raise pytest.UsageError(f"mhc-parity: {exc}") from None
        return self._prepared

    @property
    def external(self) -> str | None:
        """The name of the implementation under test (None: the built-in paths)."""
        names = self.prepared.implementation_names
        return names[0] if names else None

    def case_rows(self, case) -> list[dict]:
        """Every row of one case (computed once per process)."""
        if case.name not in self.rows_by_case:
            self.rows_by_case[case.name] = self.prepared.run_case(case)
        return self.rows_by_case[case.name]

    def comparisons_for(self, case) -> tuple[str, ...]:
        """The comparisons a case's rows can contain in this run."""
        kinds = ["vs_oracle", "vs_reference"]
        if case.mesh is not None:
            kinds.append("vs_unsharded")
        if self.prepared.plan.lowering:
            kinds.append("lowering")
        return tuple(kinds)

    def add_worker_rows(self, payload: str) -> None:
        """Rows a worker sent (JSON); a case computed by two workers keeps the first's rows."""
        for case, rows in json.loads(payload).items():
            decoded = [{k: parse_float(v) if k in FLOAT_COLUMNS else v for k, v in row.items()} for row in rows]
            self.rows_by_case.setdefault(case, decoded)

    def worker_payload(self) -> str:
        return json.dumps(json_ready(self.rows_by_case))

    def finish(self) -> bool:
        """Write the report folder and gate, as asked, from the rows of the cases run; False
        if the gate failed or could not judge the rows."""
        if not self.rows_by_case or not (self.report or self.baseline):
            return True
        from harness.api import ParityError, gate  # loaded already: `prepared` imported it

        cases = [c for c in self.prepared.cases if c.name in self.rows_by_case]
        run = self.prepared.result([r for c in cases for r in self.rows_by_case[c.name]], cases=cases)
        try:
            if self.report:
                self.report_paths = run.write_reports(self.report)
            if self.baseline:
                partial = len(cases) < len(self.prepared.cases)
                result = gate(run, self.baseline, only_current_cases=partial)
                self.gate_text = result.table()
                return result.ok
        except ParityError as exc:
            self.gate_text = f"mhc-parity: error: {exc}"
            return False
        return True


def _enabled(config) -> bool:
    return bool(_setting(config, "impl") or config.getini("parity_builtin"))


def pytest_configure(config):
    if not _enabled(config):
        return
    ensure_host_devices()
    session = ParitySession(config)
    config.stash[STATE] = session
    if session.implementation:
        _ = session.prepared  # a bad --parity-impl is a usage error before collection
    config.addinivalue_line("markers", "sharded: runs token-sharded on the 8 simulated host devices")
    if config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(_XdistRows(session), "mhc-parity-xdist-rows")


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


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session, exitstatus):
    state = session.config.stash.get(STATE, None)
    if state is None:
        return
    if _is_worker(session.config):
        session.config.workeroutput[WORKER_ROWS_KEY] = state.worker_payload()
        return
    if not state.finish():
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    state = config.stash.get(STATE, None)
    if state is None or not (state.report_paths or state.gate_text):
        return
    terminalreporter.section("mhc-parity")
    for fmt, path in state.report_paths.items():
        terminalreporter.write_line(f"{fmt:>8}: {path}")
    if state.gate_text:
        terminalreporter.write_line(state.gate_text)


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
    params = []
    for case in state.prepared.cases:
        marks = [pytest.mark.xdist_group(case.name)]
        if case.mesh is not None:
            marks.append(pytest.mark.sharded)
        for comparison in state.comparisons_for(case):
            check = ParityCheck(case, comparison, state)
            params.append(pytest.param(check, id=check.id, marks=marks))
    metafunc.parametrize("parity_check", params)


def leaf_table(rows) -> str:
    """A plain-text table of rows for a failure message (nothing cut)."""
    return rows_table(rows, limit=None)


def check_parity(check: ParityCheck) -> None:
    """Assert that every row of the check passed or is an explained skip/unsupported."""
    session = check.session
    rows = [r for r in session.case_rows(check.case) if r["comparison"] == check.comparison]
    if session.external:
        rows = [r for r in rows if r["candidate"].startswith(f"{session.external}/")]
    if not rows:
        pytest.skip(f"{check.case.name} makes no {check.comparison} comparison on this machine")
    bad = [r for r in rows if r["verdict"] not in OK_VERDICTS]
    if bad:
        pytest.fail(f"{len(bad)} of {len(rows)} rows of {check.id} failed:\n{leaf_table(bad)}", pytrace=False)
    if all(r["verdict"] == "skip" for r in rows):
        pytest.skip("; ".join(sorted({r["reason"] for r in rows}))[:300])
