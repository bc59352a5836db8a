"""What a stored program is keyed by covers what its lowering reads (issue 66, 2) and a typed PRNG
key it closes over (issue 66, 5).

A primitive lowered through `mlir.lower_fun(f)` is traced again while it lowers: `f` may read a
tuning table or an environment variable that the jaxpr does not hold. Such a rule is foreign code
(`traced_digest.foreign_rules`), so programs are keyed by their lowered module. A typed key
(`jax.random.key`) has no NumPy form: it is keyed by its impl and bits.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.extend.core import Primitive

from mhc_parity.cases import registry
from mhc_parity.cases.fixtures import make_fixture
from mhc_parity.harness.engine import traced_digest as traced_digest_module
from mhc_parity.harness.engine.implementations import wrap_external
from mhc_parity.harness.engine.paths import Path
from mhc_parity.harness.engine.program_cache import ProgramCache
from mhc_parity.harness.engine.program_store import ProgramStore
from mhc_parity.harness.engine.traced_digest import foreign_rules, traced_digest
from tests.external_impls import DropoutAtRateZero, WrappedReference

CASE = registry.get("lite-n4-c128-b2s64-f32-w32-identity-default")


@pytest.fixture
def tuned(monkeypatch):
    """tests.tuned_lowering_impl with its lowering registered for the test only (a registered
    foreign rule keys every program of the process by its lowered module)."""
    from tests import tuned_lowering_impl

    tuned_lowering_impl.register()
    monkeypatch.delenv(tuned_lowering_impl.GAIN_VARIABLE, raising=False)
    yield tuned_lowering_impl
    traced_digest_module.mlir._lowerings.pop(tuned_lowering_impl.tuned_scale_p, None)


def _run(store, obj, fixture):
    """(out, programs loaded from `store`) of `obj`'s path on CASE."""
    before = store.counts()["programs_stored_loaded"]
    result = ProgramCache(store=store).run(Path(wrap_external(obj)), CASE, fixture)
    return np.asarray(result.leaves["out"]), store.counts()["programs_stored_loaded"] - before


def test_a_lower_fun_rule_around_foreign_code_is_foreign(tuned):
    """The rule is a closure of JAX's module; the function it traces is not JAX's."""
    assert "tuned_scale" in foreign_rules()


class _Doubles:
    def __call__(self, x):
        return x * 2


@pytest.mark.parametrize(
    "code",
    [lambda x: x * 2, _Doubles(), functools.partial(jnp.multiply, 2.0), functools.partial(_Doubles(), x=1)],
    ids=["function", "object with __call__", "partial of JAX's", "partial of an object"],
)
def test_what_a_lower_fun_rule_traces_decides_whose_it_is(code):
    """Foreign unless every callable the closure reaches is JAX's (`jnp.multiply` is)."""
    primitive = Primitive("closure_probe")
    mlir = traced_digest_module.mlir
    mlir.register_lowering(primitive, mlir.lower_fun(code, multiple_results=False))
    try:
        foreign = "closure_probe" in foreign_rules()
    finally:
        mlir._lowerings.pop(primitive)
    assert foreign == (not isinstance(code, functools.partial) or code.func is not jnp.multiply)


@pytest.mark.parametrize("change", ["table", "environment"])
def test_a_program_whose_lowering_reads_another_gain_is_not_loaded(tuned, change, tmp_path, monkeypatch):
    """Gain 1.0 stores its program; 1.01 (from the table, or the variable the lowering reads) runs
    its own, as on an empty store; 1.0 again loads the first."""
    fixture, store = make_fixture(CASE), ProgramStore(tmp_path / "programs")
    first, loaded = _run(store, tuned.TunedOutput(), fixture)
    assert loaded == 0
    if change == "table":
        monkeypatch.setitem(tuned.TABLE, "gain", 1.01)
    else:
        monkeypatch.setenv(tuned.GAIN_VARIABLE, "1.01")
    second, loaded = _run(store, tuned.TunedOutput(), fixture)
    assert loaded == 0, "the gain-1.0 program was loaded for gain 1.01"
    np.testing.assert_allclose(second, first * 1.01, rtol=1e-6)
    monkeypatch.setitem(tuned.TABLE, "gain", 1.0)
    monkeypatch.delenv(tuned.GAIN_VARIABLE, raising=False)
    third, loaded = _run(store, tuned.TunedOutput(), fixture)
    assert loaded == 1 and np.array_equal(third, first)


def test_a_program_closing_over_a_typed_key_runs_and_loads(tmp_path):
    """A dropout at rate 0 from `jax.random.key(0)`: the reference's output, stored, then loaded."""
    fixture, store = make_fixture(CASE), ProgramStore(tmp_path / "programs")
    reference, _ = _run(ProgramStore(tmp_path / "other"), WrappedReference(), fixture)
    out, loaded = _run(store, DropoutAtRateZero(key=jax.random.key(0)), fixture)
    assert loaded == 0 and np.array_equal(out, reference)
    again, loaded = _run(store, DropoutAtRateZero(key=jax.random.key(0)), fixture)
    assert loaded == 1 and np.array_equal(again, reference)


def test_a_typed_key_s_bits_and_impl_are_in_the_digest():
    """Keys of other bits, or of the same bits under another impl, are other programs."""
    bits = jnp.arange(4, dtype=jnp.uint32)
    keys = {
        "key(0)": jax.random.key(0),
        "key(1)": jax.random.key(1),
        "rbg": jax.random.wrap_key_data(bits, impl="rbg"),
        "unsafe_rbg": jax.random.wrap_key_data(bits, impl="unsafe_rbg"),
    }
    x = jnp.ones((8,), jnp.float32)
    digests = {
        name: traced_digest(jax.jit(lambda x, k=k: x * jax.random.uniform(k, x.shape)).trace(x))
        for name, k in keys.items()
    }
    assert None not in digests.values() and len(set(digests.values())) == len(keys)


@pytest.mark.slow
def test_a_cli_run_whose_lowering_reads_another_gain_fails_on_a_warm_store(tmp_path):
    """`--impl tests.tuned_lowering_impl:tuned_output` at gain 1.0 passes and stores its programs;
    at 1.01 (the variable its lowering reads) it fails (exit 1), as on an empty store."""
    from tests.cli_support import run_cli
    from tests.tuned_lowering_impl import GAIN_VARIABLE

    paths = ("reference/unsharded", "tuned_output/unsharded")
    common = ("run", "--impl", "tests.tuned_lowering_impl:tuned_output", "--cases", CASE.name, "--paths", *paths)
    # --no-causes: only the exit codes are checked, and the verdicts are the same without the
    # failing run's cause search.
    common += ("--no-lowering", "--no-causes", "--jobs", "1", "--quiet")
    codes = {}
    for gain in ("1.0", "1.01"):
        env = {"MHC_PARITY_CACHE": str(tmp_path / "cache"), GAIN_VARIABLE: gain}
        proc = run_cli(*common, "--out", tmp_path / gain, env_extra=env)
        codes[gain] = proc.returncode
        assert proc.returncode in (0, 1), proc.stdout[-2000:] + proc.stderr[-2000:]
    assert codes == {"1.0": 0, "1.01": 1}
