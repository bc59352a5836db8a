"""Benchmark `python -m harness run` on a suite: cold and warm wall time, where it goes.

Usage (from the project root):  .venv/bin/python bench/parity_bench.py [--suite default]

Runs the CLI twice in subprocesses sharing one fresh cache folder (MHC_PARITY_CACHE):
the first run is cold (no fixtures, no persistent compilation cache), the second warm.
For each it prints the process wall time, the runner's wall time, the share spent
compiling and executing the paths' programs, in the oracle, fixtures and TPU lowering,
the rest (metrics, policy, row I/O: the harness overhead), the report-writing time, and
the peak resident memory of the run; then the sharpness of the bounds (bound usage of
the passing rows per comparison × activation dtype). Targets (issue 5): cold < 300 s, warm < 90 s,
harness overhead < 10% of wall.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import resource
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from reports.text import format_number, format_text_table  # noqa: E402 - after the project is on the path


def _row_seconds(rows: list[dict]) -> tuple[float, float]:
    """Compile and execute seconds, counted once per (case, candidate path)."""
    seen = {}
    for row in rows:
        if row["comparison"] in ("vs_oracle", "vs_reference", "vs_unsharded"):
            seen[(row["case"], row["candidate"])] = (row["compile_s"] or 0.0, row["execute_s"] or 0.0)
    return sum(c for c, _ in seen.values()), sum(e for _, e in seen.values())


def run_once(suite: str, cache: pathlib.Path, out: pathlib.Path) -> dict:
    """One CLI run in a child process; returns its figures."""
    env = dict(os.environ, MHC_PARITY_CACHE=str(cache))
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "harness", "run", "--suite", suite, "--out", str(out), "--quiet"],
        cwd=ROOT, env=env, capture_output=True, text=True,
    )
    process_wall = time.perf_counter() - start
    peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    if proc.returncode not in (0, 1):
        raise SystemExit(f"harness run failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    report = json.loads((out / "report.json").read_text())
    meta = report["metadata"]
    compile_s, execute_s = _row_seconds(report["rows"])
    runner_wall = meta["wall_seconds"]
    accounted = compile_s + execute_s + meta["oracle_s"] + meta["fixtures_s"] + meta["lowering_s"]
    return {
        "exit_code": proc.returncode,
        "process_wall_s": process_wall,
        "runner_wall_s": runner_wall,
        "compile_s": compile_s,
        "execute_s": execute_s,
        "oracle_s": meta["oracle_s"],
        "fixtures_s": meta["fixtures_s"],
        "lowering_s": meta["lowering_s"],
        "overhead_s": max(runner_wall - accounted, 0.0),
        "startup_and_reports_s": process_wall - runner_wall,
        # ru_maxrss of children is the largest child so far (KiB on Linux).
        "peak_rss_mib": max(peak_kib, before) / 1024,
        "rows": len(report["rows"]),
        "sharpness": report["summary"].get("sharpness", []),
    }


def _print(label: str, figures: dict) -> None:
    wall = figures["process_wall_s"]
    print(f"\n{label}: {wall:.1f} s process wall ({figures['rows']} rows, exit {figures['exit_code']})")
    keys = ("compile_s", "execute_s", "oracle_s", "fixtures_s", "lowering_s", "overhead_s", "startup_and_reports_s")
    body = [[key[:-2], f"{figures[key]:.1f} s", f"{100 * figures[key] / wall:.1f}%"] for key in keys]
    body.append(["peak memory", f"{figures['peak_rss_mib']:.0f} MiB", ""])
    print(format_text_table(["where", "time", "share"], body, indent="  "))


def _print_sharpness(groups: list[dict]) -> None:
    """Bound usage of the passing rows per comparison x activation dtype (how sharp the bounds are)."""
    print("\nsharpness (bound usage of passing rows)")
    body = [[g["comparison"], g["act_dtype"], g["passing"],
             *(format_number(g[k]) for k in ("median_usage", "p90_usage", "max_usage"))] for g in groups]
    print(format_text_table(["comparison", "act dtype", "passing", "median", "p90", "max"], body, indent="  "))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--suite", default="default")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="mhc-bench-") as tmp:
        tmp_path = pathlib.Path(tmp)
        cold = run_once(args.suite, tmp_path / "cache", tmp_path / "cold")
        warm = run_once(args.suite, tmp_path / "cache", tmp_path / "warm")
    _print(f"cold ({args.suite})", cold)
    _print(f"warm ({args.suite})", warm)
    _print_sharpness(warm["sharpness"])
    # Harness overhead: work that is neither a path's program nor the oracle nor lowering.
    overhead_share = 100 * (warm["overhead_s"] + warm["fixtures_s"]) / warm["process_wall_s"]
    print(
        f"\ntargets: cold {cold['process_wall_s']:.0f} s (< 300), warm {warm['process_wall_s']:.0f} s (< 90), "
        f"harness overhead {overhead_share:.1f}% of warm wall (< 10)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
