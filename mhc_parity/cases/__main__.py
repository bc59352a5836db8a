"""``mhc-parity cases`` (also ``python -m mhc_parity.cases``): show the catalogue.

mhc-parity cases [list] [--suite S] [--cases GLOB,...] [--tags T,...] [--dtype D] [--case-file F ...]
mhc-parity cases suites [--case-file F ...]
mhc-parity cases families
"""

from __future__ import annotations

import argparse
import functools
import sys

from mhc_parity.cases.init_families import INIT_FAMILIES
from mhc_parity.cases.registry import fresh_registry
from mhc_parity.cases.spec import CaseSpecError
from mhc_parity.cases.toml_cases import register_case_file
from mhc_parity.command_line import Parser, error
from mhc_parity.records.outputs import exit_code_through_closed_stdout
from mhc_parity.records.run_suite import USER_SUITE
from mhc_parity.records.text import format_text_table

COLUMNS = (
    "name",
    "shape",
    "tokens",
    "dtype",
    "weights",
    "variant",
    "branch",
    "init",
    "mesh",
    "blocks",
    "precision",
    "tags",
    "expect",
)


def format_table(rows: list[dict[str, str]], columns=COLUMNS) -> str:
    """The rows' `columns` as a plain-text table (cells never cut: a listing is complete)."""
    return format_text_table(columns, [[row[c] for c in columns] for row in rows], limit=None)


SUBCOMMANDS = ("list", "suites", "families")
CATALOGUE = "catalogue"


def _parser(prog: str) -> argparse.ArgumentParser:
    parser = Parser(prog=prog, description="Show the mhc-parity case catalogue (`list` unless another is named).")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    listing = sub.add_parser("list", help="list cases (all, or a selection)")
    listing.add_argument(
        "--suite",
        help="only this suite (smoke, default, full, adversarial, sharded, tpu, user), the --case-file cases "
        "marked (default: every case, or with --case-file only its cases)",
    )
    listing.add_argument("--cases", action="append", help="name glob(s), comma separated; repeatable")
    listing.add_argument("--tags", action="append", help="required tags, comma separated; '!tag' excludes")
    listing.add_argument("--dtype", help="activation dtype: float32/f32 or bfloat16/bf16")
    for command in (listing, sub.add_parser("suites", help="list suites and their sizes")):
        command.add_argument("--case-file", action="append", default=[], help="TOML file of user cases")
    sub.add_parser("families", help="list init families and what each stresses")
    return parser


def main(argv=None, *, prog: str = "mhc-parity cases") -> int:
    """List the catalogue as `argv` asks (`list` when it names no other listing); the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in SUBCOMMANDS + ("-h", "--help"):
        argv = ["list", *argv]
    try:
        args = _parser(prog).parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    if args.command == "families":
        for family in INIT_FAMILIES.values():
            print(f"{family.name}\n    " + "\n    ".join(family.stresses.splitlines()) + "\n")
        return 0

    registry = fresh_registry()
    from_file: dict[str, str] = {}
    try:
        for path in args.case_file:
            from_file.update((case.name, str(path)) for case in register_case_file(path, registry))
        if args.command == "suites":
            rows = [
                {"suite": name, "cases": str(len(registry.suite(name))), "description": description}
                for name, description in registry.suites().items()
            ]
        else:
            suite = args.suite or (USER_SUITE if args.case_file else None)
            selected = registry.select(suite=suite, names=args.cases, tags=args.tags, dtype=args.dtype)
    except (CaseSpecError, KeyError, ValueError, OSError) as exc:
        return error(exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc))
    # Printed outside the try: a closed stdout (BrokenPipeError, an OSError) is no usage error.
    if args.command == "suites":
        print(format_table(rows, ("suite", "cases", "description")))
        return 0
    described = [case.describe() for case in selected]
    columns = COLUMNS
    if args.case_file and args.suite:  # the catalogue's and the file's cases together: mark the file's
        columns = (*COLUMNS, "from")
        described = [{**row, "from": from_file.get(row["name"], CATALOGUE)} for row in described]
    print(format_table(described, columns))
    what = f"suite {args.suite!r}" if args.suite else ("the case file(s)" if args.case_file else "the catalogue")
    print(f"\n{len(selected)} case(s) from {what}")
    return 0


if __name__ == "__main__":
    sys.exit(exit_code_through_closed_stdout(functools.partial(main, prog="python -m mhc_parity.cases")))
