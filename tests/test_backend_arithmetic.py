"""The backend's own arithmetic in the model, proven on a CPU with a simulated backend.

A TPU's float32 tanh errs by up to 1365 ulps (docs/backend-arithmetic.md). Here the tanh branch's
float32 tanh is degraded by a deterministic relative error of that size (`_degraded_tanh`), the
simulated backend's: the probe's table of it gives the model a term for tanh alone, and the
hypothesis "the backend's own tanh" replays it through the oracle (`_simulated_evaluator`).
"""

from __future__ import annotations

import dataclasses
import importlib
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from support import TPU_V5E_PROBE

from mhc_parity.cases import branches, registry
from mhc_parity.cases.fixtures import make_fixture
from mhc_parity.harness.engine import backend_arithmetic, oracle_path
from mhc_parity.harness.engine import leaves as leaves_module
from mhc_parity.harness.engine.backend_arithmetic import (
    ALLOWED_ULPS,
    PRIMITIVES,
    BackendArithmetic,
    measure_primitive,
    measured_arithmetic,
    model_terms,
)
from mhc_parity.harness.engine.implementations import REFERENCE
from mhc_parity.harness.engine.plan import PathPlan
from mhc_parity.harness.engine.runner import Runner
from mhc_parity.harness.judging.policy_file import load_policy
from mhc_parity.mhc import oracle, rounding_model
from mhc_parity.mhc.oracle_backend import REPLAYED
from mhc_parity.mhc.precision import accumulation_dtype

hypotheses_module = importlib.import_module("mhc_parity.mhc.operation.hypotheses")
reference_module = importlib.import_module("mhc_parity.mhc.reference")
operation_package = importlib.import_module("mhc_parity.mhc.operation")
CASE = "lite-n4-c128-b2s64-f32-w32-tanh-default"  # the case that failed on the TPU v5e
# A TPU-sized relative error (v5e tanh: up to 1365 ulps, 1.6e-4), a deterministic function of x.
DEGRADATION = 1.5e-4


def _degradation(x):
    return DEGRADATION * np.sin(4099.0 * np.asarray(x, np.float64))


def _degraded_tanh_host(x: np.ndarray) -> np.ndarray:
    """The simulated backend's float32 tanh, on the host (NumPy)."""
    x = np.asarray(x, np.float32)
    return (np.tanh(x.astype(np.float64)) * (1.0 + _degradation(x))).astype(np.float32)


@jax.custom_jvp
def _degraded_float32_tanh(v):
    return (jnp.tanh(v) * (1.0 + DEGRADATION * jnp.sin(4099.0 * v))).astype(v.dtype)


@_degraded_float32_tanh.defjvp
def _degraded_float32_tanh_jvp(primals, tangents):
    """A backend's tanh differentiates as 1 - y² of its own output (not its approximation's slope)."""
    (v,), (t,) = primals, tangents
    y = _degraded_float32_tanh(v)
    return y, (1.0 - y * y) * t


def _degraded_tanh(v):
    """tanh on the simulated backend: degraded in float32, exact in the oracle's float64."""
    return jnp.tanh(v) if v.dtype == jnp.float64 else _degraded_float32_tanh(v)


def _degraded_apply(params, h, matmul_precision="highest", rounding=None):
    """The tanh branch (`mhc_parity.cases.branches.tanh_apply`) on the simulated backend."""
    r = rounding or (lambda value, site: value)
    value = rounding_model.evaluated(r, "tanh", _degraded_tanh, h.astype(accumulation_dtype(h.dtype)))
    return r(value, "tanh_output").astype(h.dtype)


def _correctly_rounded(name):
    function = {"exp": np.exp, "log": np.log, "logistic": lambda v: 0.5 * (1 + np.tanh(0.5 * v))}.get(name)
    function = function or {"rsqrt": lambda v: 1 / np.sqrt(v), "tanh": np.tanh}[name]
    return lambda x: function(np.asarray(x, np.float64)).astype(np.float32)


def _simulated_evaluator():
    """The simulated backend's primitives for the hypotheses' replay: its tanh degraded, the rest
    correctly rounded float32."""
    return {name: (_degraded_tanh_host if name == "tanh" else _correctly_rounded(name)) for name in REPLAYED}


def _simulated_table() -> BackendArithmetic:
    """The probe's table of the simulated backend: its tanh measured as the probe measures, the
    rest as this CPU's."""
    cpu = measured_arithmetic()
    tanh = next(p for p in PRIMITIVES if p.name == "tanh")
    original = backend_arithmetic._backend_function
    try:
        backend_arithmetic._backend_function = lambda name: _degraded_tanh if name == "tanh" else original(name)
        degraded = measure_primitive(tanh, jax.devices()[0], samples=2**16)
    finally:
        backend_arithmetic._backend_function = original
    return dataclasses.replace(cpu, primitives=tuple(degraded if p.name == "tanh" else p for p in cpu.primitives))


@pytest.fixture
def simulated_backend(monkeypatch):
    """The tanh branch on the simulated backend, and the hypotheses' replay of its primitives;
    returns a function that switches the model's backend terms on."""
    degraded = dataclasses.replace(branches.BRANCHES["tanh"], apply=_degraded_apply)
    monkeypatch.setitem(branches.BRANCHES, "tanh", degraded)
    monkeypatch.setattr(hypotheses_module, "backend_evaluator", _simulated_evaluator)

    def terms_on():
        terms = model_terms(_simulated_table())
        monkeypatch.setattr(oracle_path, "backend_terms", lambda: terms)
        return terms

    return terms_on


def _reference_rows(case_name: str = CASE) -> list[dict]:
    runner = Runner(load_policy())
    rows = runner.run_case(registry.get(case_name), PathPlan(implementations=(REFERENCE,), lowering=False))
    return [r for r in rows if r["candidate"].startswith("reference") and r["comparison"] == "vs_oracle"]


def test_this_cpu_s_primitives_are_within_the_model():
    """Every term is zero here: the CPU's rows cannot move (the rule of `ALLOWED_ULPS`)."""
    table = measured_arithmetic()
    assert dict(table.key)["backend"] == jax.default_backend()
    assert [p.name for p in table.primitives] == [p.name for p in PRIMITIVES]
    assert all(np.isfinite(p.figure) and p.max_ulps <= ALLOWED_ULPS for p in table.primitives), table.record()
    assert set(model_terms(table).values()) == {0.0}
    assert BackendArithmetic.from_json(table.to_json()) == table


def test_a_primitive_past_the_allowance_gets_its_whole_figure_and_only_it():
    table = measured_arithmetic()
    tpu_like = dataclasses.replace(table.get("exp"), max_ulps=70.0, max_relative=5.6e-6)
    log = dataclasses.replace(table.get("log"), max_ulps=9e3, max_absolute=1.1e-4)
    table = dataclasses.replace(
        table, primitives=tuple({"exp": tpu_like, "log": log}.get(p.name, p) for p in table.primitives)
    )
    terms = model_terms(table)
    assert terms["exp"] == 5.6e-6 and terms["log"] == 1.1e-4  # a log's absolute error: its argument's relative
    assert {k for k, v in terms.items() if v} == {"exp", "log"}
    units = rounding_model.unit_roundoffs("float32", "float32", 0.0, terms)
    assert units["backend_exp"] == 5.6e-6 and units["backend_tanh"] == 0.0


def test_a_backend_only_site_leaves_every_other_site_s_draws_as_they_were():
    """The tanh branch's backend-only site draws after the others, and exactly 1 on this CPU: the
    draws equal those of the branch without the site (the rows of `make parity` unchanged)."""
    case = registry.get(CASE)
    fixture = make_fixture(case)
    units = oracle_path.noise_units(case)
    assert all(units[c] == 0.0 for c in rounding_model.BACKEND_CLASSES.values())
    plain = branches.BRANCHES["tanh"]

    def bare_apply(params, h, matmul_precision="highest"):
        return jnp.tanh(h.astype(accumulation_dtype(h.dtype))).astype(h.dtype)

    args = (fixture.x, fixture.weights)
    with_site = oracle.run_oracle(
        *args, plain.apply, {}, fixture.cotangent, case.mhc_config(),
        rounding_noise=(5, units), branch_sites=plain.rounding_sites,
    )  # fmt: skip
    without = oracle.run_oracle(
        *args, bare_apply, {}, fixture.cotangent, case.mhc_config(), rounding_noise=(5, units)
    )  # fmt: skip
    for name, value in with_site.forward.items():
        np.testing.assert_array_equal(value, without.forward[name], err_msg=name)
    np.testing.assert_array_equal(with_site.d_x, without.d_x)


def test_a_longer_bank_begins_with_the_shorter_one():
    """What `RoundingNoise` relies on to bank backend-only sites last (JAX's partitionable threefry)."""
    with jax.enable_x64(True):
        key = jax.random.key(11)
        short = jax.random.uniform(key, (1000,), jnp.float64, -1.0, 1.0)
        longer = jax.random.uniform(key, (1531,), jnp.float64, -1.0, 1.0)
    np.testing.assert_array_equal(short, longer[:1000])


@pytest.mark.slow
def test_the_backend_s_tanh_fails_without_its_term_names_itself_and_passes_with_it(simulated_backend):
    failing = [r for r in _reference_rows() if r["verdict"] == "fail"]
    assert failing, "a TPU-sized tanh error must fail the float32 bounds without the backend's term"
    causes = {r["cause_id"] for r in failing}
    assert causes == {"backend:tanh:float32"}, {(r["leaf"], r["cause_id"], r["cause_explained"]) for r in failing}
    assert all(r["cause_explained"] > 0.9 for r in failing)
    terms = simulated_backend()
    # tanh, and the sigmoid, which a correct path may compute through tanh (SIGMOID_ROUTES).
    assert {k for k, v in terms.items() if v} == {"tanh", "logistic"}
    rows = _reference_rows()
    assert [r for r in rows if r["verdict"] == "fail"] == []


@pytest.mark.slow
def test_without_the_backend_hypothesis_no_other_cause_claims_the_tanh_error(simulated_backend, monkeypatch):
    """The RMS statistic's fit once took 91% of a TPU tanh's bias-gradient error: a fit is named
    only where it explains the failing leaves' error jointly."""
    every = hypotheses_module.hypotheses
    monkeypatch.setattr(
        operation_package, "hypotheses", lambda *a: [h for h in every(*a) if h.kind != hypotheses_module.BACKEND_KIND]
    )
    failing = [r for r in _reference_rows() if r["verdict"] == "fail"]
    assert failing
    claimed = [(r["leaf"], r["cause_id"], r["cause_explained"]) for r in failing if r["cause_explained"] > 0.5]
    assert claimed == [], claimed


@pytest.mark.slow
def test_a_tpu_sized_error_in_a_multiply_still_fails_with_the_backend_s_terms(simulated_backend, monkeypatch):
    """The model widens only the backend primitives' outputs: the same relative error in the
    projection (a dot and the RMS scale's product, no primitive) fails. It reaches h_res through
    the softmax, whose exp the simulated backend computes correctly; the sigmoid gates after it
    are widened (a sigmoid may go through tanh), so what follows only them cannot tell."""
    simulated_backend()
    projection = reference_module.folded_rms_projection

    def erring_projection(*args, **kwargs):
        value = projection(*args, **kwargs)
        return value * (1.0 + DEGRADATION * jnp.sin(4099.0 * value))

    monkeypatch.setattr(reference_module, "folded_rms_projection", erring_projection)
    failing = [r for r in _reference_rows() if r["verdict"] == "fail"]
    assert any(r["leaf"] == "h_res" for r in failing), [(r["leaf"], r["bound_usage"]) for r in failing]


# The TPU v5e's figures of issue 50 (exp 5.6e-6 relative on [-30, 0], log 1.1e-4 absolute on [1, 16]).
TPU_SINKHORN_TERMS = {"exp": 5.6e-6, "log": 1.1e-4}


@pytest.mark.slow
def test_a_tpu_s_exp_and_log_widen_the_sinkhorn_matrix_and_nothing_upstream_of_it():
    case = registry.get("sinkhorn-n4-c128-b2s64-f32-w32-identity-default")
    fixture = make_fixture(case)
    cpu = oracle_path.noise_units(case)
    tpu = rounding_model.unit_roundoffs(case.dtype, case.weight_dtype, 0.0, TPU_SINKHORN_TERMS)
    # Four Sinkhorn iterations, not the case's 20: each is one more unrolled copy of the same
    # exp and log in the oracle's program (its compile was most of this test's time), and the
    # deviations below are those of 20 to within 3% (measured: 6.8e-5 and 4.0e-8 for 4, 7.0e-5
    # and 4.0e-8 for 20), far from either bound.
    config = dataclasses.replace(case.mhc_config(), sinkhorn_iterations=4)
    args = (fixture.x, fixture.weights, branches.BRANCHES["identity"].apply, {}, fixture.cotangent, config)
    exact = oracle.run_oracle(*args)
    on_cpu, on_tpu = (oracle.run_oracle(*args, rounding_noise=(9, units)) for units in (cpu, tpu))

    def deviation(result, leaf):
        return float(np.linalg.norm(result.forward[leaf] - exact.forward[leaf]) / np.linalg.norm(exact.forward[leaf]))

    # h_res: the chip's Sinkhorn errs 8.6e-5 to 1.1e-4 relative; the model now spans that size.
    assert deviation(on_tpu, "h_res") > 1e-5 > 100 * deviation(on_cpu, "h_res")
    for leaf in ("layer_input", "h_pre", "h_post"):  # computed before the Sinkhorn: the same draws
        np.testing.assert_array_equal(on_tpu.forward[leaf], on_cpu.forward[leaf], err_msg=leaf)


def test_the_tpu_v5e_s_measured_table_widens_its_transcendentals_and_nothing_else():
    measured = json.loads(TPU_V5E_PROBE.read_text())
    table = BackendArithmetic.from_json(measured["device"])
    assert dict(table.key)["device_kind"] == "TPU v5 lite"
    terms = backend_arithmetic.model_terms(table)
    assert all(terms[p] > 1e-6 for p in ("exp", "log", "tanh", "logistic")), terms
    assert all(terms[p] == 0.0 for p in ("rsqrt", "sqrt", "divide", "reciprocal", "dot_highest")), terms
    # A sigmoid is held to its least accurate route there: exp(-softplus(-z)), not the logistic.
    figures = {p.name: p.figure for p in table.primitives}
    assert terms["logistic"] == max(figures[route] for route in backend_arithmetic.SIGMOID_ROUTES)
    assert terms["logistic"] > 10 * figures["logistic"]
    # The replay the backend hypotheses use explains the chip's Sinkhorn error: its exp and log.
    assert measured["replay"]["fraction_explained"]["exp+log"] > 0.999
    assert measured["replay"]["fraction_explained"]["log"] > 0.99 > measured["replay"]["fraction_explained"]["exp"]


@pytest.mark.slow
def test_the_shift_the_backend_s_primitives_may_share_is_their_term_on_their_outputs(simulated_backend):
    """A primitive's error is a fixed function of its input, so tokens that feed it alike share
    it: the oracle with every backend term applied the same way on every token measures that
    shift per leaf (the sigmoid gates: the logistic's term, tanh's here); none on this CPU."""
    case = registry.get(CASE)
    fixture = make_fixture(case)
    assert oracle_path.backend_shift_units(case, oracle_path.noise_units(case)) is None
    assert oracle_path.run_oracle_path(case, fixture).backend_shift == {}
    terms = simulated_backend()
    shift = oracle_path.run_oracle_path(case, fixture).backend_shift
    h_post = oracle.run_oracle(
        fixture.x, fixture.weights, branches.BRANCHES["tanh"].apply, {}, fixture.cotangent, case.mhc_config()
    ).forward["h_post"]
    # h_post = 2 sigmoid(z): every value off by the logistic's term, its per-stream mean over
    # the tokens off by the same fraction (normalised by the largest value).
    expected = terms["logistic"] * np.max(np.mean(h_post.reshape(-1, h_post.shape[-1]), axis=0)) / np.max(h_post)
    assert shift["h_post"] == pytest.approx(expected, rel=1e-6)
    assert shift["h_pre"] > 0.5 * terms["logistic"]
    assert set(shift) == {name for name in shift if leaves_module.token_axes(name)}


@pytest.fixture
def fresh_probe_store(tmp_path, monkeypatch):
    """A private cache folder for the probe's table, a probe of 2^12 samples a primitive (the
    table's key is the full probe's: only the measuring is cut), and `measured_arithmetic`
    forgotten before and after; returns the list of measured tables (one per probe run)."""
    monkeypatch.setenv("MHC_PARITY_CACHE", str(tmp_path))
    measure = backend_arithmetic.measure_primitive
    probes = []
    real_probe = backend_arithmetic.probe_arithmetic

    def counted_probe(device=None, samples=backend_arithmetic.SAMPLES):
        probes.append(real_probe(device, samples))
        return probes[-1]

    monkeypatch.setattr(backend_arithmetic, "measure_primitive", lambda p, device, samples: measure(p, device, 2**12))
    monkeypatch.setattr(backend_arithmetic, "probe_arithmetic", counted_probe)
    measured_arithmetic.cache_clear()
    yield probes
    measured_arithmetic.cache_clear()


def test_a_probe_table_whose_numbers_were_edited_is_measured_again(fresh_probe_store, tmp_path):
    """Issue 56, item 1: the TPU v5e's numbers pasted into this CPU's stored table, its key kept,
    gave every run here the TPU's terms (a failing run passed). The table is checksummed as every
    store's entries are: an edited one is measured again and overwritten, never used."""
    first = measured_arithmetic()
    (path,) = (tmp_path / backend_arithmetic.STORE_FOLDER).glob("*.json")
    assert first.source == f"measured in this process, stored as probe table {path}"
    measured_arithmetic.cache_clear()
    assert measured_arithmetic() == first and measured_arithmetic().source == f"probe table {path}"
    assert len(fresh_probe_store) == 1

    document = json.loads(path.read_text())
    tpu = {p["name"]: p for p in json.loads(TPU_V5E_PROBE.read_text())["device"]["primitives"]}
    document["primitives"] = [tpu[p["name"]] for p in document["primitives"]]
    assert set(model_terms(BackendArithmetic.from_json(document)).values()) != {0.0}
    path.write_text(json.dumps(document, indent=1))
    measured_arithmetic.cache_clear()
    again = measured_arithmetic()
    assert len(fresh_probe_store) == 2 and again.source.startswith("measured in this process")
    assert set(model_terms(again).values()) == {0.0} and again == first
    assert backend_arithmetic.read_stored_table(path, first.key) == (first, "")  # overwritten, whole

    # A table stored before tables were checksummed is not trusted either.
    document = json.loads(path.read_text())
    del document[backend_arithmetic.CHECKSUM_FIELD]
    path.write_text(json.dumps(document))
    assert backend_arithmetic.read_stored_table(path, first.key)[0] is None
    measured_arithmetic.cache_clear()
    measured_arithmetic()
    assert len(fresh_probe_store) == 3
