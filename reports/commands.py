"""The run-folder commands of `python -m harness`: gate, baseline and render.

They read finished runs (`reports.sources.load_run`) and write files; none of them needs
JAX, so `harness.cli` dispatches to them without loading it.

  gate      a current run against a baseline (the rules: `reports.gate`): exit 0 pass,
            1 gate failure, 2 usage or input error (unreadable, corrupt, empty or
            mismatched runs, including runs made under another tolerance policy or at
            another matmul precision, see `reports.environment`, unless allowed; a current
            run that did not finish, or was made by other code than this checkout, see
            `reports.sources`; an unwritable --markdown path)
  baseline  a finished run written as the committed baseline CSV (`reports.baseline`)
  render    every report format written again from a finished run's rows
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from reports.baseline import write_baseline
from reports.drift import DEFAULT_GROWTH_FACTOR, DEFAULT_NOISE_FLOOR_ULPS
from reports.environment import precision_conflicts, run_precision
from reports.gate import GateResult, gate
from reports.markdown import gate_markdown
from reports.ownership import default_baseline_path, implementation_rows, ownership_refusal, resolve_implementation
from reports.outputs import OutputPathError, WriterLock, cannot_write, writable_file, writable_folder
from reports.rows import ReportInputError, frame_to_json_records
from reports.sources import load_run
from reports.writers import write_all, write_run_folder

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
# Where `harness run` writes a run unless told otherwise (and where `baseline` looks).
DEFAULT_RUN_FOLDER = Path("out/parity")
GATE_PROG = "mhc-parity gate"
BASELINE_PROG = "mhc-parity baseline"
RENDER_PROG = "mhc-parity render"


def _parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None):
    """The parsed arguments, or the exit code argparse chose (0 for --help, 2 for a usage error)."""
    try:
        return parser.parse_args(None if argv is None else list(argv))
    except SystemExit as exc:
        return int(exc.code or 0)


# ------------------------------------------------------------------------------ gate


def gate_parser(prog: str = GATE_PROG) -> argparse.ArgumentParser:
    """The gate's argument parser."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Compare a parity run with the committed baseline; exit 0 pass, 1 fail, 2 input error.",
    )
    parser.add_argument("--baseline", required=True, help="baseline CSV (or any run: folder, report.json, rows file)")
    parser.add_argument("--current", required=True, help="run folder, report.json, rows.jsonl or rows.csv")
    parser.add_argument(
        "--growth-factor",
        type=float,
        default=DEFAULT_GROWTH_FACTOR,
        help=f"fail when an oracle-relative error grows by more than this (default {DEFAULT_GROWTH_FACTOR:g})",
    )
    parser.add_argument(
        "--noise-floor-ulps",
        type=float,
        default=DEFAULT_NOISE_FLOOR_ULPS,
        help=f"errors below this many eps of the leaf dtype count as noise (default {DEFAULT_NOISE_FLOOR_ULPS:g})",
    )
    parser.add_argument("--markdown", metavar="OUT", help="also write the result as Markdown to OUT")
    parser.add_argument(
        "--allow-policy-change",
        action="store_true",
        help="compare even if the baseline was produced under a different tolerance policy",
    )
    parser.add_argument(
        "--only-current-cases",
        action="store_true",
        help="gate only the baseline rows of the cases the current run selected (a partial run)",
    )
    parser.add_argument(
        "--allow-code-change",
        action="store_true",
        help="gate a current run even if this checkout's code changed since it was made",
    )
    parser.add_argument(
        "--allow-precision-change",
        action="store_true",
        help="compare even if the baseline ran its matmuls at another precision (or on a backend "
        "where a precision setting means another rounding)",
    )
    return parser


def _fail(message: str) -> int:
    print(f"gate: {message}", file=sys.stderr)
    return EXIT_USAGE


def current_cases(current) -> list[str]:
    """The cases the current run selected (its manifest's list, else those with rows)."""
    if current.manifest is not None:
        return list(current.manifest.cases)
    return list(dict.fromkeys(current.frame["case"]))


def _notes(result: GateResult, baseline, current, only_current: bool) -> list[str]:
    """Hints for a gate that found missing rows: a partial run, a seeded run."""
    if not result.missing:
        return []
    notes = []
    ran, known = set(current_cases(current)), set(baseline.frame["case"])
    if not only_current and known - ran:
        notes.append(
            f"note: the current run selected {len(ran & known)} of the baseline's {len(known)} cases; "
            f"--only-current-cases gates just those"
        )
    seed = current.manifest.request.seed if current.manifest is not None else None
    if seed is not None:
        notes.append(
            f"note: the current run used --seed {seed}, which renames every case (<name>-seed{seed}); "
            f"gate it against a baseline made with the same --seed"
        )
    return notes


def _precision_refusal(baseline, current) -> str:
    """The one-line refusal when the runs' matmul precisions conflict, else ""."""
    base, now = run_precision(baseline), run_precision(current)
    try:
        conflicts = precision_conflicts(base, now)
    except ReportInputError as exc:
        return f"cannot compare matmul precisions: {exc}"
    if not conflicts:
        return ""
    where = lambda run: run.metadata.get("backend") or "unrecorded backend"  # noqa: E731
    return (
        f"baseline {baseline.source} ran its matmuls at {base} ({where(baseline)}), the current run "
        f"at {now} ({where(current)}); make a baseline at this precision on this kind of backend "
        "(or pass --allow-precision-change)"
    )


def comparability_refusal(
    baseline, current, *, allow_policy_change: bool = False, allow_precision_change: bool = False
) -> str:
    """Why `baseline` cannot judge `current` (two `LoadedRun`s), one line, or "" if it can:
    it belongs to another implementation (`reports.ownership`), or was made under another
    tolerance policy or matmul precision (unless allowed)."""
    refusal = ownership_refusal(baseline, current)
    if refusal:
        return refusal
    if (
        baseline.policy_hash
        and current.policy_hash
        and baseline.policy_hash != current.policy_hash
        and not allow_policy_change
    ):
        return (
            f"baseline {baseline.source} was produced under policy {baseline.policy_hash}, "
            f"the current run under {current.policy_hash}; regenerate the baseline with "
            "`make baseline` (or pass --allow-policy-change)"
        )
    refusal = _precision_refusal(baseline, current)
    return "" if allow_precision_change else refusal


def gated_frame(baseline, current):
    """The current rows `baseline` judges: an implementation's baseline, that implementation's rows."""
    if baseline.implementation:
        return implementation_rows(current.frame, baseline.implementation)
    return current.frame


def gate_main(argv: Sequence[str] | None = None, *, prog: str = GATE_PROG) -> int:
    """`gate`: a current run against a baseline; exit 0 pass, 1 gate failure, 2 input error."""
    parser = gate_parser(prog)
    args = _parse(parser, argv)
    if isinstance(args, int):
        return args
    if not args.growth_factor > 1.0:
        return _fail(f"--growth-factor must be > 1, got {args.growth_factor:g}")
    if not args.noise_floor_ulps >= 0.0:
        return _fail(f"--noise-floor-ulps must be >= 0, got {args.noise_floor_ulps:g}")
    try:
        markdown_path = writable_file(args.markdown) if args.markdown else None
    except OutputPathError as exc:
        return _fail(f"--markdown: {exc}")
    try:
        baseline = load_run(args.baseline)
        current = load_run(args.current, require_current_code=not args.allow_code_change)
    except ReportInputError as exc:
        return _fail(f"cannot read input: {exc}")
    if not len(baseline.frame):
        return _fail(f"baseline {baseline.source} has no rows; regenerate it with `make baseline`")
    if not len(current.frame):
        return _fail(f"current run {current.source} has no rows; did the run write anything?")
    refusal = comparability_refusal(
        baseline,
        current,
        allow_policy_change=args.allow_policy_change,
        allow_precision_change=args.allow_precision_change,
    )
    if refusal:
        return _fail(refusal)
    if baseline.implementation:
        print(f"gating implementation {baseline.implementation!r}: its rows only")
    baseline_frame = baseline.frame
    if args.only_current_cases:
        cases = current_cases(current)
        baseline_frame = baseline_frame[baseline_frame["case"].isin(cases)]
        gated = baseline_frame["case"].nunique()
        if not gated:
            return _fail(f"--only-current-cases: none of the current run's {len(cases)} cases is in the baseline")
        print(f"gating only the current run's cases: {gated} of {baseline.frame['case'].nunique()} baseline cases")
    try:
        result = gate(
            baseline_frame,
            gated_frame(baseline, current),
            growth_factor=args.growth_factor,
            noise_floor_ulps=args.noise_floor_ulps,
        )
    except ReportInputError as exc:
        return _fail(f"unusable input: {exc}")
    print(result.table())
    for note in _notes(result, baseline, current, args.only_current_cases):
        print(note)
    if baseline.policy_hash is None or current.policy_hash is None:
        print("(policy hash not recorded on both sides; policy match not checked)")
    if run_precision(baseline) is None or run_precision(current) is None:
        print("(matmul precision not recorded on both sides; precision match not checked)")
    if markdown_path is not None:
        try:
            markdown_path.write_text(gate_markdown(result), encoding="utf-8")
        except OSError as exc:
            return _fail(f"--markdown: {cannot_write(exc, markdown_path)}")
        print(f"gate: wrote {markdown_path}")
    return EXIT_OK if result.ok else EXIT_FAILED


# -------------------------------------------------------------------------- baseline


def baseline_parser(prog: str = BASELINE_PROG) -> argparse.ArgumentParser:
    """The arguments of `baseline --from RUN` (`harness.baseline_command` adds the run of `--impl`)."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Write a finished parity run as the baseline CSV.",
        epilog="Without --from, --impl MODULE:FACTORY runs the implementation first: "
        "[--suite S] [--cases GLOB...] [--dtype D] [--case-file F] [--out DIR] [--to PATH].",
    )
    parser.add_argument(
        "--from",
        dest="source",
        type=Path,
        default=DEFAULT_RUN_FOLDER,
        help=f"folder or report.json of a finished run (default: {DEFAULT_RUN_FOLDER})",
    )
    parser.add_argument(
        "--to",
        dest="target",
        type=Path,
        default=None,
        help="baseline CSV to write (required without --impl; with it default baselines/<name>.csv)",
    )
    parser.add_argument(
        "--impl",
        default=None,
        metavar="NAME|MODULE:FACTORY",
        help="keep only this external implementation's rows, keyed by its name; without "
        "--from, `harness baseline` runs it first",
    )
    parser.add_argument(
        "--allow-code-change",
        action="store_true",
        help="use the run even if this checkout's code changed since it was made",
    )
    return parser


def baseline_main(argv: Sequence[str] | None = None, *, prog: str = BASELINE_PROG) -> int:
    """`baseline --from RUN (--to PATH | --impl NAME)`: write a finished run as the baseline CSV.

    With --impl, only that external implementation's rows (the run must have them),
    with its name in the header, by default to baselines/<name>.csv. Exit 0 written; 2
    when the target cannot be written, or the run cannot be used: unreadable,
    unfinished, empty, without the implementation, or (without --allow-code-change) made
    by other code than this checkout (see `reports.sources.load_run`). A run with
    fail/error rows is written anyway, with a warning: the gate still fails on those rows.
    """
    args = _parse(baseline_parser(prog), argv)
    if isinstance(args, int):
        return args
    if args.target is None and args.impl is None:
        print(f"{prog}: error: give --to PATH (or --impl NAME for an implementation's baseline)", file=sys.stderr)
        return EXIT_USAGE
    try:
        run = load_run(args.source, require_current_code=not args.allow_code_change)
        frame, name = run.frame, None
        if args.impl is not None:
            name = resolve_implementation(run, args.impl)
            frame = implementation_rows(run.frame, name)
        target = writable_file(args.target or default_baseline_path(name))
    except (ReportInputError, OutputPathError, ValueError) as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if not len(frame):
        print(
            f"{prog}: error: {run.source} has no rows{f' of {name!r}' if name else ''}; "
            f"refusing to write an empty baseline",
            file=sys.stderr,
        )
        return EXIT_USAGE
    try:
        path = write_baseline(dataclasses.replace(run, frame=frame), target, implementation=name)
    except ReportInputError as exc:  # rows a baseline cannot hold, e.g. two with one row key
        print(f"{prog}: error: {run.source}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as exc:
        print(f"{prog}: error: {cannot_write(exc, target)}", file=sys.stderr)
        return EXIT_USAGE
    failing = frame["verdict"].isin(("fail", "error")).sum()
    if failing:
        print(f"{prog}: warning: {failing} rows are fail/error; the gate fails on them", file=sys.stderr)
    owner = f" of implementation {name!r}" if name else ""
    print(f"baseline written: {path} ({len(frame)} rows{owner})")
    return EXIT_OK


# ---------------------------------------------------------------------------- render


def _render_metadata(path: str | None, own: dict) -> dict:
    """The run metadata to render: the JSON object in `path`, else the run's own."""
    if not path:
        return own
    try:
        metadata = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ReportInputError(f"--metadata {path}: not a readable JSON file ({exc})") from None
    if not isinstance(metadata, dict):
        raise ReportInputError(f"--metadata {path}: expected a JSON object, got a {type(metadata).__name__}")
    return metadata


def render_main(argv: Sequence[str] | None = None, *, prog: str = RENDER_PROG) -> int:
    """`render --rows RUN --out DIR [--metadata META.json] [--baseline B]`; exit 0 or 2.

    A rendered folder is a copy of the run: its manifest, row stream and reports.
    """
    parser = argparse.ArgumentParser(prog=prog, description="Write every report format again from a finished run.")
    parser.add_argument("--rows", required=True, help="run folder, report.json, rows.jsonl or rows.csv")
    parser.add_argument("--out", required=True, help="folder to write the reports into")
    parser.add_argument("--metadata", help="JSON file with run metadata (default: the run's own, if any)")
    parser.add_argument("--baseline", help="baseline to compute drift against")
    args = _parse(parser, argv)
    if isinstance(args, int):
        return args
    try:
        run = load_run(args.rows)
        metadata = _render_metadata(args.metadata, run.metadata)
        out = writable_folder(args.out)
        if run.manifest is not None and out.resolve() == run.source.resolve().parent:
            raise OutputPathError(f"{out} holds the run being rendered; render into another folder")
        with WriterLock(out, f"render ({run.source})"):  # one writer per run folder
            if run.manifest is None:
                paths = write_all(run.frame, metadata, out, baseline=args.baseline)
            else:  # a copy of the run: its manifest, stream and reports
                records = frame_to_json_records(run.frame)
                paths = write_run_folder(out, records, metadata, run.manifest, baseline=args.baseline)
    except (ReportInputError, OutputPathError, OSError) as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    print(paths["html"])
    return EXIT_OK
