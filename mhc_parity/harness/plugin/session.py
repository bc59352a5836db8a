"""One pytest process's parity run: its configuration, the baseline it gates against, the rows of its cases
(on an xdist controller, its workers'), and what it writes and says at the end."""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
from typing import TYPE_CHECKING

import pandas as pd
import pytest

from mhc_parity.command_line import ERROR_PREFIX
from mhc_parity.harness.plugin.options import (
    LEGACY_INI,
    LEGACY_OPTION,
    SUITE_VARIABLE,
    UPDATE_OPTION,
    setting,
    update_command,
)
from mhc_parity.records.environment import environment_of, run_precision
from mhc_parity.records.manifest import foreign_folder_problem
from mhc_parity.records.outputs import OutputPathError, cannot_write, writable_file
from mhc_parity.records.rows import ReportInputError, json_ready, parse_float, to_frame
from mhc_parity.records.schema import FLOAT_COLUMNS
from mhc_parity.records.settings import setting as environment_setting
from mhc_parity.records.text import plural
from mhc_parity.reports.causes import uncompared
from mhc_parity.reports.gate.baseline_file import render_baseline, write_baseline
from mhc_parity.reports.gate.comparability import (
    default_baseline_path,
    diff_baselines,
    implementation_rows,
    ownership_refusal,
    precision_refusal,
)
from mhc_parity.reports.gate.drift import baseline_gain_note
from mhc_parity.reports.gate.rule import GATE_COLUMNS, GateResult, gate_frames, typed_gate_frame
from mhc_parity.reports.sources import LoadedRun, load_baseline_or_run
from mhc_parity.reports.terminal import nothing_compared_message

if TYPE_CHECKING:
    from mhc_parity.harness.api import ParityRun, PreparedRun

DEFAULT_SUITE = "smoke"
# At most this many rows of each kind (added, removed, changed) are named in an update's summary.
NAMED_CHANGES = 3


@dataclasses.dataclass
class GateTally:
    """What a session's parity tests found gating their rows (summed from their reports)."""

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


def _shown(path: str | os.PathLike, start: pathlib.Path) -> str:
    """`path` relative to `start` (where pytest was started) when inside it."""
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
    def __init__(self, config):
        self.implementation = setting(config, "impl")
        self.suite = setting(config, "suite") or environment_setting(SUITE_VARIABLE) or DEFAULT_SUITE
        self.dtype = setting(config, "dtype")
        self.report = setting(config, "report")
        self.baseline = setting(config, "baseline")
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
        # case name -> the comparisons of its selected parity tests (`select`)
        self.selected: dict[str, frozenset[str]] = {}
        # parity tests skipped as others report their regressions: this process's ids until
        # reported, and the count summed from the reports
        self.reported_elsewhere: set[str] = set()
        self.skipped_for_others = 0
        self.report_paths: dict[str, pathlib.Path] = {}
        self.summary_lines: list[str] = []
        self.errors: list[str] = []

    @property
    def prepared(self) -> PreparedRun:
        """The checked run configuration, prepared on first use; ParityError as a usage error."""
        if self._prepared is None:
            # Here, not at the top: an installed plugin that is off loads no JAX into a pytest run.
            from mhc_parity.harness.api import ParityError, prepare

            try:
                self._prepared = prepare(self.implementation, suite=self.suite, dtype=self.dtype)
            except ParityError as exc:
                raise pytest.UsageError(f"mhc-parity: {exc}") from None
        return self._prepared

    @property
    def externals(self) -> tuple[str, ...]:
        return self.prepared.implementation_names

    @property
    def external(self) -> str | None:
        """The implementation a baseline holds the rows of (None: the built-in paths); a session of several
        has no baseline."""
        names = self.externals
        return names[0] if names else None

    @property
    def baseline_shown(self) -> str:
        return _shown(self.baseline, self.started_in) if self.baseline else ""

    def settle_baseline(self, rootpath: pathlib.Path) -> None:
        """Check the baseline before any test: in an update session that it can be written, otherwise that
        it exists and can judge this run (loaded); pytest.UsageError naming the command that writes it."""
        if (self.update or self.baseline) and len(self.externals) > 1:
            raise pytest.UsageError(
                f"mhc-parity: a baseline holds the rows of one implementation; {self.implementation} gives "
                f"{len(self.externals)} ({', '.join(self.externals)}): name a factory of one, or run without "
                "a baseline"
            )
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
        gain_note = baseline_gain_note(baseline.frame)  # a format-3 baseline: gated without the gain rule
        if gain_note:
            self.summary_lines.append(f"mhc-parity: {gain_note}")

    def settle_report(self) -> None:
        """Refuse a report folder holding files but no run before any test, not at the session's end."""
        problem = foreign_folder_problem(self.report) if self.report else ""
        if problem:
            raise pytest.UsageError(f"mhc-parity: --parity-report: {problem}")

    def refusal(self, baseline: LoadedRun, current: LoadedRun) -> str:
        """Why `baseline` cannot judge `current` (`comparability`'s refusals in this plugin's words), or ""."""
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

    def judged_rows(self, case) -> list[dict]:
        """The rows of one case the tests judge: the implementations' under test (the reference is their
        partner), else every row."""
        rows = self.case_rows(case)
        if self.externals:
            under_test = set(self.externals)
            rows = [r for r in rows if r["candidate"].partition("/")[0] in under_test]
        return rows

    def select(self, tests) -> None:
        """Note the (case, comparison) of each selected parity test: a regression is reported by the first
        that sees it, so this must be known before any test runs (the same on every xdist worker)."""
        by_case: dict[str, set[str]] = {}
        for case, comparison in tests:
            by_case.setdefault(case, set()).add(comparison)
        self.selected = {case: frozenset(comparisons) for case, comparisons in by_case.items()}

    def case_gate(self, case) -> GateResult | None:
        """One case's rows gated against the baseline's rows of it, once per process; None when not gated or
        the baseline has no row of the case."""
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
        """The comparisons a case's rows can contain in this run, in `regressions.COMPARISON_ORDER`."""
        kinds = ["vs_oracle", "vs_reference"]
        if case.mesh is not None:
            kinds.append("vs_unsharded")
        if self.prepared.plan.lowering:
            kinds.append("lowering")
            if self.prepared.plan.compiles(case):
                kinds.append("compile")
        return tuple(kinds)

    def add_worker_rows(self, payload: str) -> None:
        """Rows a worker sent (JSON); a case computed by two workers keeps the first's rows."""
        for case, rows in json.loads(payload).items():
            decoded = [{k: parse_float(v) if k in FLOAT_COLUMNS else v for k, v in row.items()} for row in rows]
            self.rows_by_case.setdefault(case, decoded)

    def worker_payload(self) -> str:
        return json.dumps(json_ready(self.rows_by_case))

    def nothing_compared(self) -> str:
        """The error line of a session that compared nothing of what it tests (as `mhc-parity run` exits 2
        on it); "" when something of each compared, or no case ran."""
        rows = [r for case_rows in self.rows_by_case.values() for r in case_rows]
        if not rows or not uncompared(rows, self.externals):
            return ""
        return f"{ERROR_PREFIX}{nothing_compared_message(rows, self.externals)}"

    def finish(self, interrupted: bool = False) -> list[str]:
        """Write the report folder and baseline as asked (no baseline after an interruption); the problems,
        one line each, first whether the session compared nothing."""
        if self.update and interrupted:
            self.summary_lines.append(f"mhc-parity: interrupted; baseline {self.baseline_shown} not written")
            return []
        nothing = "" if interrupted else self.nothing_compared()  # an interrupted session compared only some
        problems = [nothing] if nothing else []
        if not self.rows_by_case or not (self.report or self.update):
            return problems
        from mhc_parity.harness.api import ParityError  # loaded already: `prepared` imported it

        cases = [c for c in self.prepared.cases if c.name in self.rows_by_case]
        run = self.prepared.result([r for c in cases for r in self.rows_by_case[c.name]], cases=cases)
        if self.report:
            try:
                self.report_paths = run.write_reports(self.report)
            except ParityError as exc:
                problems.append(f"{ERROR_PREFIX}{exc}")
        if self.update:
            try:
                self.summary_lines += self.write_baseline(run, cases)
            except OSError as exc:
                problems.append(f"{ERROR_PREFIX}{cannot_write(exc, self.baseline)}")
            except ReportInputError as exc:  # rows a baseline cannot hold, e.g. two with one row key
                problems.append(f"{ERROR_PREFIX}baseline {self.baseline_shown} not written: {exc}")
        return problems

    def write_baseline(self, run: ParityRun, cases) -> list[str]:
        """Write the baseline from `run`, keeping the old file's rows of selected cases the session did not
        run; the summary lines saying what changed."""
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
        if self.skipped_for_others:
            lines.append(
                f"mhc-parity: {plural(self.skipped_for_others, 'parity test')} skipped: each leaf failing there fails "
                "the first selected test of its case that saw it, whose message lists every comparison"
            )
        return [*lines, *self.summary_lines, *self.errors]
