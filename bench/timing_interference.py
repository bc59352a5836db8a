"""A path's device time alone, and with a parity run's background work running beside it (issue 55).

    python bench/timing_interference.py --out DIR [--case NAME] [--beside NAME] [--path reference]

Issue 55's `reference/unsharded` of `lite-n4-c1024-b1s128-f32-w32-identity-default` took 185 ms
per timed repeat on the v5e while its first call took 31 ms. Before the fix, a run timed a path's
repeats while its pool computed the next cases' oracle answers and compiled their programs
(`mhc_parity.harness.engine.runner.Runner.run`). This script measures what that does: the path's
program (`ProgramCache.run`, then `ProgramCache.device_time`, the run's own timing) on `--case`,

- `alone`: nothing else running (what a run now times, `mhc_parity.harness.engine.quiet`);
- `oracle beside`: the float64 oracle of `--beside` computed in another thread meanwhile (not
  from the cache: computed, as a cold run's pool does);
- `compile beside`: the programs of `--beside`'s paths traced, lowered and compiled in another
  thread meanwhile (not from the store), as the pool compiles ahead.

Each condition is timed `--repeats` times, the conditions in turn (a shared machine's load
drifts; the background restarted as often as needed to last through the timing); the table
gives each one's median and range. On a CPU the program
and the background share the host's cores; on a TPU the program runs on the chip, but its
dispatch and wait need the GIL and host cores the background holds. Writes DIR/timing-interference.json
and .md, and prints the table.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import platform
import statistics
import sys
import threading

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from mhc_parity.harness.env import ensure_host_devices  # noqa: E402

ensure_host_devices()

import jax  # noqa: E402

from mhc_parity.cases import registry  # noqa: E402
from mhc_parity.cases.fixtures import make_fixture  # noqa: E402
from mhc_parity.harness.engine.implementations import BUILTIN  # noqa: E402
from mhc_parity.harness.engine.oracle_path import run_oracle_path  # noqa: E402
from mhc_parity.harness.engine.paths import Path  # noqa: E402
from mhc_parity.harness.engine.program_cache import ProgramCache  # noqa: E402

ISSUE_CASE = "lite-n4-c1024-b1s128-f32-w32-identity-default"
# The case after it in the default suite: a run's pool computes its oracle while ISSUE_CASE runs.
NEXT_CASE = "lite-n4-c1024-b1s128-bf16-w32-mlp-default"


class Beside:
    """Background work repeated in a thread until stopped: `work()` called again and again."""

    def __init__(self, work):
        self.work, self.stop, self.rounds = work, threading.Event(), 0
        self.thread = threading.Thread(target=self._loop, name="beside", daemon=True)

    def _loop(self):
        while not self.stop.is_set():
            self.work()
            self.rounds += 1

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", default=ISSUE_CASE)
    parser.add_argument("--beside", default=NEXT_CASE, help="the case whose oracle / programs run beside")
    parser.add_argument("--path", default="reference", help="a built-in implementation's name")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--out", required=True, type=pathlib.Path)
    args = parser.parse_args(argv)
    case, beside = registry.get(args.case), registry.get(args.beside)
    fixture, beside_fixture = make_fixture(case), make_fixture(beside)
    path = Path(BUILTIN[args.path])
    cache = ProgramCache()
    first = cache.run(path, case, fixture)

    def timed() -> float:
        return cache.device_time(path, case, fixture)[0]

    def oracle_work():
        run_oracle_path(beside, beside_fixture)

    def compile_work():
        ProgramCache().prepare([Path(impl) for impl in BUILTIN.values()], beside, beside_fixture)
        jax.clear_caches()  # the next round traces again, as a new case's programs are

    conditions = {"alone": None, "oracle beside": oracle_work, "compile beside": compile_work}
    results = {name: [] for name in conditions}
    for _ in range(args.repeats):  # the conditions interleaved: a shared machine's load drifts
        for name, work in conditions.items():
            if work is None:
                results[name].append(timed())
                continue
            with Beside(work):
                results[name].append(timed())
    for name, times in results.items():
        print(name, [f"{t * 1e3:.2f}" for t in times], flush=True)
    alone = statistics.median(results["alone"])
    lines = [
        f"`{' '.join(['python', 'bench/timing_interference.py', *argv])}`: {path.name} of {case.name}, "
        f"first call {first.execute_first_s * 1e3:.2f} ms; beside it: {beside.name}.",
        "",
        "| condition | median ms | min ms | max ms | × alone |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, times in results.items():
        median = statistics.median(times)
        lines.append(
            f"| {name} | {median * 1e3:.2f} | {min(times) * 1e3:.2f} | {max(times) * 1e3:.2f} | {median / alone:.2f} |"
        )
    table = "\n".join(lines) + "\n"
    environment = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "backend": jax.default_backend(),
        "device_kind": jax.devices()[0].device_kind,
        "cpu_count": os.cpu_count(),
        "load_average": os.getloadavg(),
        "jax_version": jax.__version__,
        "python_version": platform.python_version(),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "timing-interference.json").write_text(
        json.dumps({"environment": environment, "first_s": first.execute_first_s, "times_s": results}, indent=1)
    )
    (args.out / "timing-interference.md").write_text(table + f"\n{json.dumps(environment)}\n")
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
