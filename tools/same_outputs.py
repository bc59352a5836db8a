"""Whether a change moves any output: the default suite's rows, and every report written from the same rows, at two
commits. A refactor must move none (the timing columns aside, which are the run's own).

    python tools/same_outputs.py [BEFORE [AFTER]]    defaults: main and HEAD; run with the project's .venv

Each commit is checked out in a temporary worktree and runs the default suite against its own baselines/default.csv,
each with a fresh cache (so neither reuses what the other stored); then both commits render the first run's rows
again (`mhc-parity render --baseline`). Exit 0 when nothing moved, 1 naming what moved, 2 on a bad commit.
"""

from __future__ import annotations

import csv
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPORTS = ("report.html", "summary.md", "report.json", "rows.csv")


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], check=True, capture_output=True, text=True).stdout.strip()


def _cli(tree: Path, cache: Path, *args: str) -> None:
    """`mhc-parity ARGS` with `tree`'s package first on the path; exit codes 0 and 1 are both results here."""
    env = {**os.environ, "PYTHONPATH": str(tree), "MHC_PARITY_CACHE": str(cache)}
    done = subprocess.run([sys.executable, "-m", "mhc_parity.harness", *args], cwd=tree, env=env)
    if done.returncode not in (0, 1):
        raise SystemExit(f"mhc-parity {' '.join(args)} at {tree.name} exited {done.returncode}")


def _timing_columns(tree: Path) -> tuple[str, ...]:
    code = "from mhc_parity.records.schema import TIMING_COLUMNS; print(' '.join(TIMING_COLUMNS))"
    env = {**os.environ, "PYTHONPATH": str(tree)}
    return tuple(
        subprocess.run(
            [sys.executable, "-c", code], cwd=tree, env=env, check=True, capture_output=True, text=True
        ).stdout.split()
    )


def rows_moved(before: Path, after: Path, timing: tuple[str, ...]) -> list[str]:
    """The differences of two rows.csv files, timing columns aside: one line each (the first 20)."""

    def read(path: Path) -> tuple[list[str], list[dict]]:
        with path.open(newline="", encoding="utf-8") as handle:
            reader = csv.DictReader(handle)
            return list(reader.fieldnames or ()), list(reader)

    (columns_a, rows_a), (columns_b, rows_b) = read(before), read(after)
    if columns_a != columns_b:
        return [f"the columns differ: {sorted(set(columns_a) ^ set(columns_b)) or 'in their order'}"]
    if len(rows_a) != len(rows_b):
        return [f"{len(rows_a)} rows before, {len(rows_b)} after"]
    moved = [
        f"row {index + 2} ({a.get('case')} {a.get('candidate')} {a.get('leaf')}) {name}: {a[name]!r} -> {b[name]!r}"
        for index, (a, b) in enumerate(zip(rows_a, rows_b, strict=True))
        for name in columns_a
        if name not in timing and a[name] != b[name]
    ]
    return moved[:20] + ([f"... {len(moved) - 20} more"] if len(moved) > 20 else [])


def main(argv: list[str]) -> int:
    if len(argv) > 2:
        print(__doc__, file=sys.stderr)
        return 2
    revisions = argv + ["main", "HEAD"][len(argv) :]
    try:
        commits = [_git("rev-parse", "--verify", f"{rev}^{{commit}}") for rev in revisions]
    except subprocess.CalledProcessError:
        print(f"not a commit: {' or '.join(revisions)}", file=sys.stderr)
        return 2
    scratch = Path(tempfile.mkdtemp(prefix="same-outputs-"))
    trees = [scratch / name for name in ("before", "after")]
    for tree, commit in zip(trees, commits, strict=True):
        _git("worktree", "add", "--detach", str(tree), commit)
    try:
        for tree in trees:
            _cli(
                tree,
                scratch / f"cache-{tree.name}",
                "run",
                "--suite",
                "default",
                "--out",
                str(scratch / f"run-{tree.name}"),
                "--baseline",
                str(tree / "baselines/default.csv"),
            )
        moved = rows_moved(scratch / "run-before/rows.csv", scratch / "run-after/rows.csv", _timing_columns(trees[1]))
        for tree in trees:
            _cli(
                tree,
                scratch / f"cache-{tree.name}",
                "render",
                "--rows",
                str(scratch / "run-before"),
                "--out",
                str(scratch / f"render-{tree.name}"),
                "--baseline",
                str(trees[0] / "baselines/default.csv"),
            )
        moved += [
            f"{name} written from the same rows differs"
            for name in REPORTS
            if (scratch / "render-before" / name).read_bytes() != (scratch / "render-after" / name).read_bytes()
        ]
    finally:
        for tree in trees:
            _git("worktree", "remove", "--force", str(tree))
    print(f"{revisions[0]} ({commits[0][:7]}) -> {revisions[1]} ({commits[1][:7]}); runs and renders in {scratch}")
    print("\n".join(moved) if moved else "nothing moved: the default suite's rows and every report are identical")
    return 1 if moved else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
