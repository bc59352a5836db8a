"""Benchmark `mhc-parity run` on a suite: cold, warm and after a kernel edit, where the time goes.

Usage (from the project root):
    .venv/bin/python bench/parity_bench.py [--suite default|maxtext] [--jobs 1 2 | auto]

`make bench` runs both suites, the default suite then the maxtext suite, each into its results
file: its warm figures are those of a warm `make parity` and a warm `make parity-maxtext`.

For each --jobs value (a number, or `auto`: what `make parity` and `make parity-maxtext`
pass), CLI runs in subprocesses share one fresh cache folder (MHC_PARITY_CACHE: fixtures,
oracle answers, programs, JAX's persistent compilation cache). The default suite runs what
`make parity` runs (`--baseline baselines/default.csv`: the gate is part of its time), with
`--jobs 1 auto` unless given, three times:

  cold   nothing cached;
  warm   the same suite again, nothing changed (`WARM_REPEATS` times: the run of median
         wall is reported, the others beside it);
  edit   one kernel file changed: a copy of the project's sources in a temporary folder
         in which `mhc_parity/mhc/kernels/forward.py`'s post-forward kernel body multiplies its
         output by 1 (exact, so no number moves, but the program text changes). A comment
         would not do: JAX keys its cache on the program with debug information stripped,
         so a comment edit recompiles nothing. Every program that contains the
         post-forward kernel (the interpret paths and their TPU lowering) recompiles; the
         reference programs, fixtures and oracle answers come from the cache.

The maxtext suite runs what `make parity-maxtext` runs (`SUITES`: MaxText's implementations
beside this project's reference), with `--jobs 1` unless given (its cold run peaks near 10 GiB
in one process; two workers ran a shared 24 GiB machine out of memory), cold and warm only: an edit of a
MaxText file or of `mhc_parity/maxtext_parity/` misses every store entry of the run (they are
keyed by all the foreign code the process loaded: `mhc_parity.records.foreign_code`), so it
would measure a cold run again, with JAX's persistent cache warm; the installed MaxText copy is
not edited.

For each run it prints the process wall time and its shares, as the runner's own thread
spent it: the paths (waiting for their programs and running them), the float64 oracle,
fixtures, TPU lowering, process start-up plus report writing, and the rest of the
runner's time (metrics, policy, row I/O: harness overhead); with --jobs N > 1 these are
summed over the workers and shown as a share of N x the runner's wall time (worker
time). Programs compile in threads ahead of their case (`mhc_parity.harness.engine.runner.Runner.run`), so
the seconds the programs took to obtain (the rows' compile_s) overlap the rest: they are
printed beside, with the programs' execution (execute_s), not as shares. Also: the CPU
seconds the machine was busy during the run, peak resident memory (the largest single
process; workers report their own), the programs XLA compiled and those loaded
from the persistent cache, the oracle answers computed and loaded, the sharpness of the
bounds, and before each run the load average and a speed probe (fixed Python work on every
core at once: a shared machine's speed drifts between runs). The harness's own time is
start-up, report writing and the runner's overhead (scaled to the wall: ÷ N workers).
Targets for the 2-core CI machine per suite (`SUITES`: wall, CPU and own seconds). With
--results FILE (`make bench`:
docs/results/bench-<suite>.md) the same report is also written there with its date,
commit and machine.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import importlib.metadata
import io
import json
import math
import os
import pathlib
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from mhc_parity.harness.engine.run_info import git_commit  # noqa: E402 - after the project is on the path
from mhc_parity.harness.env import host_cpu  # noqa: E402
from mhc_parity.records.text import format_number, format_text_table  # noqa: E402
from mhc_parity.reports.writers import write_results  # noqa: E402

# The sources a run imports (the package, copied for the "edit" run) and the edit itself.
SOURCE_DIRS = ("mhc_parity",)
EDITED_FILE = "mhc_parity/mhc/kernels/forward.py"
EDIT_FROM = "    out_ref[...] = expand_streams(hres_ref[...], hpost_ref[...], x_ref[...], y_ref[...])\n"
EDIT_TO = "    out_ref[...] = expand_streams(hres_ref[...], hpost_ref[...], x_ref[...], y_ref[...]) * 1\n"
# The runner's timed parts (`mhc_parity.harness.engine.runner.TIMINGS`), summed over the workers.
# A warm run lasts seconds, and a shared machine's speed drifts by tenths of one between runs:
# the warm scenario runs this many times and the run of median wall stands for them (the
# others' walls and own times are printed beside it).
WARM_REPEATS = 3
_TIMED = ("paths_s", "oracle_s", "fixtures_s", "effects_s", "compare_s", "causes_s", "lowering_s")


@dataclasses.dataclass(frozen=True)
class SuiteRuns:
    """How a suite is benchmarked: the run's arguments beyond `--suite`, its scenarios, the
    --jobs values measured unless given, and each scenario's targets on the 2-core CI machine:
    process wall seconds, CPU seconds (which a busy machine moves less than walls) and the
    harness's own seconds (`own_seconds`)."""

    arguments: tuple[str, ...]
    scenarios: tuple[str, ...]
    jobs: tuple[str, ...]
    wall_targets: dict[str, float]
    cpu_targets: dict[str, float] = dataclasses.field(default_factory=dict)
    own_targets: dict[str, float] = dataclasses.field(default_factory=dict)


# The baseline `make parity` judges the default suite against on a CPU (the Makefile's DEFAULT_BASELINE),
# by absolute path: the edit scenario runs from a copy of the sources without it.
DEFAULT_BASELINE = ROOT / "baselines" / "default.csv"
SUITES = {
    # `make parity`'s command line (the Makefile's parity target, --jobs auto there).
    # A warm run near the time its programs take to run; an edit and a cold run in CPU seconds.
    "default": SuiteRuns(
        ("--baseline", str(DEFAULT_BASELINE)),
        ("cold", "warm", "edit"),
        ("1", "auto"),
        {"warm": 5.0},
        {"cold": 200.0, "edit": 90.0},
        {"warm": 2.0},
    ),
    # `make parity-maxtext`'s command line (the Makefile's parity-maxtext target). A warm run traces
    # every MaxText program to key it (docs/speed.md): about 1 s per kernel program on the 2-core
    # machine, 18 of them. (The cold run's 150 s target was --jobs auto's: none for --jobs 1.)
    "maxtext": SuiteRuns(
        ("--impl", "mhc_parity.maxtext_parity:implementations", "--paths", "reference/*", "maxtext-*"),
        ("cold", "warm"),
        ("1",),
        {"warm": 15.0},
    ),
}


def _seconds(value) -> float:
    """A timing cell as seconds: status rows (a path that did not run) hold nan, written "nan"."""
    seconds = value if isinstance(value, (int, float)) else 0.0
    return 0.0 if math.isnan(seconds) else float(seconds)


def _row_seconds(rows: list[dict]) -> tuple[float, float]:
    """Compile and execute seconds, counted once per (case, candidate path)."""
    seen = {}
    for row in rows:
        if row["comparison"] in ("vs_oracle", "vs_reference", "vs_unsharded"):
            seen[(row["case"], row["candidate"])] = (_seconds(row["compile_s"]), _seconds(row["execute_s"]))
    return sum(c for c, _ in seen.values()), sum(e for _, e in seen.values())


# Runs the command given as arguments and prints the largest resident memory of the processes
# it waited for (ru_maxrss of the waited-for descendants, KiB on Linux) and the CPU seconds
# they used (user + system): one fresh wrapper per run, so each run's figures are its own.
# Forked workers (mhc_parity.harness.processes.worker_processes) are not among them: their peak comes from the
# run's metadata and the CPU seconds from the machine's counters (`busy_cpu_seconds`).
_USAGE_PREFIX = "bench-peak-kib-cpu-s "
_USAGE_WRAPPER = (
    "import resource, subprocess, sys\n"
    "code = subprocess.run(sys.argv[1:]).returncode\n"
    "usage = resource.getrusage(resource.RUSAGE_CHILDREN)\n"
    f"print({_USAGE_PREFIX!r} + str(usage.ru_maxrss) + ' ' + str(usage.ru_utime + usage.ru_stime), file=sys.stderr)\n"
    "sys.exit(code)\n"
)


def busy_cpu_seconds() -> float | None:
    """CPU seconds the whole machine has spent busy (not idle or waiting for I/O) since boot,
    from /proc/stat (None elsewhere). A run's difference counts all its processes, forked
    workers and their server included, and anything else running then (see the load note)."""
    try:
        fields = [int(v) for v in pathlib.Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return None
    user, nice, system, _idle, _iowait, irq, softirq = fields[:7]  # then steal (another VM's), guest (in user)
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


def edited_copy(
    destination: pathlib.Path, edited_file: str = EDITED_FILE, edit_from: str = EDIT_FROM, edit_to: str = EDIT_TO
) -> pathlib.Path:
    """A copy of the project's sources with a one-line edit of one file applied (by default the
    exact kernel edit above)."""
    for folder in SOURCE_DIRS:
        shutil.copytree(ROOT / folder, destination / folder, ignore=shutil.ignore_patterns("__pycache__"))
    target = destination / edited_file
    text = target.read_text()
    if text.count(edit_from) != 1:
        raise SystemExit(f"bench: cannot apply the edit: {edited_file} no longer has the line {edit_from!r}")
    target.write_text(text.replace(edit_from, edit_to))
    return destination


def run_once(
    suite: str,
    cache: pathlib.Path,
    out: pathlib.Path,
    jobs: str,
    project: pathlib.Path = ROOT,
    edited_file: str = EDITED_FILE,
    extra: tuple[str, ...] = (),
) -> dict:
    """One CLI run in a child process (from `project`'s sources, whose `edited_file` it checks
    the run used), with the suite's own arguments (`SUITES`) and `--jobs jobs` (a number or
    "auto", which the run resolves: its metadata says to what) and `extra` arguments; returns its figures."""
    env = dict(os.environ, MHC_PARITY_CACHE=str(cache))
    command = [
        sys.executable,
        "-m",
        "mhc_parity.harness",
        "run",
        "--suite",
        suite,
        *(SUITES[suite].arguments if suite in SUITES else ()),
        "--out",
        str(out),
        "--quiet",
        "--jobs",
        str(jobs),
        *extra,
    ]
    start, busy_start = time.perf_counter(), busy_cpu_seconds()
    proc = subprocess.run(
        [sys.executable, "-c", _USAGE_WRAPPER, *command], cwd=project, env=env, capture_output=True, text=True
    )
    process_wall, busy_end = time.perf_counter() - start, busy_cpu_seconds()
    peak_kib, cpu_s = proc.stderr.strip().splitlines()[-1].removeprefix(_USAGE_PREFIX).split()
    if proc.returncode not in (0, 1):
        raise SystemExit(f"mhc-parity run failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    report = json.loads((out / "report.json").read_text())
    if project != ROOT:  # the run really used the edited copy
        recorded = report["manifest"]["code_files"][edited_file]
        if recorded != hashlib.sha256((project / edited_file).read_bytes()).hexdigest():
            raise SystemExit("bench: the edit run did not use the edited sources")
    meta = report["metadata"]
    compile_s, execute_s = _row_seconds(report["rows"])
    runner_wall = meta["wall_seconds"]
    jobs = int(meta.get("jobs", 1))  # "auto" resolved
    worker_wall = jobs * runner_wall
    accounted = sum(meta.get(key, 0.0) for key in _TIMED)
    return {
        "jobs": jobs,
        "exit_code": proc.returncode,
        "process_wall_s": process_wall,
        "runner_wall_s": runner_wall,
        "compile_s": compile_s,
        "execute_s": execute_s,
        "paths_s": meta["paths_s"],
        "oracle_s": meta["oracle_s"],
        "fixtures_s": meta["fixtures_s"],
        "lowering_s": meta["lowering_s"],
        "effects_s": meta.get("effects_s", 0.0),
        "compare_s": meta.get("compare_s", 0.0),
        "causes_s": meta.get("causes_s", 0.0),
        "overhead_s": max(worker_wall - accounted, 0.0),
        "startup_and_reports_s": process_wall - runner_wall,
        "peak_rss_mib": max(int(peak_kib) / 1024, meta.get("worker_peak_rss_mib", 0)),
        "cpu_s": float(cpu_s) if busy_start is None else busy_end - busy_start,
        "programs_compiled": meta.get("programs_compiled"),
        "programs_loaded": meta.get("programs_loaded"),
        "programs_stored": (meta.get("programs_stored_loaded", 0), meta.get("programs_stored_missed", 0)),
        "programs_keyed": (
            meta.get("programs_traced_to_key", 0),
            meta.get("programs_lowered_to_key", 0),
            meta.get("program_keys_s", 0.0),
        ),
        "lowerings_stored": (meta.get("lowerings_stored_loaded", 0), meta.get("lowerings_stored_missed", 0)),
        "causes_stored": (meta.get("causes_stored_loaded", 0), meta.get("causes_stored_missed", 0)),
        "comparisons_stored": (meta.get("comparisons_stored_loaded", 0), meta.get("comparisons_stored_missed", 0)),
        "oracle_computed": meta.get("oracle_computed"),
        "oracle_cached": meta.get("oracle_cached"),
        "rows": len(report["rows"]),
        "sharpness": report["summary"].get("sharpness", []),
        "causes": report["summary"].get("causes", []),
    }


def median_run(tries: list[dict]) -> dict:
    """The figures of the run of median process wall among `tries` (one run's figures, not a
    mix); with more than one, each run's wall and own seconds under "repeats", in run order."""
    figures = dict(sorted(tries, key=lambda run: run["process_wall_s"])[len(tries) // 2])
    if len(tries) > 1:
        figures["repeats"] = [(run["process_wall_s"], own_seconds(run)) for run in tries]
    return figures


def own_seconds(figures: dict) -> float:
    """The harness's own seconds of the wall: start-up, reports, the comparisons and the runner's
    overhead (worker time with jobs > 1, so scaled back to the wall by 1/jobs). The comparisons
    were part of the overhead until the runner timed them (`compare_s`): the targets count them."""
    own_work = figures["overhead_s"] + figures.get("compare_s", 0.0)
    return figures["startup_and_reports_s"] + own_work / figures["jobs"]


def _verdict(value: float, target: float | None) -> str:
    return "" if target is None else f" (target <= {target:g}: {'met' if value <= target else 'MISSED'})"


def print_run(label: str, figures: dict) -> None:
    wall, jobs = figures["process_wall_s"], figures["jobs"]
    basis = wall if jobs == 1 else jobs * figures["runner_wall_s"]
    print(
        f"\n{label}: {wall:.1f} s process wall ({figures['rows']} rows, exit {figures['exit_code']})"
        + ("" if jobs == 1 else f"; component shares are of worker time ({jobs} x {figures['runner_wall_s']:.1f} s)")
    )
    if "repeats" in figures:
        walls = " / ".join(f"{wall:.1f}" for wall, _ in figures["repeats"])
        owns = " / ".join(f"{own:.1f}" for _, own in figures["repeats"])
        print(f"  the median of {len(figures['repeats'])} runs: walls {walls} s, harness's own {owns} s")
    keys = (*_TIMED, "overhead_s")
    body = [[key[:-2], f"{figures[key]:.1f} s", f"{100 * figures[key] / basis:.1f}%"] for key in keys]
    body.append(["  programs obtained", f"{figures['compile_s']:.1f} s", "loaded or compiled, mostly in threads ahead"])
    body.append(["  programs executed", f"{figures['execute_s']:.1f} s", "within paths"])
    body.append(
        [
            "startup_and_reports",
            f"{figures['startup_and_reports_s']:.1f} s",
            f"{100 * figures['startup_and_reports_s'] / wall:.1f}% of wall",
        ]
    )
    body.append(["harness's own time", f"{own_seconds(figures):.1f} s", "start-up, reports, overhead / jobs"])
    body.append(["CPU time", f"{figures['cpu_s']:.1f} s", "the machine's busy CPU during the run (every process)"])
    body.append(["peak memory", f"{figures['peak_rss_mib']:.0f} MiB", "largest process"])
    body.append(
        [
            "programs compiled / loaded",
            f"{figures['programs_compiled']} / {figures['programs_loaded']}",
            "XLA / JAX's persistent cache",
        ]
    )
    body.append(
        [
            "path programs loaded / missed",
            "{} / {}".format(*figures["programs_stored"]),
            "program store (a miss is traced, lowered and compiled)",
        ]
    )
    body.append(
        [
            "programs traced / lowered to key",
            "{} / {} / {:.1f} s".format(*figures["programs_keyed"]),
            "to compute their key (keyed by what they compute), thread-seconds in paths",
        ]
    )
    body.append(["TPU lowerings loaded / missed", "{} / {}".format(*figures["lowerings_stored"]), "lowering store"])
    body.append(
        [
            "causes / effects loaded / missed",
            "{} / {}".format(*figures["causes_stored"]),
            "cause store (failing rows' causes, declared choices' effects)",
        ]
    )
    body.append(["oracle computed / cached", f"{figures['oracle_computed']} / {figures['oracle_cached']}", "cases"])
    body.append(
        [
            "judged rows loaded / missed",
            "{} / {}".format(*figures["comparisons_stored"]),
            "comparison store, cases (a miss is judged)",
        ]
    )
    print(format_text_table(["where", "time", "share"], body, indent="  "))


def print_sharpness(groups: list[dict]) -> None:
    """Bound usage of the passing rows per comparison x activation dtype (how sharp the bounds are)."""
    print("\nsharpness (bound usage of passing rows)")
    body = [
        [
            g["comparison"],
            g["act_dtype"],
            g["passing"],
            *(format_number(g[k]) for k in ("median_usage", "p90_usage", "max_usage")),
        ]
        for g in groups
    ]
    print(format_text_table(["comparison", "act dtype", "passing", "median", "p90", "max"], body, indent="  "))


# Fixed single-threaded work for the speed probe: a fraction of a second on one core.
_PROBE_CODE = (
    "import time\nstart = time.perf_counter()\ntotal = 0\n"
    "for value in range(2_000_000):\n    total += value * value\nprint(time.perf_counter() - start)"
)


def speed_probe_seconds() -> float:
    """Seconds the slowest of one probe process per core took, all at once: the machine's
    multi-core speed just now. A shared machine runs the same code slower in one bench run
    than in the next with nothing else running, so each run's walls come with the probe
    taken before it."""
    probes = [
        subprocess.Popen([sys.executable, "-c", _PROBE_CODE], stdout=subprocess.PIPE, text=True)
        for _ in range(os.cpu_count() or 1)
    ]
    return max(float(probe.communicate()[0]) for probe in probes)


def load_note() -> str:
    one, five, fifteen = os.getloadavg()
    return (
        f"load average {one:.1f} / {five:.1f} / {fifteen:.1f} on {os.cpu_count()} CPUs, "
        f"speed probe {speed_probe_seconds():.3f} s"
    )


class Tee(io.TextIOBase):
    """Standard output that is also kept, for the results file."""

    def __init__(self, stream):
        self.stream, self.kept = stream, io.StringIO()

    def write(self, text: str) -> int:
        self.kept.write(text)
        return self.stream.write(text)

    def flush(self) -> None:
        self.stream.flush()


def results_metadata() -> dict:
    """The provenance of a benchmark's results file: commit, machine, versions."""
    return {
        "git_commit": git_commit(),
        "host_cpu": host_cpu(),
        "platform": platform.platform(),
        "jax_version": importlib.metadata.version("jax"),
        "jaxlib_version": importlib.metadata.version("jaxlib"),
        "numpy_version": importlib.metadata.version("numpy"),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--suite", default="default", choices=sorted(SUITES))
    parser.add_argument(
        "--jobs", nargs="+", default=None, help="--jobs values to measure, numbers or auto (default: the suite's)"
    )
    parser.add_argument("--results", type=pathlib.Path, default=None, metavar="FILE", help="also write the report here")
    args = parser.parse_args(argv)
    tee = Tee(sys.stdout)
    with contextlib.redirect_stdout(tee):
        code = _measure(args)
    if args.results is not None:
        command = "python bench/parity_bench.py " + shlex.join(argv if argv is not None else sys.argv[1:])
        title = f"# Benchmark of `mhc-parity run` on the {args.suite} suite"
        markdown = f"{title}\n\n```text\n{tee.kept.getvalue().strip()}\n```\n"
        print(f"results: {write_results(args.results, markdown, command, results_metadata())}")
    return code


def _measure(args) -> int:
    results, loads = {}, []
    runs = SUITES[args.suite]
    job_values = list(args.jobs or runs.jobs)
    with tempfile.TemporaryDirectory(prefix="mhc-bench-") as tmp:
        tmp_path = pathlib.Path(tmp)
        project = edited_copy(tmp_path / "edited-project") if "edit" in runs.scenarios else ROOT
        for jobs in job_values:
            cache = tmp_path / f"cache-jobs{jobs}"
            for scenario in runs.scenarios:
                loads.append(f"before {scenario} --jobs {jobs}: {load_note()}")
                tries = [
                    run_once(
                        args.suite,
                        cache,
                        tmp_path / f"{scenario}-{jobs}-{attempt}",
                        jobs,
                        project if scenario == "edit" else ROOT,
                    )
                    for attempt in range(WARM_REPEATS if scenario == "warm" else 1)
                ]
                results[(scenario, jobs)] = median_run(tries)
                # printed as it comes: a long benchmark's first figures are usable before it ends
                print_run(f"{scenario} ({args.suite}, --jobs {jobs}; {loads[-1]})", results[(scenario, jobs)])
                sys.stdout.flush()
    print_sharpness(results[("warm", job_values[0])]["sharpness"])
    print("\nmachine load while measuring (the walls are only comparable on a quiet machine):")
    for line in loads:
        print(f"  {line}")
    print("\ntargets:")
    for (scenario, jobs), figures in results.items():
        wall, cpu, own = figures["process_wall_s"], figures["cpu_s"], own_seconds(figures)
        print(
            f"  {scenario:<5} --jobs {jobs}: wall {wall:.1f} s{_verdict(wall, runs.wall_targets.get(scenario))}, "
            f"CPU {cpu:.0f} s{_verdict(cpu, runs.cpu_targets.get(scenario))}, "
            f"harness's own {own:.1f} s{_verdict(own, runs.own_targets.get(scenario))}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
