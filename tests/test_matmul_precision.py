"""Every matmul states its precision: a walk over the jaxprs of every program that runs.

The programs: the harness's forward+VJP program of the reference and interpret paths
(unsharded and token-sharded, float32 and bfloat16, with the MLP branch, at both
matmul-precision settings), the kernels' forward-only program (its custom VJP holds the
Pallas calls), the Mosaic kernel programs (unsharded and token-sharded), every branch
function in every dtype, and the float64 oracle. `tests/jaxpr_audit.py` descends into
jit, shard_map, custom_vjp and pallas_call; the first tests show it finds an implicit
dot at any depth, and in the real reference program once the precision is dropped.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jaxpr_audit import dot_sites, implicit_precision_dots, trace
from support import random_activations, random_weights

from mhc_parity.cases.branches import BRANCHES
from mhc_parity.cases.fixtures import make_fixture
from mhc_parity.cases.spec import Case
from mhc_parity.harness.engine.devices import host_fallback, path_placement
from mhc_parity.harness.engine.implementations import INTERPRET, REFERENCE
from mhc_parity.harness.engine.paths import Path, _build_program, _place
from mhc_parity.mhc import kernels, oracle, oracle_math, rounding_model
from mhc_parity.mhc.kernels import KernelConfig
from mhc_parity.mhc.kernels.lowering import abstract_tpu_mesh, kernel_programs
from mhc_parity.mhc.precision import MATMUL_PRECISIONS, dot_precision
from mhc_parity.mhc.types import MhcConfig

Precision = jax.lax.Precision
PAIR = {"highest": (Precision.HIGHEST, Precision.HIGHEST), "default": (Precision.DEFAULT, Precision.DEFAULT)}


def _expected_precision(site, setting: str) -> tuple:
    """float64 dots at HIGHEST; two bfloat16 operands at DEFAULT whatever the setting (an exact
    product, float32 accumulation: Mosaic's compiler rejects HIGHEST for them); a dot with a
    float32 operand (a float32 path's, or a bfloat16 dot's transpose: the float32 cotangent) at
    the setting."""
    if "float64" in site.operand_dtypes:
        return PAIR["highest"]
    if all(d == "bfloat16" for d in site.operand_dtypes):
        return PAIR["default"]
    return PAIR[setting]


def _assert_all_dots_state(jaxpr, setting: str, *, minimum: int = 1) -> list:
    sites = list(dot_sites(jaxpr))
    implicit = [s.describe() for s in sites if s.precision is None]
    assert not implicit, "dots without an explicit precision:\n" + "\n".join(implicit)
    assert len(sites) >= minimum, f"expected at least {minimum} dots, the walk found {len(sites)}"
    wrong = [s.describe() for s in sites if s.precision != _expected_precision(s, setting)]
    assert not wrong, f"dots not at the {setting!r} setting:\n" + "\n".join(wrong)
    return sites


# ------------------------------------------------------------------ the walk can fail


def _nested_program(precision):
    """jit → shard_map → custom_vjp → pallas_call(kernel with one dot at `precision`)."""
    mesh = jax.sharding.Mesh(np.asarray(jax.devices("cpu")[:2]), ("data",))

    def kernel(a_ref, b_ref, o_ref):
        o_ref[...] = jnp.dot(a_ref[...], b_ref[...], precision=precision)

    def matmul(a, b):
        return pl.pallas_call(
            kernel, out_shape=jax.ShapeDtypeStruct((a.shape[0], b.shape[1]), a.dtype), interpret=True
        )(a, b)

    @jax.custom_vjp
    def core(a, b):
        return matmul(a, b)

    core.defvjp(lambda a, b: (matmul(a, b), (a, b)), lambda res, g: (g @ res[1].T, res[0].T @ g))
    return jax.shard_map(core, mesh=mesh, in_specs=(jax.P("data"), jax.P()), out_specs=jax.P("data"), check_vma=False)


def test_the_walk_finds_an_implicit_dot_inside_jit_shard_map_custom_vjp_and_pallas_call():
    a, b = jnp.ones((8, 128), jnp.float32), jnp.ones((128, 128), jnp.float32)
    implicit = implicit_precision_dots(trace(_nested_program(None), a, b))
    assert len(implicit) == 1
    where = implicit[0].where
    for level in ("jit", "shard_map", "custom_vjp_call", "pallas_call", "dot_general"):
        assert level in where, where
    assert not implicit_precision_dots(trace(_nested_program(Precision.HIGHEST), a, b))


def test_the_walk_fails_on_the_reference_program_when_a_helper_drops_its_precision(monkeypatch):
    monkeypatch.setattr("mhc_parity.mhc.common.dot_precision", lambda dtype, setting="highest": None)
    jaxpr = trace(*_harness_program(REFERENCE, None, "float32", "highest"))
    with pytest.raises(AssertionError, match="without an explicit precision"):
        _assert_all_dots_state(jaxpr, "highest")


# ------------------------------------------------------------------ the real programs


@functools.cache
def _case(dtype: str, sharded: bool) -> Case:
    return Case(
        name=f"precision-audit-{dtype}-{sharded}",
        batch=2,
        sequence=64,
        streams=4,
        embedding=128,
        dtype=dtype,
        branch="mlp",
        mesh=(2, 4) if sharded else None,
        block_tokens=16,
    )


def _harness_program(impl, mesh, dtype: str, setting: str):
    """The harness's forward+VJP program of a path, with its placed fixture arguments."""
    case = _case(dtype, mesh is not None)
    path = Path(impl, mesh, host=mesh is not None and host_fallback(mesh[0] * mesh[1]))
    placement = path_placement(path)
    return _build_program(path, case, placement, setting), *_place(make_fixture(case), path, placement)


@pytest.mark.parametrize("setting", MATMUL_PRECISIONS)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("mesh", [None, (2, 4)], ids=["unsharded", "sharded"])
@pytest.mark.parametrize("impl", [REFERENCE, INTERPRET], ids=lambda i: i.name)
def test_every_dot_of_a_path_program_states_its_precision(impl, mesh, dtype, setting):
    sites = _assert_all_dots_state(trace(*_harness_program(impl, mesh, dtype, setting)), setting, minimum=6)
    if dtype == "bfloat16":
        # The forward dots of bfloat16 operands and the VJP's float32-cotangent transposes are both there.
        assert any(set(s.operand_dtypes) == {"bfloat16"} for s in sites)
        assert any(set(s.operand_dtypes) == {"float32", "bfloat16"} for s in sites)
    if impl is INTERPRET:
        assert any("pallas_call" in s.where for s in sites)
        assert mesh is None or any("shard_map" in s.where for s in sites)


@pytest.mark.parametrize("setting", MATMUL_PRECISIONS)
def test_the_kernels_custom_vjp_forward_states_its_precision(setting):
    config = MhcConfig(4, 128, matmul_precision=setting)
    x, w = random_activations((2, 64, 4, 128)), random_weights(config)

    def forward(x, w):
        layer_input, context = kernels.pre(x, w, config=config)
        return kernels.post(layer_input, context, config=config)

    sites = _assert_all_dots_state(trace(forward, x, w), setting, minimum=2)
    assert all("custom_vjp_call" in s.where and "pallas_call" in s.where for s in sites)


@pytest.mark.parametrize("setting", MATMUL_PRECISIONS)
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("mesh_shape", [(), (2, 4)], ids=["unsharded", "sharded"])
def test_every_dot_of_the_mosaic_kernel_programs_states_its_precision(mesh_shape, dtype, setting):
    config = MhcConfig(4, 128, matmul_precision=setting)
    mesh = abstract_tpu_mesh(mesh_shape, ("data", "fsdp")[: len(mesh_shape)])
    programs = kernel_programs(
        config, batch=2, seq=64, dtype=dtype, kernel=KernelConfig(block_tokens=16), mesh=mesh if mesh_shape else None
    )
    with jax.sharding.use_abstract_mesh(mesh):
        counts = {
            name: len(_assert_all_dots_state(trace(fn, *structs), setting, minimum=0))
            for name, (fn, structs) in programs.items()
        }
    assert counts["pre_forward"] and counts["pre_backward"], counts


@pytest.mark.parametrize("setting", MATMUL_PRECISIONS)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float64"])
@pytest.mark.parametrize("branch", sorted(BRANCHES))
def test_every_dot_of_a_branch_states_its_precision(branch, dtype, setting):
    spec = BRANCHES[branch]
    params = {k: jnp.asarray(v, jnp.float32) for k, v in spec.init(np.random.default_rng(0), 128).items()}

    def loss(params, h):
        return jnp.sum(spec.apply(params, h, setting).astype(jnp.float32))

    with jax.enable_x64(dtype == "float64"):
        h = jnp.ones((2, 8, 128), dtype)
        jaxpr = trace(jax.value_and_grad(loss, argnums=(0, 1)), params, h)
    _assert_all_dots_state(jaxpr, setting, minimum=6 if branch == "mlp" else 0)


@pytest.mark.parametrize("units", [None, "bfloat16"], ids=["exact", "noisy"])
def test_every_dot_of_the_oracle_is_at_highest_precision(units):
    config = MhcConfig(4, 128)
    units = oracle._units_vector(None if units is None else rounding_model.unit_roundoffs(units, "float32"))[None]
    with jax.enable_x64(True):
        x = jnp.ones((2, 8, 4, 128), jnp.float64)
        w = {k: jnp.asarray(v, jnp.float64) for k, v in random_weights(config).as_dict().items()}
        params = {k: jnp.asarray(v) for k, v in BRANCHES["mlp"].init(np.random.default_rng(0), 128).items()}
        # The jitted program's function: traced inside the audit's own jit (compiler options
        # belong to a top-level jit only).
        program = oracle._oracle_program(BRANCHES["mlp"].apply, config).__wrapped__
        sites = oracle._recorded_sites(x, w, params, x, config, BRANCHES["mlp"].apply)
        banks = jnp.zeros((1, oracle._bank_size(sites)), jnp.float64)
        jaxpr = trace(program, x, w, params, x, banks, jnp.asarray(units))
    sites = _assert_all_dots_state(jaxpr, "highest", minimum=10)
    assert oracle_math.PRECISION == dot_precision(np.float64, "default") == Precision.HIGHEST
    assert all(s.operand_dtypes == ("float64", "float64") for s in sites)
