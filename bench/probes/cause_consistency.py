"""What the rule that a cause must hold across its implementation changes in a kill matrix's rows.

Usage (from the project root, after `mhc-parity faults ... --out FAULTS`; on a TPU VM too):
    .venv/bin/python bench/probes/cause_consistency.py --rows FAULTS/perturbed_rows.csv --out DIR

For each fault and dtype slice, its failing rows counted by cause id as the cases named them
(the rows as recorded) and as every report states them (`mhc_parity.records.cause_consistency`:
a rounding named on fewer of an implementation's failing leaves than no rounding explains is
not named), and per fault the places not named with their counts. Writes DIR/cause_consistency.md
and prints it. Issue 56, item 7: on the TPU v5e the mosaic path's rows of
`kernel.accumulators_reset_every_block` (the default suite) should all read "unexplained"
after; the precision faults' own causes (`causes` in the catalogue) should keep their rows.
Loads no JAX.
"""

from __future__ import annotations

import argparse
import collections
import csv
import math
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

from mhc_parity.records.cause_consistency import as_recorded, consistent_causes, unheld_places  # noqa: E402

SHOWN = 6  # cause ids shown per slice, the commonest first


def _counts(rows) -> str:
    counted = collections.Counter(str(r["cause_id"]) for r in rows if r["verdict"] == "fail" and r["cause_id"])
    shown = ", ".join(f"{cause_id} {n}" for cause_id, n in counted.most_common(SHOWN))
    more = len(counted) - SHOWN
    return shown + (f" (+{more} more ids)" if more > 0 else "")


def report(rows: list[dict]) -> str:
    """The before/after table of `rows` (a kill matrix's perturbed rows, with `perturbation`)."""
    by_fault: dict[str, list[dict]] = collections.defaultdict(list)
    for row in rows:
        by_fault[row["perturbation"]].append(row)
    lines = ["| fault | slice | failing rows | as the cases named them | as stated |", "|---|---|---:|---|---|"]
    notes = []
    for fault, members in by_fault.items():
        stated = consistent_causes(members)
        recorded = [as_recorded(r) for r in members]  # the file may state them already (written by the rule)
        for dtype in sorted({r["act_dtype"] for r in members}):
            before = [r for r in recorded if r["act_dtype"] == dtype]
            after = [r for r in stated if r["act_dtype"] == dtype]
            failing = sum(r["verdict"] == "fail" for r in before)
            if failing:
                lines.append(f"| {fault} | {dtype} | {failing} | {_counts(before)} | {_counts(after)} |")
        for (implementation, place), (named, unexplained, total) in sorted(unheld_places(members).items()):
            notes.append(
                f"- {fault}, {implementation}: the roundings at {place} not named (they fit {named} of "
                f"{total} failing leaves, no rounding {unexplained})"
            )
    return "\n".join(lines + [""] + (notes or ["- no place lost its name"])) + "\n"


def _row(record: dict) -> dict:
    value = record.get("cause_explained", "")
    record["cause_explained"] = float(value) if value not in ("", None) else math.nan
    return record


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", required=True, help="a kill matrix's perturbed_rows.csv")
    parser.add_argument("--out", required=True, help="folder for cause_consistency.md")
    args = parser.parse_args(argv)
    with open(args.rows, newline="", encoding="utf-8") as f:
        rows = [_row(r) for r in csv.DictReader(f)]
    text = report(rows)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "cause_consistency.md").write_text(text, encoding="utf-8")
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
