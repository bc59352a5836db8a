"""`python -m harness` (also the `mhc-parity` script): run the parity matrix, gate a run.

  run   cases × paths → rows.jsonl, rows.csv, report.json, report.html, summary.md
  gate  a run's rows against a stored baseline (see reports.gate)
  baseline  write a run's rows as the baseline CSV

Exit codes: 0 every row passed (or is an explained skip/unsupported), 1 a parity
failure or error row (or a gate failure), 2 a usage or configuration error.
"""

from __future__ import annotations

import argparse
import datetime
import pathlib
import sys
import time

from harness.env import ensure_host_devices

EXIT_OK, EXIT_PARITY_FAILURE, EXIT_USAGE = 0, 1, 2
DEFAULT_OUT = pathlib.Path("out/parity")


class UsageError(Exception):
    """A bad argument or configuration; exit code 2."""


def _run_parser(sub) -> None:
    p = sub.add_parser("run", help="run cases through every path and write reports")
    p.add_argument("--suite", default=None, help="case suite (default: 'default' unless --cases is given)")
    p.add_argument("--cases", nargs="+", default=None, metavar="GLOB", help="case-name globs")
    p.add_argument("--tags", nargs="+", default=None, metavar="TAG", help="keep cases having all these tags")
    p.add_argument("--paths", nargs="+", default=["*"], metavar="GLOB",
                   help="path-name globs, e.g. 'interpret/*' 'reference/*' (oracle always runs)")
    p.add_argument("--dtype", default=None, help="activation dtype filter: float32|bfloat16 (f32, bf16)")
    p.add_argument("--impl", action="append", default=[], metavar="MODULE:FACTORY",
                   help="add an external implementation (repeatable)")
    p.add_argument("--case-file", action="append", default=[], type=pathlib.Path,
                   help="TOML file of extra cases (repeatable)")
    p.add_argument("--policy", type=pathlib.Path, default=None, help="tolerance policy TOML (default: packaged)")
    p.add_argument("--out", type=pathlib.Path, default=DEFAULT_OUT, help="output folder")
    p.add_argument("--resume", action="store_true", help="finish an interrupted run in --out")
    p.add_argument("--seed", type=int, default=None, help="override every selected case's seed")
    p.add_argument("--baseline", type=pathlib.Path, default=None, help="baseline CSV to show drift against")
    p.add_argument("--no-lowering", action="store_true", help="skip the TPU lowering rows")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mhc-parity", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    _run_parser(sub)
    g = sub.add_parser("gate", help="compare a run against a baseline", add_help=False)
    g.add_argument("rest", nargs=argparse.REMAINDER)
    b = sub.add_parser("baseline", help="write a run's rows as the baseline CSV")
    b.add_argument("--from", dest="source", type=pathlib.Path, default=DEFAULT_OUT,
                   help="run folder or rows file (default: out/parity)")
    b.add_argument("--to", dest="target", type=pathlib.Path, required=True, help="baseline CSV to write")
    f = sub.add_parser("faults", help="run the fault catalogue (kill matrix)", add_help=False)
    f.add_argument("rest", nargs=argparse.REMAINDER)
    return parser


def select_cases(args):
    """The cases `args` asks for, with --seed applied; UsageError for unknown names.

    Without --suite or --cases the default suite runs, or — when case files are given —
    the cases of those files (suite "user").
    """
    from cases import registry
    from cases.spec import CaseSpecError, normalize_dtype
    from cases.toml_cases import USER_SUITE, register_case_file

    reg = registry.fresh_registry()
    try:
        for path in args.case_file:
            register_case_file(path, reg)
        suite = args.suite
        if suite is None and args.cases is None:
            suite = USER_SUITE if args.case_file else "default"
        dtype = normalize_dtype(args.dtype, field="--dtype") if args.dtype else None
        selected = reg.select(suite=suite, names=args.cases, tags=args.tags, dtype=dtype)
    except (CaseSpecError, KeyError, ValueError, OSError) as exc:
        raise UsageError(str(exc)) from exc
    if not selected:
        raise UsageError("no case matches the selection")
    if args.seed is not None:
        selected = [c.replace(name=f"{c.name}-seed{args.seed}", seed=args.seed) for c in selected]
    return selected


def _command_run(args) -> int:
    ensure_host_devices()
    from harness.env import enable_compilation_cache, run_metadata
    from harness.implementations import BUILTIN, ImplementationError, load_external
    from harness.policy import PolicyError, load_policy
    from harness.progress import Progress
    from harness.runner import PathPlan, Runner
    from harness.store import RowStore, StoreError

    try:
        policy = load_policy(args.policy)
        externals = tuple(load_external(spec) for spec in args.impl)
    except (PolicyError, ImplementationError, OSError) as exc:
        raise UsageError(str(exc)) from exc
    cases = select_cases(args)
    baseline = _load_baseline(args.baseline)  # before the run: a bad path wastes no time
    plan = PathPlan(
        implementations=tuple(BUILTIN.values()) + externals,
        path_globs=tuple(args.paths),
        lowering=not args.no_lowering,
    )
    enable_compilation_cache()
    store = RowStore(args.out)
    try:
        rows, done = store.resume() if args.resume else (store.start_fresh() or [], set())
    except StoreError as exc:
        raise UsageError(str(exc)) from exc
    todo = [c for c in cases if c.name not in done]
    started = datetime.datetime.now(datetime.timezone.utc)
    wall_start = time.perf_counter()
    runner = Runner(policy)
    progress = Progress(len(cases), already_done=len(cases) - len(todo), enabled=not args.quiet)
    for case, case_rows in runner.run(todo, plan, on_case_start=progress.start):
        store.append_case(case.name, case_rows)
        rows.extend(case_rows)
        progress.finish(case, case_rows)
    progress.close()

    metadata = run_metadata(cases)
    metadata.update(
        command_line=" ".join(sys.argv),
        start_time=started.isoformat(timespec="seconds"),
        end_time=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        wall_seconds=round(time.perf_counter() - wall_start, 3),
        policy_file=str(policy.source),
        policy_hash=policy.digest,
        suite=args.suite or "",
        case_count=len(cases),
        resumed_cases=len(done),
        **{name: round(seconds, 3) for name, seconds in runner.timings.items()},
    )
    return _write_reports(rows, metadata, args.out, baseline)


def _load_baseline(path):
    """The baseline to show drift against (None without --baseline); UsageError if unreadable."""
    if path is None:
        return None
    import reports

    try:
        return reports.load_baseline(path)
    except (reports.ReportInputError, OSError) as exc:
        raise UsageError(f"baseline {path}: {exc}") from exc


def _write_reports(rows, metadata, out: pathlib.Path, baseline) -> int:
    import reports
    from harness.summary import exit_code, print_summary

    paths = reports.write_all(rows, metadata, out, baseline=baseline)
    print_summary(rows)
    for fmt, path in paths.items():
        print(f"{fmt:>8}: {path}")
    print(f"HTML report: {paths['html']}")
    return exit_code(rows)


def _command_baseline(args) -> int:
    import reports

    try:
        frame = reports.load_run(args.source)
    except (reports.ReportInputError, OSError) as exc:
        raise UsageError(str(exc)) from exc
    path = reports.write_baseline(frame, args.target)
    print(f"baseline written: {path} ({len(frame)} rows)")
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    if argv[:1] == ["gate"]:
        from reports.gate import main as gate_main

        return gate_main(argv[1:])
    if argv[:1] == ["faults"]:
        from harness.faults_cli import main as faults_main

        return faults_main(argv[1:])
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse exits 2 on usage errors, 0 on --help
        return int(exc.code or 0)
    try:
        if args.command == "run":
            return _command_run(args)
        if args.command == "baseline":
            return _command_baseline(args)
    except UsageError as exc:
        print(f"mhc-parity: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    parser.error(f"unknown command {args.command}")
    return EXIT_USAGE
