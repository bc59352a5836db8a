"""``python -m mhc_parity.cases``: show the catalogue.

    python -m mhc_parity.cases list [--suite S] [--cases GLOB,...] [--tags T,...] [--dtype D] [--case-file F ...]
    python -m mhc_parity.cases suites [--case-file F ...]
    python -m mhc_parity.cases families

`list` prints one row per selected case (name, shape, dtypes, variant, branch, init,
mesh, blocks, matmul precision, tags, expectation) and the count; `suites` prints every suite with its
case count and description; `families` prints each init family and what it stresses.
Exit status 2 on a usage error (unknown suite/case, malformed case file); 141, quietly,
when stdout's reader went away (`| head`), as in `mhc-parity`.
"""

from __future__ import annotations

import argparse
import sys

from mhc_parity.cases.init_families import INIT_FAMILIES
from mhc_parity.cases.registry import fresh_registry
from mhc_parity.cases.spec import CaseSpecError
from mhc_parity.cases.toml_cases import register_case_file
from mhc_parity.records.outputs import exit_code_through_closed_stdout
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


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m mhc_parity.cases", description="Show the mhc-parity case catalogue."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    listing = sub.add_parser("list", help="list cases (all, or a selection)")
    listing.add_argument("--suite", help="only this suite (smoke, default, full, adversarial, sharded, tpu, user)")
    listing.add_argument("--cases", action="append", help="name glob(s), comma separated; repeatable")
    listing.add_argument("--tags", action="append", help="required tags, comma separated; '!tag' excludes")
    listing.add_argument("--dtype", help="activation dtype: float32/f32 or bfloat16/bf16")
    for command in (listing, sub.add_parser("suites", help="list suites and their sizes")):
        command.add_argument("--case-file", action="append", default=[], help="TOML file of user cases")
    sub.add_parser("families", help="list init families and what each stresses")
    return parser


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "families":
        for family in INIT_FAMILIES.values():
            print(f"{family.name}\n    " + "\n    ".join(family.stresses.splitlines()) + "\n")
        return 0

    registry = fresh_registry()
    try:
        for path in args.case_file:
            register_case_file(path, registry)
        if args.command == "suites":
            rows = [
                {"suite": name, "cases": str(len(registry.suite(name))), "description": description}
                for name, description in registry.suites().items()
            ]
        else:
            selected = registry.select(suite=args.suite, names=args.cases, tags=args.tags, dtype=args.dtype)
    except (CaseSpecError, KeyError, ValueError, OSError) as error:
        message = error.args[0] if isinstance(error, KeyError) and error.args else error
        print(f"error: {message}", file=sys.stderr)
        return 2
    # Printed outside the try: a closed stdout (BrokenPipeError, an OSError) is no usage error.
    if args.command == "suites":
        print(format_table(rows, ("suite", "cases", "description")))
        return 0
    print(format_table([case.describe() for case in selected]))
    what = f"suite {args.suite!r}" if args.suite else "the catalogue"
    print(f"\n{len(selected)} case(s) from {what}")
    return 0


if __name__ == "__main__":
    sys.exit(exit_code_through_closed_stdout(main))
