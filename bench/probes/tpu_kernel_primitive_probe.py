"""Do a Mosaic kernel's float32 primitives differ from XLA's?

`python bench/probes/tpu_kernel_primitive_probe.py --out DIR`.

Runs `mhc_parity.harness.engine.kernel_primitives.compare_primitives` on the default device: each
elementwise primitive of the backend probe (exp, log, log1p, tanh, logistic, softplus, rsqrt, sqrt,
divide, reciprocal) on the same float32 inputs by XLA (`jax.jit`) and inside a Pallas kernel
(`pl.pallas_call` over (512, 128) blocks), and writes DIR/kernel-primitives.json: per primitive,
whether the two are bit-identical, how many outputs differ and by how many ulps at most, and each
one's error against float64; with the backend probe's terms for this device and what
`narrowed_terms` leaves of them for a Mosaic-vs-XLA comparison.

On a TPU the kernel is compiled by Mosaic. Anywhere else it runs in Pallas interpret mode (XLA
again): a test of this script, which says so (`"compiler": "interpret"`), and a table the
harness never narrows by.

Needs only JAX, NumPy and the standard library (a TPU image as it comes: Python 3.11, JAX 0.10.2),
and the project on the path (run from a checkout; nothing is installed).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import jax  # noqa: E402

from mhc_parity.harness.engine.backend_arithmetic import SAMPLES, model_terms, probe_arithmetic  # noqa: E402
from mhc_parity.harness.engine.kernel_primitives import (  # noqa: E402
    INTERPRET,
    compare_primitives,
    narrowed_terms,
    narrowing_note,
)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.partition("\n")[0])
    parser.add_argument("--out", required=True, type=pathlib.Path, help="folder for kernel-primitives.json")
    parser.add_argument("--samples", type=int, default=SAMPLES, help="inputs per primitive (a multiple of 65536)")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    device = jax.devices()[0]
    table = compare_primitives(device, args.samples)
    terms = model_terms(probe_arithmetic(device, args.samples))
    result = {
        "table": table.to_json(),
        "interpret": table.compiler == INTERPRET,
        "backend_terms": terms,
        "mosaic_vs_xla_terms": narrowed_terms(terms, table),
        "note": narrowing_note(terms, table),
        "python": sys.version.split()[0],
        "seconds": time.perf_counter() - start,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "kernel-primitives.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    if table.compiler == INTERPRET:
        print(
            f"INTERPRET MODE on {device.platform}: no Mosaic here; this table tests the script, it measures no kernel"
        )
    print(table.record())
    print("differ or not measured:", ", ".join(sorted(table.differing())) or "none")
    print(result["note"] or "no backend term on this device: nothing to narrow")
    print(f"wrote {path} ({result['seconds']:.1f}s)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
