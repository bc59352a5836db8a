"""The chunked float64 oracle: the one-shot oracle's draws and statistics, token chunk by token
chunk, with its host memory bounded by the case-memory estimate."""

import dataclasses
import json
import math
import pathlib
import subprocess
import sys
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mhc_parity.cases.branches import get_branch
from mhc_parity.cases.fixtures import make_fixture
from mhc_parity.cases.spec import Case
from mhc_parity.harness.engine import case_memory, oracle_cache, oracle_path
from mhc_parity.harness.engine.leaves import token_axes
from mhc_parity.harness.engine.operation import OPERATION
from mhc_parity.harness.judging.error_statistics import (
    draw_deviations,
    effective_dof,
    shared_shift,
    systematic_error,
)
from mhc_parity.harness.judging.token_statistics import TokenLeafDraws
from mhc_parity.mhc import oracle, oracle_chunks, rounding_model
from mhc_parity.mhc.oracle_chunks import bank_numbers, run_oracle_chunks

ROOT = pathlib.Path(__file__).resolve().parents[1]
# Tiny shapes (quick to compile) with an odd token count, so chunks of 5 pad the last one.
LITE = Case(name="chunks-lite", batch=3, sequence=7, streams=3, embedding=40, branch="mlp", seed=11)
SINKHORN = LITE.replace(name="chunks-sinkhorn", variant="sinkhorn", branch="tanh", dtype="bfloat16")
# The Sinkhorn case's iterations: each is one more copy of the same per-token step in the
# oracle's programs (one-shot and chunked), whose compile time grows with every copy; a few show
# that its chunks are the one-shot run as well as the default 20 would.
SINKHORN_ITERATIONS = 3
# Chunked sums reassociate float64 additions over tokens: leaves agree to a few float64 ulps of
# their largest value (measured: below 1e-15 on the default suite's cases).
LEAF_TOLERANCE = 1e-13


def _relative(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b)) / (np.max(np.abs(b)) or 1.0))


def test_bank_numbers_are_the_bank_s_numbers_at_those_positions():
    size = 40_000
    positions = np.array([0, 1, 2, 17, 12_345, size - 1], np.uint64)
    with jax.enable_x64(True):
        keys = jnp.stack([jax.random.key_data(jax.random.key(seed)) for seed in (0, 5, 2**30 + 3)])
        got = np.asarray(bank_numbers(keys, jnp.asarray(positions)))
        for row, seed in enumerate((0, 5, 2**30 + 3)):
            bank = np.asarray(jax.random.uniform(jax.random.key(seed), (size,), jnp.float64, -1.0, 1.0))
            np.testing.assert_array_equal(got[row], bank[positions.astype(np.int64)])


def _draws(case):
    units = oracle_path.noise_units(case)
    # the exact oracle, two noisy draws and a shifted one (every delta +u: a seed of None)
    return [(0, None), (3, units), (4, units), (None, units)]


def _chunks(case, chunk_tokens):
    fixture = make_fixture(case)
    branch = get_branch(case.branch)
    config = case.mhc_config()
    if case.variant == "sinkhorn":
        config = dataclasses.replace(config, sinkhorn_iterations=SINKHORN_ITERATIONS)
    args = (fixture.x, fixture.weights, branch.apply, fixture.branch_params, fixture.cotangent, config)
    one_shot = oracle.run_oracle_batch(*args, draws=_draws(case), branch_sites=branch.rounding_sites)
    chunks = list(
        run_oracle_chunks(*args, draws=_draws(case), chunk_tokens=chunk_tokens, branch_sites=branch.rounding_sites)
    )
    return one_shot, chunks


def _joined(chunks, draw: int, field: str, name: str | None = None):
    parts = [getattr(chunk.results[draw], field) for chunk in chunks]
    return np.concatenate([p if name is None else p[name] for p in parts])


@pytest.mark.parametrize("case", [LITE, SINKHORN], ids=lambda c: c.name)
def test_chunked_draws_are_the_one_shot_draws(case):
    tokens = case.batch * case.sequence
    one_shot, chunks = _chunks(case, 5)
    assert [(c.start, c.stop) for c in chunks] == [(s, min(s + 5, tokens)) for s in range(0, tokens, 5)]
    for draw, expected in enumerate(one_shot):
        for name, value in expected.forward.items():
            got = _joined(chunks, draw, "forward", name).reshape(value.shape)
            assert _relative(got, value) < LEAF_TOLERANCE, (draw, name)
        assert _relative(_joined(chunks, draw, "d_x").reshape(expected.d_x.shape), expected.d_x) < LEAF_TOLERANCE
        for field in ("d_weights", "d_branch"):
            for name, value in getattr(expected, field).items():
                total = sum(getattr(chunk.results[draw], field)[name] for chunk in chunks)
                assert _relative(total, value) < LEAF_TOLERANCE, (draw, name)
    # The noise is the one-shot noise: each noisy draw's deviation from the exact one matches
    # (a draw with other random numbers would differ by as much as the deviation itself).
    deviation = one_shot[1].d_x - one_shot[0].d_x
    chunked = (_joined(chunks, 1, "d_x") - _joined(chunks, 0, "d_x")).reshape(deviation.shape)
    assert _relative(chunked, deviation) < 1e-6


def test_one_chunk_of_every_token_is_the_one_shot_run_bit_for_bit():
    one_shot, (chunk,) = _chunks(LITE, 10_000)
    for expected, got in zip(one_shot, chunk.results):
        for name, value in expected.forward.items():
            np.testing.assert_array_equal(got.forward[name].reshape(value.shape), value)
        np.testing.assert_array_equal(got.d_x.reshape(expected.d_x.shape), expected.d_x)
        for name, value in expected.d_weights.items():
            np.testing.assert_array_equal(got.d_weights[name], value)


def _whole_statistics(exact, noisy, shifted):
    max_devs, rms_devs, gains, deviations = draw_deviations(noisy, exact)
    return {
        "max_devs": max_devs,
        "rms_devs": rms_devs,
        "gains": gains,
        "dof_rms": effective_dof(deviations),
        "systematic": [systematic_error(value, exact, token_axes=1)[0] for value in noisy],
        "shift": shared_shift(shifted, exact, token_axes=1),
    }


def _accumulated(exact, noisy, shifted, sizes):
    statistics = TokenLeafDraws(len(noisy), shifted=True)
    start = 0
    for size in sizes:
        part = slice(start, start + size)
        statistics.add(exact[part], [value[part] for value in noisy], shifted[part])
        start += size
    assert start == len(exact)
    return statistics.finish(exact)


def _leaf_draws(seed=0, tokens=50, draws=16):
    rng = np.random.default_rng(seed)
    exact = rng.normal(size=(tokens, 3, 4)) * 10.0 ** rng.integers(-3, 3, size=(1, 3, 4))
    # per-token noise, plus an error shared by every token on one group (a systematic one)
    noisy = [exact * (1 + 1e-3 * rng.normal(size=exact.shape)) for _ in range(draws)]
    noisy[3] = noisy[3] + 1e-2 * np.abs(exact).max() * (np.arange(12).reshape(3, 4) == 5)
    shifted = exact * (1 + 1e-4) + 1e-6
    return exact, noisy, shifted


# Relative agreement of chunk-wise and whole-array statistics: float64 reassociation, except the
# t statistic of an error shared by every token, whose spread is a difference of nearly equal
# numbers (relative error eps·|mean|/std: here t = 1.8e7, so about 1e-9).
RTOL = {"systematic": 1e-9}


@pytest.mark.parametrize("sizes", [[50], [7] * 7 + [1], [1] * 50, [49, 1]])
def test_accumulated_statistics_are_the_whole_arrays_statistics(sizes):
    exact, noisy, shifted = _leaf_draws()
    got, expected = _accumulated(exact, noisy, shifted, sizes), _whole_statistics(exact, noisy, shifted)
    assert got.keys() == expected.keys()
    for key, value in expected.items():
        if sizes == [50]:  # one chunk: the whole arrays' own arithmetic
            np.testing.assert_array_equal(got[key], value, err_msg=key)
        else:
            np.testing.assert_allclose(got[key], value, rtol=RTOL.get(key, 1e-12), err_msg=key)


def test_accumulated_statistics_keep_the_whole_arrays_special_values():
    exact, noisy, shifted = _leaf_draws(seed=1)
    noisy[2] = noisy[2].copy()
    noisy[2][9, 1, 1] = np.nan  # a draw with a NaN: its gain and t are NaN, its max NaN too
    zero = np.zeros_like(exact)  # an all-zero exact leaf: normalisations fall back
    for exact_, noisy_ in ((exact, noisy), (zero, [zero] * 3 + [zero + 1e-9])):
        got = _accumulated(exact_, noisy_, shifted, [9] * 5 + [5])
        expected = _whole_statistics(exact_, noisy_, shifted)
        for key, value in expected.items():
            if key == "systematic" and exact_ is zero:
                # An error equal on every token: t is unbounded (inf), or its rounding's 1e16.
                assert got[key][:3] == expected[key][:3] == [0.0] * 3 and min(got[key][3], value[3]) > 1e15
                continue
            np.testing.assert_allclose(got[key], value, rtol=RTOL.get(key, 1e-12), equal_nan=True, err_msg=key)


def _one_shot_path(case, fixture):
    """`run_oracle_path` as it was before chunks: one run over every token, then the statistics
    of the whole arrays."""
    units = oracle_path.noise_units(case)
    draws = [(0, None)] + [(seed, units) for seed in oracle_path.noise_seeds(case)]
    exact, *noisy = (
        oracle_path.named_leaves(d) for d in OPERATION.oracle_draws(case, fixture, get_branch(case.branch), draws)
    )
    sensitivity = {name: oracle_path.leaf_sensitivity([d[name] for d in noisy], value) for name, value in exact.items()}
    systematic = {
        name: oracle_path.root_mean_square([systematic_error(d[name], value)[0] for d in noisy])
        for name, value in exact.items()
        if token_axes(name)
    }
    return exact, sensitivity, systematic


def test_the_chunked_oracle_path_gives_the_one_shot_answer():
    case = LITE.replace(dtype="bfloat16")
    fixture = make_fixture(case)
    exact, sensitivity, systematic = _one_shot_path(case, fixture)
    chunked = oracle_path.run_oracle_path(case, fixture, chunk_tokens=4)
    assert chunked.leaves.keys() == exact.keys() and chunked.systematic.keys() == systematic.keys()
    for name, value in exact.items():
        assert chunked.leaves[name].shape == value.shape
        assert _relative(chunked.leaves[name], value) < LEAF_TOLERANCE, name
        # A sensitivity is a difference of leaves: its relative error is the leaves' over the
        # unit roundoff of the draws (bfloat16's 2^-8 here).
        got, want = chunked.sensitivity[name].as_dict(), sensitivity[name].as_dict()
        np.testing.assert_allclose(list(got.values()), list(want.values()), rtol=1e-9, err_msg=name)
    np.testing.assert_allclose(
        [chunked.systematic[n] for n in systematic], [systematic[n] for n in systematic], rtol=1e-9
    )


def test_chunks_run_side_by_side_give_the_same_answer_bit_for_bit(monkeypatch):
    """The oracle's own process runs several chunks at once on a many-core host (issue 55): each
    chunk's values and the sums over chunks, taken in token order, are those of one at a time; a
    chunk joins those running only while the memory has room for it."""
    case = LITE.replace(dtype="bfloat16")
    fixture = make_fixture(case)
    alone = oracle_path.run_oracle_path(case, fixture, chunk_tokens=4)
    threads, running, most = [], [0], [0]
    lock = threading.Lock()
    chunk_program = oracle._oracle_program

    def watched(*args):  # which threads the chunks ran on, and how many at once
        program = chunk_program(*args)

        def run(*a):
            with lock:
                threads.append(threading.current_thread().name)
                running[0] += 1
                most[0] = max(most[0], running[0])
            time.sleep(0.05)  # long enough for the others to start beside it
            try:
                return jax.block_until_ready(program(*a))
            finally:
                with lock:
                    running[0] -= 1

        return run

    monkeypatch.setattr(oracle, "_oracle_program", watched)
    together = oracle_path.run_oracle_path(case, fixture, chunk_tokens=4, in_flight=3)
    assert len(threads) == 6 and sum(name.startswith("oracle-chunk") for name in threads) == 5  # the first alone
    assert most[0] == 3
    for name, value in alone.leaves.items():
        np.testing.assert_array_equal(together.leaves[name], value, err_msg=name)
    assert together.sensitivity == alone.sensitivity and together.systematic == alone.systematic
    most[0] = 0
    crowded = oracle_path.run_oracle_path(case, fixture, chunk_tokens=4, in_flight=3, room=lambda: False)
    assert most[0] == 1  # no room: one at a time, still on the pool's threads
    for name, value in alone.leaves.items():
        np.testing.assert_array_equal(crowded.leaves[name], value, err_msg=name)
    with pytest.raises(ValueError, match="in_flight"):
        next(OPERATION.oracle_chunks(case, fixture, get_branch(case.branch), [(0, None)], 4, in_flight=0))


@pytest.mark.parametrize("pair_terms", [("exp",), ()], ids=["pair-with-a-term", "pair-without-terms"])
def test_a_kernel_pair_batch_shares_each_chunk_s_random_numbers_and_keeps_its_own_statistics(monkeypatch, pair_terms):
    """On a TPU the oracle runs a second batch of draws, without the backend terms a Mosaic kernel
    computes like XLA (`kernel_pair`; issue 55): the same seeds, so each chunk makes its random
    numbers once for both batches. Each batch's statistics are those it has when run alone, bit
    for bit, with its backend-shift draw or without one (a pair left with no term)."""
    case = LITE.replace(dtype="bfloat16")
    fixture = make_fixture(case)
    terms = {primitive: 2.0**-12 for primitive in rounding_model.BACKEND_PRIMITIVES}
    narrowed = {primitive: terms[primitive] for primitive in pair_terms}

    def units(backend_terms):
        noise = rounding_model.unit_roundoffs(case.dtype, case.weight_dtype, 0.0, backend_terms)
        return noise, oracle_path.backend_shift_units(case, noise)

    (noise, shift), (pair, pair_shift) = units(terms), units(narrowed)
    assert shift is not None and (pair_shift is None) == (not pair_terms)
    made = []
    numbers = oracle_chunks.bank_numbers
    monkeypatch.setattr(oracle_chunks, "bank_numbers", lambda *a: made.append(1) or numbers(*a))
    both = oracle_path.run_oracle_path(
        case, fixture, chunk_tokens=4, units=oracle_path.OracleUnits(noise, shift, pair, pair_shift)
    )
    assert len(made) == 6  # 21 tokens, 4 a chunk: one bank of random numbers a chunk, for both batches
    main_alone = oracle_path.run_oracle_path(
        case, fixture, chunk_tokens=4, units=oracle_path.OracleUnits(noise, shift, None, None)
    )
    pair_alone = oracle_path.run_oracle_path(
        case, fixture, chunk_tokens=4, units=oracle_path.OracleUnits(pair, pair_shift, None, None)
    )
    for name, value in main_alone.leaves.items():
        np.testing.assert_array_equal(both.leaves[name], value, err_msg=name)
    assert (both.sensitivity, both.systematic, both.backend_shift) == (
        main_alone.sensitivity,
        main_alone.systematic,
        main_alone.backend_shift,
    )
    assert both.kernel_pair == oracle_path.PairStatistics(
        pair_alone.sensitivity, pair_alone.systematic, pair_alone.backend_shift
    )
    assert bool(both.kernel_pair.backend_shift) == bool(pair_terms)
    with pytest.raises(ValueError, match="one units per draw"):
        next(
            OPERATION.oracle_chunks(case, fixture, get_branch(case.branch), [(0, None)], 4, other_units=[[None, None]])
        )


def test_the_chunk_is_part_of_the_oracle_cache_key(monkeypatch):
    case = LITE
    fixture = make_fixture(case)
    default = oracle_cache.key_material(case, fixture, "digest")
    monkeypatch.setenv(oracle_path.CHUNK_TOKENS_ENV_VAR, "5")
    assert oracle_path.oracle_chunk_tokens(case) == 5
    assert oracle_cache.key_material(case, fixture, "digest") != default
    monkeypatch.setenv(oracle_path.CHUNK_TOKENS_ENV_VAR, "1000000")  # past every token: the one-shot run
    assert oracle_cache.key_material(case, fixture, "digest") == default
    monkeypatch.setenv(oracle_path.CHUNK_TOKENS_ENV_VAR, "0")
    with pytest.raises(ValueError, match="positive integer"):
        oracle_path.oracle_chunk_tokens(case)


def test_the_oracle_budget_grows_with_the_tokens_by_their_whole_arrays_only():
    small = Case(name="budget", batch=1, sequence=1024, streams=4, embedding=1024, dtype="bfloat16")
    larger = small.replace(batch=8)
    n, c, extra = 4, 1024, 7 * 1024
    grown = case_memory.oracle_memory_bytes(larger, 64) - case_memory.oracle_memory_bytes(small, 64)
    # Each more token costs its exact leaves (float64, with the statistics' temporaries) and its
    # fixture rows (x and cotangent in bfloat16), not a chunk's working set again.
    leaves = 8 * case_memory.ORACLE_LEAF_COPIES * (2 * n * c + 2 * c + 2 * n + n * n)
    assert grown == extra * (leaves + 2 * n * c * 2)
    # The chunk bounds the rest: 64 tokens at a time cost a fraction of all 8192 at once.
    assert case_memory.oracle_memory_bytes(larger, 64) < case_memory.oracle_memory_bytes(larger, 8 * 1024) / 4
    # The refusal's floor is below every peak measured (bench/oracle_memory.py: 0.53-0.82 of the budget).
    assert case_memory.case_memory_bytes(larger) == int(0.5 * case_memory.oracle_memory_bytes(larger))


@pytest.mark.slow
def test_a_mid_size_case_s_measured_peak_stays_within_its_oracle_budget(tmp_path):
    """In a fresh process (its own peak): the oracle of a case of 512 tokens of 4 x 256, in
    chunks of 32 tokens, peaks within `oracle_memory_bytes`; the budget is well under the
    one-shot oracle's measured peak for the same case (1.7 GB), so the chunks bound it."""
    name = "lite-n4-c256-b2s128-f32-w32-identity-default-bt32-bf128"
    proc = subprocess.run(
        [sys.executable, "bench/oracle_memory.py", "--cases", name, "--chunk-tokens", "32", "--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode in (0, 1), proc.stderr
    (line,) = (tmp_path / "oracle-memory.jsonl").read_text().splitlines()
    figures = json.loads(line)
    assert figures["peak_bytes"] <= figures["budget_bytes"], figures
    assert figures["budget_bytes"] < 1.7e9 and math.isfinite(figures["oracle_s"])
