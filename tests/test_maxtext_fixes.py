"""`mhc_parity.maxtext_parity.fixes`: the run-time changes apply only while this thread traces a fixed path."""

from __future__ import annotations

import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("maxtext")  # the `maxtext` extra, where it installs (docs/accelerators.md)

from maxtext.kernels.mhc import api  # noqa: E402 - after the skip

from mhc_parity.maxtext_parity.fixes import KernelCalls, kernel_calls, permutation_constant  # noqa: E402 - after the skip

CONFIG = api.MhcKernelConfig(block_size=128, bwd_block_size=32)


def _inputs():
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((1, 128, 4, 128)), jnp.bfloat16)
    small = lambda *shape: jnp.asarray(0.01 * rng.standard_normal(shape), jnp.float32)
    weights = api.MhcWeights(
        norm_scale=jnp.ones(512, jnp.bfloat16),
        pre_alpha=small(512, 4).astype(jnp.bfloat16),
        pre_bias=small(4),
        pre_scale=small(1),
        post_alpha=small(512, 4).astype(jnp.bfloat16),
        post_bias=small(4),
        post_scale=small(1),
        res_alpha=small(512, 24).astype(jnp.bfloat16),
        res_bias=small(24),
        res_scale=small(1),
    )
    return x, weights


def _traced_pre(x, weights):
    """`api.pre` under a new `jit` (a new function each time: jit reuses a function's trace)."""

    def layer_input(x_, weights_):
        return api.pre(x_, weights_, permutation_constant(4), config=CONFIG)[0]

    return jax.jit(layer_input)(x, weights)


def test_the_public_pre_is_released_outside_kernel_calls_and_fixed_inside():
    x, weights = _inputs()
    with kernel_calls(KernelCalls(interpret=True, constant_permutations=True)):
        fixed = _traced_pre(x, weights)
    assert fixed.shape == (1, 128, 128)
    # The wrappers stay installed and forward to MaxText's own `pre`: the released tracer error.
    with pytest.raises(jax.errors.UnexpectedTracerError):
        _traced_pre(x, weights)


def test_another_threads_kernel_calls_do_not_leak_into_this_one():
    x, weights = _inputs()
    inside, leave = threading.Event(), threading.Event()

    def hold():
        with kernel_calls(KernelCalls(interpret=True, constant_permutations=True)):
            inside.set()
            leave.wait(60)

    thread = threading.Thread(target=hold)
    thread.start()
    try:
        assert inside.wait(60)
        with pytest.raises(jax.errors.UnexpectedTracerError):
            _traced_pre(x, weights)
    finally:
        leave.set()
        thread.join()


def _permutation_mix_precisions(calls):
    """The precision of every dot in MaxText's permutation mix, as traced under `calls`."""
    from maxtext.kernels.mhc import common

    dims = common.MhcDims(tokens=8, streams=4, embedding=128)
    args = (
        jnp.zeros((8, 24), jnp.float32),
        jnp.ones((1,), jnp.float32),
        jnp.zeros((24,), jnp.float32),
        jnp.zeros((24, 4, 4), jnp.float32),
    )
    with kernel_calls(calls):
        jaxpr = jax.make_jaxpr(lambda *a: common.compute_residual_permutations(*a, dims))(*args)
    return [e.params["precision"] for e in jaxpr.eqns if e.primitive.name == "dot_general"]


def test_the_fixed_kernels_mix_the_permutations_at_full_float32_precision():
    """Fix 4: Mosaic runs a dot of no stated precision with bfloat16 operands on a TPU v5e, so the
    fixed kernels trace MaxText's permutation mix at HIGHEST; as released it states none."""
    released = _permutation_mix_precisions(KernelCalls(interpret=True))
    fixed = _permutation_mix_precisions(KernelCalls(interpret=True, float32_permutation_mix=True))
    assert released and all(p is None or p == (jax.lax.Precision.DEFAULT,) * 2 for p in released), released
    assert fixed and all(p == (jax.lax.Precision.HIGHEST,) * 2 for p in fixed), fixed


def test_kernels_run_interpreted_where_their_devices_are_not_tpus(monkeypatch):
    """A sharded path laid on the host's CPU devices beside a chip (`...@cpu`) runs MaxText's
    kernels in interpret mode: Mosaic cannot run on a CPU ("Only interpret mode is supported")."""
    from mhc_parity.maxtext_parity.fixes import runs_interpreted

    cpu_mesh = jax.sharding.Mesh(np.array(jax.devices("cpu")[:8]).reshape(2, 4), ("data", "fsdp"))
    assert runs_interpreted(cpu_mesh)
    assert runs_interpreted(None) == (jax.default_backend() != "tpu")
    # Beside a chip (its default backend a TPU), an unsharded path on the host (the `vs_unsharded`
    # partner of a sharded `@cpu` path) is traced with the host's device as the default
    # (ProgramCache._trace): interpreted; the chip's own unsharded path compiled by Mosaic.
    monkeypatch.setattr(jax, "default_backend", lambda: "tpu")
    assert not runs_interpreted(None)
    with jax.default_device(jax.devices("cpu")[0]):
        assert runs_interpreted(None)
