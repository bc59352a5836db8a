"""Time report writing on a finished run: `mhc_parity.reports.write_all` in this process, and `mhc-parity render`.

Usage (from the project root):
    .venv/bin/python bench/report_writing.py --rows RUN [--repeat 3]

RUN is a finished run folder (or anything `mhc_parity.reports.load_run` reads), e.g. one
`make parity` left. Two measurements, each repeated and reported as the first, best and
median wall time, and the best CPU time (on a machine shared with other work the CPU
seconds move less than the wall time):

  write_all   `mhc_parity.reports.write_all(rows, metadata, out)` of the run's rows, in this
              process, into a fresh folder each time (the first write also pays for
              whatever a report draws lazily, such as the plotting library's font set-up);
  render      `mhc-parity render --rows RUN --out OUT` in a fresh process each
              time: interpreter start, imports, loading the run and writing a full copy
              of the folder (manifest, row stream, every report).

Loads no JAX: report writing is plain Python, pandas and the plotting library.
"""

from __future__ import annotations

import argparse
import pathlib
import resource
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from mhc_parity.records.text import format_text_table  # noqa: E402 - after the project is on the path
from mhc_parity.reports import ReportInputError, load_run, write_all  # noqa: E402


def time_write_all(run_path: str, repeat: int, scratch: pathlib.Path) -> list[tuple[float, float]]:
    """(wall, CPU) seconds of each of `repeat` `write_all` calls on the rows of `run_path`, each into a new folder."""
    run = load_run(run_path)
    seconds = []
    for index in range(repeat):
        wall, cpu = time.perf_counter(), time.process_time()
        write_all(run.frame, run.metadata, scratch / f"write_all-{index}")
        seconds.append((time.perf_counter() - wall, time.process_time() - cpu))
    return seconds


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def time_render(run_path: str, repeat: int, scratch: pathlib.Path) -> list[tuple[float, float]]:
    """(wall, CPU) seconds of each of `repeat` `mhc-parity render` processes on `run_path`."""
    seconds = []
    for index in range(repeat):
        command = [
            sys.executable,
            "-m",
            "mhc_parity.harness",
            "render",
            "--rows",
            run_path,
            "--out",
            str(scratch / f"r{index}"),
        ]
        wall, cpu = time.perf_counter(), _children_cpu()
        subprocess.run(command, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
        seconds.append((time.perf_counter() - wall, _children_cpu() - cpu))
    return seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", required=True, help="a finished run folder, report.json or baseline")
    parser.add_argument("--repeat", type=int, default=3, help="writes per measurement (default 3)")
    args = parser.parse_args(argv)
    try:
        rows = len(load_run(args.rows))
    except ReportInputError as exc:
        print(
            f"report_writing: {exc} (a finished run is needed: `make parity` leaves one in out/parity)", file=sys.stderr
        )
        return 2
    with tempfile.TemporaryDirectory(prefix="report-bench-") as scratch:
        folder = pathlib.Path(scratch)
        results = {
            "write_all": time_write_all(args.rows, args.repeat, folder),
            "render": time_render(args.rows, args.repeat, folder),
        }
    print(f"report writing, {rows} rows of {args.rows}, {args.repeat} times each (seconds)")
    table = []
    for name, times in results.items():
        walls = [wall for wall, _ in times]
        best_cpu = min(cpu for _, cpu in times)
        table.append(
            [name, f"{walls[0]:.3f}", f"{min(walls):.3f}", f"{statistics.median(walls):.3f}", f"{best_cpu:.3f}"]
        )
    print(format_text_table(["measure", "first wall", "best wall", "median wall", "best CPU"], table))
    return 0


if __name__ == "__main__":
    sys.exit(main())
