"""What naming the causes of a failing run costs: `mhc-parity run` with one leaf broken, cold and warm.

Usage (from the project root):
    .venv/bin/python bench/causes_bench.py [--suite smoke] [--jobs auto]

The break: a copy of the project's sources in a temporary folder in which the kernels'
custom VJP multiplies the gradient of `post_bias` by 1.01 (`mhc_parity/mhc/kernels/api.py`), a logic
error no rounding explains. Six runs of the suite: the unmodified code cold and warm (it
passes and names no cause) in one fresh cache folder, then the break cold and warm in another,
with and without `--no-causes` (which skips the search).
For each: the wall time, the seconds the runner's thread spent naming causes (`causes_s`: the
hypotheses through the oracle and the attribution, only for cases with a failing row; the
compile-ahead threads share the cores meanwhile, so it overlaps other work), the exit code and
the cause headings. The target: a failing run at most `TARGET_RATIO` times the passing one's
wall time, cold and warm (issue 67; the break changes no program's cost). A cold run's wall
time varies by tens of seconds on a busy 2-core machine, so the runs are repeated `--rounds`
times, each round in fresh cache folders, and each scenario's least wall time is taken. A
passing run spends nothing there (`tests/test_attribution.py` pins that none of it runs).
"""

from __future__ import annotations

import argparse
import contextlib
import pathlib
import shlex
import sys
import tempfile

from parity_bench import Tee, edited_copy, results_metadata, run_once  # the same copy, run and figures

from mhc_parity.cases import registry  # noqa: E402 - parity_bench puts the project on the path
from mhc_parity.harness.processes.parallel import auto_jobs  # noqa: E402
from mhc_parity.reports.writers import write_results  # noqa: E402

EDITED_FILE = "mhc_parity/mhc/kernels/api.py"
EDIT_FROM = "        grads[name] = psum_to_primal_vma(g, primal).reshape(primal.shape).astype(primal.dtype)\n"
EDIT_TO = (
    "        grads[name] = (psum_to_primal_vma(g, primal) * (1.01 if name == 'post_bias' else 1.0))"
    ".reshape(primal.shape).astype(primal.dtype)\n"
)
TARGET_RATIO = 1.5


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--suite", default="smoke")
    # A failing default run is `make parity`'s, whose JOBS is auto: what that gives here is measured.
    parser.add_argument("--jobs", default="auto", help="worker processes: a count, or auto (make parity's)")
    parser.add_argument("--rounds", type=int, default=2, help="repeat the four runs; each scenario's least time counts")
    parser.add_argument("--results", type=pathlib.Path, default=None, metavar="FILE", help="also write the report here")
    args = parser.parse_args(argv)
    args.jobs = auto_jobs(len(registry.select(suite=args.suite))) if args.jobs == "auto" else int(args.jobs)
    tee = Tee(sys.stdout)
    with contextlib.redirect_stdout(tee), tempfile.TemporaryDirectory(prefix="mhc-causes-") as tmp:
        tmp_path = pathlib.Path(tmp)
        project = edited_copy(tmp_path / "broken-project", EDITED_FILE, EDIT_FROM, EDIT_TO)
        walls: dict[str, float] = {}
        runs = (
            ("clean cold", None, "clean-cache", ()),
            ("break cold", project, "break-cache", ()),
            ("break no-causes cold", project, "unsearched-cache", ("--no-causes",)),
            ("clean warm", None, "clean-cache", ()),
            ("break warm", project, "break-cache", ()),
            ("break no-causes warm", project, "unsearched-cache", ("--no-causes",)),
        )
        for round_, (scenario, source, cache, extra) in ((r, run) for r in range(1, args.rounds + 1) for run in runs):
            where = {} if source is None else {"project": source, "edited_file": EDITED_FILE}
            out = tmp_path / f"{scenario.replace(' ', '-')}-{round_}"
            figures = run_once(args.suite, tmp_path / f"{cache}-{round_}", out, args.jobs, extra=extra, **where)
            walls[scenario] = min(walls.get(scenario, float("inf")), figures["process_wall_s"])
            print(
                f"{scenario}, round {round_} ({args.suite}, --jobs {args.jobs}): exit {figures['exit_code']}, "
                f"wall {figures['process_wall_s']:.1f} s, causes {figures['causes_s']:.1f} s, "
                f"{len(figures['causes'])} cause(s):"
            )
            for cause in figures["causes"]:
                print(f"  {cause['rows']} rows in {cause['cases']} cases: {', '.join(cause['leaves'])} of "
                      f"{', '.join(cause['candidates'])}: {cause['cause']}")  # fmt: skip
            sys.stdout.flush()
        for state in ("cold", "warm"):
            clean = walls[f"clean {state}"]
            for name, scenario in (("naming causes", "break"), ("--no-causes", "break no-causes")):
                ratio = walls[f"{scenario} {state}"] / clean
                met = "met" if ratio <= TARGET_RATIO else "MISSED"
                print(
                    f"{state}, {name}: the failing run took {walls[f'{scenario} {state}']:.1f} s against the passing "
                    f"run's {clean:.1f} s, {ratio:.2f}x, the least of {args.rounds} round(s) "
                    f"(target <= {TARGET_RATIO}x: {met})"
                )
    if args.results is not None:
        command = "python bench/causes_bench.py " + shlex.join(argv if argv is not None else sys.argv[1:])
        markdown = (
            f"# What naming causes costs, on the {args.suite} suite\n\n```text\n{tee.kept.getvalue().strip()}\n```\n"
        )
        print(f"results: {write_results(args.results, markdown, command, results_metadata())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
