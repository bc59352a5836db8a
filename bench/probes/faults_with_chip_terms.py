"""`mhc-parity faults` on this CPU, judged as a chip judges: with a chip's measured backend terms.

    python bench/probes/faults_with_chip_terms.py [--probe docs/results/backend-probe-tpu-v5e.json] \
        faults --suite smoke --dtype float32 --faults '*gate_params_bf16' --out out/faults-chip-terms

The chip's transcendentals widen each leaf's sensitivity σ (`mhc_parity.harness.engine.backend_arithmetic`),
and its paths run off the host, so the hypotheses' sums in the host's order are not matched there
(`mhc_parity.harness.engine.causes.off_backend_errors`). Both change which hypothesis a failing
leaf's error is matched to; this runs the CLI with the probe table's terms in place of this
backend's and every path taken as off the host, so a chip kill matrix's causes can be looked at,
and fixed, here. The candidates' own errors stay this CPU's: a chip's arithmetic is not replayed.
"""

from __future__ import annotations

import argparse
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from mhc_parity.harness.env import ensure_host_devices  # noqa: E402

ensure_host_devices()

from mhc_parity.harness.cli import main  # noqa: E402
from mhc_parity.harness.engine import case_judging, oracle_path  # noqa: E402
from mhc_parity.harness.engine.backend_arithmetic import model_terms, probe_document_table  # noqa: E402

PROBE = ROOT / "docs" / "results" / "backend-probe-tpu-v5e.json"


def in_this_process(cli_args: list[str]) -> list[str]:
    """The CLI's arguments with `--jobs 1`: a patch made here does not reach worker processes."""
    jobs = [value for option, value in zip(cli_args, cli_args[1:]) if option == "--jobs"]
    jobs += [a.removeprefix("--jobs=") for a in cli_args if a.startswith("--jobs=")]
    if any(j != "1" for j in jobs):
        sys.exit(f"{sys.argv[0]}: runs in this process (its patches do not reach workers): leave out --jobs")
    return cli_args if jobs else [*cli_args, "--jobs", "1"]


def judge_as_chip(probe: pathlib.Path = PROBE) -> None:
    """From now on in this process, every run is judged with `probe`'s terms, its paths off the host."""
    terms = model_terms(probe_document_table(probe))
    oracle_path.backend_terms = lambda: terms
    case_judging.runs_on_host = lambda path: False


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--probe", type=pathlib.Path, default=PROBE, help="a probe table (tpu_backend_probe.py)")
    options, cli_args = parser.parse_known_args()
    judge_as_chip(options.probe)
    sys.exit(main(in_this_process(cli_args)))
