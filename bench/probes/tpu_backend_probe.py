"""The backend arithmetic probe on an accelerator, written as JSON: `python bench/probes/tpu_backend_probe.py OUT.json`.

Runs `mhc_parity.harness.engine.backend_arithmetic.probe_arithmetic` on the default device (a TPU)
and on the host CPU, and writes both tables, the rounding model's terms for the device, and a
check of the replay the hypotheses use (`mhc_parity.mhc.oracle_backend`): a float32 log-space
Sinkhorn run on the device against the float64 one, and the fraction of its error that the
float64 Sinkhorn with the device's exp and log (through host callbacks) explains.

Needs only JAX, NumPy and the standard library (a TPU image as it comes: Python 3.11, JAX 0.10.2),
and the project on the path (run from a checkout; nothing is installed).
"""

from __future__ import annotations

import json
import pathlib
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from mhc_parity.harness.engine.backend_arithmetic import model_terms, probe_arithmetic  # noqa: E402
from mhc_parity.mhc import oracle_backend, oracle_math  # noqa: E402

# The Sinkhorn the issue measured: 4 x 4, 4096 tokens, 20 iterations.
STREAMS, TOKENS, ITERATIONS = 4, 4096, 20


def _float32_sinkhorn(z):
    """The paths' log-space Sinkhorn (`mhc_parity.mhc.common.sinkhorn_residual_matrix`'s loop)."""
    for _ in range(ITERATIONS):
        z = z - jax.nn.logsumexp(z, axis=-1, keepdims=True)
        z = z - jax.nn.logsumexp(z, axis=-2, keepdims=True)
    return jnp.exp(z)


def replay_check() -> dict:
    """The chip's Sinkhorn error, and the share of it the oracle's replay of exp and log explains."""
    z = np.random.default_rng(0).standard_normal((TOKENS, STREAMS, STREAMS)).astype(np.float32)
    on_device = np.asarray(jax.jit(_float32_sinkhorn)(z), np.float64)
    evaluator = oracle_backend.backend_evaluator()
    with jax.enable_x64(True), jax.default_device(jax.devices("cpu")[0]):
        exact = np.asarray(oracle_math._sinkhorn_log(jnp.asarray(z, jnp.float64), ITERATIONS, oracle_math.unrounded))
        found = {}
        for chosen in (("exp", "log"), ("log",), ("exp",)):
            hook = oracle_backend.BackendPrimitives(frozenset(chosen), evaluator)
            replay = np.asarray(oracle_math._sinkhorn_log(jnp.asarray(z, jnp.float64), ITERATIONS, hook))
            error, predicted = on_device - exact, replay - exact
            found["+".join(chosen)] = 1.0 - float(np.sum((error - predicted) ** 2) / np.sum(error**2))
    relative = float(np.max(np.abs(on_device - exact)) / np.max(np.abs(exact)))
    return {"sinkhorn_max_relative_error": relative, "fraction_explained": found}


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python bench/probes/tpu_backend_probe.py OUT.json", file=sys.stderr)
        return 2
    out = pathlib.Path(argv[0])
    start = time.perf_counter()
    device = probe_arithmetic()
    host = probe_arithmetic(jax.devices("cpu")[0])
    result = {
        "device": device.to_json(),
        "host_cpu": host.to_json(),
        "model_terms": model_terms(device),
        "python": sys.version.split()[0],
    }
    try:
        result["replay"] = replay_check()
    except Exception as exc:  # noqa: BLE001 - the tables are the point; the check says why it could not run
        result["replay"] = {"error": f"{type(exc).__name__}: {exc}"}
    result["seconds"] = time.perf_counter() - start
    out.write_text(json.dumps(result, indent=1))
    print(device.record())
    print("model terms:", {k: v for k, v in result["model_terms"].items() if v} or "none")
    print("replay:", result["replay"])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
