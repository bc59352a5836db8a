"""Device time of each path's program, alone in the process, against what the chip can do.

    python bench/device_speed.py --suite maxtext --impl mhc_parity.maxtext_parity:implementations \
        --paths reference mosaic 'maxtext-*' --out DIR [--cases GLOB ...] [--runs 50]

For every selected case and unsharded path (this project's `reference` and `mosaic` kernels, and
each `--impl` implementation inside its envelope), the program a parity run judges (the forward
pass and one VJP, `mhc_parity.harness.engine.paths`) is compiled, its arguments placed on the
device, called once, then timed two ways, nothing else running in the process:

- `device_ms`: the device time per run, as a parity run's rows take it on an accelerator
  (`mhc_parity.harness.engine.execution_timing.device_time`: warm-up, then `--runs` runs issued
  back to back, each waited for once the next is queued). JAX dispatches asynchronously, so the
  host's dispatch of the next call overlaps the device's work on this one: for programs longer
  than a dispatch this is the device's time per program.
- `blocking_ms`: the median of `--runs` calls each waited for (dispatch and wait included): the
  latency a caller sees; the gap to `device_ms` is the host's share.

What a program must move and do: `bytes` is the size of its arguments and results (each read or
written at least once: a lower bound on its HBM traffic), `flops` the XLA cost analysis of the
reference program of the case (the same arithmetic for every path; a Pallas kernel is opaque to
XLA's analysis). GB/s and FLOP/s follow, with the fraction of the chip's peak: the arithmetic and
the peaks (by device kind) are `mhc_parity.records.roofline`'s, which the run's Speed section
uses too. The mHC layer is memory-bound, so its HBM fraction is the one that matters; an MLP branch
adds matmuls that can make the FLOP fraction the larger (docs/speed.md). On a CPU the figures are
written without a peak (not a speed claim about any TPU).

Writes DIR/device-speed.json (one record per case and path, with the environment) and
DIR/device-speed.md (the table), and prints the table.
"""

from __future__ import annotations

import argparse
import datetime
import fnmatch
import json
import pathlib
import platform
import statistics
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from mhc_parity.harness.env import ensure_host_devices  # noqa: E402

ensure_host_devices()

import jax  # noqa: E402

from mhc_parity.cases import registry  # noqa: E402
from mhc_parity.cases.fixtures import make_fixture  # noqa: E402
from mhc_parity.harness.engine import paths as path_programs  # noqa: E402
from mhc_parity.harness.engine.execution_timing import device_time  # noqa: E402
from mhc_parity.harness.engine.implementations import BUILTIN, load_implementations  # noqa: E402
from mhc_parity.records.roofline import array_bytes, peaks_of, throughput  # noqa: E402


def time_program(compiled, args, runs: int) -> dict:
    """device_ms (the runs' device time: `device_time`) and blocking_ms (the median of waited
    calls) of `compiled(*args)`."""
    jax.block_until_ready(compiled(*args))  # the first call, as a parity run's
    device_s, runs = device_time(lambda: compiled(*args), jax.block_until_ready, runs=runs)
    waited = []
    for _ in range(runs):
        start = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        waited.append(time.perf_counter() - start)
    return {"device_ms": device_s * 1e3, "blocking_ms": statistics.median(waited) * 1e3, "runs": runs}


def measure(impl, case, fixture, runs: int, reference_flops: float | None) -> dict:
    """One record: the program of `impl` on `case`, compiled, timed and set against the chip's peaks."""
    path = path_programs.Path(impl)
    placed = path_programs.compile_placed(path, case, fixture)
    compiled, args, placement, compile_s = placed.compiled, placed.args, placed.placement, placed.compile_s
    outputs = jax.eval_shape(placed.program, *args)
    record = {
        "case": case.name,
        "path": path.name,
        "compile_s": round(compile_s, 3),
        "bytes": array_bytes(jax.tree.leaves(args)) + array_bytes(jax.tree.leaves(outputs)),
        "flops": reference_flops if reference_flops is not None else path_programs.xla_flops(compiled),
        "program_flops_xla": path_programs.xla_flops(compiled),
        **time_program(compiled, args, runs),
    }
    rates = throughput(
        record["bytes"], record["device_ms"] / 1e3, placement.devices[0].device_kind, flops=record["flops"]
    )
    record["gb_per_s"] = rates.gb_per_s
    record["tflop_per_s"] = rates.flops_per_s / 1e12
    record["hbm_fraction"] = rates.hbm_fraction
    record["flop_fraction"] = rates.flop_fraction
    return record


def _table(records: list[dict], device_kind: str) -> str:
    peaks = peaks_of(device_kind)
    head = (
        f"Device: {device_kind}"
        + (
            f" (peaks: {peaks.hbm_bytes_per_s / 1e9:.0f} GB/s HBM, {peaks.bf16_flops_per_s / 1e12:.0f} TFLOP/s bf16)"
            if peaks
            else " (no peak known: not a TPU figure)"
        )
        + "\n\n| case | path | device ms | blocking ms | MB moved | GB/s | of HBM peak | GFLOP | TFLOP/s |"
        + "\n|---|---|---:|---:|---:|---:|---:|---:|---:|\n"
    )
    rows = []
    for r in records:
        if "skip" in r:
            rows.append(f"| {r['case']} | {r['path']} | skip: {r['skip']} | | | | | | |")
            continue
        rows.append(
            f"| {r['case']} | {r['path']} | {r['device_ms']:.3f} | {r['blocking_ms']:.3f} | {r['bytes'] / 1e6:.1f} | "
            f"{r['gb_per_s']:.1f} | {r['hbm_fraction']:.1%} | {r['flops'] / 1e9:.2f} | {r['tflop_per_s']:.2f} |"
        )
    return head + "\n".join(rows) + "\n"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", nargs="+", default=["maxtext"], help="the suites whose cases are selected")
    parser.add_argument("--cases", nargs="*", default=None, help="case-name globs (default: every case of the suite)")
    parser.add_argument("--impl", action="append", default=[], help="MODULE:FACTORY of more implementations")
    parser.add_argument("--paths", nargs="*", default=["reference", "mosaic"], help="implementation-name globs")
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--out", required=True, type=pathlib.Path)
    args = parser.parse_args(argv)
    impls = [*BUILTIN.values(), *(i for spec in args.impl for i in load_implementations(spec))]
    impls = [i for i in impls if any(fnmatch.fnmatch(i.name, g) for g in args.paths)]
    cases = [
        c
        for suite in args.suite
        for c in registry.select(suite=suite)
        if args.cases is None or any(fnmatch.fnmatch(c.name, g) for g in args.cases)
    ]
    backend = jax.default_backend()
    device_kind = jax.devices()[0].device_kind
    records = []
    for case in cases:
        fixture = make_fixture(case)
        reference_flops = None
        for impl in impls:
            skip = impl.case_skip_reason(case) or impl.envelope_reason(case)
            if impl.needs_backend and impl.needs_backend != backend:
                skip = f"needs {impl.needs_backend}"
            if skip:
                records.append({"case": case.name, "path": f"{impl.name}/unsharded", "skip": skip})
                continue
            try:
                record = measure(impl, case, fixture, args.runs, reference_flops)
            except Exception as exc:  # noqa: BLE001 - one path's failure is a row of the table, not the end
                first_line = (str(exc).splitlines() or [""])[0][:160]
                records.append(
                    {
                        "case": case.name,
                        "path": f"{impl.name}/unsharded",
                        "skip": f"error: {type(exc).__name__}: {first_line}",
                    }
                )
                continue
            if impl.name == "reference":
                reference_flops = record["flops"]
            records.append(record)
            print(json.dumps(record), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    environment = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": " ".join(["python", "bench/device_speed.py", *argv]),
        "backend": backend,
        "device_kind": device_kind,
        "jax_version": jax.__version__,
        "python_version": platform.python_version(),
    }
    (args.out / "device-speed.json").write_text(json.dumps({"environment": environment, "records": records}, indent=1))
    table = _table(records, device_kind)
    (args.out / "device-speed.md").write_text(f"`{environment['command']}` on {environment['date']}\n\n{table}")
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
