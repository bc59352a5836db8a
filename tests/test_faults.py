"""Faults, legitimate variants and `mhc-parity faults` (kill matrix, sweep).

Fast by design: the full catalogue on the default suite is `make faults`; here every
perturbation is checked to patch and restore exactly its seams and to leave the paths
it does not name bit-identical, representative faults (reference, kernel, sharded,
custom VJP, an external implementation without h_pre) are shown caught on small cases
per dtype slice, legitimate variants pass, the unmodified code passes a 2-seed sweep,
and the CLI's exit codes are pinned.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import pathlib

import numpy as np
import pytest

from mhc_parity.cases.catalogue import make_case
from mhc_parity.harness.commands import faults as faults_cli
from mhc_parity.harness.engine.implementations import INTERPRET, REFERENCE
from mhc_parity.harness.engine.paths import Path
from mhc_parity.harness.engine.program_cache import ProgramCache
from mhc_parity.harness.faults import (
    CATALOGUE,
    FAULTS,
    VARIANTS,
    VARIANTS_BY_NAME,
    Patch,
    Perturbation,
    Seam,
    SeamError,
    passes,
)
from mhc_parity.harness.faults import matrix as kill_matrix
from mhc_parity.harness.faults import seed_sweep as sweep
from mhc_parity.harness.faults.model import BelowBackendShift, UnknownPerturbationError, select
from mhc_parity.records.cause_consistency import consistent_causes
from mhc_parity.records.kill_records import BELOW_BACKEND_SHIFT, BELOW_ROUNDING, KillMatrix, fault_counts
from mhc_parity.records.schema import TIMING_COLUMNS
from mhc_parity.reports.kill_matrix import kill_matrix_document, kill_matrix_markdown
from mhc_parity.reports.samples import measured_row
from mhc_parity.reports.sweep import calibration_table, headroom_table

# Registry cases the CLI tests select by name. The kernels reject embedding 96 before
# compiling anything (an expected-unsupported case), so only the reference path (and
# the independent external implementation) run: the cheapest case a reference fault
# can be killed on. The lite one runs every path.
REFERENCE_ONLY_CASE = "lite-n4-c96-b2s64-f32-w32-identity-default"
LITE_CASE = "lite-n4-c128-b2s64-f32-w32-identity-default"

# Hand-made small cases for in-process runs: one unsharded, one token-sharded over all
# 8 host devices with 16 tokens per shard (2 kernel blocks per shard), and a bfloat16
# one whose gate parameters bfloat16 cannot represent.
SMALL = make_case(streams=3, batch=1, sequence=32, dtype="float32")
SMALL_SHARDED = make_case(batch=2, sequence=64, dtype="float32", mesh=(2, 4), block_tokens=8)
SMALL_BF16 = make_case(batch=1, sequence=64, dtype="bfloat16", init="bf16_inexact_gates")
ALL = CATALOGUE + VARIANTS


def _no_op(name="test.no_op", legitimate=False) -> Perturbation:
    """A perturbation that installs the original value: nothing can catch it."""
    return Perturbation(
        name=name,
        description="test-only: patches the reference gate with itself",
        patches=(Patch(Seam("mhc_parity.mhc.reference", "compute_sigmoid_gate"), lambda original: original),),
        implementations=("reference",),
        legitimate=legitimate,
    )


@pytest.fixture(scope="module", autouse=True)
def compilation_cache():
    """JAX's persistent compilation cache, on from the module's first test rather than its first CLI
    test (`mhc-parity faults` turns it on for the process, as `run` does): the tests here compile the
    same programs again and again (a perturbation's untouched paths, the clean passes of the one-pass
    references and of the matrices, a case's seeds), and a program whose HLO a patch changes is
    compiled afresh, so no row can come from another's program. Left on, as the CLI leaves it."""
    from mhc_parity.harness.engine.run_info import enable_compilation_cache

    enable_compilation_cache()


@pytest.fixture(scope="module")
def impls():
    return kill_matrix.implementations()


# ------------------------------------------------------------------ the catalogues


def test_catalogue_covers_the_required_regressions():
    required = {
        "reference.gate_params_bf16",
        "kernel.gate_params_bf16",
        "kernel.pre_epsilon_dropped",
        "kernel.post_gate_factor_lost",
        "kernel.rms_stats_bf16",
        "kernel.permutation_order_changed",
        "kernel.residual_contraction_transposed",
        "kernel.weight_grad_not_summed",
        "kernel.bias_grad_zeroed",
        "kernel.token_block_skipped",
        "kernel.vjp_bias_grads_swapped",
        "kernel.accumulators_reset_every_block",
        "independent.gate_params_bf16",
        "reference.layer_input_scaled",
    }
    assert required <= set(FAULTS)
    assert len({p.name for p in ALL}) == len(ALL), "names must be unique across faults and variants"
    prefixes = {("reference",): "reference.", ("interpret", "mosaic"): "kernel.", ("independent",): "independent."}
    for perturbation in ALL:
        assert perturbation.description
        assert perturbation.name.startswith(prefixes[perturbation.implementations]), perturbation.name
    assert not any(f.legitimate for f in CATALOGUE) and all(v.legitimate for v in VARIANTS)


def test_exceptions_are_declared_for_slices_and_faults_only():
    listed = {(f.name, s) for f in CATALOGUE for s, _ in f.unkillable_in}
    assert listed == {
        (f"{p}.{what}", "bfloat16")
        for p in ("reference", "kernel")
        for what in ("pre_epsilon_dropped", "rms_stats_bf16")
    }
    with pytest.raises(ValueError, match="slices"):
        Perturbation(
            name="x",
            description="d",
            patches=_no_op().patches,
            implementations=("reference",),
            unkillable_in=(("float16", "no such slice"),),
        )
    with pytest.raises(ValueError, match="faults only"):
        Perturbation(
            name="x",
            description="d",
            patches=_no_op().patches,
            implementations=("reference",),
            legitimate=True,
            unkillable_in=(("bfloat16", "why"),),
        )


@pytest.mark.parametrize("perturbation", ALL, ids=lambda p: p.name)
def test_perturbation_patches_its_seams_and_restores_them(perturbation):
    resolved = [p.seam.resolve() for p in perturbation.patches]
    originals = [getattr(owner, attribute) for owner, attribute in resolved]
    with perturbation.injected():
        for (owner, attribute), original in zip(resolved, originals):
            assert getattr(owner, attribute) is not original
    with pytest.raises(RuntimeError, match="boom"):
        with perturbation.injected():
            raise RuntimeError("boom")
    for (owner, attribute), original in zip(resolved, originals):
        assert getattr(owner, attribute) is original


def test_missing_seam_is_reported_not_patched():
    broken = Perturbation(
        name="test.missing",
        description="test",
        implementations=("reference",),
        patches=(Patch(Seam("mhc_parity.mhc.reference", "no_such_helper"), lambda original: original),),
    )
    with pytest.raises(SeamError, match="no_such_helper"):
        with broken.injected():
            pass


def test_select_by_glob():
    assert [f.name for f in select(["kernel.vjp_*"], CATALOGUE, "fault")] == ["kernel.vjp_bias_grads_swapped"]
    assert len(select(None, CATALOGUE, "fault")) == len(CATALOGUE)
    with pytest.raises(UnknownPerturbationError, match="no fault matches"):
        select(["kernel.no_such_*"], CATALOGUE, "fault")
    chosen = faults_cli.select_perturbations(["kernel.vjp_*"], None)
    assert [p.name for p in chosen] == ["kernel.vjp_bias_grads_swapped"], "--faults alone runs no variant"
    assert len(faults_cli.select_perturbations(None, None)) == len(ALL)


def test_scope_by_path_and_case(impls):
    sharded_fault = FAULTS["kernel.weight_grad_not_summed"]
    assert sharded_fault.affects_path(Path(INTERPRET, (2, 4)))
    assert not sharded_fault.affects_path(Path(INTERPRET, None))
    assert not sharded_fault.affects_case(SMALL, impls) and sharded_fault.affects_case(SMALL_SHARDED, impls)
    kernel_fault, reference_fault = FAULTS["kernel.gate_params_bf16"], FAULTS["reference.gate_params_bf16"]
    assert not kernel_fault.affects_path(Path(REFERENCE, None))
    assert not reference_fault.affects_path(Path(INTERPRET, None))
    sinkhorn = make_case(variant="sinkhorn")
    assert reference_fault.affects_case(sinkhorn, impls) and not kernel_fault.affects_case(sinkhorn, impls)
    rejected = make_case(embedding=96, expect_reason="multiple of 128")
    assert not kernel_fault.affects_case(rejected, impls)
    independent = FAULTS["independent.gate_params_bf16"]
    assert independent.affects_case(rejected, impls), "the independent implementation has no kernel limits"
    assert not independent.affects_case(sinkhorn, impls)
    assert not independent.affects_case(SMALL, [REFERENCE, INTERPRET]), "not in the plan: nothing to affect"


# --------------------------------------------------- each perturbation touches its path only


@pytest.fixture(scope="module")
def clean_outputs():
    """Leaves of the unmodified code: SMALL on both unsharded paths, SMALL_SHARDED on interpret."""
    from mhc_parity.cases.fixtures import make_fixture

    cache = ProgramCache()
    runs = {
        "reference": (Path(REFERENCE, None), SMALL),
        "interpret": (Path(INTERPRET, None), SMALL),
        "interpret_unsharded_big": (Path(INTERPRET, None), SMALL_SHARDED),
    }
    return {key: cache.run(path, case, make_fixture(case)).leaves for key, (path, case) in runs.items()}


def _assert_bit_identical(leaves, expected, what):
    assert leaves.keys() == expected.keys()
    for name, value in leaves.items():
        np.testing.assert_array_equal(value, expected[name], err_msg=f"{what}: leaf {name} changed")


@pytest.mark.slow
@pytest.mark.parametrize("perturbation", ALL, ids=lambda p: p.name)
def test_perturbation_leaves_the_paths_it_does_not_name_bit_identical(perturbation, clean_outputs):
    """A reference fault must not change the kernels, a kernel fault not the reference,
    a sharded-only fault not the unsharded kernel path, an external one neither."""
    from mhc_parity.cases.fixtures import make_fixture

    if perturbation.sharded_only:
        path, case, key = Path(INTERPRET, None), SMALL_SHARDED, "interpret_unsharded_big"
    elif perturbation.affects_path(Path(REFERENCE, None)):
        path, case, key = Path(INTERPRET, None), SMALL, "interpret"
    else:
        path, case, key = Path(REFERENCE, None), SMALL, "reference"
    assert not perturbation.affects_path(path)
    with perturbation.injected():
        leaves = ProgramCache().run(path, case, make_fixture(case)).leaves
    _assert_bit_identical(leaves, clean_outputs[key], f"{perturbation.name} on {path.name}")


# ------------------------------------------------------------------ kills on small cases

# SMALL's tokens (and data) in four backward token blocks of 8.
SMALL_MULTI_BLOCK = make_case(streams=3, batch=1, sequence=32, dtype="float32", block_tokens_bwd=8)


@pytest.mark.slow
def test_a_fault_past_the_first_token_block_is_seen_only_with_several_blocks(impls):
    """Accumulators zeroed at every step: the same data in one backward block passes every
    row; in four blocks the weight gradients fail (the last block's alone), nothing else."""
    from mhc_parity.harness.judging.policy_file import load_policy

    fault = FAULTS["kernel.accumulators_reset_every_block"]
    policy = load_policy(None)
    kernel_impls = [i for i in impls if i.name in ("reference", "interpret")]
    shared, memo = passes.SharedInputs(), {}
    cases = [SMALL, SMALL_MULTI_BLOCK]
    clean_rows = passes.run_clean_pass(cases, policy, shared, memo, kernel_impls)
    assert not [r for r in clean_rows if r["verdict"] in ("fail", "error")]
    rows = passes.perturbed_rows_of(fault, cases, policy, shared, memo, kernel_impls)
    failing = [r for r in rows if r["verdict"] in ("fail", "error")]
    assert {r["case"] for r in failing} == {SMALL_MULTI_BLOCK.name}
    leaves = {r["leaf"] for r in failing}
    assert {"d_pre_alpha", "d_post_bias", "d_res_scale"} <= leaves
    assert not leaves & {"out", "d_x", "h_pre", "layer_input"}, "only weight gradients may change"


@pytest.mark.slow
def test_the_accumulator_fault_acts_alike_in_the_program_a_tpu_runs():
    """On a TPU the clean kernel zero-fills at the first step (`zero_fill_at_first_step`), in
    interpret mode it starts from aliased zeros: the fault gives the same wrong weight
    gradients in both (Mosaic's program run by Pallas's TPU interpreter)."""
    import jax
    import jax.numpy as jnp

    from mhc_parity.mhc.kernels import KernelConfig, post, pre
    from mhc_parity.mhc.types import MhcConfig
    from tests.support import random_activations, random_weights

    config, shape = MhcConfig(4, 128), (1, 32, 4, 128)
    x, g = random_activations(shape, seed=4), random_activations(shape, seed=6)
    weights = random_weights(config, seed=3)

    def weight_grads(kernel):
        def loss(w):
            li, ctx = pre(x, w, config=config, kernel=kernel)
            return jnp.sum(post(jnp.tanh(li), ctx, config=config, kernel=kernel) * g)

        return jax.grad(loss)(weights).as_dict()

    interpret = KernelConfig(block_tokens=8, block_tokens_bwd=8, block_features=128)
    mosaic = dataclasses.replace(interpret, interpret=False, tpu_interpreter=True)
    clean = weight_grads(interpret)
    with FAULTS["kernel.accumulators_reset_every_block"].injected():
        faulty = {mode: weight_grads(kernel) for mode, kernel in (("interpret", interpret), ("mosaic", mosaic))}
    for leaf, value in clean.items():
        np.testing.assert_allclose(faulty["mosaic"][leaf], faulty["interpret"][leaf], rtol=1e-6, atol=1e-6)
        assert not np.allclose(faulty["mosaic"][leaf], value, rtol=1e-2), leaf


REPRESENTATIVE = (
    "reference.gate_params_bf16",  # reference path, forward numerics
    "kernel.token_block_skipped",  # kernel forward
    "kernel.weight_grad_not_summed",  # token-sharded gradient reduction
    "kernel.vjp_bias_grads_swapped",  # custom VJP
    "independent.gate_params_bf16",  # an external implementation without h_pre, bfloat16
    "kernel.coefficient_operands_rounded",  # legitimate: must pass
    "independent.normalised_activations",  # legitimate: must pass
)


def _one_pass_at_a_time(names, cases, impls):
    """The clean pass, then each perturbation's pass (`names`, faults or variants), one pass at a time
    over the cases, each (pass, case) with its own runner: (clean rows, results by name, rows by name).
    Each case keeps its own `SharedInputs`: a `HypothesisOracle` keeps the latest case's hypotheses
    only, so one shared by the cases drew a case's hypotheses again for every failing pass (the
    costliest part of a pass); the rows are the same, as the one-process matrix, which runs case by
    case, shows (`test_case_by_case_passes_give_the_rows_of_one_pass_at_a_time`)."""
    from mhc_parity.harness.judging.policy_file import load_policy

    policy = load_policy(None)
    memo = {}
    shared = {case.name: passes.SharedInputs() for case in cases}
    programs = ProgramCache()
    clean_rows = [row for c in cases for row in passes.clean_rows_of(c, policy, shared[c.name], memo, impls, programs)]
    results, rows_of = {}, {}
    for name in names:
        perturbation = FAULTS.get(name) or VARIANTS_BY_NAME[name]
        targets = [c for c in cases if perturbation.affects_case(c, impls)]
        rows = [
            row
            for c in targets
            for row in passes.perturbed_rows_of(perturbation, [c], policy, shared[c.name], memo, impls)
        ]
        results[name] = kill_matrix.judge(perturbation, rows, clean_rows, targets, 0.0)
        rows_of[name] = rows
    return clean_rows, results, rows_of


@pytest.fixture(scope="module")
def representative(impls):
    """The representative perturbations on the three small cases, one pass at a time (`_one_pass_at_a_time`)."""
    return _one_pass_at_a_time(REPRESENTATIVE, [SMALL, SMALL_SHARDED, SMALL_BF16], impls)


@pytest.mark.slow
def test_unmodified_code_passes_every_row_on_the_small_cases(representative):
    clean_rows, _, _ = representative
    failing = [
        (r["case"], r["candidate"], r["leaf"], r["reason"])
        for r in clean_rows
        if r["verdict"] != "pass" and r["verdict"] not in ("skip", "unsupported")
    ]
    assert not failing
    assert {r["candidate"] for r in clean_rows} >= {"independent/unsharded", "independent/sharded(data=2,fsdp=4)"}


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in REPRESENTATIVE if n in FAULTS])
def test_representative_fault_is_caught_in_every_slice_it_runs_in(name, representative):
    result = representative[1][name]
    assert result.ok and result.catches, f"{name}: {result.status}"
    for verdict in result.slices:
        if verdict.cases_run:
            assert verdict.caught and (verdict.margin > 1 or verdict.only_errors), (name, verdict.dtype_slice)


@pytest.mark.slow
def test_the_gate_cast_is_caught_in_an_external_kernel_without_h_pre_on_bfloat16_alone(representative):
    result = representative[1]["independent.gate_params_bf16"]
    bf16 = result.slice("bfloat16")
    assert bf16.cases_caught == (SMALL_BF16.name,)
    assert not {c.leaf for c in bf16.catches} & {"h_pre"}, "the implementation exposes no h_pre"
    assert bf16.margin >= 3


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in REPRESENTATIVE if n in VARIANTS_BY_NAME])
def test_representative_variant_passes(name, representative):
    result = representative[1][name]
    assert result.ok and result.status == "passes", result.status
    assert all(not s.catches for s in result.slices)
    assert any(s.closest is not None for s in result.slices)


def _untimed(rows) -> list[str]:
    """Rows as canonical JSON, less the columns that time them (NaN compares equal as text)."""
    return [json.dumps({k: v for k, v in r.items() if k not in TIMING_COLUMNS}, sort_keys=True) for r in rows]


# The kill matrix the CLI runs in one process, which three tests read: the workers' run is compared
# with it, the one-pass-at-a-time rows are compared with it, and its exit code and --results file are
# those of a run where every fault is killed. Two registry cases (workers take a case by name): one
# runs every unsharded path, the kernels reject the other (REFERENCE_ONLY_CASE). A reference fault
# runs on both (its causes held across two cases), a kernel fault on one, and a legitimate variant on
# both after the faults.
DEALT_CASES = (REFERENCE_ONLY_CASE, LITE_CASE)
DEALT_PERTURBATIONS = (
    "reference.post_gate_factor_lost",
    "kernel.bias_grad_zeroed",
    "independent.normalised_activations",
)
DEALT_ARGV = ["--cases", *DEALT_CASES, "--faults", "reference.post_gate_*", "kernel.bias_grad_zeroed"]
DEALT_ARGV += ["--variants", "independent.*", "--quiet"]


@pytest.fixture(scope="module")
def one_process_run(tmp_path_factory):
    """`mhc-parity faults` over DEALT_ARGV in one process, with --results: (exit code, output folder,
    results file, the `KillMatrix` that `run_in_process` returned to the CLI, recorded on its way)."""
    out = tmp_path_factory.mktemp("one")
    results = out / "docs" / "kill-matrix.md"
    returned = []
    run_in_process = kill_matrix.run_in_process

    def recorded(*args, **kwargs):
        returned.append(run_in_process(*args, **kwargs))
        return returned[-1]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(kill_matrix, "run_in_process", recorded)
        code = _main([*DEALT_ARGV, "--out", str(out), "--results", str(results)])
    (matrix,) = returned
    return code, out, results, matrix


@pytest.mark.slow
def test_case_by_case_passes_give_the_rows_of_one_pass_at_a_time(one_process_run, impls):
    """The kill matrix runs each case's clean pass and then every perturbation on it, the case's
    fixture, oracle answer, hypotheses and clean programs (from the program store) shared by its
    passes (`mhc_parity.harness.faults.passes.CaseRunner`): the rows and verdicts are those of one
    pass at a time over every case, each pass with its own runner. The matrix's rows state the
    causes that hold across a perturbation's run of the cases (`consistent_causes`, over the same
    cases either way), so the one-pass rows are compared stated so too.

    The matrix is the CLI's one-process run (DEALT_ARGV), which shows every sharing at stake: each
    case runs several passes (a fault's failing rows draw its hypotheses and fits, a variant runs
    after the faults, so a leak would fail it), the paths a perturbation leaves alone keep their clean
    rows, a fault's causes are held across two cases, and a kernel fault runs on one case only."""
    from mhc_parity.harness.engine.selection import RunSelection, select_cases

    matrix = one_process_run[3]
    cases = select_cases(RunSelection(suite=None, cases=DEALT_CASES, dtype=None))  # in the CLI's order
    clean_rows, results, rows_of = _one_pass_at_a_time(DEALT_PERTURBATIONS, cases, impls)
    assert _untimed(matrix.clean_rows) == _untimed(clean_rows)
    assert [name for name, _ in matrix.perturbed_rows] == list(DEALT_PERTURBATIONS)
    for name, rows in matrix.perturbed_rows:
        assert _untimed(rows) == _untimed(consistent_causes(rows_of[name])), name
    for result in matrix.results:
        assert repr(dataclasses.replace(result, seconds=0.0)) == repr(results[result.name]), result.name


@pytest.mark.slow
def test_cases_dealt_to_workers_give_the_one_process_matrix(one_process_run, tmp_path):
    """`--jobs 2` deals the cases to two processes (the costliest first) and assembles the matrix
    in the selection's order: every file is the one-process run's but for timing."""
    one = one_process_run[1]
    assert one_process_run[0] == 0
    assert _main([*DEALT_ARGV, "--jobs", "2", "--out", str(tmp_path / "two")]) == 0
    documents = []
    for run in (one, tmp_path / "two"):
        document = json.loads((run / "kill_matrix.json").read_text())
        del document["metadata"]
        for result in document["results"]:
            del result["seconds"]
        documents.append(document)
    assert documents[0] == documents[1]
    for name in ("clean_rows.csv", "perturbed_rows.csv"):
        first, second = (_untimed(csv.DictReader((run / name).open())) for run in (one, tmp_path / "two"))
        assert first == second and first, name
    assert (one / "kill_matrix.md").read_text() == (tmp_path / "two" / "kill_matrix.md").read_text()


def test_the_costliest_cases_are_dealt_first(impls):
    """Each worker takes the next case when it is done, so the costliest go first: more passes,
    more elements and a mesh (its sharded paths) each cost more."""
    bigger = make_case(streams=3, batch=4, sequence=32, dtype="float32")
    assert kill_matrix.estimated_cost(SMALL, 5) > kill_matrix.estimated_cost(SMALL, 2)
    assert kill_matrix.estimated_cost(bigger, 5) > kill_matrix.estimated_cost(SMALL, 5)
    unsharded = make_case(batch=2, sequence=64, dtype="float32", block_tokens=8)
    assert kill_matrix.estimated_cost(SMALL_SHARDED, 5) > kill_matrix.estimated_cost(unsharded, 5)
    by_case = kill_matrix.perturbations_by_case(ALL, [SMALL, SMALL_SHARDED], impls)
    assert by_case[SMALL.name] == [p for p in ALL if p.affects_case(SMALL, impls)]
    assert FAULTS["kernel.weight_grad_not_summed"] in by_case[SMALL_SHARDED.name]
    assert FAULTS["kernel.weight_grad_not_summed"] not in by_case[SMALL.name]


def test_no_seam_is_in_the_code_a_cases_passes_share():
    """A case's passes share its fixture, oracle answer and hypotheses, and store the fits of
    its failing candidates: sound while no perturbation patches a module the fixtures, the
    oracle or a fit are computed from."""
    import importlib.util

    from mhc_parity.cases.fixtures import GENERATOR_ENTRY
    from mhc_parity.harness.engine.fit_store import fit_sources
    from mhc_parity.harness.engine.oracle_cache import oracle_sources
    from mhc_parity.records.code import import_closure
    from mhc_parity.records.project_code import PROJECT_ROOT

    shared = set(oracle_sources()) | set(import_closure(GENERATOR_ENTRY)) | set(fit_sources())
    for perturbation in ALL:
        for seam in perturbation.seams:
            origin = importlib.util.find_spec(seam.module).origin
            assert str(pathlib.Path(origin).relative_to(PROJECT_ROOT)) not in shared, (perturbation.name, seam.name)


@pytest.mark.slow
def test_a_scaled_layer_input_fails_its_own_row_on_cancelling_bfloat16_data(impls):
    """On mixed_signs the collapse cancels: a legitimate bfloat16 collapse operand moves
    layer_input by a third of what a 10% scale error does in RMS, so the gain criterion
    (the error along the leaf itself) is what fails the fault with a margin, and it must
    pass the variant.

    Both perturbations patch the reference alone and the row read is the reference's own
    comparison with the oracle, so the reference is the only implementation run: that row is
    the same, column for column, as in a run of every implementation."""
    from mhc_parity.cases import registry
    from mhc_parity.harness.judging.policy_file import load_policy

    case = registry.get("lite-n4-c128-b2s64-bf16-w32-mlp-mixed_signs")
    policy, shared, memo = load_policy(None), passes.SharedInputs(), {}
    impls = [i for i in impls if i.name == "reference"]
    passes.run_clean_pass([case], policy, shared, memo, impls)

    def layer_input_row(name):
        perturbation = FAULTS.get(name) or VARIANTS_BY_NAME[name]
        rows = passes.perturbed_rows_of(perturbation, [case], policy, shared, memo, impls)
        (row,) = [
            r
            for r in rows
            if r["leaf"] == "layer_input" and r["candidate"] == "reference/unsharded" and r["comparison"] == "vs_oracle"
        ]
        return row

    fault = layer_input_row("reference.layer_input_scaled")
    assert fault["verdict"] == "fail" and "cand_oracle_gain" in fault["reason"], fault["reason"]
    variant = layer_input_row("reference.coefficient_operands_rounded")
    assert variant["verdict"] == "pass" and variant["bound_usage"] < 0.5


@pytest.mark.slow
def test_kills_land_on_the_leaves_the_fault_models(representative):
    results = representative[1]

    def caught(name, comparison):
        return {c.leaf for c in results[name].catches if c.comparison == comparison}

    assert {"h_pre", "h_post", "layer_input"} & caught("reference.gate_params_bf16", "vs_oracle")
    assert {"d_pre_bias", "d_post_bias"} <= caught("kernel.vjp_bias_grads_swapped", "vs_reference")
    assert "d_x" not in caught("kernel.vjp_bias_grads_swapped", "vs_reference")
    not_summed = caught("kernel.weight_grad_not_summed", "vs_unsharded")
    assert {"d_pre_alpha", "d_pre_bias", "d_res_scale"} <= not_summed
    assert not not_summed & {"out", "d_x", "h_pre"}, "only weight gradients may change"
    assert results["kernel.weight_grad_not_summed"].slice("float32").cases_run == (SMALL_SHARDED.name,)
    assert "out" in caught("kernel.token_block_skipped", "vs_reference")


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in REPRESENTATIVE if n in FAULTS])
def test_each_representative_fault_names_its_own_cause(name, representative):
    # A precision fault's rows name its own rounding; a logic fault's name no rounding.
    result = representative[1][name]
    named = [s for s in result.slices if s.cause_rows]
    assert named, f"{name}: no failing row names a cause"
    for verdict in named:
        assert verdict.own_cause, (name, verdict.dtype_slice, verdict.top_cause)


# -------------------------------------------------------------------- judging, headroom


def _row(verdict, usage=0.5, leaf="h_pre", comparison="vs_oracle", case=SMALL, candidate="reference/unsharded"):
    return {
        "case": case.name,
        "candidate": candidate,
        "partner": "oracle",
        "leaf": leaf,
        "comparison": comparison,
        "leaf_kind": "intermediate",
        "dtype": "float32",
        "verdict": verdict,
        "bound_usage": usage,
        "reason": "",
        "bound": "b",
    }


def test_rows_failing_on_clean_code_are_not_evidence():
    fault = _no_op()
    clean = [_row("pass", leaf="h_pre"), _row("fail", 3.0, leaf="h_post"), _row("pass", leaf="out")]
    faulted = [_row("fail", 40.0, leaf="h_pre"), _row("fail", 9.0, leaf="h_post"), _row("error", math.nan, leaf="out")]
    result = kill_matrix.judge(fault, faulted, clean, [SMALL], 1.0)
    f32 = result.slice("float32")
    assert f32.caught and result.ignored_clean_failures == 1
    assert {c.leaf for c in f32.catches} == {"h_pre", "out"}
    assert f32.margin == 40.0 and f32.cell == "killed 1/1 (40x)"
    survived = kill_matrix.judge(fault, [_row("fail", 9.0, leaf="h_post"), _row("pass", 0.7)], clean, [SMALL], 1.0)
    assert survived.status == "SURVIVED in float32" and not survived.ok
    assert survived.slice("float32").closest.usage == 0.7 and survived.slice("float32").closest.clean_usage == 0.5
    assert kill_matrix.judge(fault, [], clean, [], 0.0).status == "not exercised"


def test_slices_are_judged_separately():
    fault = _no_op()
    bf16_case = make_case(dtype="bfloat16")
    rows = [_row("fail", 5.0, case=SMALL), _row("pass", 0.9, case=bf16_case)]
    clean = [_row("pass", 0.1, case=SMALL), _row("pass", 0.2, case=bf16_case)]
    result = kill_matrix.judge(fault, rows, clean, [SMALL, bf16_case], 0.0)
    assert result.slice("float32").status == "killed" and result.slice("bfloat16").status == "SURVIVED"
    assert not result.ok, "killed on float32 cases alone is not killed"
    listed = Perturbation(
        name="t.listed",
        description="d",
        patches=fault.patches,
        implementations=("reference",),
        unkillable_in=(("bfloat16", "below the noise"),),
    )
    excused = kill_matrix.judge(listed, rows, clean, [SMALL, bf16_case], 0.0)
    assert excused.ok and excused.status == "killed in float32; listed in bfloat16 (not seen)"
    assert excused.outcome == "caught in part" and excused.slice("bfloat16").listed_by == BELOW_ROUNDING
    variant = kill_matrix.judge(_no_op(legitimate=True), rows, clean, [SMALL, bf16_case], 0.0)
    assert variant.slice("float32").status == "FALSE POSITIVE" and not variant.ok


def test_a_fault_below_the_backend_s_own_shift_is_listed_only_where_the_clean_rows_show_it():
    """The epsilon faults on the TPU v5e: a correct sigmoid there shifts h_pre on every token by
    ~1e-4 of its size, the dropped 1e-6 epsilon by ~2e-6; on a CPU (no backend shift) they must
    be caught."""
    below = BelowBackendShift("float32", "h_pre", 1e-6, "the backend's sigmoid")
    listed = Perturbation(
        name="t.below",
        description="d",
        patches=_no_op().patches,
        implementations=("reference",),
        below_backend_shift=(below,),
    )

    def clean_row(shift, leaf="h_pre"):  # h_pre's largest value 0.5: the epsilon is 2e-6 of it
        return {**_row("pass", 0.2, leaf=leaf), "oracle_backend_shift": shift, "max_abs_err": 1e-7, "max_rel_err": 2e-7}

    survived = [_row("pass", 0.3)]
    on_tpu = kill_matrix.judge(listed, survived, [clean_row(1e-4), clean_row(math.nan, "h_post")], [SMALL], 0.0)
    assert on_tpu.ok and on_tpu.status == "listed in float32 (not seen)" and on_tpu.outcome == "listed"
    assert on_tpu.slice("float32").listed_by == BELOW_BACKEND_SHIFT
    assert "h_pre shifted by at least 0.0001" in on_tpu.slice("float32").unkillable_reason
    assert "the fault by at most 2e-06" in on_tpu.slice("float32").unkillable_reason
    for clean in ([clean_row(math.nan)], [clean_row(1e-6)], [clean_row(1e-4), clean_row(math.nan)], []):
        result = kill_matrix.judge(listed, survived, clean, [SMALL], 0.0)
        assert result.status == "SURVIVED in float32" and not result.ok, clean
    with pytest.raises(ValueError, match="slices"):
        dataclasses.replace(listed, below_backend_shift=(dataclasses.replace(below, dtype_slice="float16"),))


def test_listed_faults_are_counted_apart_from_caught_ones_in_the_headline_and_every_slice():
    """The smoke kill matrix in float32 with the TPU v5e's terms read "17/18 caught (or listed)"
    while both epsilon faults were never seen: a listed slice is counted as listed, never caught."""
    bf16_case = make_case(dtype="bfloat16")
    clean = [
        {**_row("pass", 0.1), "oracle_backend_shift": 1e-4, "max_abs_err": 1e-7, "max_rel_err": 2e-7},
        _row("pass", 0.2, case=bf16_case),
    ]

    def fault(name, **listing):
        return dataclasses.replace(_no_op(name), **listing)

    below = BelowBackendShift("float32", "h_pre", 1e-6, "the backend's sigmoid")
    caught_rows = [_row("fail", 5.0), _row("fail", 3.0, case=bf16_case)]
    quiet_rows = [_row("pass", 0.3), _row("pass", 0.4, case=bf16_case)]
    results = (
        kill_matrix.judge(fault("t.caught"), caught_rows, clean, [SMALL, bf16_case], 0.0),
        kill_matrix.judge(fault("t.epsilon", below_backend_shift=(below,)), [quiet_rows[0]], clean, [SMALL], 0.0),
        kill_matrix.judge(
            fault("t.rms", unkillable_in=(("bfloat16", "noise"),)),
            [caught_rows[0], quiet_rows[1]],
            clean,
            [SMALL, bf16_case],
            0.0,
        ),
        kill_matrix.judge(fault("t.sharded"), [], clean, [], 0.0),
        kill_matrix.judge(_no_op("t.variant", legitimate=True), quiet_rows, clean, [SMALL, bf16_case], 0.0),
    )
    everything = fault_counts(results)
    assert everything.text == (
        "1 caught, 1 caught in some slices and listed in the others, "
        "1 listed (not seen: below the backend shift), 1 not exercised of 4"
    )
    assert fault_counts(results, "float32").text == (
        "2 caught, 1 listed (not seen: below the backend shift), 1 not exercised of 4"
    )
    assert fault_counts(results, "bfloat16").text == (
        "1 caught, 1 listed (not seen: below the slice's own rounding), 2 not exercised of 4"
    )
    matrix = KillMatrix(tuple(clean), results, ())
    markdown = kill_matrix_markdown(matrix)
    assert f"Faults: {everything.text}." in markdown and "or listed" not in markdown
    assert f"- float32: {fault_counts(results, 'float32').text}." in markdown
    assert "`t.epsilon`, float32 (1 cases): closest row" in markdown.partition("## Listed, not seen")[2]
    document = kill_matrix_document(matrix, {})
    assert document["fault_outcomes"]["caught"] == 1 and document["fault_outcomes"]["listed"] == 1
    assert document["slice_outcomes"]["float32"]["listed_by"][BELOW_BACKEND_SHIFT] == 1
    assert [(x["name"], x["dtype_slice"]) for x in document["listed"]] == [
        ("t.epsilon", "float32"),
        ("t.rms", "bfloat16"),
    ]
    assert document["faults_ok"] == 3, "listed faults do not fail the run; the one not exercised does"


def test_headroom_is_measured_per_group_over_passing_rows():
    def row(case, usage, verdict="pass"):
        return measured_row(
            case,
            "reference/unsharded",
            "oracle",
            "vs_oracle",
            "h_pre",
            "intermediate",
            "float32",
            1.0,
            bound_usage=usage,
            verdict=verdict,
        )

    rows = [row("c", 0.2), row("c", 0.4), row("c", 0.7), row("d", 5.0, "fail")]
    table = headroom_table(rows)
    line = table.iloc[0]
    assert (line.passing, line.failing, line.max_usage, line.median_usage) == (3, 1, 0.7, 0.4)
    assert line.closest_case == "c"


def test_calibration_holds_each_cell_against_the_stated_rate():
    def row(case, usage, verdict="pass", leaf="h_pre"):
        return measured_row(
            case,
            "reference/unsharded",
            "oracle",
            "vs_oracle",
            leaf,
            "intermediate",
            "float32",
            1.0,
            bound_usage=usage,
            verdict=verdict,
        )

    rows = [row(f"a-seed{s}", u) for s, u in enumerate((0.1, 0.2, 0.6, 0.9))]
    rows += [row(f"b-seed{s}", 0.3) for s in range(3)] + [row("b-seed3", 1.5, "fail")]
    families = {**{f"a-seed{s}": "default" for s in range(4)}, **{f"b-seed{s}": "mixed_signs" for s in range(4)}}
    table = calibration_table(rows, families, 1e-5).set_index("init")
    clean, failing = table.loc["default"], table.loc["mixed_signs"]
    assert clean.rows == 4 and clean.max_usage == 0.9 and clean["above_0.5"] == 0.5 and clean["above_0.8"] == 0.25
    assert clean["above_1"] == 0 and clean["tail"] == "consistent"
    assert clean.expected_above_1 == pytest.approx(4e-5)
    # One row above its bound in 4 is far beyond a 1e-5 rate.
    assert failing["above_1"] == 0.25 and failing["tail"] == "above the stated rate"
    assert calibration_table(rows, families, None).set_index("init").loc["default"]["tail"] == "-"


def test_seeded_cases_are_renamed_and_reseeded():
    seeded = sweep.seeded_cases([SMALL], 3)
    assert [c.seed for c in seeded] == [0, 1, 2]
    assert [c.name for c in seeded] == [f"{SMALL.name}-seed{s}" for s in range(3)]


def test_the_sweep_runs_a_cases_seeds_together_and_reports_them_seed_major():
    """A case's seeds share its programs (same shapes), so they run one after the other; the
    rows are reported in the seed-major order of `seeded_cases`."""
    seeded, run = sweep.seeded_cases([SMALL, SMALL_BF16], [3, 5]), sweep.case_major([SMALL, SMALL_BF16], [3, 5])
    assert [(c.name, c.seed) for c in seeded] == [
        (f"{SMALL.name}-seed3", 3), (f"{SMALL_BF16.name}-seed3", 3),
        (f"{SMALL.name}-seed5", 5), (f"{SMALL_BF16.name}-seed5", 5),
    ]  # fmt: skip
    assert run == [seeded[0], seeded[2], seeded[1], seeded[3]]


# ------------------------------------------------------------------------------- the CLI


def _main(argv, **kwargs):
    return faults_cli.main(argv, **kwargs)


@pytest.mark.slow
def test_cli_exits_1_when_a_fault_survives(tmp_path, capsys):
    code = _main(
        ["--cases", REFERENCE_ONLY_CASE, "--out", str(tmp_path), "--quiet"],
        faults=(_no_op(), FAULTS["reference.post_gate_factor_lost"]),
        variants=(),
    )
    assert code == 1
    document = json.loads((tmp_path / "kill_matrix.json").read_text())
    assert document["survivors"] == ["test.no_op"] and document["faults_ok"] == 1
    assert "test.no_op" in capsys.readouterr().out
    markdown = (tmp_path / "kill_matrix.md").read_text()
    assert "`reference.post_gate_factor_lost`" in markdown and "## Surviving faults" in markdown
    assert "closest row" in markdown
    header = (tmp_path / "kill_matrix.csv").read_text().splitlines()[0]
    assert header.startswith("perturbation,kind,dtype_slice,status,comparison,leaf")
    assert (tmp_path / "perturbed_rows.csv").read_text().startswith("perturbation,case,")


@pytest.mark.slow
def test_cli_exits_1_on_a_false_positive(tmp_path):
    wrongly_legitimate = Perturbation(
        name="reference.claims_to_be_fine",
        description="a fault mislabelled as legitimate",
        patches=FAULTS["reference.post_gate_factor_lost"].patches,
        implementations=("reference",),
        legitimate=True,
    )
    code = _main(
        ["--cases", REFERENCE_ONLY_CASE, "--out", str(tmp_path), "--quiet"], faults=(), variants=(wrongly_legitimate,)
    )
    assert code == 1
    assert json.loads((tmp_path / "kill_matrix.json").read_text())["false_positives"] == ["reference.claims_to_be_fine"]


@pytest.mark.slow
def test_cli_exits_0_when_every_fault_is_killed(one_process_run):
    """The one-process run of DEALT_ARGV (shared with the workers' test): two faults, each killed,
    and a variant that passes."""
    code, out, results, _ = one_process_run
    assert code == 0
    document = json.loads((out / "kill_matrix.json").read_text())
    assert document["faults_ok"] == document["faults"] == 2 and document["ok"]
    written = results.read_text().splitlines()
    assert written[0] == "# Fault kill matrix" and written[2].startswith("Written by `mhc-parity faults ")
    assert "commit `" in written[2] and written[3].startswith("Machine: ")
    assert (out / "kill_matrix.md").read_text().partition("\n")[2].strip() in results.read_text()


@pytest.mark.parametrize(
    "argv",
    [
        ["--faults", "kernel.no_such_fault"],
        ["--variants", "kernel.no_such_variant"],
        ["--cases", "no-such-case-*"],
        ["--dtype", "float64"],
        ["--seeds", "0"],
        ["--seeds", "2", "--faults", "kernel.*"],
        ["--impl", "not_a_spec"],
        ["--no-such-option"],
        ["--results", "/proc/no-such-folder/results.md"],
    ],
)
def test_cli_usage_errors_exit_2(argv, tmp_path):
    assert _main(argv + ["--out", str(tmp_path)]) == 2


@pytest.mark.slow
def test_unmodified_code_passes_a_two_seed_sweep(tmp_path, capsys):
    results = tmp_path / "sweep-results.md"
    argv = ["--seeds", "2", "--cases", LITE_CASE, REFERENCE_ONLY_CASE, "--out", str(tmp_path), "--quiet"]
    code = _main([*argv, "--results", str(results)])
    printed = capsys.readouterr().out
    assert code == 0, printed
    document = json.loads((tmp_path / "sweep.json").read_text())
    assert document["failing_rows"] == 0 and document["seeds"] == 2
    usages = [h["max_usage"] for h in document["headroom"] if h["max_usage"] is not None]
    assert usages and all(u <= 1 for u in usages)
    assert (tmp_path / "headroom.csv").exists() and (tmp_path / "sweep.md").exists()
    assert "Written by `mhc-parity faults " in results.read_text()
    cases = list(dict.fromkeys(row["case"] for row in csv.DictReader((tmp_path / "rows.csv").open())))
    first, second = (name.removesuffix("-seed0") for name in cases[:2])
    assert {first, second} == {LITE_CASE, REFERENCE_ONLY_CASE}
    assert cases == [f"{first}-seed0", f"{second}-seed0", f"{first}-seed1", f"{second}-seed1"], "seed-major"


def test_the_independent_gate_has_a_finite_gradient_where_it_saturates():
    """Saturated gates (seed 5 of saturated_gates) reach logits below -88, where 1/(1 + exp(-z))
    overflows in float32 and its gradient is inf/inf."""
    import jax
    import jax.numpy as jnp

    from mhc_parity.harness.faults import independent_mhc

    z = jnp.asarray([-120.0, -90.0, 0.0, 90.0], jnp.float32)
    one = jnp.ones((), jnp.float32)
    values, grad = jax.value_and_grad(lambda logits: independent_mhc.sigmoid_gate(logits, one, 0 * one).sum())(z)
    assert bool(jnp.all(jnp.isfinite(grad))) and float(values) == pytest.approx(1.5, abs=1e-6)
