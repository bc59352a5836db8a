"""What the judge says of correct code on this backend with the rounding model's backend terms off.

Usage (from the project root, on the machine whose arithmetic is in question, e.g. a TPU VM):
    python bench/probes/backend_causes_check.py OUT.json [CASE ...]

For each case (by default the two that failed correct code on the TPU v5e, issue 50: the
float32 Sinkhorn case and the float32 tanh-branch case) every path that runs here is judged
twice against the float64 oracle:

- `terms off`: `oracle_path.backend_terms` returns no term, as if the backend rounded every
  primitive as XLA:CPU does; on a backend whose transcendentals err more, rows fail, and each
  failing row's most likely cause must be the backend's own primitive (`backend:<primitive>:...`);
- `terms on`: the model as `mhc-parity run` uses it; no row may fail.

Writes, per case and setting, the failing rows' leaf, bound usage, cause and the share of the
error it explains, and prints a summary line per case. Exit 1 where a failing row names
another cause first or a row fails with the terms on; 0 otherwise (on a CPU every term is 0
and both settings pass: nothing to switch off, said so).
"""

from __future__ import annotations

import json
import pathlib
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from mhc_parity.harness.env import ensure_host_devices  # noqa: E402 - after the project is on the path

ensure_host_devices()  # this script is an entry point: before anything computes

import jax  # noqa: E402

from mhc_parity.cases import registry  # noqa: E402
from mhc_parity.harness.engine import oracle_path  # noqa: E402
from mhc_parity.harness.engine.implementations import BUILTIN  # noqa: E402
from mhc_parity.harness.engine.plan import PathPlan  # noqa: E402
from mhc_parity.harness.engine.runner import Runner  # noqa: E402
from mhc_parity.harness.judging.policy_file import load_policy  # noqa: E402

CASES = ("sinkhorn-n4-c128-b2s64-f32-w32-identity-default", "lite-n4-c128-b2s64-f32-w32-tanh-default")
BACKEND_CAUSE = "backend:"


def judged_rows(case_name: str) -> list[dict]:
    """The case's unsharded rows against the oracle, every built-in implementation that runs here."""
    plan = PathPlan(implementations=tuple(BUILTIN.values()), path_globs=("*/unsharded",), lowering=False)
    rows = Runner(load_policy()).run_case(registry.get(case_name), plan)
    return [r for r in rows if r["comparison"] == "vs_oracle" and r["verdict"] != "skip"]


def failing(rows: list[dict]) -> list[dict]:
    keys = ("candidate", "leaf", "bound_usage", "cause_id", "cause_explained")
    return [{k: r.get(k) for k in keys} for r in rows if r["verdict"] != "pass"]


def check_case(case_name: str, terms: dict[str, float]) -> tuple[dict, list[str]]:
    """The case judged with the terms off and on; the problems found (empty: as expected)."""
    original = oracle_path.backend_terms
    start = time.perf_counter()
    try:
        oracle_path.backend_terms = lambda: {}
        off = judged_rows(case_name)
    finally:
        oracle_path.backend_terms = original
    on = judged_rows(case_name)
    result = {
        "rows": len(on),
        "terms_off_failing": failing(off),
        "terms_on_failing": failing(on),
        "seconds": round(time.perf_counter() - start, 1),
    }
    problems = [f"{r['candidate']} {r['leaf']}: fails with the terms on" for r in result["terms_on_failing"]]
    problems += [
        f"{r['candidate']} {r['leaf']}: terms off, named {r['cause_id']!r} first"
        for r in result["terms_off_failing"]
        if not str(r["cause_id"]).startswith(BACKEND_CAUSE)
    ]
    if any(terms.values()) and not result["terms_off_failing"]:
        result["note"] = "no row fails with the terms off: this case does not need them here"
    return result, problems


def main(argv: list[str]) -> int:
    if not argv or argv[0].startswith("-"):
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    out, case_names = pathlib.Path(argv[0]), argv[1:] or list(CASES)
    terms = oracle_path.backend_terms()
    device = jax.devices()[0]
    report = {"backend": jax.default_backend(), "device_kind": device.device_kind, "jax": jax.__version__}
    report["terms"] = {name: term for name, term in terms.items() if term}
    if not report["terms"]:
        print(f"{device.device_kind}: every backend term is 0 here; nothing to switch off (both settings alike)")
    report["cases"], all_problems = {}, []
    for name in case_names:
        result, problems = check_case(name, terms)
        report["cases"][name] = result
        all_problems += [f"{name}: {p}" for p in problems]
        off = result["terms_off_failing"]
        causes = sorted({f"{r['cause_id']} ({r['cause_explained']:.3f})" for r in off if r["cause_id"]})
        print(
            f"{name}: {result['rows']} rows; terms off: {len(off)} fail, causes {', '.join(causes) or '-'}; "
            f"terms on: {len(result['terms_on_failing'])} fail ({result['seconds']} s)"
        )
    report["problems"] = all_problems
    out.write_text(json.dumps(report, indent=1, default=float) + "\n")
    for problem in all_problems:
        print(f"PROBLEM {problem}")
    return 1 if all_problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
