"""One parity run whose Speed section puts this project's kernels, the XLA reference and MaxText's side by side.

    python bench/speed_run.py --out DIR [--suite tpu] [--no-maxtext] [-- MORE RUN ARGUMENTS]
    python bench/speed_run.py --out DIR --suite tpu --from RUN   # a finished (e.g. merged) run

Runs `mhc-parity run --suite SUITE --impl mhc_parity.maxtext_parity:implementations --paths
'reference/*' 'interpret/*' 'mosaic/*' 'maxtext-*' --jobs 1 --out DIR/run` (the same entry point
as `make parity`; `--no-maxtext` leaves MaxText out where it is not installed; arguments after
`--`, such as `--shard 1/2` or `--cases GLOB`, are passed on), then writes what docs/results keeps
of it: DIR/speed-SUITE.csv (the run's speed.csv: per case and program the device time, bytes,
GB/s and fraction of the chip's peak HBM bandwidth; then the FLOPs the case's program must do,
the FLOP rate and its fraction of the chip's bfloat16 peak), DIR/speed-SUITE.svg (the report's plot of
those fractions, where the programs ran on a chip with a stated peak) and DIR/speed-SUITE.md (the
command, the run's environment, the plot and the table). The run's own exit status (1 where a
row fails) does not stop the copy: the speed figures stand whatever the verdicts, which the .md
states. With `--from RUN` nothing runs: the files are written from that finished run folder
(the shards of `bench/tpu_suite_check.sh`, merged), which the .md names in the command's place.

The FLOPs are XLA's count of the case's reference program (forward and VJP), lowered on this host
and not compiled (`mhc_parity.harness.engine.paths.lowered_flops`): the arithmetic every program
of the case must do, whichever path ran it, as `bench/device_speed.py` counts it (a Pallas
kernel is opaque to XLA's analysis). The rows do not carry it, so a case must be in the registry
(a `--case-file` case gets none); each case's fixture is made for its shapes.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import json
import pathlib
import shlex
import subprocess
import sys

from mhc_parity.harness.env import ensure_host_devices

ensure_host_devices()  # before JAX starts, as for a run

from mhc_parity.cases import registry  # noqa: E402
from mhc_parity.cases.fixtures import make_fixture  # noqa: E402
from mhc_parity.harness.engine import paths  # noqa: E402
from mhc_parity.harness.engine.implementations import BUILTIN  # noqa: E402
from mhc_parity.records.roofline import throughput  # noqa: E402
from mhc_parity.records.rows import encode_float, load_rows  # noqa: E402
from mhc_parity.reports.html.svg import roofline_svg, standalone_svg  # noqa: E402
from mhc_parity.reports.speed import program_speeds, roofline_figure  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent
PATHS = ("reference/*", "interpret/*", "mosaic/*")
MAXTEXT = ("--impl", "mhc_parity.maxtext_parity:implementations")
FLOPS_NOTE = (
    "GFLOP: XLA's count of the case's reference program (forward and VJP), lowered before any "
    "backend's optimisation: what every program of the case must do, whichever ran it. The rate is "
    "that count over the program's device time, set against the chip's dense bfloat16 peak."
)


def run_command(suite: str, out: pathlib.Path, *, maxtext: bool, more: list[str]) -> list[str]:
    """The `mhc-parity run` command line (as `python -m mhc_parity.harness run ...`)."""
    paths = [*PATHS, "maxtext-*"] if maxtext else list(PATHS)
    return [
        sys.executable,
        "-m",
        "mhc_parity.harness",
        "run",
        "--suite",
        suite,
        *(MAXTEXT if maxtext else ()),
        "--paths",
        *paths,
        "--jobs",
        "1",
        "--out",
        str(out),
        *more,
    ]


def _number(text: str, scale: float = 1.0, digits: int = 3) -> str:
    value = float(text)
    return "—" if value != value else f"{value * scale:.{digits}g}"


# Appended to the run's speed.csv columns in DIR/speed-SUITE.csv (`with_flops`).
FLOP_COLUMNS = ("flops", "tflop_per_s", "fraction_of_bf16_peak")


def reference_flops(case_names: list[str]) -> dict[str, float]:
    """Per case name, XLA's FLOP count of its reference program as lowered here
    (`paths.lowered_flops`); NaN for a name the case registry does not hold."""
    reference = paths.Path(BUILTIN["reference"])
    counts = {}
    for name in dict.fromkeys(case_names):
        try:
            case = registry.get(name)
        except KeyError:
            counts[name] = float("nan")
            continue
        counts[name] = paths.lowered_flops(reference, case, make_fixture(case))
    return counts


def with_flops(lines: list[dict[str, str]], flops: dict[str, float]) -> list[dict[str, str]]:
    """speed.csv's lines (as `csv.DictReader` gives them), each with `FLOP_COLUMNS` added: its
    case's FLOPs, the rate its device time gives and that rate's fraction of the chip's bfloat16
    peak (`roofline.throughput`; NaN without a stated peak), written as `encode_float` writes them."""
    for line in lines:
        count = flops.get(line["case"], float("nan"))
        rates = throughput(float(line["bytes_moved"]), float(line["device_s"]), line["device_kind"], flops=count)
        line.update(zip(FLOP_COLUMNS, map(encode_float, (count, rates.flops_per_s / 1e12, rates.flop_fraction))))
    return lines


def speed_table(lines: list[dict[str, str]]) -> str:
    """`with_flops`'s lines as a Markdown table."""
    head = (
        "| case | program | device ms | MB moved | GB/s | of peak HBM | GFLOP | TFLOP/s | of peak bf16 | timing |\n"
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---|\n"
    )
    return head + "".join(
        f"| {r['case']} | {r['path']} | {_number(r['device_s'], 1e3)} | {_number(r['bytes_moved'], 1e-6)} | "
        f"{_number(r['gb_per_s'])} | {_number(r['fraction_of_peak'])} | {_number(r['flops'], 1e-9)} | "
        f"{_number(r['tflop_per_s'])} | {_number(r['fraction_of_bf16_peak'])} | {r['timing']} |\n"
        for r in lines
    )


def roofline_plot(run_folder: pathlib.Path, metadata: dict, svg: pathlib.Path) -> str:
    """Write the run's Speed plot (each program's fraction of the chip's peak HBM bandwidth, as
    its report draws it) to `svg`; the Markdown that shows it, or a line saying why there is none."""
    figure = roofline_figure(program_speeds(load_rows(run_folder / "rows.csv"), metadata))
    if figure is None:
        svg.unlink(missing_ok=True)
        return "No program ran on a chip whose peak is stated: no plot.\n\n"
    svg.write_text(standalone_svg(roofline_svg(figure)))
    return (
        f"![Fraction of the peak HBM bandwidth per case and program]({svg.name})\n\n"
        f"Each program's bytes over its device time, as a fraction of {figure.device_kind}'s "
        f"{figure.peak_gb_per_s:g} GB/s.\n\n"
    )


def _recorded_status(run_folder: pathlib.Path) -> int:
    """A finished run's exit status as its verdicts give it: 1 where a row failed or erred."""
    with (run_folder / "rows.csv").open(newline="") as handle:
        return int(any(row["verdict"] in ("fail", "error") for row in csv.DictReader(handle)))


def main(argv: list[str]) -> int:
    more = argv[argv.index("--") + 1 :] if "--" in argv else []
    own = argv[: argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=pathlib.Path)
    parser.add_argument("--suite", default="tpu")
    parser.add_argument("--no-maxtext", action="store_true", help="leave MaxText's implementations out")
    parser.add_argument("--from", dest="source", type=pathlib.Path, help="a finished run folder: run nothing")
    args = parser.parse_args(own)
    if args.source is not None:
        run_folder, status = args.source, _recorded_status(args.source)
        shown = f"The run folder `{run_folder}`"
    else:
        run_folder = args.out / "run"
        command = run_command(args.suite, run_folder, maxtext=not args.no_maxtext, more=more)
        command_text = shlex.join(["mhc-parity", *command[3:]])
        print(command_text, flush=True)
        shown = f"`{command_text}`"
        status = subprocess.run(command, cwd=ROOT, check=False).returncode
    speed_csv = run_folder / "speed.csv"
    if not speed_csv.is_file():
        print(f"the run wrote no {speed_csv} (exit {status})", file=sys.stderr)
        return status or 1
    metadata = json.loads((run_folder / "report.json").read_text())["metadata"]
    if args.source is not None and metadata.get("command_line"):  # a merged run's: the merge's
        shown = f"{shown}, made by `{metadata['command_line']}`"
    keys = ("backend", "device_kind", "jax_version", "jaxlib_version", "libtpu_version", "git_commit", "start_time")
    environment = {key: metadata.get(key) for key in keys if metadata.get(key) is not None}
    args.out.mkdir(parents=True, exist_ok=True)
    with speed_csv.open(newline="") as handle:
        reader = csv.DictReader(handle)
        lines = list(reader)
        columns = [*(reader.fieldnames or ()), *FLOP_COLUMNS]  # the run's, even where no line follows
    lines = with_flops(lines, reference_flops([line["case"] for line in lines]))
    with (args.out / f"speed-{args.suite}.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns)
        writer.writeheader()
        writer.writerows(lines)
    plot = roofline_plot(run_folder, metadata, args.out / f"speed-{args.suite}.svg")
    written = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    table = speed_table(lines)
    (args.out / f"speed-{args.suite}.md").write_text(
        f"{shown} (exit {status}: 0 every verdict passed, 1 a row failed; the figures stand either way), "
        f"copied {written}.\n\n{json.dumps(environment)}\n\n{plot}{FLOPS_NOTE}\n\n{table}"
    )
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
