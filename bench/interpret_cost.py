"""Seconds per element of x of an interpret-mode path, the cost `interpret_cost` estimates from.

    python bench/interpret_cost.py [--tokens 2048] [--embedding 1024] [--branch mlp] \
        [--dtype bfloat16 float32] [--runs 2] [--out DIR]

For each dtype, a case of n = 4 streams and the given tokens (one batch), embedding and branch
is made (its fixture only: no oracle), and the program a parity run judges for
`interpret/unsharded` (forward and one VJP, `mhc_parity.harness.engine.paths`) is compiled on the
default backend, run once to warm up and then `--runs` times, each waited for. One JSON line per
dtype: the elements of x, the compile seconds, the median run and the seconds per element
(also written to DIR/interpret-cost.jsonl). The figures of
`mhc_parity.harness.engine.interpret_cost.SECONDS_PER_ELEMENT` come from here; on a TPU
(`.venv-system/bin/python bench/interpret_cost.py --out DIR`) it measures the chip's.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mhc_parity.harness.env import ensure_host_devices  # noqa: E402

ensure_host_devices()

import jax  # noqa: E402

from mhc_parity.cases.catalogue import make_case  # noqa: E402
from mhc_parity.cases.fixtures import make_fixture  # noqa: E402
from mhc_parity.harness.engine import paths as path_programs  # noqa: E402
from mhc_parity.harness.engine.implementations import BUILTIN  # noqa: E402


def measure(case, runs: int) -> dict:
    """The interpret path's program of `case`: compiled, warmed up, run `runs` times."""
    path = path_programs.Path(BUILTIN["interpret"])
    fixture = make_fixture(case, use_cache=False)
    placed = path_programs.compile_placed(path, case, fixture)
    compiled, args, compile_s = placed.compiled, placed.args, placed.compile_s
    jax.block_until_ready(compiled(*args))
    seconds = []
    for _ in range(runs):
        start = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        seconds.append(time.perf_counter() - start)
    batch, sequence, streams, embedding = case.shape
    elements = batch * sequence * streams * embedding
    run_s = statistics.median(seconds)
    return {
        "case": case.name,
        "backend": jax.default_backend(),
        "elements": elements,
        "compile_s": round(compile_s, 3),
        "run_s": round(run_s, 3),
        "runs": runs,
        "seconds_per_element": run_s / elements,
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--embedding", type=int, default=1024)
    parser.add_argument("--branch", default="mlp")
    parser.add_argument("--dtype", nargs="+", default=["bfloat16", "float32"])
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--out", type=pathlib.Path)
    args = parser.parse_args(argv)
    lines = []
    for dtype in args.dtype:
        case = make_case(embedding=args.embedding, batch=1, sequence=args.tokens, dtype=dtype, branch=args.branch)
        record = measure(case, args.runs)
        print(json.dumps(record), flush=True)
        lines.append(json.dumps(record))
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "interpret-cost.jsonl").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
