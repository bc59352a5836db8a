"""`mhc-parity gate`: a current run against a baseline (rules: `mhc_parity.reports.gate.rule`; the judgement `run
--baseline` shares: `mhc_parity.reports.gate.judgement`). Loads no JAX.

Exit 0 pass, 1 gate failure, 2 usage or input error: unreadable or mismatched runs (another policy
or matmul precision unless allowed, another backend, a baseline not covering the run, a current run
unfinished or made by other code, a baseline given as --current, a legacy baseline without
--allow-legacy-baseline, an unwritable --markdown path).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from mhc_parity.command_line import colour_wanted, paint_verdicts
from mhc_parity.harness.commands.common import EXIT_FAILED, EXIT_OK, Parser, error, parse
from mhc_parity.records.environment import run_precision
from mhc_parity.records.outputs import OutputPathError, cannot_write, writable_file
from mhc_parity.reports.gate.baseline_file import LEGACY_OPTION
from mhc_parity.reports.gate.comparability import current_cases
from mhc_parity.reports.gate.drift import (
    DEFAULT_GROWTH_FACTOR,
    DEFAULT_NOISE_FLOOR_ULPS,
    growth_factor_problem,
    noise_floor_problem,
    settings_note,
)
from mhc_parity.reports.gate.judgement import gate_run
from mhc_parity.reports.gate.rule import GateResult
from mhc_parity.reports.markdown import gate_markdown

GATE_PROG = "mhc-parity gate"


def gate_parser(prog: str = GATE_PROG) -> argparse.ArgumentParser:
    parser = Parser(
        prog=prog,
        description="Compare a parity run with the committed baseline; exit 0 pass, 1 fail, 2 input error.",
    )
    parser.add_argument("--baseline", required=True, help="baseline CSV (or any run: folder, report.json, rows file)")
    parser.add_argument(
        "--current",
        required=True,
        help="the run to judge: its folder or report.json (or its rows.jsonl/rows.csv beside its manifest); "
        "never a baseline file",
    )
    parser.add_argument(
        "--growth-factor",
        type=_checked(growth_factor_problem),
        default=DEFAULT_GROWTH_FACTOR,
        help=f"fail when an oracle-relative error grows by more than this (default {DEFAULT_GROWTH_FACTOR:g})",
    )
    parser.add_argument(
        "--noise-floor-ulps",
        type=_checked(noise_floor_problem),
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
    parser.add_argument(
        LEGACY_OPTION,
        action="store_true",
        help="read a baseline in a legacy format (1 or 2), whose header or rows no digest covers; "
        "the gate says what went unverified",
    )
    return parser


def _checked(problem):
    """An argparse type: a float that `problem` finds nothing wrong with."""

    def parse_value(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if problem(value):
            raise argparse.ArgumentTypeError(problem(value))
        return value

    return parse_value


def _fail(message: str) -> int:
    return error(message)


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


def main(argv: Sequence[str] | None = None, *, prog: str = GATE_PROG) -> int:
    parser = gate_parser(prog)
    args = parse(parser, argv)
    if isinstance(args, int):
        return args
    try:
        markdown_path = writable_file(args.markdown) if args.markdown else None
    except OutputPathError as exc:
        return _fail(f"--markdown: {exc}")
    gated = gate_run(
        args.baseline,
        args.current,
        growth_factor=args.growth_factor,
        noise_floor_ulps=args.noise_floor_ulps,
        allow_policy_change=args.allow_policy_change,
        allow_precision_change=args.allow_precision_change,
        only_current_cases=args.only_current_cases,
        allow_code_change=args.allow_code_change,
        allow_legacy=args.allow_legacy_baseline,
    )
    judgement, baseline, current = gated.judgement, gated.baseline, gated.current
    if judgement.result is None:
        return _fail(judgement.refusal)
    result = judgement.result
    note = settings_note(args.growth_factor, args.noise_floor_ulps)
    for line in ([note] if note else []) + list(judgement.scope):
        print(line)
    table = result.table()
    print(paint_verdicts(table) if colour_wanted() else table)
    for note in _notes(result, baseline, current, args.only_current_cases):
        print(note)
    if baseline.note:
        print(baseline.note)
    if judgement.isa_note:
        print(judgement.isa_note)
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
