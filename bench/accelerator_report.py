"""The summary lines of `bench/accelerator_check.sh` (run with the project's .venv python).

probe [EXPECTED]   one line: JAX's backend, devices and matmul precision record;
                   exit 3 when EXPECTED ("tpu", "cuda" or "cuda13", the installed extra) is not
                   what JAX sees, 0 otherwise
paths RUN_DIR      one line per candidate path of a parity run: verdict counts, the
                   devices it ran on and its effective matmul precision; exit 1 if a
                   row failed or errored
"""

from __future__ import annotations

import collections
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from mhc_parity.harness.env import ensure_host_devices  # noqa: E402 - after the project is on the path

ensure_host_devices()  # this script is an entry point: before anything computes

import jax  # noqa: E402

from mhc_parity.harness.engine.run_info import run_metadata  # noqa: E402
from mhc_parity.reports import load_run  # noqa: E402

# The JAX platform an accelerator extra of pyproject.toml provides.
EXTRA_PLATFORM = {"tpu": "tpu", "cuda": "gpu", "cuda13": "gpu"}


def probe(expected_extra: str = "") -> int:
    meta = run_metadata()
    print(
        f"backend: {meta['backend']} ({meta['device_count']} x {meta['device_kind']}); "
        f"host cpu devices: {meta['host_cpu_devices']}; matmul precision: {meta['matmul_precision']}"
    )
    wanted = EXTRA_PLATFORM.get(expected_extra)
    if wanted and jax.default_backend() != wanted:
        print(
            f"error: the '{expected_extra}' extra is installed but JAX's default backend is "
            f"{jax.default_backend()!r}, not {wanted!r}"
        )
        return 3
    return 0


def path_lines(rows: list[dict]) -> list[str]:
    """One line per candidate path, in first-seen order."""
    order: dict[str, collections.Counter] = {}
    where: dict[str, set] = collections.defaultdict(set)
    for row in rows:
        order.setdefault(row["candidate"], collections.Counter())[row["verdict"]] += 1
        if row.get("devices"):
            where[row["candidate"]].add(f"{row['devices']} at {row['matmul_precision']}")
    lines = []
    for candidate, counts in order.items():
        tally = ", ".join(f"{counts[v]} {v}" for v in ("pass", "fail", "error", "skip", "unsupported") if counts[v])
        placed = "; ".join(sorted(where[candidate])) or "did not run"
        lines.append(f"path {candidate}: {tally} [{placed}]")
    return lines


def paths(run_dir: str) -> int:
    frame = load_run(run_dir).frame
    rows = frame.to_dict(orient="records")
    for line in path_lines(rows):
        print(line)
    return 1 if frame["verdict"].isin(("fail", "error")).any() else 0


def main(argv: list[str]) -> int:
    if argv[:1] == ["probe"]:
        return probe(argv[1] if len(argv) > 1 else "")
    if argv[:1] == ["paths"] and len(argv) == 2:
        return paths(argv[1])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
