"""A program keyed by what it computes is keyed by its traced jaxpr, written out by value
(`mhc_parity.harness.engine.traced_digest`; issue 56, 8: lowering MaxText's programs only to key
them cost most of a warm run). A changed program changes its key, what JAX's own printer leaves
out still changes it, and what a jaxpr cannot hold by value (code, a rule from outside JAX)
falls back to the lowered module's key (`program_store.program_digest`) or to no entry at all.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl

from mhc_parity.cases import registry
from mhc_parity.cases.fixtures import make_fixture
from mhc_parity.harness.engine import traced_digest as traced_digest_module
from mhc_parity.harness.engine.devices import path_placement
from mhc_parity.harness.engine.implementations import wrap_external
from mhc_parity.harness.engine.paths import Path, _build_program, _place, effective_precision
from mhc_parity.harness.engine.program_cache import ProgramCache
from mhc_parity.harness.engine.program_store import ProgramStore, computed_material
from mhc_parity.harness.engine.traced_digest import foreign_rules, traced_digest
from tests.external_impls import ScaledKernel

X = jnp.linspace(-1.0, 1.0, 16 * 128, dtype=jnp.float32).reshape(16, 128)
WEIGHTS = np.linspace(0.5, 1.5, 128, dtype=np.float32)


def _traced(function, *args):
    return jax.jit(function).trace(*args)


def _digest(function, *args) -> str | None:
    return traced_digest(_traced(function, *args))


def _scaled(x, scale=2.0, weights=WEIGHTS):
    return jnp.sin(x) * scale + weights


def _pallas(shift: int = 0, factor: float = 2.0):
    """A Pallas program (interpret mode) whose input block of grid step i is block (i + shift) % 2."""

    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...] * factor

    def program(x):
        return pl.pallas_call(
            kernel,
            grid=(2,),
            in_specs=[pl.BlockSpec((8, 128), lambda i: ((i + shift) % 2, 0))],
            out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)),
            out_shape=jax.ShapeDtypeStruct((16, 128), jnp.float32),
            interpret=True,
        )(x)

    return program


def test_one_program_traced_twice_has_one_digest():
    assert _digest(_scaled, X) == _digest(_scaled, X) is not None
    assert _digest(_pallas(), X) == _digest(_pallas(), X) is not None, "two closures of one code"


ONE_ULP = np.nextafter(np.float32(2.0), np.float32(3.0))
CHANGES = {
    "a scalar constant, by one ulp": (functools.partial(_scaled, scale=float(ONE_ULP)), X),
    "one element of a closed-over array, by one ulp": (
        functools.partial(_scaled, weights=np.where(np.arange(128) == 7, np.nextafter(WEIGHTS, 2), WEIGHTS)),
        X,
    ),
    "an operation": (lambda x: jnp.cos(x) * 2.0 + WEIGHTS, X),
    "the argument's dtype": (_scaled, X.astype(jnp.bfloat16)),
    "a Pallas kernel's body": (_pallas(factor=float(ONE_ULP)), X),
}


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_a_changed_program_changes_its_digest(change):
    function, x = CHANGES[change]
    base = _pallas() if "Pallas" in change else _scaled
    assert _digest(function, x) not in (None, _digest(base, X))


def test_a_pallas_index_map_jax_s_printer_leaves_out_changes_the_digest():
    """Two kernels that read their blocks in another order compute different results, yet JAX
    prints their jaxprs alike (its `GridMapping` shows the grid and block shapes, not the index
    maps): keyed by that text, one would be served the other's program."""
    same_order, swapped = _traced(_pallas(shift=0), X), _traced(_pallas(shift=1), X)
    assert str(same_order.jaxpr) == str(swapped.jaxpr), "JAX's printer no longer hides the index map"
    assert not np.array_equal(jax.jit(_pallas(shift=0))(X), jax.jit(_pallas(shift=1))(X))
    assert traced_digest(same_order) != traced_digest(swapped)


def _callback(scale):
    def host(x):  # one name, one printed form, two computations
        return np.asarray(x) * scale

    return lambda x: jax.pure_callback(host, jax.ShapeDtypeStruct(x.shape, x.dtype), x)


def test_a_program_holding_code_has_no_digest_and_a_callback_is_never_keyed():
    """A `pure_callback` holds its Python function: JAX prints two of one name alike (the
    address masked), so the jaxpr cannot key it; its lowered module cannot either (it names the
    callback by index): no key, never stored."""
    one, other = _traced(_callback(1.0), X), _traced(_callback(2.0), X)
    assert str(one.jaxpr) == str(other.jaxpr)
    assert traced_digest(one) is None and traced_digest(other) is None
    computed, lowered = computed_material(one, lambda traced: traced.lower())
    assert computed is None and lowered is not None


def test_a_jaxpr_holding_a_function_parameter_falls_back_to_the_lowered_module():
    """A `custom_vjp` called without differentiating keeps its backward function as a parameter:
    keyed by its lowered module instead (which holds everything it computes)."""

    @jax.custom_vjp
    def double(x):
        return x * 2.0

    double.defvjp(lambda x: (x * 2.0, None), lambda _, g: (g * 2.0,))
    traced = _traced(double, X)
    assert traced_digest(traced) is None
    computed, lowered = computed_material(traced, lambda t: t.lower())
    assert set(computed) == {"program"} and lowered is not None


@dataclasses.dataclass(frozen=True)
class _Scale:
    """A value-like object that is code: its fields do not say what its `__call__` does."""

    factor: float = 2.0

    def __call__(self, x):
        return x * self.factor


@pytest.mark.parametrize(
    "code",
    [_Scale(), functools.partial(_scaled, scale=2.0), _scaled],
    ids=["callable dataclass", "partial", "function"],
)
def test_a_parameter_that_is_code_is_not_written_as_a_value(code):
    with pytest.raises(traced_digest_module.NotAValue):
        traced_digest_module._Writer().value({"params": (1, code)})


def test_a_lowering_rule_from_outside_jax_keys_no_program_by_its_jaxpr(monkeypatch):
    """A rule that lowers a primitive, registered by foreign code, may compute from anything:
    while one is registered (here JAX's own `sin` rule replaced), no jaxpr keys a program."""
    traced = _traced(_scaled, X)
    assert foreign_rules() == () and traced_digest(traced) is not None

    mlir = traced_digest_module.mlir
    jax_rule = mlir._lowerings[jax.lax.sin_p]

    def foreign_sin_rule(ctx, *args, **params):  # JAX's, through a function of another module
        return jax_rule.rule(ctx, *args, **params)

    monkeypatch.setitem(mlir._lowerings, jax.lax.sin_p, mlir.LoweringRuleEntry(foreign_sin_rule, jax_rule.inline))
    assert foreign_rules() == ("sin",)
    assert traced_digest(traced) is None
    computed, _ = computed_material(traced, lambda t: t.lower())
    assert set(computed) == {"program"}, "keyed by its lowered module instead"


# ------------------------------------------------------------------ through the store

CASE = registry.get("lite-n4-c128-b2s64-f32-w32-identity-default")


def test_a_changed_external_program_is_not_served_from_the_store(tmp_path):
    """`ScaledKernel` x1, then x(1 + 2^-20) (one code, one name, one type: only the traced
    constant differs) on one store: the second misses and computes its own outputs; x1 then
    loads its own program again."""
    fixture = make_fixture(CASE)
    store = ProgramStore(tmp_path / "programs")
    outputs, counts = {}, []
    for scale in (1.0, 1.0 + 2.0**-20, 1.0):
        before = store.counts()
        path = Path(wrap_external(ScaledKernel(scale=scale)))
        outputs.setdefault(scale, []).append(ProgramCache(store=store).run(path, CASE, fixture).leaves["out"])
        counts.append({k: store.counts()[k] - before[k] for k in ("programs_stored_loaded", "programs_stored_missed")})
    assert counts == [
        {"programs_stored_loaded": 0, "programs_stored_missed": 1},
        {"programs_stored_loaded": 0, "programs_stored_missed": 1},
        {"programs_stored_loaded": 1, "programs_stored_missed": 0},
    ]
    assert not np.array_equal(outputs[1.0][0], outputs[1.0 + 2.0**-20][0]), "its own program ran"
    assert np.array_equal(outputs[1.0][0], outputs[1.0][1])
    assert store.counts()["programs_lowered_to_key"] == 0, "keyed by its jaxpr, lowered only on a miss"


# ------------------------------------------------------------------ MaxText's programs

MAXTEXT_CASE = "lite-n4-c128-b2s128-bf16-w32-identity-bf16_inexact_gates-bt64-btb32"


def _maxtext_digest(name: str) -> str | None:
    from mhc_parity.harness.engine.implementations import load_implementations

    impl = next(i for i in load_implementations("mhc_parity.maxtext_parity:implementations") if i.name == name)
    case = registry.get(MAXTEXT_CASE)
    path = Path(impl)
    placement = path_placement(path)
    args = _place(make_fixture(case), path, placement)
    program = _build_program(path, case, placement, effective_precision(case, placement))
    with jax.default_device(placement.devices[0]):
        return traced_digest(jax.jit(program).trace(*args))


@pytest.mark.slow
@pytest.mark.parametrize("change", ["a fix (fixes.permutation_constant)", "MaxText's get_permutation_matrices"])
def test_a_changed_maxtext_kernel_program_changes_its_digest(change, monkeypatch):
    """MaxText's fixed kernel path: its permutation matrices in another order, whether the
    project's fix or MaxText's own function gives them, is another key."""
    pytest.importorskip("maxtext")
    from mhc_parity.maxtext_parity import fixes

    before = _maxtext_digest("maxtext-layer-kernel-fixed")
    assert before is not None and before == _maxtext_digest("maxtext-layer-kernel-fixed")
    if change.startswith("a fix"):
        original = fixes.permutation_constant
        monkeypatch.setattr(fixes, "permutation_constant", lambda streams: np.roll(original(streams), 1, axis=0))
    else:
        original = fixes.maxtext_layer.get_permutation_matrices
        monkeypatch.setattr(
            fixes.maxtext_layer, "get_permutation_matrices", lambda streams: jnp.roll(original(streams), 1, axis=0)
        )
    after = _maxtext_digest("maxtext-layer-kernel-fixed")
    assert after is not None and after != before
