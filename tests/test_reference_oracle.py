"""The reference path against the independent float64 oracle."""

import ast
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mhc_parity.mhc import oracle, oracle_math, reference, rounding_model
from mhc_parity.mhc.types import WEIGHT_FIELDS, MhcConfig, MhcWeights
from tests.support import max_rel_err, mlp_params, random_activations, random_weights, tanh_mlp_branch

SHAPE = (2, 16, 4, 128)

# float32: every leaf within this many float32 epsilons (normalised by max|oracle|).
# Sums run over at most B·S·n·C = 16k terms; observed errors are ~5 eps, so 32 eps leaves room while any
# real slip (a wrong epsilon, a lost factor) is orders of magnitude larger.
F32_LEAF_BOUND = 32 * np.finfo(np.float32).eps
# bfloat16: 8 significant bits (eps 2^-7); the reference rounds x, the folded weights
# and every output once, so a few eps per leaf is what the arithmetic explains.
BF16_LEAF_BOUND = 4 * 2.0**-7


def _reference_vjp(x, weights, params, cotangent, config):
    def run(x_, w_, p_):
        layer_input, ctx = reference.pre(x_, w_, config=config)
        out = reference.post(tanh_mlp_branch(p_, layer_input), ctx, config=config)
        return out, {"layer_input": layer_input, "h_pre": ctx.h_pre, "h_post": ctx.h_post, "h_res": ctx.h_res}

    out, pullback, aux = jax.vjp(jax.jit(run), x, weights, params, has_aux=True)
    d_x, d_w, d_p = pullback(cotangent)
    forward = {"out": out, **aux}
    grads = {
        "d_x": d_x,
        **{f"d_{k}": v for k, v in d_w.as_dict().items()},
        **{f"d_branch.{k}": v for k, v in d_p.items()},
    }
    return forward, grads


def _oracle_leaves(x, weights, params, cotangent, config):
    res = oracle.run_oracle(x, weights, tanh_mlp_branch, params, cotangent, config)
    grads = {
        "d_x": res.d_x,
        **{f"d_{k}": v for k, v in res.d_weights.items()},
        **{f"d_branch.{k}": v for k, v in res.d_branch.items()},
    }
    return res.forward, grads


def _leaf_errors(config, dtype, weight_dtype, weights=None):
    x = random_activations(SHAPE, dtype=dtype)
    weights = random_weights(config, dtype=weight_dtype) if weights is None else weights
    params = mlp_params(SHAPE[-1], dtype=weight_dtype)
    cotangent = random_activations(SHAPE, seed=7, dtype=dtype)
    fwd, grads = _reference_vjp(x, weights, params, cotangent, config)
    o_fwd, o_grads = _oracle_leaves(x, weights, params, cotangent, config)
    errors = {k: max_rel_err(fwd[k], o_fwd[k]) for k in fwd}
    errors.update({k: max_rel_err(grads[k], o_grads[k]) for k in grads})
    assert set(grads) == {"d_x", "d_branch.w", "d_branch.b", *(f"d_{f}" for f in WEIGHT_FIELDS)}
    return errors


# The Sinkhorn's iterations repeat one step: a few run every operation of it through both the
# reference and the oracle (and a reference that ignored the config's count would disagree), while
# the oracle's compile time grows with each unrolled one (20 by default: four times the cost).
FEW_SINKHORN_ITERATIONS = 4


@pytest.mark.parametrize("variant", ["lite", pytest.param("sinkhorn", marks=pytest.mark.slow)])
def test_reference_matches_oracle_in_float32(variant):
    config = MhcConfig(streams=4, embedding=128, variant=variant, sinkhorn_iterations=FEW_SINKHORN_ITERATIONS)
    errors = _leaf_errors(config, jnp.float32, jnp.float32)
    bad = {k: v for k, v in errors.items() if not v <= F32_LEAF_BOUND}
    assert not bad, f"leaves beyond {F32_LEAF_BOUND:.2e}: {bad}"


@pytest.mark.parametrize("weight_dtype", [jnp.float32, jnp.bfloat16])
def test_reference_error_against_oracle_in_bfloat16_is_bounded(weight_dtype, record_property):
    config = MhcConfig(streams=4, embedding=128)
    errors = _leaf_errors(config, jnp.bfloat16, weight_dtype)
    for leaf, err in errors.items():
        record_property(f"max_rel_err[{leaf}]", f"{err:.3e}")
    bad = {k: v for k, v in errors.items() if not v <= BF16_LEAF_BOUND}
    assert not bad, f"leaves beyond {BF16_LEAF_BOUND:.2e}: {bad}"
    # bfloat16 really is coarser: the comparison can tell the dtypes apart.
    assert max(errors.values()) > F32_LEAF_BOUND


def test_oracle_catches_a_lost_post_gate_factor():
    config = MhcConfig(streams=4, embedding=128)
    x = random_activations(SHAPE)
    weights = random_weights(config)
    layer_input, ctx = reference.pre(x, weights, config=config)
    broken = reference.post(layer_input, ctx.__class__(ctx.x, ctx.h_pre, ctx.h_post / 2, ctx.h_res), config=config)
    truth = oracle.oracle_forward(x, weights, lambda h: h, config)["out"]
    assert max_rel_err(broken, truth) > 1e3 * F32_LEAF_BOUND


def _imported_modules(module) -> set[str]:
    imported = set()
    for node in ast.walk(ast.parse(pathlib.Path(module.__file__).read_text())):
        if isinstance(node, ast.Import):
            imported |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            imported.add(node.module or "")
    return imported


def test_oracle_is_independent_of_the_shared_helpers():
    """A bug in mhc_parity.mhc.common must not be reproduced by the ground truth: the oracle
    imports nothing of `mhc` but its own math and its rounding model's declarations, which
    import nothing of it."""

    def from_mhc(module) -> set[str]:
        return {m for m in _imported_modules(module) if m == "mhc_parity.mhc" or m.startswith("mhc_parity.mhc.")}

    assert from_mhc(oracle) == {"mhc_parity.mhc.oracle_math", "mhc_parity.mhc.rounding_model"}, from_mhc(oracle)
    assert from_mhc(oracle_math) == {"mhc_parity.mhc.rounding_model"}, from_mhc(oracle_math)
    assert not {m for m in _imported_modules(rounding_model) if m.startswith("mhc_parity")}


def test_oracle_permutations_follow_itertools_order():
    mats = oracle_math.oracle_permutations(3)
    assert mats.shape == (6, 3, 3) and mats.dtype == np.float64
    np.testing.assert_array_equal(mats[1], np.eye(3)[[0, 2, 1]])


def test_oracle_returns_the_cotangent_at_the_branch_output():
    config = MhcConfig(streams=2, embedding=128)
    shape = (1, 4, 2, 128)
    x = random_activations(shape)
    ct = random_activations(shape, seed=3)
    res = oracle.run_oracle(x, random_weights(config), lambda p, h: h, {}, ct, config)
    # out[j] += h_post[j] * y  =>  d_y = sum_j h_post[j] ct[j]
    expected = np.einsum("bsn,bsnc->bsc", res.forward["h_post"], np.asarray(ct, np.float64))
    np.testing.assert_allclose(res.d_layer_output, expected, rtol=1e-12)
    assert res.forward["out"].dtype == np.float64


@pytest.mark.slow
def test_oracle_rounding_noise_measures_sensitivity_proportional_to_the_roundoff():
    config = MhcConfig(streams=4, embedding=128)
    x = random_activations(SHAPE)
    weights = random_weights(config)
    params = mlp_params(SHAPE[-1])
    ct = random_activations(SHAPE, seed=7)
    exact = oracle.run_oracle(x, weights, tanh_mlp_branch, params, ct, config)
    again = oracle.run_oracle(x, weights, tanh_mlp_branch, params, ct, config, rounding_noise=(5, 0.0))
    np.testing.assert_array_equal(exact.forward["out"], again.forward["out"])
    spreads = []
    for u in (2.0**-24, 2.0**-8):
        noisy = oracle.run_oracle(x, weights, tanh_mlp_branch, params, ct, config, rounding_noise=(5, u))
        spreads.append(max_rel_err(noisy.d_weights["res_alpha"], exact.d_weights["res_alpha"]))
        # one rounding per operation moves a leaf by a few roundings, not by orders more
        assert u / 4 < max_rel_err(noisy.forward["out"], exact.forward["out"]) < 64 * u
    # linear in the roundoff: 2^16 times the noise, ~2^16 times the spread
    assert 2.0**14 < spreads[1] / spreads[0] < 2.0**18


def test_batched_draws_equal_single_draws_to_float64_rounding():
    """`run_oracle_draws` (one vmapped program) gives each seed's single-draw result: the same
    random deltas, and at most a float64 reassociation of the contractions."""
    config = MhcConfig(streams=4, embedding=128)
    x = random_activations(SHAPE, dtype=jnp.bfloat16)
    weights, params = random_weights(config), mlp_params(SHAPE[-1])
    ct = random_activations(SHAPE, seed=7, dtype=jnp.bfloat16)
    units = rounding_model.unit_roundoffs("bfloat16", "float32")
    seeds = (11, 12, 13)
    batched = oracle.run_oracle_draws(x, weights, tanh_mlp_branch, params, ct, config, seeds=seeds, units=units)
    assert len(batched) == len(seeds)
    exact = oracle.run_oracle(x, weights, tanh_mlp_branch, params, ct, config)
    for seed, draw in zip(seeds, batched):
        single = oracle.run_oracle(x, weights, tanh_mlp_branch, params, ct, config, rounding_noise=(seed, units))
        for name in ("out", "h_post", "h_res"):
            scale = np.max(np.abs(exact.forward[name]))
            assert np.max(np.abs(draw.forward[name] - single.forward[name])) <= 1e-13 * scale, name
            # ... while the draw itself moved the leaf by far more (the noise is there)
            assert np.max(np.abs(draw.forward[name] - exact.forward[name])) > 1e-6 * scale, name
        for name, grad in single.d_weights.items():
            scale = np.max(np.abs(grad)) or 1.0
            assert np.max(np.abs(draw.d_weights[name] - grad)) <= 1e-12 * scale, name
    # different seeds draw different noise
    assert not np.array_equal(batched[0].forward["out"], batched[1].forward["out"])


def test_the_random_banks_do_not_depend_on_the_optimisation_level():
    """`_bank_program` compiles at XLA's default level, the oracle at -O0: its numbers must
    be the ones the oracle's own -O0 compile would draw (integer arithmetic and an exact
    affine map), bit for bit."""
    with jax.enable_x64(True):
        keys = jnp.stack([jax.random.key(seed) for seed in (0, 11, 2**31 - 1)])
        banks = np.asarray(oracle._bank_program(4099)(keys))
        unoptimised = jax.jit(
            jax.vmap(lambda key: jax.random.uniform(key, (4099,), jnp.float64, -1.0, 1.0)),
            compiler_options=oracle._COMPILER_OPTIONS,
        )
        assert banks.dtype == np.float64 and banks.shape == (3, 4099)
        assert np.array_equal(banks.view(np.uint64), np.asarray(unoptimised(keys)).view(np.uint64))
        assert np.all((banks >= -1.0) & (banks < 1.0)) and len(np.unique(banks)) > 12_000


def test_a_bank_of_the_wrong_size_is_refused():
    config = MhcConfig(streams=4, embedding=128)
    with jax.enable_x64(True):
        x = jnp.zeros((1, 8, 4, 128), jnp.float64)
        w = {k: jnp.asarray(v, jnp.float64) for k, v in random_weights(config).as_dict().items()}
        params = {k: jnp.asarray(v, jnp.float64) for k, v in mlp_params(128).items()}
        program = oracle._oracle_program(tanh_mlp_branch, config)
        units = jnp.zeros((1, len(rounding_model.PRECISION_CLASSES)), jnp.float64)
        with pytest.raises(ValueError, match="bank holds"):
            program(x, w, params, x, jnp.zeros((1, 5), jnp.float64), units)


# ------------------------------------------------------------ the mixed-precision rounding model


def _gate_dominated_weights(config):
    """Small gate scales and O(1) biases: the regime where a bfloat16 bias would show."""
    weights = random_weights(config).as_dict()
    for name in ("pre", "post", "res"):
        weights[f"{name}_scale"] = jnp.full((1,), 0.03)
        weights[f"{name}_bias"] = 1.5 + 0.1 * weights[f"{name}_bias"]
    return MhcWeights.from_dict(weights)


def _sensitivity(units, leaf="h_post", dtype=jnp.bfloat16, seed=3, variant="lite", **config_changes):
    config = MhcConfig(streams=4, embedding=128, variant=variant, **config_changes)
    x = random_activations(SHAPE, dtype=dtype)
    weights = _gate_dominated_weights(config)
    params = mlp_params(SHAPE[-1])
    ct = random_activations(SHAPE, seed=7, dtype=dtype)
    exact = oracle.run_oracle(x, weights, tanh_mlp_branch, params, ct, config)
    noisy = oracle.run_oracle(x, weights, tanh_mlp_branch, params, ct, config, rounding_noise=(seed, units))
    pick = lambda r: r.forward[leaf] if leaf in r.forward else r.d_weights[leaf]  # noqa: E731
    return max_rel_err(pick(noisy), pick(exact))


@pytest.mark.slow
def test_rounding_model_holds_the_coefficients_in_float32_in_bfloat16_runs():
    """The coefficients of a bfloat16 run are float32 arithmetic on a bfloat16 projection:
    rounding every value at bfloat16 would explain away a bfloat16 gate bias (the upstream bug)."""
    mixed = rounding_model.unit_roundoffs("bfloat16", "float32")
    uniform = {c: mixed[rounding_model.ACTIVATION] for c in rounding_model.PRECISION_CLASSES}
    assert (
        mixed[rounding_model.FLOAT32] == 2.0**-24
        and mixed[rounding_model.ACTIVATION] == mixed[rounding_model.OPERAND] == 2.0**-8
    )
    assert (
        mixed[rounding_model.WEIGHT] == 2.0**-24
        and rounding_model.unit_roundoffs("bfloat16", "bfloat16")[rounding_model.WEIGHT] == 2.0**-8
    )
    assert mixed[rounding_model.MATMUL] == 0.0, "at highest precision a dot rounds no operand"
    tpu_default = rounding_model.unit_roundoffs("float32", "float32", matmul_operand_roundoff=2.0**-8)
    assert tpu_default[rounding_model.OPERAND] == tpu_default[rounding_model.MATMUL] == 2.0**-8
    assert tpu_default[rounding_model.ACTIVATION] == tpu_default[rounding_model.FLOAT32] == 2.0**-24
    for leaf in ("h_post", "h_pre", "h_res"):
        assert _sensitivity(mixed, leaf) < _sensitivity(uniform, leaf) / 4, leaf
    # ...while the bfloat16 roundings a correct path makes still move them: far above float32 noise.
    float32_only = {c: (2.0**-24 if c == rounding_model.FLOAT32 else 0.0) for c in rounding_model.PRECISION_CLASSES}
    assert _sensitivity(mixed) > 100 * _sensitivity(float32_only)


def test_rounding_model_explains_the_reference_bfloat16_error():
    """What a correct bfloat16 path does must be inside what the model explains (RMS over draws)."""
    config = MhcConfig(streams=4, embedding=128)
    errors = _leaf_errors(config, jnp.bfloat16, jnp.float32, _gate_dominated_weights(config))
    units = rounding_model.unit_roundoffs("bfloat16", "float32")
    for leaf in ("h_post", "h_pre", "h_res", "out", "layer_input"):
        spread = np.sqrt(np.mean([_sensitivity(units, leaf, seed=s) ** 2 for s in range(4)]))
        assert errors[leaf] < 3 * spread, (leaf, errors[leaf], spread)


@pytest.mark.slow
def test_every_rounding_site_is_used_and_every_class_is_known(monkeypatch):
    used = []
    original = oracle_math.RoundingNoise.__call__

    def recording(self, v, site, part=""):
        used.append(site)
        return original(self, v, site, part)

    monkeypatch.setattr(oracle_math.RoundingNoise, "__call__", recording)
    oracle._oracle_program.cache_clear()
    try:
        _sensitivity(rounding_model.unit_roundoffs("bfloat16", "float32"))
        # The Sinkhorn's sums and logs (the backend's exp and log) are in its variant only.
        # One iteration passes every site of the Sinkhorn's step as twenty would.
        units = rounding_model.unit_roundoffs("bfloat16", "float32")
        _sensitivity(units, leaf="h_res", variant="sinkhorn", sinkhorn_iterations=1)
    finally:
        oracle._oracle_program.cache_clear()
    assert set(used) == set(rounding_model.ROUNDING_SITES)
    for site in rounding_model.ROUNDING_SITES.values():
        assert set(site.forward) | set(site.backward) <= set(rounding_model.PRECISION_CLASSES) and site.why
    with pytest.raises(ValueError, match="precision classes"):
        oracle.run_oracle(
            np.zeros(SHAPE),
            random_weights(MhcConfig(streams=4, embedding=128)),
            tanh_mlp_branch,
            mlp_params(SHAPE[-1]),
            np.zeros(SHAPE),
            MhcConfig(streams=4, embedding=128),
            rounding_noise=(0, {rounding_model.FLOAT32: 1e-7}),
        )


def test_a_branch_declares_its_own_rounding_sites():
    """The MLP branch rounds its hidden activation (and that value's cotangent) through the
    oracle's model: its parameter gradients move further than with the branch exact, and a
    site that repeats one of the layer's names is refused."""
    from mhc_parity.cases.branches import BRANCHES, MLP_ROUNDING_SITES

    mlp = BRANCHES["mlp"]
    config = MhcConfig(streams=4, embedding=128)
    x = random_activations(SHAPE, dtype=jnp.bfloat16)
    weights = random_weights(config)
    params = {k: jnp.asarray(v) for k, v in mlp.init(np.random.default_rng(0), SHAPE[-1]).items()}
    ct = random_activations(SHAPE, seed=7, dtype=jnp.bfloat16)
    units = rounding_model.unit_roundoffs("bfloat16", "float32")
    sites = rounding_model.branch_site_tuple(MLP_ROUNDING_SITES)
    with jax.enable_x64(True):
        x64 = jnp.asarray(np.asarray(x, np.float64))
        recorded = oracle._recorded_sites(
            x64,
            {k: jnp.asarray(np.asarray(v, np.float64)) for k, v in weights.as_dict().items()},
            {k: jnp.asarray(np.asarray(v, np.float64)) for k, v in params.items()},
            x64,
            config,
            mlp.apply,
            sites,
        )
    assert {"mlp_hidden", "mlp_preactivation"} <= {site for site, _ in recorded}

    # The exact answer, computed once for both spreads below (the oracle's answer is a function
    # of its inputs: computing it again gave the same one).
    exact = oracle.run_oracle(x, weights, mlp.apply, params, ct, config, branch_sites=MLP_ROUNDING_SITES)

    def spread(branch_sites, only_sites=None):
        if only_sites is None:
            draws = oracle.run_oracle_draws(
                x, weights, mlp.apply, params, ct, config, seeds=range(8), units=units, branch_sites=branch_sites
            )
        else:
            draws = oracle.run_oracle_batch(
                x,
                weights,
                mlp.apply,
                params,
                ct,
                config,
                draws=[(seed, units) for seed in range(8)],
                branch_sites=branch_sites,
                only_sites=only_sites,
            )
        return np.sqrt(np.mean([max_rel_err(d.d_branch["w_out"], exact.d_branch["w_out"]) ** 2 for d in draws]))

    # The branch's own sites alone move its gradient by a good share of what every site does.
    assert spread(MLP_ROUNDING_SITES, only_sites=tuple(MLP_ROUNDING_SITES)) > 0.1 * spread(MLP_ROUNDING_SITES)
    # Without the branch's sites declared, its site names are no rounding site: refused before
    # anything is computed (the exact run and draws a spread would compile first showed nothing).
    with pytest.raises(ValueError, match="only_sites names no rounding site"):
        spread(None, only_sites=tuple(MLP_ROUNDING_SITES))
    with pytest.raises(ValueError, match="clash"):
        rounding_model.branch_site_tuple({"layer_input": MLP_ROUNDING_SITES["mlp_hidden"]})
