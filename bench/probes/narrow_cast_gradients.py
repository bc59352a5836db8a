"""`bench/probes/cause_diagnosis.py` with the gate-cast faults' bias gradients summed as XLA:TPU sums them.

    MHC_PARITY_CACHE=$(mktemp -d) python bench/probes/narrow_cast_gradients.py --to out/narrow.jsonl \
        --chip-terms faults --suite smoke --dtype float32 --faults '*.gate_params_bf16' \
        --out out/narrow --quiet [--block 8]

Under `*.gate_params_bf16` a bias is cast to bfloat16, so its gradient is a token sum converted to
bfloat16. XLA:CPU sums in float32 and rounds once (the cast hypothesis' prediction); XLA:TPU folds
the convert into the reduce, a reduce with a bfloat16 result (libtpu's optimized HLO of that
gradient, compiled for v5e=1x1), and the chip's bias gradients err 3-6x the CPU's (docs/jax-notes.md,
the rows of `bench/tpu_gate_check.sh faults` at bdc5e91). This replaces
the faults' bias broadcast by one whose gradient sums `--block` tokens in float32, rounds each
partial sum to bfloat16 and adds the partial sums in bfloat16: a backend's narrow sum, here on the
CPU, to try how causes are named for it. A fresh MHC_PARITY_CACHE: the clean programs are stored
by the checkout's code, which this patch does not change.
"""

from __future__ import annotations

import argparse
import pathlib
import runpy
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from mhc_parity.harness.env import ensure_host_devices  # noqa: E402

ensure_host_devices()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from mhc_parity.harness.faults import fault_catalogue  # noqa: E402


def narrow_broadcast(bias: jax.Array, shape: tuple[int, ...], block: int) -> jax.Array:
    """bias (n,) bfloat16 broadcast to `shape` (..., n) float32; its gradient, each `block` tokens'
    float32 sum rounded to bfloat16, those partial sums added in bfloat16."""

    @jax.custom_vjp
    def broadcast(b):
        return jnp.broadcast_to(b.astype(jnp.float32), shape)

    def backward(_, cotangent):
        rows = cotangent.reshape(-1, shape[-1])
        rows = jnp.pad(rows, ((0, -rows.shape[0] % block), (0, 0))).reshape(-1, block, shape[-1])
        partial = jnp.sum(rows, axis=1).astype(jnp.bfloat16)
        total = partial[0]
        for part in partial[1:]:
            total = (total.astype(jnp.float32) + part.astype(jnp.float32)).astype(jnp.bfloat16)
        return (total,)

    broadcast.defvjp(lambda b: (broadcast(b), None), backward)
    return broadcast(bias)


def narrow_gate(block: int):
    """A fault's replacement of a gate `(logits, scale, bias, ...)`: scale and bias rounded to
    bfloat16 as the fault's own, the bias gradient summed narrowly."""

    def replace(original_gate):
        def gate(logits, scale, bias, *rest, **options):
            narrow = narrow_broadcast(bias.astype(jnp.bfloat16), logits.shape, block)
            return original_gate(logits, scale.astype(jnp.bfloat16), narrow, *rest, **options)

        return gate

    return replace


# The faults whose every patch casts a gate's scale and bias to bfloat16.
CAST_FAULTS = ("reference.gate_params_bf16", "independent.gate_params_bf16")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], add_help=False)
    parser.add_argument("--block", type=int, default=8, help="tokens per float32 partial sum")
    options, rest = parser.parse_known_args()
    for patch in (p for name in CAST_FAULTS for p in fault_catalogue.FAULTS[name].patches):
        object.__setattr__(patch, "make_replacement", narrow_gate(options.block))  # frozen records, patched here alone
    diagnosis = pathlib.Path(__file__).with_name("cause_diagnosis.py")
    sys.argv = [str(diagnosis), *rest]
    sys.path.insert(0, str(diagnosis.parent))
    runpy.run_path(str(diagnosis), run_name="__main__")
