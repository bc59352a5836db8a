"""The public Python API: run the parity matrix on an implementation, write its reports, gate it against a
baseline. Re-exported by `mhc_parity.harness`.

    run = run_parity("my_pkg.kernels:factory", suite="smoke", dtype="bf16")
    run.passed, run.reason, run.failures, run.rows
    run.write_reports("out/mine"); run.write_baseline()
    gate(run, "baselines/my_kernel.csv").ok

Stable names: `run_parity`, `prepare`, `gate`, `ParityRun`, `PreparedRun` and the errors of
`mhc_parity.harness.errors`. The engine is the CLI's (same selection, `Runner` and writers), so a folder
written here is a complete run the CLI accepts; docs/external-implementations.md has more.
"""

from __future__ import annotations

import dataclasses
import functools
import pathlib
import time
import types
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypedDict, Unpack

import pandas as pd

from mhc_parity.harness.engine.implementations import REFERENCE, Implementation, load_externals
from mhc_parity.harness.engine.run_info import enable_compilation_cache
from mhc_parity.harness.engine.runner import Runner
from mhc_parity.harness.engine.selection import RunSelection, configure, finished_metadata, new_manifest
from mhc_parity.harness.errors import (
    BaselineError,
    ConfigurationError,
    ParityError,  # noqa: F401 - re-exported: `mhc_parity.harness.ParityError`, the pytest plugin
    ReportError,
    checked_settings,
)
from mhc_parity.harness.judging.policy import PolicyError
from mhc_parity.records.cause_consistency import consistent_causes
from mhc_parity.records.manifest import Manifest, foreign_folder_problem, selection_digest
from mhc_parity.records.outputs import OutputPathError, WriterLock, writable_file, writable_folder
from mhc_parity.records.path_names import implementation_glob
from mhc_parity.records.rows import ReportInputError, to_frame
from mhc_parity.records.run_suite import run_suite
from mhc_parity.records.schema import OK_VERDICTS
from mhc_parity.records.store import case_records
from mhc_parity.reports.gate.baseline_file import write_baseline as _write_baseline_file
from mhc_parity.reports.gate.comparability import (
    default_baseline_path,
    implementation_rows,
    narrowing_refusal,
    overwrite_refusal,
    selection_of_run,
)
from mhc_parity.reports.gate.drift import DEFAULT_GROWTH_FACTOR, DEFAULT_NOISE_FLOOR_ULPS
from mhc_parity.reports.gate.judgement import gate_run
from mhc_parity.reports.gate.rule import GateResult
from mhc_parity.reports.sources import LoadedRun
from mhc_parity.reports.terminal import format_summary, nothing_compared_message, rows_table, run_verdict
from mhc_parity.reports.writers import write_run_folder

ImplementationLike = str | Implementation | Any
# What an in-memory run is called where a file name would be (messages, LoadedRun.source).
IN_MEMORY_SOURCE = pathlib.Path("<run_parity result>")


@dataclasses.dataclass(frozen=True, eq=False)
class ParityRun:
    """A finished parity run: its rows, the run metadata and the complete manifest.

    records: one read-only mapping per row, exactly the rows the manifest recorded (ReportError otherwise),
    so a verdict flipped in memory cannot make a failing run pass. implementations: the external
    implementations it ran (paths `<name>/...`).
    """

    records: tuple[Mapping[str, Any], ...]
    metadata: Mapping[str, Any]
    manifest: Manifest
    implementations: tuple[str, ...] = ()

    def __post_init__(self):
        records = tuple(types.MappingProxyType(dict(r)) for r in self.records)
        problem = self.manifest.rows_problem(case_records(records, self.manifest.cases))
        if problem:
            raise ReportError(f"the records are not those run {self.manifest.run_id} recorded: {problem}")
        object.__setattr__(self, "records", records)
        object.__setattr__(self, "metadata", types.MappingProxyType(dict(self.metadata)))

    @functools.cached_property
    def _frame(self) -> pd.DataFrame:
        return to_frame([dict(r) for r in self.records], source="run rows")

    @property
    def rows(self) -> pd.DataFrame:
        """Every row as a typed DataFrame (`ROW_COLUMNS` order), a copy."""
        return self._frame.copy()

    @property
    def verdict(self) -> str:
        """ "PASS", "FAIL" or "NOTHING COMPARED": the verdict `mhc-parity run` exits with."""
        return run_verdict(self.records, self.implementations)

    @property
    def passed(self) -> bool:
        """Every row passed or is an explained skip, and something of every implementation under test
        compared (`reason` says why not)."""
        return self.verdict == "PASS"

    @property
    def reason(self) -> str:
        """Why the run did not pass, in one line ("" when it passed)."""
        verdict = self.verdict
        if verdict == "NOTHING COMPARED":
            return nothing_compared_message(self.records, self.implementations)
        if verdict == "FAIL":
            return f"{len(self.failures)} of {len(self.records)} rows are fail/error (`failures`, `failure_table()`)"
        return ""

    @property
    def failures(self) -> pd.DataFrame:
        frame = self._frame
        return frame[~frame["verdict"].isin(OK_VERDICTS)].copy()

    def failure_table(self) -> str:
        """The fail/error rows as a plain-text leaf table ("" when none)."""
        bad = [r for r in self.records if r["verdict"] not in OK_VERDICTS]
        return rows_table(bad, limit=None) if bad else ""

    def summary(self) -> str:
        """The one-screen summary `mhc-parity run` prints."""
        return format_summary(
            [dict(r) for r in self.records], dict(self.metadata), implementations=self.implementations
        )

    def implementation_rows(self, name: str | None = None) -> pd.DataFrame:
        """The rows of external implementation `name` (default: the run's only one)."""
        return implementation_rows(self.rows, self._implementation(name))

    def write_reports(self, folder: str | pathlib.Path) -> dict[str, pathlib.Path]:
        """Write the run folder as `mhc-parity run --out` does, replacing what was there; {"csv", "json",
        "html", "markdown": path}. ReportError if the folder cannot be written."""
        try:
            out = _run_folder(folder)
            writer = WriterLock(out, f"ParityRun.write_reports ({self.manifest.command_line})")
        except OutputPathError as exc:  # FolderInUseError included: one writer per run folder
            raise ReportError(f"cannot write reports to {folder}: {exc}") from exc
        with writer:
            return self._write_reports(out, folder)

    def _write_reports(self, out: pathlib.Path, folder) -> dict[str, pathlib.Path]:
        try:
            paths = write_run_folder(out, [dict(r) for r in self.records], dict(self.metadata), self.manifest)
        except (OutputPathError, OSError) as exc:
            raise ReportError(f"cannot write reports to {folder}: {exc}") from exc
        return paths

    def write_baseline(
        self, path: str | pathlib.Path | None = None, *, implementation: str | None = None, allow_narrower: bool = False
    ) -> pathlib.Path:
        """Write one external implementation's rows (default: the only one) as its baseline to `path`
        (default baselines/<name>.csv). ReportError if it cannot be written, is another suite's baseline or,
        unless `allow_narrower`, covers cases or paths these rows lack; ConfigurationError if the run has no
        such implementation."""
        name = self._implementation(implementation)
        frame = implementation_rows(self.rows, name)
        if not len(frame):
            raise ConfigurationError(f"the run has no rows of implementation {name!r}; refusing an empty baseline")
        try:
            target = writable_file(path or default_baseline_path(name))
            suite = run_suite(self.manifest.request)
            elsewhere = "write them to another path"
            loaded = dataclasses.replace(self.loaded(), frame=frame)
            selection = dataclasses.replace(selection_of_run(loaded), implementations=(name,))
            refusal = overwrite_refusal(target, suite, frame["case"], elsewhere=elsewhere)
            if not refusal and not allow_narrower:
                refusal = narrowing_refusal(target, selection, elsewhere=elsewhere, option="allow_narrower=True")
            if refusal:
                raise ReportInputError(refusal)
            return _write_baseline_file(loaded, target, implementation=name, suite=suite, selection=selection)
        except (OutputPathError, OSError, ReportInputError) as exc:  # ReportInputError: a run folder's own file
            raise ReportError(f"cannot write baseline {path or default_baseline_path(name)}: {exc}") from exc

    def loaded(self) -> LoadedRun:
        """This run as `mhc_parity.reports.load_run` would return it from its folder."""
        return LoadedRun(
            self._frame.copy(), IN_MEMORY_SOURCE, self.manifest.policy_digest, dict(self.metadata), False, self.manifest
        )

    def _implementation(self, name: str | None) -> str:
        if name is not None:
            if name not in self.implementations:
                raise ConfigurationError(
                    f"the run has no implementation {name!r} (it ran: {', '.join(self.implementations) or 'none'})"
                )
            return name
        if len(self.implementations) != 1:
            raise ConfigurationError(
                f"the run has {len(self.implementations)} external implementations "
                f"({', '.join(self.implementations) or 'none'}); name one"
            )
        return self.implementations[0]


def _run_folder(folder: str | pathlib.Path) -> pathlib.Path:
    """`writable_folder(folder)`; OutputPathError also for a folder holding files but no run manifest."""
    out = writable_folder(folder)
    problem = foreign_folder_problem(out)
    if problem:
        raise OutputPathError(problem)
    return out


class PreparedRun:
    """A run configuration loaded and checked before any compute (`prepare`): `run_case` runs one case (the
    pytest plugin's way), `run` all, `result` assembles rows into a `ParityRun`."""

    def __init__(self, selection: RunSelection, command_line: str):
        self.selection = selection
        self.configuration = configure(selection)
        self.policy, self.externals, self.plan = (
            self.configuration.policy,
            self.configuration.externals,
            self.configuration.plan,
        )
        self.cases = self.configuration.cases
        self.command_line = command_line
        enable_compilation_cache()  # as `mhc-parity run` does: compiled programs are reused across processes
        self.runner = Runner.with_disk_stores(self.policy)
        self.started = time.perf_counter()
        self._manifest = new_manifest(selection, self.configuration, command_line)

    @property
    def implementation_names(self) -> tuple[str, ...]:
        return tuple(impl.name for impl in self.externals)

    def run_case(self, case) -> list[dict]:
        """Every row of one of `self.cases`. ConfigurationError if the policy cannot judge a comparison."""
        try:
            return list(self.runner.run_case(case, self.plan))
        except PolicyError as exc:
            raise ConfigurationError(f"{exc} (found while running {case.name})") from exc

    def run(self, *, on_case: Callable[[Any, list[dict]], None] | None = None) -> ParityRun:
        records: list[dict] = []
        for case in self.cases:
            rows = self.run_case(case)
            records.extend(rows)
            if on_case is not None:
                on_case(case, rows)
        return self.result(records)

    def result(self, records: Iterable[Mapping[str, Any]], *, cases: Sequence | None = None) -> ParityRun:
        """A `ParityRun` of `records`, the rows of `cases` (default: every prepared case), with the causes
        that hold across the run."""
        records = tuple(dict(r) for r in consistent_causes(records))
        manifest = self._manifest
        if cases is not None:
            manifest = dataclasses.replace(
                manifest, cases=tuple(c.name for c in cases), selection_digest=selection_digest(cases)
            )
        found = case_records(records, manifest.cases)
        manifest = manifest.with_cases(found[case] for case in manifest.cases)
        cases = list(cases or self.cases)
        implementations = self.plan.implementations
        metadata = finished_metadata(manifest, self.policy, cases, set(), self.runner, self.started, implementations)
        return ParityRun(records, metadata, manifest.completed(len(records)), self.implementation_names)


def _as_tuple(value: str | Sequence[str] | None) -> tuple[str, ...] | None:
    if value is None:
        return None
    return (value,) if isinstance(value, str) else tuple(value)


def prepare(
    implementation: ImplementationLike | Sequence[ImplementationLike] | None = None,
    *,
    suite: str | None = None,
    cases: str | Sequence[str] | None = None,
    tags: str | Sequence[str] | None = None,
    dtype: str | None = None,
    paths: Sequence[str] | None = None,
    case_files: Sequence[str | pathlib.Path] = (),
    seed: int | None = None,
    policy: str | pathlib.Path | None = None,
    lowering: bool | None = None,
    inside_envelope: bool = False,
) -> PreparedRun:
    """Load and check a run configuration without computing anything.

    implementation: a `module:factory` spec, an `Implementation`, an object with pre/post/name, a list of
    those, or None (the built-in paths). suite / cases / tags / dtype / inside_envelope as the `mhc-parity
    run` options. paths: path-name globs (default with an implementation: "reference/*" and "<name>/*";
    without: every path). lowering: the TPU-lowering rows (default: only without an implementation). Raises
    ConfigurationError for anything that cannot run, a refused `MHC_PARITY_*` setting first; an unknown one
    is a warning.
    """
    for note in checked_settings():
        warnings.warn(f"mhc-parity: {note}", stacklevel=2)
    items = (
        []
        if implementation is None
        else (list(implementation) if isinstance(implementation, (list, tuple)) else [implementation])
    )
    externals = load_externals(items)  # ImplementationError is a ConfigurationError
    if paths is None:
        paths = ["*"] if not externals else [implementation_glob(impl.name) for impl in (REFERENCE, *externals)]
    selection = RunSelection(
        implementations=externals,
        suite=suite,
        cases=_as_tuple(cases),
        tags=_as_tuple(tags),
        dtype=dtype,
        case_files=tuple(pathlib.Path(p) for p in case_files),
        seed=seed,
        paths=tuple(paths),
        policy=None if policy is None else pathlib.Path(policy),
        lowering=lowering if lowering is not None else not externals,
        inside_envelope=inside_envelope,
    )
    shown = ", ".join(f"{k}={v!r}" for k, v in (("suite", suite), ("cases", cases), ("dtype", dtype)) if v)
    arguments = [impl.spec or impl.name for impl in externals] + ([shown] if shown else [])
    command_line = f"run_parity({', '.join(arguments)})"
    return PreparedRun(selection, command_line)


class Selection(TypedDict, total=False):
    suite: str | None
    cases: str | Sequence[str] | None
    tags: str | Sequence[str] | None
    dtype: str | None
    paths: Sequence[str] | None
    case_files: Sequence[str | pathlib.Path]
    seed: int | None
    policy: str | pathlib.Path | None
    lowering: bool | None
    inside_envelope: bool


def run_parity(
    implementation: ImplementationLike | Sequence[ImplementationLike] | None = None,
    *,
    out: str | pathlib.Path | None = None,
    **selection: Unpack[Selection],
) -> ParityRun:
    """Run the parity matrix and return the `ParityRun`; `selection` as `prepare`.

    out: also write the run folder there. Raises ConfigurationError before any compute for what cannot run,
    ReportError if `out` cannot be written (checked first). A failing row is not an exception.
    """
    if out is not None:
        try:
            _run_folder(out)
        except OutputPathError as exc:
            raise ReportError(f"out: {exc}") from exc
    run = prepare(implementation, **selection).run()
    if out is not None:
        run.write_reports(out)
    return run


def gate(
    run: ParityRun | str | pathlib.Path,
    baseline: str | pathlib.Path,
    *,
    growth_factor: float = DEFAULT_GROWTH_FACTOR,
    noise_floor_ulps: float = DEFAULT_NOISE_FLOOR_ULPS,
    allow_policy_change: bool = False,
    allow_precision_change: bool = False,
    only_current_cases: bool = False,
    allow_code_change: bool = False,
    allow_legacy_baseline: bool = False,
) -> GateResult:
    """Gate `run` (a `ParityRun` or a run folder) against `baseline` (a baseline CSV or a run) as
    `mhc-parity gate` does; the keywords are its options.

    Returns the `GateResult`; raises BaselineError where the command exits 2 (a baseline that cannot judge
    the run, a run unfinished or made by other code than this checkout, a baseline given as `run`),
    ConfigurationError for a growth factor <= 1 or a negative noise floor.
    """
    gated = gate_run(
        baseline,
        run.loaded() if isinstance(run, ParityRun) else run,
        growth_factor=growth_factor,
        noise_floor_ulps=noise_floor_ulps,
        allow_policy_change=allow_policy_change,
        allow_precision_change=allow_precision_change,
        only_current_cases=only_current_cases,
        allow_code_change=allow_code_change,
        allow_legacy=allow_legacy_baseline,
        legacy_option="allow_legacy_baseline=True",
        code_change_option="allow_code_change=True",
        parameter_names=("growth_factor", "noise_floor_ulps"),
    )
    if gated.problem == "parameters":
        raise ConfigurationError(gated.judgement.refusal)
    if gated.judgement.result is None:
        raise BaselineError(gated.judgement.refusal)
    return gated.judgement.result
