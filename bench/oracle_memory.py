"""The chunked float64 oracle's measured peak host memory against the case-memory estimate.

    python bench/oracle_memory.py --cases NAME [NAME ...] [--chunk-tokens N ...] [--case-file F] [--out DIR]

Each (case, chunk) runs in a fresh process, in the environment of the oracle's own process
(`oracle_process.child_environment`: the CPU, glibc keeping what it frees): it makes the
fixture, notes its resident memory (`oracle_process.peak_resident_bytes`), runs
`mhc_parity.harness.engine.oracle_path.run_oracle_path` with that chunk (no oracle cache) and
notes the peak again. One JSON line per run (also written to
DIR/oracle-memory.jsonl): the case, its tokens, the chunk, the time, the peak before and after
the oracle, and `mhc_parity.harness.engine.case_memory.oracle_memory_bytes`' budget for it;
`within` says whether the peak stayed inside the budget. Exit 1 if any did not.
Without --chunk-tokens each case runs at its default chunk (`oracle_chunk_tokens`).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mhc_parity.harness.env import ensure_host_devices  # noqa: E402

ensure_host_devices()

from mhc_parity.cases import registry  # noqa: E402
from mhc_parity.cases.fixtures import make_fixture  # noqa: E402
from mhc_parity.cases.toml_cases import load_case_file  # noqa: E402
from mhc_parity.harness.engine.case_memory import oracle_memory_bytes  # noqa: E402
from mhc_parity.harness.engine.oracle_path import oracle_chunk_tokens, run_oracle_path  # noqa: E402
from mhc_parity.harness.engine.oracle_process import (  # noqa: E402
    child_environment,
    peak_resident_bytes,
    sample_resident_peak,
)


def measure(name: str, chunk_tokens: int | None, case_files: list[str]) -> dict:
    """Run the oracle of case `name` in this process and return its figures (the child's side)."""
    cases = {case.name: case for path in case_files for case in load_case_file(path)}
    case = cases[name] if name in cases else registry.get(name)
    sample_resident_peak()
    fixture = make_fixture(case, use_cache=False)
    before = peak_resident_bytes()
    chunk = oracle_chunk_tokens(case) if chunk_tokens is None else chunk_tokens
    start = time.perf_counter()
    run_oracle_path(case, fixture, chunk)
    seconds = time.perf_counter() - start
    peak = peak_resident_bytes()
    budget = oracle_memory_bytes(case, chunk)
    return {
        "case": case.name,
        "tokens": case.shape[0] * case.shape[1],
        "chunk_tokens": chunk,
        "oracle_s": round(seconds, 2),
        "peak_before_oracle_bytes": before,
        "peak_bytes": peak,
        "budget_bytes": budget,
        "within": peak <= budget,
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="+", required=True)
    parser.add_argument("--chunk-tokens", nargs="*", type=int, default=[])
    parser.add_argument("--case-file", action="append", default=[])
    parser.add_argument("--out", type=pathlib.Path)
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        name, chunk = args.child
        print(json.dumps(measure(name, None if chunk == "default" else int(chunk), args.case_file)))
        return 0
    lines, ok = [], True
    for name in args.cases:
        for chunk in args.chunk_tokens or ["default"]:
            command = [sys.executable, __file__, "--cases", name, "--child", name, str(chunk)]
            command += [f"--case-file={path}" for path in args.case_file]
            proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, env=child_environment())
            if proc.returncode:
                sys.stderr.write(proc.stderr)
                return 2
            line = proc.stdout.strip().splitlines()[-1]
            print(line, flush=True)
            lines.append(line)
            ok = ok and json.loads(line)["within"]
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "oracle-memory.jsonl").write_text("".join(line + "\n" for line in lines))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
