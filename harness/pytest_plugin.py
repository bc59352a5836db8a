"""pytest plugin: the parity matrix as parametrised tests, one per case x comparison, each
also gated against the implementation's committed baseline.

Installed as the `pytest11` entry point `harness.pytest_plugin` of the `mhc-parity`
distribution (pyproject.toml), so any repository whose environment has mhc-parity
installed gets it; it is named like its module, so a `pytest_plugins =
["harness.pytest_plugin"]` line (this repo's conftest.py, or a run with plugin autoload
off) never registers it twice. It does nothing unless asked:

    pytest --parity-impl my_pkg.kernels:factory [--parity-suite smoke] [--parity-dtype bf16]
           [--parity-report DIR] [--parity-baseline FILE] [--parity-update-baseline]
           [--parity-allow-legacy-baseline]

(each but --parity-update-baseline also an ini option: `parity_impl`, `parity_suite`,
..., `parity_allow_legacy_baseline = true` in `[tool.pytest.ini_options]`, paths
relative to the ini file's folder; the command line wins). This repository sets
`parity_builtin = true` instead: the built-in paths, as `harness run` without `--impl`.
A test that asks for the `parity_check` fixture is parametrised over the cases of the
suite (default: $MHC_PARITY_SUITE, else `smoke`) and the comparisons each case makes;
test ids are `<case name>::<comparison>`, so `pytest -k bf16` or `-k vs_unsharded`
select as expected, and pytest-xdist's `--dist loadscope` keeps a case's tests on one
worker (the scope of a test id ends at its last "::"). With an implementation, a test
judges that implementation's rows (`<name>/...` candidates); the reference runs as its
`vs_reference` partner. Each case runs once per process, through
`harness.api.PreparedRun` (the engine of `harness run`).

The baseline loop (as pytest-regressions' `--force-regen` or syrupy's `--snapshot-update`):

- `pytest --parity-update-baseline` writes the baseline (the `parity_baseline` file;
  without one, `baselines/<name>.csv` in the ini file's folder, the path
  `harness.api.ParityRun.write_baseline` uses; the built-in paths need one named) from the
  rows of the session, and says in its summary what changed against the old file:
  created, up to date, or rows added / removed / changed, a few named. Rows of the cases
  the session ran replace theirs; when it ran only some of its cases (`-k`, a test path),
  the old file's rows of the others are kept, unless the old file could not judge this run
  (see below: it is then replaced whole, and the summary says why). The session is not
  gated; its tests still judge their rows, so failing rows fail them, and the baseline is
  written anyway with a warning (as `harness baseline` does: the gate fails on those rows
  until they pass). Nothing is written after an interruption. Under pytest-xdist the
  controller writes it once, from the rows its workers sent.
- With a `parity_baseline`, every parity test also gates its rows (its case and
  comparison) against the baseline's rows of that case, by the rules of `reports.gate`
  (as `harness gate --only-current-cases`: baseline rows of cases the session did not run
  are not judged; a test of a case the baseline has no row of is not gated, and the
  summary counts it so, with the command that adds its rows). A finding fails the test;
  its message names the leaf and, for a regression, the growth and the allowed factor.
  The summary counts the tests and rows gated. The verdict is pytest's own: the session
  never fails after its tests passed, except when its report folder or baseline cannot
  be written at the end (counted as an "mhc-parity error" in pytest's summary line).
- A configured baseline that does not exist, cannot be read, or cannot judge the run
  (another implementation's, another tolerance policy's or matmul precision's:
  `reports.comparability`) stops pytest before any test with a one-line usage error
  naming the command that writes it. So does a baseline in a legacy format, whose header
  or rows no digest covers (`reports.baseline`), unless `--parity-allow-legacy-baseline`
  lets it judge the session: the summary then says what went unverified. An update never
  keeps a legacy file's rows: it replaces the file whole.

With `--parity-report DIR` the session writes the run folder `harness run --out DIR`
writes (manifest, rows, CSV, JSON, HTML, Markdown) for the cases it ran; under
pytest-xdist each worker sends its rows to the controller when it finishes, and the
controller writes the folder (and the updated baseline) once.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import shlex
from collections import Counter
from typing import TYPE_CHECKING

import pandas as pd
import pytest

from harness.env import ensure_host_devices
from records.environment import environment_of, run_precision
from records.outputs import OutputPathError, cannot_write, writable_file
from records.rows import ReportInputError, json_ready, parse_float, to_frame
from records.schema import FLOAT_COLUMNS, OK_VERDICTS
from records.text import format_number, format_text_table
from reports.baseline import diff_baselines, render_baseline, write_baseline
from reports.causes import cause_groups
from reports.comparability import precision_refusal
from reports.drift import GATE_COLUMNS, typed_gate_frame
from reports.gate import GateFinding, GateResult, gate_frames
from reports.ownership import default_baseline_path, implementation_rows, ownership_refusal
from reports.sources import LoadedRun, load_baseline_or_run
from reports.terminal import rows_table

if TYPE_CHECKING:
    from harness.api import ParityRun, PreparedRun

DEFAULT_SUITE = "smoke"
# Key of the rows a pytest-xdist worker sends its controller (`config.workeroutput`).
WORKER_ROWS_KEY = "mhc_parity_rows"
# Key of a parity test's gate counts in its report's user_properties (they travel to an xdist controller).
GATE_PROPERTY = "mhc_parity_gate"
# The key of pytest's summary-line count of what failed at the end of the session (a write).
SESSION_ERROR_STAT = "mhc-parity error"
UPDATE_OPTION = "--parity-update-baseline"
# `reports.baseline.LEGACY_OPTION` of the plugin: a flag, and the bool ini option `parity_allow_legacy_baseline`.
LEGACY_OPTION = "--parity-allow-legacy-baseline"
LEGACY_INI = "parity_allow_legacy_baseline"
OPTIONS = {  # name: help; each is `--parity-<name>` on the command line and `parity_<name>` in the ini file
    "impl": "MODULE:FACTORY of the implementation whose parity the parity_check tests check",
    "suite": "case suite the parity-matrix tests run (default: $MHC_PARITY_SUITE or smoke)",
    "dtype": "keep the cases of this activation dtype only: float32|bfloat16 (f32, bf16)",
    "report": "write the run folder (manifest, rows, CSV/JSON/HTML/Markdown reports) here",
    "baseline": f"gate each parity test against this baseline file (which {UPDATE_OPTION} writes)",
}
# A gate finding's category (`reports.gate.FAILING_CATEGORIES`) as a noun: (one, several).
FINDING_NOUNS = {
    "failure": ("failure", "failures"),
    "missing": ("missing row", "missing rows"),
    "baseline_gap": ("baseline gap", "baseline gaps"),
    "lost_coverage": ("lost coverage", "lost coverage"),
    "new_nonfinite": ("new non-finite", "new non-finite"),
    "regression": ("regression", "regressions"),
}
# At most this many rows of each kind (added, removed, changed) are named in an update's summary.
NAMED_CHANGES = 3
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


@dataclasses.dataclass
class GateTally:
    """What the parity tests of a session found gating their rows (summed from their reports)."""

    gated: int = 0  # tests whose case the baseline has rows of
    ungated: int = 0  # tests whose case it has none of
    matched: int = 0  # rows found in both
    failing: int = 0  # failing findings (other than the rows' own failures)
    improvements: int = 0
    new_rows: int = 0

    def add(self, counts) -> None:
        """Add one test's counts (`dataclasses.astuple` of its tally, as its report carries them)."""
        for field, value in zip(dataclasses.fields(self), counts):
            setattr(self, field.name, getattr(self, field.name) + int(value))


def pytest_addoption(parser):
    group = parser.getgroup("mhc-parity", "numerical parity of an mHC implementation (mhc-parity)")
    for name, help_text in OPTIONS.items():
        group.addoption(f"--parity-{name}", default=None, help=help_text)
        parser.addini(f"parity_{name}", help=help_text, default=None)
    group.addoption(
        UPDATE_OPTION,
        action="store_true",
        default=False,
        help="write the baseline (parity_baseline, else baselines/<name>.csv) from this run's rows instead of gating",
    )
    group.addoption(
        LEGACY_OPTION,
        action="store_true",
        default=False,
        help="let a baseline in a legacy format (whose header or rows no digest covers) judge the session",
    )
    parser.addini(
        LEGACY_INI,
        type="bool",
        default=False,
        help="as --parity-allow-legacy-baseline: let a legacy-format baseline judge the session",
    )
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


def _ini_overrides(args) -> list[str]:
    """The `-o parity_...=VALUE` arguments of a pytest command line, as `-o` pairs."""
    found, args, index = [], [str(a) for a in args], 0
    while index < len(args):
        arg, value = args[index], None
        if arg in ("-o", "--override-ini") and index + 1 < len(args):
            value, index = args[index + 1], index + 1
        elif arg.startswith("--override-ini="):
            value = arg.partition("=")[2]
        elif arg.startswith("-o") and not arg.startswith("--"):
            value = arg[2:]
        if value and value.startswith("parity_"):
            found += ["-o", value]
        index += 1
    return found


def update_command(config) -> str:
    """The pytest command that writes this session's baseline: the parity options and ini
    overrides of its command line, the suite it took from $MHC_PARITY_SUITE, and the update flag."""
    words = ["pytest"]
    for name in ("impl", "suite", "dtype", "baseline"):
        value = config.getoption(f"--parity-{name}")
        if value:
            words += [f"--parity-{name}", value]
    words += _ini_overrides(config.invocation_params.args)
    if not _setting(config, "suite") and os.environ.get("MHC_PARITY_SUITE"):
        words += ["--parity-suite", os.environ["MHC_PARITY_SUITE"]]
    return shlex.join([*words, UPDATE_OPTION])


def _shown(path: str | os.PathLike, start: pathlib.Path) -> str:
    """`path` relative to `start` (the folder pytest was started in) when inside it."""
    try:
        return str(pathlib.Path(path).resolve().relative_to(start.resolve()))
    except ValueError:
        return str(path)


def _row_name(key) -> str:
    case, candidate, partner, leaf = key
    return f"{case}::{leaf} ({candidate} vs {partner})"


def _update_lines(head: str, diff, what: str) -> list[str]:
    """What an updated baseline changed: the counts, then a few rows of each kind by name."""
    counts = f"{len(diff.added)} rows added, {len(diff.removed)} removed, {len(diff.changed)} changed"
    lines = [f"{head}: {counts} (now {what})"]
    for label, keys in (("added", diff.added), ("removed", diff.removed)):
        lines += [f"  {label}: {_row_name(key)}" for key in keys[:NAMED_CHANGES]]
        if len(keys) > NAMED_CHANGES:
            lines.append(f"  ... and {len(keys) - NAMED_CHANGES} more {label}")
    for key, cells in diff.changed[:NAMED_CHANGES]:
        moved = "; ".join(f"{column} {before} -> {after}" for column, before, after in cells[:2])
        lines.append(f"  changed: {_row_name(key)}: {moved}")
    if len(diff.changed) > NAMED_CHANGES:
        lines.append(f"  ... and {len(diff.changed) - NAMED_CHANGES} more changed")
    return lines + [f"  header: {key} {before or '-'} -> {after or '-'}" for key, before, after in diff.header]


class ParitySession:
    """What one pytest process knows of the parity run: its configuration, the baseline it
    gates against, and the rows of the cases it ran (or, on an xdist controller, the rows
    its workers sent)."""

    def __init__(self, config):
        self.implementation = _setting(config, "impl")
        self.suite = _setting(config, "suite") or os.environ.get("MHC_PARITY_SUITE") or DEFAULT_SUITE
        self.dtype = _setting(config, "dtype")
        self.report = _setting(config, "report")
        self.baseline = _setting(config, "baseline")
        self.update = bool(config.getoption(UPDATE_OPTION))
        self.allow_legacy = bool(config.getoption(LEGACY_OPTION) or config.getini(LEGACY_INI))
        self.update_command = update_command(config)
        self.started_in = config.invocation_params.dir
        self.baseline_run: LoadedRun | None = None  # loaded once per process when the session is gated
        self._prepared: PreparedRun | None = None
        self.rows_by_case: dict[str, list[dict]] = {}
        self._case_gates: dict[str, GateResult | None] = {}
        self.gate_counts: dict[str, tuple[int, ...]] = {}  # check id -> its GateTally counts, until reported
        self.tally = GateTally()
        self.report_paths: dict[str, pathlib.Path] = {}
        self.summary_lines: list[str] = []
        self.errors: list[str] = []

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

    @property
    def baseline_shown(self) -> str:
        return _shown(self.baseline, self.started_in) if self.baseline else ""

    def settle_baseline(self, rootpath: pathlib.Path) -> None:
        """Check the baseline before any test: in an update session, where it goes (it can
        be written); otherwise that it exists and can judge this run, loaded. pytest.UsageError
        (one line, with the command that writes it) when not."""
        if self.update:
            if not self.baseline:
                if not self.external:
                    raise pytest.UsageError(
                        f"mhc-parity: {UPDATE_OPTION} of the built-in paths needs the baseline file: "
                        "pass --parity-baseline FILE (or set parity_baseline)"
                    )
                self.baseline = str(rootpath / default_baseline_path(self.external))
            try:
                writable_file(self.baseline)
            except OutputPathError as exc:
                raise pytest.UsageError(f"mhc-parity: {exc}") from None
            return
        if not self.baseline:
            return
        if not pathlib.Path(self.baseline).exists():
            raise pytest.UsageError(
                f"mhc-parity: baseline {self.baseline_shown} does not exist; create it with: {self.update_command}"
            )
        try:
            baseline = load_baseline_or_run(
                self.baseline, allow_legacy=self.allow_legacy, legacy_option=f"{LEGACY_OPTION} (or {LEGACY_INI} = true)"
            )
        except ReportInputError as exc:
            problem = str(exc).removesuffix("; regenerate it with `make baseline`")
            raise pytest.UsageError(f"mhc-parity: {problem}; recreate it with: {self.update_command}") from None
        reason = self.refusal(baseline, self.prepared.result([]).loaded())
        if reason:
            raise pytest.UsageError(
                f"mhc-parity: baseline {self.baseline_shown} cannot judge this run: {reason}; "
                f"refresh it with: {self.update_command}"
            )
        self.baseline_run = baseline
        if baseline.note:
            self.summary_lines.append(f"mhc-parity: {baseline.note}")

    def refusal(self, baseline: LoadedRun, current: LoadedRun) -> str:
        """Why `baseline` cannot judge `current` (`reports.comparability`'s refusals, in this
        plugin's words), or ""."""
        if ownership_refusal(baseline, current):
            theirs = f"implementation {baseline.implementation!r}" if baseline.implementation else "the built-in paths"
            ours = f"implementation {self.external!r}" if self.external else "the built-in paths"
            return f"it holds the rows of {theirs}, this run checks {ours}"
        if baseline.policy_hash and current.policy_hash and baseline.policy_hash != current.policy_hash:
            return f"it was made under tolerance policy {baseline.policy_hash}, this run's is {current.policy_hash}"
        if precision_refusal(baseline, current):
            where = lambda run: run.metadata.get("backend") or "unrecorded backend"  # noqa: E731
            return (
                f"its matmuls ran at {run_precision(baseline)} ({where(baseline)}), "
                f"this run's at {run_precision(current)} ({where(current)})"
            )
        return ""

    def case_rows(self, case) -> list[dict]:
        """Every row of one case (computed once per process)."""
        if case.name not in self.rows_by_case:
            self.rows_by_case[case.name] = self.prepared.run_case(case)
        return self.rows_by_case[case.name]

    def case_gate(self, case) -> GateResult | None:
        """The gate of one case's rows against the baseline's rows of that case, once per
        process; None when the session is not gated or the baseline has no row of the case."""
        if self.baseline_run is None:
            return None
        if case.name not in self._case_gates:
            frame = self.baseline_run.frame
            baseline = frame[frame["case"] == case.name]
            result = None
            if len(baseline):
                current = to_frame(self.case_rows(case), source=f"rows of {case.name}")
                if self.baseline_run.implementation:
                    current = implementation_rows(current, self.baseline_run.implementation)
                result = gate_frames(
                    typed_gate_frame(baseline, source=self.baseline_shown),
                    typed_gate_frame(current, source=f"rows of {case.name}"),
                )
            self._case_gates[case.name] = result
        return self._case_gates[case.name]

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

    def finish(self, interrupted: bool = False) -> list[str]:
        """Write the report folder and the baseline, as asked, from the rows of the cases
        run (no baseline after an interruption); the problems, one line each."""
        if self.update and interrupted:
            self.summary_lines.append(f"mhc-parity: interrupted; baseline {self.baseline_shown} not written")
            return []
        if not self.rows_by_case or not (self.report or self.update):
            return []
        from harness.api import ParityError  # loaded already: `prepared` imported it

        cases = [c for c in self.prepared.cases if c.name in self.rows_by_case]
        run = self.prepared.result([r for c in cases for r in self.rows_by_case[c.name]], cases=cases)
        problems = []
        if self.report:
            try:
                self.report_paths = run.write_reports(self.report)
            except ParityError as exc:
                problems.append(f"mhc-parity: error: {exc}")
        if self.update:
            try:
                self.summary_lines += self.write_baseline(run, cases)
            except OSError as exc:
                problems.append(f"mhc-parity: error: {cannot_write(exc, self.baseline)}")
            except ReportInputError as exc:  # rows a baseline cannot hold, e.g. two with one row key
                problems.append(f"mhc-parity: error: baseline {self.baseline_shown} not written: {exc}")
        return problems

    def write_baseline(self, run: ParityRun, cases) -> list[str]:
        """Write the baseline from `run` (the rows of `cases`), keeping the old file's rows of
        the selected cases the session did not run; the summary lines saying what changed."""
        name, path, shown = self.external, pathlib.Path(self.baseline), self.baseline_shown
        frame = run.rows if name is None else implementation_rows(run.rows, name)
        if not len(frame):
            return [f"mhc-parity: the session has no rows of {name!r}; baseline {shown} not written"]
        current = run.loaded()
        new = typed_gate_frame(frame, source="the session's rows")[list(GATE_COLUMNS)]
        old_text = path.read_text(encoding="utf-8", errors="replace") if path.is_file() else None
        replaced, kept = "", None
        if old_text is not None:
            try:
                # A legacy file is replaced whole: no digest vouches for the rows it would keep.
                old = load_baseline_or_run(path, allow_legacy=True)
                replaced = self.refusal(old, current) or old.note.removeprefix("note: ")
            except ReportInputError as exc:
                replaced = f"it could not be read ({exc})"
            if not replaced and len(cases) < len(self.prepared.cases):  # a part of the selection ran
                kept = old.frame[~old.frame["case"].isin({c.name for c in cases})]
                new = pd.concat([new, typed_gate_frame(kept, source=shown)[list(GATE_COLUMNS)]], ignore_index=True)
        rows = dataclasses.replace(current, frame=new)
        text = render_baseline(new, policy_hash=rows.policy_hash, environment=environment_of(rows), implementation=name)
        what = f"{len(new)} rows of " + (f"implementation {name!r}" if name else "the built-in paths")
        cases_now = new["case"].nunique()
        what += f" in {cases_now} case{'s' * (cases_now != 1)}"
        failing = int(new["verdict"].isin(("fail", "error")).sum())
        notes = []
        if kept is not None and len(kept):
            count = kept["case"].nunique()
            notes.append(f"  kept the rows of {count} case{'s' * (count != 1)} this session did not run")
        if failing:
            notes.append(f"mhc-parity: warning: {failing} rows are fail/error; the gate fails on them until they pass")
        if old_text == text:
            return [f"mhc-parity: baseline {shown} is up to date ({what})", *notes]
        write_baseline(rows, path, implementation=name)
        if old_text is None:
            return [f"mhc-parity: created baseline {shown}: {what}", *notes]
        if replaced:
            return [f"mhc-parity: replaced baseline {shown}: {what} (the old file: {replaced})", *notes]
        return [*_update_lines(f"mhc-parity: updated baseline {shown}", diff_baselines(old_text, text), what), *notes]

    def summary(self) -> list[str]:
        """The lines of the session's "mhc-parity" section of pytest's summary."""
        lines = [f"{fmt:>8}: {path}" for fmt, path in self.report_paths.items()]
        tally = self.tally
        if self.baseline_run is not None and (tally.gated or tally.ungated):
            counts = ((tally.gated, "test"), (tally.matched, "row"), (tally.failing, "failing finding"))
            gated, matched, failing = (f"{n} {noun}{'s' * (n != 1)}" for n, noun in counts)
            lines.append(
                f"mhc-parity: gate against {self.baseline_shown}: {gated} gated, {matched} matched, {failing}, "
                f"{tally.improvements} improvements, {tally.new_rows} new rows"
            )
            if tally.ungated:
                lines.append(
                    f"mhc-parity: {tally.ungated} tests not gated: the baseline has no rows of their cases; "
                    f"add them with: {self.update_command}"
                )
        return [*lines, *self.summary_lines, *self.errors]


def _enabled(config) -> bool:
    return bool(_setting(config, "impl") or config.getini("parity_builtin"))


def pytest_configure(config):
    if not _enabled(config):
        if config.getoption(UPDATE_OPTION):
            raise pytest.UsageError(
                f"mhc-parity: {UPDATE_OPTION}: no implementation to check; pass --parity-impl MODULE:FACTORY "
                "(or set parity_impl in the pytest configuration)"
            )
        return
    ensure_host_devices()
    session = ParitySession(config)
    if session.implementation or session.baseline or session.update:
        _ = session.prepared  # a bad --parity-impl is a usage error before collection
    session.settle_baseline(config.rootpath)
    config.stash[STATE] = session
    config.addinivalue_line("markers", "sharded: runs token-sharded on the 8 simulated host devices")
    config.pluginmanager.register(_GateTally(session), "mhc-parity-gate-tally")
    if config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(_XdistRows(session), "mhc-parity-xdist-rows")


class _GateTally:
    """Sums the gate counts of the parity tests' reports (an xdist controller gets its workers')."""

    def __init__(self, session: ParitySession):
        self.session = session

    def pytest_runtest_logreport(self, report):
        if report.when != "call":
            return
        for name, value in report.user_properties:
            if name == GATE_PROPERTY:
                self.session.tally.add(value)


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


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """A parity test's gate counts go into its report (to the xdist controller with it)."""
    check = getattr(getattr(item, "callspec", None), "params", {}).get("parity_check")
    if call.when == "call" and isinstance(check, ParityCheck):
        counts = check.session.gate_counts.pop(check.id, None)
        if counts is not None:
            item.user_properties.append((GATE_PROPERTY, counts))
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


def failed_rows_message(check: ParityCheck, bad: list[dict], total: int) -> str:
    """A test's failing rows by cause (`reports.causes`): each cause's heading and its rows; a
    cause whose every row's leaf also fails against the oracle is told once, by that test."""
    oracle_failures = {
        (r["candidate"], r["leaf"])
        for r in check.session.case_rows(check.case)
        if r["comparison"] == "vs_oracle" and r["verdict"] not in OK_VERDICTS
    }
    lines = [f"{len(bad)} of {total} rows of {check.id} failed:"]
    for group in cause_groups(bad):
        told = check.comparison != "vs_oracle" and all(
            (r["candidate"], r["leaf"]) in oracle_failures for r in group.rows
        )
        if told:
            lines.append(f"{group.heading()} (the leaves fail against the oracle too: {check.case.name}::vs_oracle)")
        else:
            lines += [group.heading(), leaf_table(list(group.rows))]
    return "\n".join(lines)


def _worst(finding: GateFinding, result: GateResult) -> str:
    """One finding in a phrase: a regression's leaf, growth and the allowed factor."""
    _, candidate, partner, leaf = finding.key
    if finding.category == "regression":
        return (
            f"leaf {leaf} ({candidate} vs {partner}) grew x{format_number(finding.growth)} "
            f"> allowed x{result.growth_factor:g}"
        )
    return f"{finding.category.replace('_', ' ')} leaf {leaf} ({candidate} vs {partner}): {finding.detail}"


def gate_failure(check: ParityCheck, findings, result: GateResult) -> str:
    """The failure message of a test's gate findings: a headline with the worst, then each."""
    counts = Counter(f.category for f in findings)
    found = ", ".join(f"{n} {FINDING_NOUNS[category][n != 1]}" for category, n in counts.items())
    more = f" (and {len(findings) - 1} more)" if len(findings) > 1 else ""
    table = format_text_table(
        ("finding", "leaf", "candidate", "partner", "detail"),
        [(f.category, f.key[3], f.key[1], f.key[2], f.detail) for f in findings],
        limit=None,
    )
    return (
        f"{check.id}: gate FAIL against {check.session.baseline_shown}: {_worst(findings[0], result)}{more}\n"
        f"{found} (growth factor x{result.growth_factor:g}, noise floor {result.noise_floor_ulps:g} ulps):\n{table}"
    )


def check_parity(check: ParityCheck) -> None:
    """Assert that every row of the check passed or is an explained skip/unsupported and,
    when the session is gated, that the gate finds nothing failing in them against the
    baseline's rows of the check's case and comparison."""
    session = check.session
    rows = [r for r in session.case_rows(check.case) if r["comparison"] == check.comparison]
    if session.external:
        rows = [r for r in rows if r["candidate"].startswith(f"{session.external}/")]
    result = session.case_gate(check.case)
    findings = []
    if result is not None:
        of_check = lambda found: [f for f in found if f.comparison == check.comparison]  # noqa: E731
        # A failing row is in the leaf table below; the gate's other findings follow it.
        findings = [f for f in of_check(result.failing_findings()) if f.category != "failure"]
        matched = sum(d.comparison == check.comparison for d in result.drifts)
        improvements, new_rows = len(of_check(result.improvements)), len(of_check(result.new_rows))
        tally = GateTally(1, 0, matched, len(findings), improvements, new_rows)
        session.gate_counts[check.id] = dataclasses.astuple(tally)
    elif session.baseline_run is not None:
        session.gate_counts[check.id] = dataclasses.astuple(GateTally(ungated=1))
    bad = [r for r in rows if r["verdict"] not in OK_VERDICTS]
    parts = [failed_rows_message(check, bad, len(rows))] if bad else []
    if findings:
        parts.append(gate_failure(check, findings, result))
    if parts:
        pytest.fail("\n\n".join(parts), pytrace=False)
    if not rows:
        pytest.skip(f"{check.case.name} makes no {check.comparison} comparison on this machine")
    if all(r["verdict"] == "skip" for r in rows):
        pytest.skip("; ".join(sorted({r["reason"] for r in rows}))[:300])
