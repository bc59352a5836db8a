"""Why a failing leaf was given its cause: a dumped path's leaves against every hypothesis, here.

    python bench/probes/cause_replay.py --dump DIR/<case>/<implementation>.npz --suite maxtext \
        --failing d_res_alpha [--top 6]

Reads a dump of `bench/probes/leaves_dump.py` (made on any machine: a TPU's leaves looked at on a CPU;
its DIR/dumped.json names the backend), computes the case's float64 oracle and hypotheses here
(`mhc_parity.harness.engine.causes.HypothesisOracle`), and prints, in units of each leaf's
sensitivity σ (the oracle's: a path's declared precision choices are left out):

- per leaf, the error's size ‖z‖² and the `--top` hypotheses that explain most of it value for
  value, 1 − ‖z_c − z_h‖² / ‖z_c‖² (no penalty: what each predicts on that leaf alone);
- the cause `attribute_candidate` names for the `--failing` leaves, with every other leaf taken
  as passing (its penalty), as a run names it: for a dump from another backend than this one,
  the leaves of the sums in this backend's order matched by size (`causes.off_backend_errors`).

Only the harness's own functions judge: the script names no cause of its own.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from mhc_parity.harness.env import ensure_host_devices  # noqa: E402

ensure_host_devices()

import jax  # noqa: E402
import numpy as np  # noqa: E402

from mhc_parity.cases import registry  # noqa: E402
from mhc_parity.cases.fixtures import make_fixture  # noqa: E402
from mhc_parity.harness.engine.causes import (  # noqa: E402
    HypothesisOracle,
    fitted_in_units,
    leaf_scales,
    off_backend_errors,
)
from mhc_parity.harness.engine.oracle_path import run_oracle_path  # noqa: E402
from mhc_parity.harness.judging.attribution import attribute_candidate, scaled_errors  # noqa: E402
from mhc_parity.harness.judging.error_statistics import upcast  # noqa: E402

sys.path.insert(0, str(ROOT / "bench" / "probes"))
from leaves_dump import load_leaves  # noqa: E402


def explained(z_candidate: np.ndarray, z_hypothesis: np.ndarray) -> float:
    """1 − ‖z_c − z_h‖² / ‖z_c‖²: the share of the candidate's squared error the hypothesis explains."""
    residual = z_candidate - z_hypothesis
    return 1.0 - float(np.sum(residual * residual)) / float(np.sum(z_candidate * z_candidate))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dump", required=True, type=pathlib.Path, help="a leaves .npz of bench/probes/leaves_dump.py")
    parser.add_argument("--suite", default="maxtext", help="the suite its case is registered in")
    parser.add_argument("--failing", nargs="+", required=True, help="the leaves to name a cause for")
    parser.add_argument("--top", type=int, default=6, help="hypotheses listed per leaf")
    args = parser.parse_args(argv)
    case_name = args.dump.parent.name
    dumped = json.loads((args.dump.parent.parent / "dumped.json").read_text())
    dump_backend = dumped["environment"]["backend"]
    case = next(c for c in registry.select(suite=args.suite) if c.name == case_name)
    fixture = make_fixture(case)
    oracle = run_oracle_path(case, fixture)
    hypotheses = HypothesisOracle()
    chosen, _ = hypotheses(case, fixture)
    scales = leaf_scales(oracle.leaves, oracle.sensitivity)
    errors_of = hypotheses.in_units(case, fixture, oracle.leaves, scales)
    elsewhere = dump_backend != jax.default_backend()
    if elsewhere:
        errors_of = off_backend_errors(errors_of, chosen, case.tokens)
    leaves = load_leaves(args.dump)
    errors = {leaf: upcast(value) - oracle.leaves[leaf] for leaf, value in leaves.items() if leaf in oracle.leaves}
    candidate = scaled_errors(errors, scales)
    print(f"{case.name}: {args.dump.stem} on {dump_backend}, judged on {jax.default_backend()}"
          f"{' (its sums in this backend order matched by size)' if elsewhere else ''}")  # fmt: skip
    for leaf in sorted(candidate, key=lambda name: -float(np.sum(candidate[name] ** 2))):
        z = candidate[leaf]
        size = float(np.sum(z * z))
        if size == 0.0:
            continue
        ranked = sorted(((explained(z, h.errors[leaf]), h.name) for h in errors_of if leaf in h.errors), reverse=True)
        listed = ", ".join(f"{name} {share:.2f}" for share, name in ranked[: args.top])
        print(f"  {leaf}: |z|² {size:.3g}; {listed}")
    fits = [fitted_in_units(h, response, scales) for h, response in hypotheses.fitted(case, fixture)]
    for leaf, found in attribute_candidate(candidate, errors_of, args.failing, fits).items():
        print(f"cause of {leaf}: {found.cause} ({found.explained:.2f}; {found.cause_id})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
