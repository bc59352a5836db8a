"""`mhc-parity run`: cases x paths -> a run folder (`mhc_parity.records.manifest`).

manifest.json first, rows.jsonl as cases finish, the reports once complete; with `--baseline` the gate's
verdict heads every report. Exit codes: docs/running.md.
"""

from __future__ import annotations

import argparse
import math
import pathlib
import shlex
import sys
import time

import pandas as pd

from mhc_parity.harness.commands.common import DEFAULT_RUN_FOLDER, EXIT_USAGE, Parser, error
from mhc_parity.harness.commands.progress import DEFAULT_HEARTBEAT_S, Progress
from mhc_parity.harness.engine.case_cost import pass_cost
from mhc_parity.harness.engine.case_memory import first_too_large
from mhc_parity.harness.engine.failures import out_of_memory
from mhc_parity.harness.engine.run_info import enable_compilation_cache, run_metadata
from mhc_parity.harness.engine.runner import Runner
from mhc_parity.harness.engine.selection import RunSelection, configure, finished_metadata, new_manifest
from mhc_parity.harness.errors import ConfigurationError, ResourceError, UsageError
from mhc_parity.harness.judging.policy import PolicyError
from mhc_parity.harness.processes.interrupts import SignalsInterrupt, interruption_message
from mhc_parity.harness.processes.parallel import ParallelRunner, auto_jobs
from mhc_parity.harness.processes.shards import parse_shard, shard_cases
from mhc_parity.harness.processes.watchdog import Watchdog
from mhc_parity.records.manifest import (
    MANIFEST_FILE,
    ManifestError,
    foreign_folder_problem,
    read_manifest,
    record_stop,
    write_manifest,
)
from mhc_parity.records.outputs import OutputPathError, WriterLock, cannot_write, writable_folder
from mhc_parity.records.rows import frame_from_records, typed_rows
from mhc_parity.records.space_reserve import SpaceReserve, release_reserve, reserve_bytes
from mhc_parity.records.store import RowStore, StoreError, typed_case_records
from mhc_parity.reports import ReportInputError, load_baseline, writers
from mhc_parity.reports.causes import uncompared
from mhc_parity.reports.gate.comparability import comparability_refusal
from mhc_parity.reports.rerun import run_rerun_command
from mhc_parity.reports.sources import LoadedRun, baseline_as_run
from mhc_parity.reports.terminal import exit_code, nothing_compared_message, print_summary

PROG = "mhc-parity run"


def run_parser(prog: str = PROG) -> argparse.ArgumentParser:
    p = Parser(prog=prog, description="Run cases through every path and write the reports.")
    p.add_argument("--suite", default=None, help="case suite (default: 'default' unless --cases is given)")
    p.add_argument("--cases", nargs="+", default=None, metavar="GLOB", help="case-name globs")
    p.add_argument("--tags", nargs="+", default=None, metavar="TAG", help="keep cases having all these tags")
    p.add_argument(
        "--paths",
        nargs="+",
        default=["*"],
        metavar="GLOB",
        help="path-name globs, e.g. 'interpret/*' 'reference/*' (oracle always runs)",
    )
    p.add_argument("--dtype", default=None, help="activation dtype filter: float32|bfloat16 (f32, bf16)")
    p.add_argument(
        "--impl",
        action="append",
        default=[],
        metavar="MODULE:FACTORY",
        help="add an external implementation (repeatable)",
    )
    p.add_argument(
        "--inside-envelope",
        action="store_true",
        help="keep only the cases inside every --impl implementation's declared envelope",
    )
    p.add_argument(
        "--case-file", action="append", default=[], type=pathlib.Path, help="TOML file of extra cases (repeatable)"
    )
    p.add_argument("--policy", type=pathlib.Path, default=None, help="tolerance policy TOML (default: packaged)")
    p.add_argument("--out", type=pathlib.Path, default=DEFAULT_RUN_FOLDER, help="output folder")
    p.add_argument("--resume", action="store_true", help="finish an interrupted run in --out")
    p.add_argument("--seed", type=int, default=None, help="override every selected case's seed")
    p.add_argument(
        "--baseline",
        type=pathlib.Path,
        default=None,
        help="baseline CSV to judge the run against as `gate` does: its verdict and drift head every "
        "report, and a gate failure exits 1",
    )
    p.add_argument(
        "--only-current-cases",
        action="store_true",
        help="with --baseline: gate only the baseline rows of the cases this run selected, as `gate "
        "--only-current-cases` (a smoke run against the default suite's baseline); a run naming its "
        "--cases, --tags, --dtype or --shard does so already",
    )
    p.add_argument(
        "--allow-legacy-baseline",
        action="store_true",
        help="read a --baseline of an older format (its header is not inside its digest)",
    )
    p.add_argument("--no-lowering", action="store_true", help="skip the TPU lowering rows")
    p.add_argument(
        "--no-causes",
        action="store_true",
        help="do not search the failing rows' causes (cheaper in an edit loop; the verdicts are the same)",
    )
    p.add_argument(
        "--jobs",
        default="1",
        metavar="N",
        help="run the cases in N worker processes (rows identical to one process); 'auto': one "
        "per CPU core as memory allows, on a CPU backend (1 on an accelerator)",
    )
    p.add_argument(
        "--shard",
        default=None,
        metavar="K/N",
        help="run shard K of N of the selected cases (1 <= K <= N); `merge` joins the shards",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument(
        "--heartbeat",
        type=heartbeat_seconds,
        default=DEFAULT_HEARTBEAT_S,
        metavar="SECONDS",
        help="without a terminal, print the running case at least this often: a finite number of seconds > 0 "
        f"(default {DEFAULT_HEARTBEAT_S:g}; --quiet prints no progress at all)",
    )
    return p


def heartbeat_seconds(text: str) -> float:
    """`--heartbeat`: a finite number of seconds > 0 (the heartbeat thread waits that long: inf overflows,
    nan never compares, <= 0 never pauses); --quiet, not a value, turns it off."""
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds > 0):
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds > 0, got {text!r}")
    return seconds


def selection_of(args) -> RunSelection:
    return RunSelection(
        implementations=tuple(args.impl),
        suite=args.suite,
        cases=None if args.cases is None else tuple(args.cases),
        tags=None if args.tags is None else tuple(args.tags),
        dtype=args.dtype,
        case_files=tuple(args.case_file),
        seed=args.seed,
        paths=tuple(args.paths),
        policy=args.policy,
        lowering=not args.no_lowering,
        inside_envelope=args.inside_envelope,
        causes=not args.no_causes,
    )


def _take_shard(args, cases):
    """(the cases this run makes, the whole selection if --shard took a share of it, else ())."""
    if args.shard is None:
        return cases, ()
    try:
        return shard_cases(cases, parse_shard(args.shard)), cases
    except ValueError as exc:
        raise UsageError(str(exc)) from exc


def _open_run(store, manifest, *, resume: bool):
    """(manifest, rows kept, cases done): a fresh run, or the folder's run continued.

    The manifest ("running") is written before the stream or reports change, so a kill from here on leaves a
    folder no reader accepts. --resume continues only the same run (cases, paths, implementations, seed,
    policy, code).
    """
    if resume:
        try:
            previous = read_manifest(store.folder)
        except ManifestError as exc:
            raise UsageError(f"--resume: {exc}") from exc
        if previous is None and store.has_rows():
            raise UsageError(
                f"--resume: {store.folder} holds rows but no {MANIFEST_FILE}, so nothing says they "
                f"belong to this request; run without --resume"
            )
        if previous is not None:
            differences = previous.differences(manifest)
            if differences:
                raise UsageError(
                    f"--resume: {store.folder} holds another run; "
                    + "; ".join(differences)
                    + ". Run without --resume to start over (or use another --out)"
                )
            try:
                rows, found = store.finished()
            except StoreError as exc:
                raise UsageError(f"--resume: {exc}") from exc
            problem = previous.rows_problem(found, exact=previous.is_complete)
            if problem:
                # As merge checks a shard: the stream must hold the rows the manifest recorded.
                raise UsageError(
                    f"--resume: {store.folder}: its row stream does not match its manifest ({problem}): it was "
                    f"cut, edited or left by another run. Run without --resume to start over"
                )
            # Finished cases the manifest did not record are redone.
            done = [record.case for record in previous.case_records]
            recorded = set(done)
            rows = [row for row in rows if row["case"] in recorded]
            manifest = previous.resumed_as(manifest)
            write_manifest(store.folder, manifest)
            store.keep(rows, done)
            return manifest, rows, recorded
    write_manifest(store.folder, manifest)
    store.start_fresh()
    return manifest, [], set()


AUTO_JOBS = "auto"


def parse_jobs(text) -> int | str:
    """`--jobs`: a count of at least 1, or "auto"."""
    if str(text).strip().lower() == AUTO_JOBS:
        return AUTO_JOBS
    try:
        jobs = int(text)
    except ValueError:
        raise UsageError(f"--jobs must be a whole number or 'auto', got {text!r}") from None
    if jobs < 1:
        raise UsageError(f"--jobs must be at least 1, got {jobs}")
    return jobs


def _command_run(args, argv, command_line: str | None = None) -> int:
    args.jobs = parse_jobs(args.jobs)
    selection = selection_of(args)
    configuration = configure(selection)
    policy, plan = configuration.policy, configuration.plan
    cases, whole_selection = _take_shard(args, list(configuration.cases))
    # Before the folder changes: a case whose numbers would run and cannot fit is refused with its size.
    too_large = first_too_large(case for case in cases if plan.needs_numbers(case))
    if too_large:
        raise UsageError(too_large)
    baseline = _load_baseline(args.baseline, args.allow_legacy_baseline)  # before the run: a bad path wastes no time
    try:
        out = writable_folder(args.out)
    except OutputPathError as exc:
        raise UsageError(f"--out: {exc}") from exc
    _refuse_foreign_folder(out, resume=args.resume)
    command_line = command_line or "mhc-parity run " + shlex.join(argv)
    shard_label = parse_shard(args.shard).label if whole_selection else ""
    manifest = new_manifest(
        selection, configuration, command_line, cases=cases, shard_label=shard_label, whole_selection=whole_selection
    )
    _refuse_unfit_baseline(baseline, manifest, policy, cases, out)
    try:
        writer = WriterLock(out, command_line)  # one writer per run folder, for the run's life
    except OutputPathError as exc:  # held by another run (FolderInUseError), or not a lock of ours
        raise UsageError(f"--out: {exc}") from exc
    with writer:
        enable_compilation_cache()  # before the folder changes: an unwritable cache is a usage error
        try:  # room for the final manifest, however full the disk gets (mhc_parity.records.space_reserve)
            reserve = SpaceReserve(out, reserve_bytes(manifest.to_json(), len(cases)))
        except OSError as exc:
            raise UsageError(f"--out: {cannot_write(exc, out)}") from exc
        with reserve:
            store = RowStore(out)
            manifest, rows, done = _open_run(store, manifest, resume=args.resume)
            return _execute(args, store, manifest, rows, done, cases, plan, policy, baseline)


def _refuse_foreign_folder(out: pathlib.Path, *, resume: bool) -> None:
    """UsageError for an --out folder holding files but no run manifest, before the run writes there; rows
    without a manifest under --resume are left to `_open_run`."""
    problem = foreign_folder_problem(out)
    if problem and not (resume and RowStore(out).has_rows()):
        raise UsageError(f"--out: {problem}")


def _execute(args, store, manifest, rows, done, cases, plan, policy, baseline) -> int:
    """Run what is not done, then write the reports and finish the manifest. Ctrl-C / SIGTERM finish it as
    "interrupted" with the --resume command; a policy that cannot judge a comparison stops the run the same
    way, a configuration error."""
    todo = [c for c in cases if c.name not in done]
    wall_start = time.perf_counter()
    progress = Progress(
        len(cases),
        already_done=len(cases) - len(todo),
        enabled=not args.quiet,
        heartbeat_s=args.heartbeat,
        remaining_cost=sum(map(pass_cost, todo)),
        cost=pass_cost,
    )
    signals = SignalsInterrupt(Watchdog(store.folder))  # stops the run if code under test holds the handlers off
    typed = typed_rows(rows, source="rows kept")  # each row coerced once: its case's record, then the reports' frame
    try:
        with signals:
            runner = _runner(args, policy, plan, len(todo))  # in here: a signal while workers start is caught
            for case, case_rows in runner.run(todo, plan, on_case_start=progress.start, on_step=progress.step):
                case_typed = typed_rows(case_rows, source=f"rows of case {case.name}")
                records = typed_case_records(case_typed, [case.name])
                # Rows of another case among them: append_case computes the records and names it.
                record = records[case.name] if len(records) == 1 else None
                record = store.append_case(case.name, case_rows, record=record)
                rows.extend(case_rows)
                typed.extend(case_typed)
                manifest = manifest.with_case(record)
                write_manifest(store.folder, manifest)
                progress.finish(case, case_rows)
            progress.close()
            metadata = finished_metadata(manifest, policy, cases, done, runner, wall_start, plan.implementations)
            finished = manifest.completed(len(rows))
            paths, judgement, frame = _write_reports(
                typed, metadata, store.folder, baseline, finished, only_current_cases=args.only_current_cases
            )
            release_reserve(store.folder)  # its room is for this last write
            write_manifest(store.folder, finished)  # last: the folder is now a complete run
    except KeyboardInterrupt:
        progress.close()
        name = signals.name
        record_stop(store.folder, manifest.interrupted(name))
        print("\n" + interruption_message(manifest, name, store.folder), file=sys.stderr)
        return signals.exit_code
    except PolicyError as exc:
        progress.close()
        write_manifest(store.folder, manifest.interrupted(f"configuration error: {exc}"))
        raise UsageError(f"{exc} (found while running; the run is stopped)") from exc
    except (OSError, MemoryError, ResourceError) as exc:  # what the machine lacked, not a parity failure
        progress.close()
        reason = _shortage(exc)
        record_stop(store.folder, manifest.failed(reason))
        kept = manifest.cases_done
        raise UsageError(
            f"{reason}; {kept} finished case{'s' * (kept != 1)} kept in {store.folder}. "
            f"Once that is mended, finish the run with `{manifest.resume_command()}`"
        ) from exc
    return _conclude(
        rows,
        paths,
        metadata,
        judgement,
        frame,
        [name for name, _ in finished.request.implementations],
        finished.shard,
        rerun=run_rerun_command(frame, finished, judgement, store.folder),
    )


def _runner(args, policy, plan, cases: int):
    jobs = auto_jobs(cases) if args.jobs == AUTO_JOBS else args.jobs
    if jobs == 1:
        return Runner.with_disk_stores(policy)
    return ParallelRunner(policy, jobs)


def _shortage(exc: BaseException) -> str:
    """One phrase for what stopped the run: the case that exhausted memory, memory outside a case, or the
    file it could not write."""
    if isinstance(exc, ResourceError):
        return str(exc)
    if out_of_memory(exc):  # outside a case's computations: the rows, the manifest, the reports
        first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        return f"out of memory while writing the run's records or reports ({first_line or type(exc).__name__})"
    return cannot_write(exc, "the run folder")


def _load_baseline(path, allow_legacy: bool):
    """The --baseline as the gate reads it (None without one); UsageError if unreadable or legacy without
    `allow_legacy`, before the run."""
    if path is None:
        return None
    try:
        baseline = load_baseline(path, allow_legacy=allow_legacy)
    except (ReportInputError, OSError) as exc:
        raise UsageError(f"baseline {path}: {exc}") from exc
    if baseline.note:
        print(baseline.note, file=sys.stderr)
    return baseline_as_run(baseline)


def _refuse_unfit_baseline(baseline, manifest, policy, cases, out: pathlib.Path) -> None:
    """UsageError before any case runs where `baseline` cannot judge this run whatever its rows
    (`comparability_refusal`), as the gate would refuse it after."""
    if baseline is None:
        return
    metadata = dict(run_metadata(cases), policy_hash=policy.digest)
    planned = LoadedRun(pd.DataFrame(), out, policy.digest, metadata, is_baseline=False, manifest=manifest)
    refusal = comparability_refusal(baseline, planned)
    if refusal:
        raise UsageError(f"--baseline cannot judge this run: {refusal}")


def _write_reports(typed, metadata, out: pathlib.Path, baseline, manifest, *, only_current_cases: bool = False):
    """(report paths, the gate's judgement against `baseline` or None, the rows' frame), judged as
    `mhc-parity gate` will judge the finished folder."""
    frame = frame_from_records(typed)
    judgement = None
    if baseline is not None:
        judgement = writers.judge_frame(
            frame,
            metadata,
            baseline,
            manifest,
            out / writers.OUTPUT_FILES["json"],
            only_current_cases=only_current_cases,
        )
    return writers.write_frame(frame, metadata, out, manifest=manifest, judgement=judgement), judgement, frame


def _conclude(rows, paths, metadata, judgement=None, frame=None, implementations=(), shard="", rerun="") -> int:
    """Print the summary, the report paths and `rerun` (the command rerunning only the failing cases);
    return the exit code (a shard's is not the whole run's)."""
    print_summary(rows, metadata, judgement, frame=frame, implementations=implementations)
    for fmt, path in paths.items():
        print(f"{fmt:>8}: {path}")
    print(f"HTML report: {paths['html']}")
    if rerun:
        print(f"Rerun only the failing cases: {rerun}")
    code = exit_code(rows, judgement, implementations, whole_run=not shard)
    if judgement is not None and judgement.result is None:  # exit 2, as `mhc-parity gate` on this baseline
        print(f"mhc-parity: error: --baseline cannot judge this run: {judgement.refusal}", file=sys.stderr)
    if uncompared(rows, implementations):
        message = nothing_compared_message(rows, implementations)
        if code == EXIT_USAGE:
            error(message)
        elif shard:  # a part: the merged run must compare it, and `merge` exits 2 if it does not
            print(f"mhc-parity: note: in shard {shard}, {message}; `mhc-parity merge` checks the whole run")
    return code


def main(argv: list[str], *, command_line: str | None = None) -> int:
    """`run` with `argv` (after the command name); the exit code. command_line: what the manifest records,
    if not `mhc-parity run ARGV` (`baseline --impl` runs through here)."""
    try:
        args = run_parser().parse_args(argv)
    except SystemExit as exc:  # argparse exits 2 on usage errors, 0 on --help
        return int(exc.code or 0)
    # From here on, before any --impl is imported: a process started with SIGINT ignored
    # (nohup, a CI runner) would otherwise ignore Ctrl-C through the import.
    signals = SignalsInterrupt()
    try:
        with signals:
            return _command_run(args, argv, command_line)
    except ConfigurationError as exc:  # UsageError included; e.g. an unwritable cache folder
        return error(str(exc))
    except KeyboardInterrupt:  # before the run started computing (see _execute for after)
        print(f"\nmhc-parity: interrupted ({signals.name})", file=sys.stderr)
        return signals.exit_code
