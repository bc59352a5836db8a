"""Where a run's own process spends its time: `mhc-parity run RUN-ARGS` under cProfile.

    python bench/probes/run_profile.py [--numbers-here] [--top N] [--stats FILE] -- RUN-ARGS...

Prints the run's exit code and wall time, the peak resident memory of its own process (the
oracle's process apart), its own timings (report.json's `*_s` metadata), and the N functions of
the main thread with the most cumulative time. Threads are not profiled (the compiles started
ahead, the wait for the oracle's process): their time shows as the main thread's waits, and
cProfile may charge such a wait to an unrelated frame (once a matplotlib function, with the whole
wall time), so read the harness's own functions. A warm cache answers the comparisons from its
store and measures none of them: point `MHC_PARITY_CACHE` at a folder holding only the fixtures
and oracle answers to measure them.

--numbers-here: compute a `tpu`-tagged case's numbers on this backend too, which a run refuses
off a TPU (`mhc_parity.harness.engine.plan.numbers_refusal`, lifted in this process only). Its
paths then run in interpret mode, so only the host's share (the comparisons, the oracle) says
anything about a TPU run. On 2026-12-06 it measured the comparisons of an 8192-token case
(docs/results/tpu-suite-tpu-v5e.md).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pathlib
import pstats
import resource
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from mhc_parity.harness import cli  # noqa: E402
from mhc_parity.harness.commands.run import run_parser  # noqa: E402
from mhc_parity.harness.engine import plan, runner  # noqa: E402


def lift_tpu_refusal() -> None:
    """Every module that asks `numbers_refusal` gets "" (numbers everywhere) in this process:
    each looks the name up in its own globals when a case is planned."""
    plan.numbers_refusal = runner.numbers_refusal = lambda case: ""


def run_timings(run_args: list[str]) -> dict:
    """The `*_s` metadata of the run's report.json (in its `--out`, as `run` reads its arguments),
    or {} where there is none."""
    report = run_parser().parse_args(run_args).out / "report.json"
    if not report.is_file():
        return {}
    metadata = json.loads(report.read_text())["metadata"]
    return {key: value for key, value in metadata.items() if key.endswith("_s")}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--numbers-here", action="store_true", help="lift the tpu tag's refusal of numbers off a TPU")
    parser.add_argument("--top", type=int, default=40, help="functions to print, by cumulative time")
    parser.add_argument("--stats", type=pathlib.Path, help="also write the raw profile here (pstats)")
    parser.add_argument("run_args", nargs=argparse.REMAINDER, help="-- then `mhc-parity run`'s arguments")
    args = parser.parse_args()
    run_args = args.run_args[1:] if args.run_args[:1] == ["--"] else args.run_args
    if not run_args:
        parser.error("give `mhc-parity run`'s arguments after --")
    if args.numbers_here:
        lift_tpu_refusal()
    profile = cProfile.Profile()
    start = time.perf_counter()
    profile.enable()
    try:
        code = cli.main(["run", *run_args])
    finally:
        profile.disable()
    wall = time.perf_counter() - start
    if args.stats:
        profile.dump_stats(args.stats)
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("cumulative").print_stats(args.top)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    print(f"exit {code}, wall {wall:.1f} s, own peak resident {peak / 2**30:.2f} GiB")
    print(f"the run's timings: {run_timings(run_args)}")
    print(text.getvalue())
    return 0


if __name__ == "__main__":
    sys.exit(main())
