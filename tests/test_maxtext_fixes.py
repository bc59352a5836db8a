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
