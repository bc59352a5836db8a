"""The float64 oracle with some primitives evaluated by the backend in float32: what a correct
program computes on a backend whose primitives are not correctly rounded.

A TPU's float32 exp, log, tanh and logistic are approximations. Where a row fails on such a
backend, the hypothesis "the backend's own tanh" is the oracle with only tanh replaced by
float64(backend_tanh(float32(x))), every other operation exact (measured on a TPU v5e: the
log-space Sinkhorn's error reproduced with fraction explained 1.000 by the oracle with the
chip's exp and log). Its error against the exact oracle is that primitive's error, value for
value, through the whole layer and its VJP.

Each primitive is a rounding hook's `primitive` (`mhc_parity.mhc.rounding_model.evaluated`); its
derivative uses the backend's output as the paths' VJPs do (exp' = exp, tanh' = 1 - tanh²,
logistic' = y(1 - y), rsqrt' = -y³/2; log' = 1/x exact). The backend evaluates by
`backend_evaluator()`: on a CPU, XLA:CPU's float32 op inside the oracle's own program; on another
device, a host callback that runs the op there. Imports nothing that computes from `mhc`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from mhc_parity.mhc import oracle, oracle_math, rounding_model

# The primitives a hypothesis can replay, with their float32 programs and derivatives from
# (input, the backend's output).
REPLAYED: Mapping[str, tuple[Callable, Callable]] = {
    "exp": (jnp.exp, lambda x, y: y),
    "log": (jnp.log, lambda x, y: 1.0 / x),
    "tanh": (jnp.tanh, lambda x, y: 1.0 - y * y),
    "logistic": (jax.nn.sigmoid, lambda x, y: y * (1.0 - y)),
    "rsqrt": (jax.lax.rsqrt, lambda x, y: -0.5 * y * y * y),
}
# A host function float32 array -> float32 array per primitive (`backend_evaluator`), or None:
# the float32 op inside the oracle's program (the oracle's own device, the host CPU).
Evaluator = Mapping[str, Callable[[np.ndarray], np.ndarray]] | None


def backend_evaluator() -> Evaluator:
    """How the backend that runs the paths evaluates each of `REPLAYED`: None where that is the
    oracle's own device (a CPU: the float32 op in the oracle's program), else per primitive a
    host function running the jitted float32 op on the default device."""
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
    """float64 x -> float64(backend's float32 `name`(float32 x)), differentiable (its derivative
    from the backend's output, module docstring)."""
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
    """The identity at every site; `primitive` evaluates a replayable primitive by the backend
    where `flags` (name -> traced bool scalar) says so, else exactly.

    flags: one flag per `REPLAYED` name the program may replay (a flag is data, so every set of
    primitives shares one compiled program); evaluator: `backend_evaluator()`'s answer."""

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
    """The jitted float64 forward + VJP once per row of flags (H, len(names)) bool, each row's
    flagged primitives evaluated by the backend: program(x, w, p, ct, flags), every output with
    a leading H axis. One compile serves every set of `names` (a compile per set cost seconds
    each on a failing run: bench/causes_bench.py)."""
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
    """The oracle once per set of `primitives`, those evaluated by the backend in float32
    (`evaluator`: `backend_evaluator()`'s answer; None: XLA:CPU's float32 op), everything else
    exact, all sets in one compiled program. Arguments otherwise as `mhc_parity.mhc.oracle.run_oracle`;
    one `OracleResult` per set, NumPy float64."""
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
