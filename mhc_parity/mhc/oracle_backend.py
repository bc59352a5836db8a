"""The float64 oracle with some primitives evaluated by the backend in float32 (a TPU's exp,
log, tanh, logistic are approximations): "the backend's own tanh" is the oracle with only tanh
replaced by float64(backend_tanh(float32(x))), its derivative from the backend's output as the
paths' VJPs take it (docs/backend-arithmetic.md).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from mhc_parity.mhc import oracle, oracle_math, rounding_model

# Replayable primitives: float32 program, derivative from (input, the backend's output).
REPLAYED: Mapping[str, tuple[Callable, Callable]] = {
    "exp": (jnp.exp, lambda x, y: y),
    "log": (jnp.log, lambda x, y: 1.0 / x),
    "tanh": (jnp.tanh, lambda x, y: 1.0 - y * y),
    "logistic": (jax.nn.sigmoid, lambda x, y: y * (1.0 - y)),
    "rsqrt": (jax.lax.rsqrt, lambda x, y: -0.5 * y * y * y),
}
# Per primitive a host float32 -> float32 function, or None: the op inside the oracle's program.
Evaluator = Mapping[str, Callable[[np.ndarray], np.ndarray]] | None


def backend_evaluator() -> Evaluator:
    """None where the paths' backend is the oracle's device (a CPU), else per `REPLAYED`
    primitive a host function running the float32 op on the default device."""
    device = jax.devices()[0]
    if device.platform == oracle.oracle_device().platform:
        return None
    return {name: _on_device(function, device) for name, (function, _) in REPLAYED.items()}


def _on_device(function, device):
    program = jax.jit(function)

    def evaluate(x: np.ndarray) -> np.ndarray:
        return np.asarray(program(jax.device_put(np.asarray(x, np.float32), device)), np.float32)

    return evaluate


def _replay(name: str, evaluator: Evaluator):
    """float64 x -> float64(backend's float32 `name`(float32 x)), differentiable."""
    function, derivative = REPLAYED[name]

    def value(x):
        if evaluator is None:
            return function(x.astype(jnp.float32)).astype(x.dtype)
        shape = jax.ShapeDtypeStruct(x.shape, jnp.float32)
        host = evaluator[name]
        return jax.pure_callback(lambda v: host(np.asarray(v, np.float32)), shape, x.astype(jnp.float32)).astype(
            x.dtype
        )

    @jax.custom_jvp
    def replayed(x):
        return value(x)

    @replayed.defjvp
    def _(primals, tangents):
        (x,), (t,) = primals, tangents
        y = value(x)
        return y, derivative(x, y) * t

    return replayed


class BackendPrimitives:
    """The identity at every site; `primitive` evaluates by the backend where `flags` (name ->
    traced bool: data, so every set of primitives shares one program) says so, else exactly."""

    def __init__(self, flags: Mapping[str, Any], evaluator: Evaluator):
        unknown = sorted(set(flags) - set(REPLAYED))
        if unknown:
            raise ValueError(f"no backend replay of {unknown}: one of {sorted(REPLAYED)}")
        self.flags = flags
        self.replays = {name: _replay(name, evaluator) for name in flags}

    def __call__(self, v, site: str, part: str = ""):
        del site, part
        return v

    def primitive(self, name: str, function, *operands):
        replay = self.replays.get(name)
        if replay is None:
            return function(*operands)
        # A cond, not a where: the branch not taken (an f32 exp's overflow) adds no NaN to the VJP.
        return jax.lax.cond(self.flags[name], replay, function, *operands)


@functools.lru_cache(maxsize=8)
def _backend_program(branch_apply, config, branch_sites, names: tuple[str, ...], evaluator_key):
    """The jitted float64 forward + VJP once per row of flags (H, len(names)) bool, outputs with a
    leading H axis; one compile serves every set (one per set cost seconds each)."""
    evaluator = _EVALUATORS[evaluator_key]

    def one(x, w, p, ct, flags):
        chosen = BackendPrimitives(dict(zip(names, flags)), evaluator)
        return oracle_math.layer_and_vjp(x, w, p, ct, chosen, config, branch_apply, branch_sites)

    def program(x, w, p, ct, flags):
        shapes = jax.eval_shape(one, x, w, p, ct, flags[0])
        outputs = jax.tree.map(lambda s: jnp.zeros((flags.shape[0], *s.shape), s.dtype), shapes)

        def run(h, outputs_):
            answer = one(x, w, p, ct, flags[h])
            return jax.tree.map(lambda o, a: o.at[h].set(a), outputs_, answer)

        return jax.lax.fori_loop(0, flags.shape[0], run, outputs)

    return jax.jit(program, compiler_options=oracle.HYPOTHESIS_COMPILER_OPTIONS)


# The evaluators a program was compiled with, by id (a Mapping is not hashable).
_EVALUATORS: dict[int, Evaluator] = {}


def run_oracle_backend(
    x,
    weights,
    branch_apply: oracle_math.BranchApply,
    branch_params: Mapping[str, Any],
    cotangent,
    config,
    *,
    primitives: Sequence[frozenset[str]],
    branch_sites: Mapping[str, rounding_model.RoundingSite] | None = None,
    evaluator: Evaluator = None,
) -> list[oracle.OracleResult]:
    """The oracle once per set of `primitives` (those by the backend in float32, the rest exact),
    in one program; arguments otherwise as `oracle.run_oracle`. One `OracleResult` per set."""
    if not primitives:
        return []
    sites = rounding_model.branch_site_tuple(branch_sites)
    names = tuple(name for name in REPLAYED if any(name in chosen for chosen in primitives))
    unknown = sorted(set().union(*primitives) - set(REPLAYED))
    if unknown:
        raise ValueError(f"no backend replay of {unknown}: one of {sorted(REPLAYED)}")
    flags = np.array([[name in chosen for name in names] for chosen in primitives], bool)
    _EVALUATORS[id(evaluator)] = evaluator
    with jax.enable_x64(True), jax.default_device(oracle.oracle_device()):
        inputs = oracle._float64_inputs(x, weights, branch_params, cotangent)
        program = _backend_program(branch_apply, config, sites, names, id(evaluator))
        outputs = jax.tree.map(lambda a: np.asarray(a, dtype=np.float64), program(*inputs, jnp.asarray(flags)))
    return [oracle._result(jax.tree.map(lambda a, h=h: a[h], outputs)) for h in range(len(primitives))]
