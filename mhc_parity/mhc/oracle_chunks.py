"""The float64 oracle's draws run token chunk by token chunk: host memory bounded whatever the token count.

`mhc_parity.mhc.oracle.run_oracle_batch` runs every draw over every token at once, each draw
holding its inputs, intermediates, gradients and bank of random numbers in float64 for all of
them: its memory grows with the tokens. But the layer's tokens are independent in the forward
pass and in d_x (the norm, the gates, the Sinkhorn and the branch are per token), and the
weight and branch gradients are sums over tokens. So `run_oracle_chunks` runs the same compiled
program (`mhc_parity.mhc.oracle._oracle_program`) on `chunk_tokens` tokens at a time and yields
each chunk's results: the token-major leaves of its tokens, and its share of the weight and
branch gradients (the caller sums them in float64).

Each draw keeps the random numbers it has in one run over every token. A draw's bank is
`jax.random.uniform(key, (size,))` over the whole layer's rounding sites, in call order; a
chunk's bank gathers that bank's entries at the chunk's own positions (`chunk_bank_indices`:
a token site's numbers of the chunk's tokens, a weight site's every number), computed from
the indices alone by the same counter-based generator (`bank_numbers`: JAX's partitionable
threefry, whose number at a position depends only on the key and that position, tested
against `jax.random.uniform`). So every value of every token meets the same deltas as in
the one-shot run, and the chunked draws are the one-shot draws, to a float64 reassociation
of the sums over tokens.

Several batches of draws that share their seeds (the same draws at other unit roundoffs:
`other_units`) run chunk by chunk together: each chunk's random numbers are made once and serve
every batch, which then runs the same compiled program at its own units. The numbers are the
larger part of a chunk's cost after the program itself, so a second batch costs the program alone.

The last chunk is padded to the chunk's size with copies of its last token under a zero
cotangent, so every chunk runs one compiled program: a zero cotangent adds exactly zero to
every gradient, and the padding's forward values are dropped. Imports nothing that computes
from `mhc` but the oracle's own modules.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import functools
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import jax
import jax.extend.random as jax_random
import jax.numpy as jnp
import numpy as np

from mhc_parity.mhc import oracle, rounding_model
from mhc_parity.mhc.oracle_math import BranchApply


@dataclasses.dataclass(frozen=True)
class OracleChunk:
    """The oracle's draws on tokens [start, stop) of the flattened (batch · sequence) tokens.

    results: one `mhc_parity.mhc.oracle.OracleResult` per draw, in order: its forward leaves,
    d_x and d_layer_output of these tokens only, shaped (stop - start, *the leaf's per-token
    shape); its d_weights and d_branch the sums over these tokens alone (float64).
    other_results: the same for each further batch (`run_oracle_chunks`' `other_units`), in order.
    """

    start: int
    stop: int
    results: list[oracle.OracleResult]
    other_results: tuple[list[oracle.OracleResult], ...] = ()


def chunk_count(tokens: int, chunk_tokens: int) -> int:
    """How many chunks of `chunk_tokens` cover `tokens` tokens."""
    return -(-tokens // chunk_tokens)


@jax.jit
def bank_numbers(key_data, indices, ones=None):
    """The numbers at `indices` of the banks `jax.random.uniform(key, (size,), float64, -1, 1)`.

    key_data: (D, 2) uint32, `jax.random.key_data` of D threefry keys; indices: (M,) uint64
    positions (any, below 2**64). Returns (D, M) float64 uniform in [-1, 1), row d equal to
    that bank of key d at those positions, whatever its size: the partitionable threefry's
    64 bits at position i are threefry2x32(key, (i >> 32, i & 0xffffffff)), and `uniform`
    keeps their top 52 as the mantissa of a number in [1, 2). ones: (D,) bool, the rows that
    are all 1.0 instead (a shifted draw's), in the same array: a chunk's banks are gigabytes,
    each mapped afresh. Call under `jax.enable_x64`.
    """
    high = (indices >> 32).astype(jnp.uint32)
    low = (indices & 0xFFFFFFFF).astype(jnp.uint32)

    def one(key):
        bits_high, bits_low = jax_random.threefry2x32_p.bind(key[0], key[1], high, low)
        bits = (bits_high.astype(jnp.uint64) << 32) | bits_low.astype(jnp.uint64)
        one_to_two = jax.lax.bitcast_convert_type((bits >> 12) | np.float64(1.0).view(np.uint64), jnp.float64)
        return jnp.maximum(-1.0, (one_to_two - 1.0) * 2.0 + -1.0)

    numbers = jax.vmap(one)(key_data)
    return numbers if ones is None else jnp.where(ones[:, None], 1.0, numbers)


def _token_sites(chunk_sites, wider_sites, tokens: int) -> list[bool]:
    """Per site call, whether it holds per-token values: its shape (1, tokens, ...) grows with
    the chunk's token count (`wider_sites`: the calls of a chunk one token wider)."""
    flags = []
    for (site, shape), (other, wider) in zip(chunk_sites, wider_sites, strict=True):
        if site != other:
            raise AssertionError(f"rounding site {site!r} of a chunk is {other!r} one token wider")
        per_token = shape[:2] == (1, tokens) and wider == (1, tokens + 1, *shape[2:])
        if not per_token and wider != shape:
            raise AssertionError(f"rounding site {site!r} of shape {shape} is neither per token nor shared")
        flags.append(per_token)
    return flags


def chunk_bank_indices(
    full_sites: Sequence[tuple[str, tuple[int, ...]]],
    per_token: Sequence[bool],
    rules: Mapping[str, rounding_model.RoundingSite],
    start: int,
    stop: int,
    chunk_tokens: int,
) -> np.ndarray:
    """(bank size of a chunk,) uint64: where each number a chunk's draw takes lies in the bank of
    one run over every token, in the order `mhc_parity.mhc.oracle_math.RoundingNoise` takes them.

    full_sites: the (site, shape) of every call of the one-shot run (token sites (B, S, ...));
    per_token: whether each call holds per-token values; rules: site -> `RoundingSite`;
    [start, stop): the chunk's tokens, padded to `chunk_tokens` with copies of its last one.
    A call takes its forward numbers, then its backward ones; the backend-only sites' numbers
    come after every other site's, in both banks (`RoundingNoise`)."""
    tokens = np.minimum(np.arange(start, start + chunk_tokens), stop - 1).astype(np.uint64)
    layout = [(shape, token, rules[site].backend_only) for (site, shape), token in zip(full_sites, per_token)]
    offset = 0
    backend_offset = 2 * sum(math.prod(shape) for shape, _, backend in layout if not backend)
    plain, backend_part = [], []
    for shape, token, backend in layout:
        size = math.prod(shape)
        base = backend_offset if backend else offset
        if token:
            width = math.prod(shape[2:])
            within = (tokens[:, None] * np.uint64(width) + np.arange(width, dtype=np.uint64)[None, :]).ravel()
        else:
            within = np.arange(size, dtype=np.uint64)
        target = backend_part if backend else plain
        target.extend([np.uint64(base) + within, np.uint64(base + size) + within])
        if backend:
            backend_offset += 2 * size
        else:
            offset += 2 * size
    return np.concatenate(plain + backend_part) if plain or backend_part else np.zeros(0, np.uint64)


def _chunk_of(array: np.ndarray, start: int, stop: int, chunk_tokens: int) -> np.ndarray:
    """Tokens [start, stop) of `array` (B, S, ...) as (1, chunk_tokens, ...), padded with copies of
    the last one; `array` itself where one chunk holds every token."""
    if chunk_tokens >= math.prod(array.shape[:2]):
        return array
    flat = array.reshape(-1, *array.shape[2:])
    rows = np.minimum(np.arange(start, start + chunk_tokens), stop - 1)
    return flat[rows][None]


def _unpadded(result: oracle.OracleResult, count: int) -> oracle.OracleResult:
    """A chunk's result with its token-major leaves (two token axes) as (count, ...): the first
    `count` tokens."""

    def cut(a):
        return None if a is None else np.ascontiguousarray(a.reshape(-1, *a.shape[2:])[:count])

    return dataclasses.replace(
        result,
        forward={k: cut(v) for k, v in result.forward.items()},
        d_x=cut(result.d_x),
        d_layer_output=cut(result.d_layer_output),
    )


def run_oracle_chunks(
    x,
    weights,
    branch_apply: BranchApply,
    branch_params: Mapping[str, Any],
    cotangent,
    config,
    *,
    draws: Sequence[tuple[int | None, Mapping[str, float] | float | None]],
    chunk_tokens: int,
    branch_sites: Mapping[str, rounding_model.RoundingSite] | None = None,
    in_flight: int = 1,
    room: Callable[[], bool] | None = None,
    other_units: Sequence[Sequence[Mapping[str, float] | float | None]] = (),
) -> Iterator[OracleChunk]:
    """`mhc_parity.mhc.oracle.run_oracle_batch`'s draws, `chunk_tokens` tokens at a time (module docstring).

    Arguments as for `run_oracle_batch` (x and cotangent (B, S, n, C), any float dtype,
    upcast a chunk at a time); chunk_tokens >= 1. Yields one `OracleChunk` per chunk, in
    token order (flattened batch · sequence); up to `in_flight` chunks run at once, each on a
    thread of its own (the same values as one at a time), so the host holds that many chunks'
    draws: one more starts beside those running only while `room()` (default: always) says the
    memory has room for it, else it waits for the earliest to end.
    other_units: further batches, each the units of every one of `draws` (their seeds kept), run
    on each chunk after `draws` with the chunk's random numbers made once (`other_results`).
    """
    if not draws:
        raise ValueError("run_oracle_chunks needs at least one draw")
    if any(len(units) != len(draws) for units in other_units):
        raise ValueError(f"each batch of other_units needs one units per draw ({len(draws)})")
    if not (isinstance(chunk_tokens, int) and chunk_tokens >= 1):
        raise ValueError(f"chunk_tokens must be a positive int, got {chunk_tokens!r}")
    if not (isinstance(in_flight, int) and in_flight >= 1):
        raise ValueError(f"in_flight must be a positive int, got {in_flight!r}")
    x, cotangent = np.asarray(x), np.asarray(cotangent)
    tokens = math.prod(x.shape[:2])
    chunk_tokens = min(chunk_tokens, tokens)
    batches = [[units for _, units in draws], *other_units]
    batch_units = [np.stack([oracle._units_vector(units) for units in batch]) for batch in batches]
    sites = rounding_model.branch_site_tuple(branch_sites)
    rules = {**rounding_model.ROUNDING_SITES, **dict(sites)}
    with jax.enable_x64(True), jax.default_device(oracle.oracle_device()):
        w64 = {k: jnp.asarray(v) for k, v in oracle._weight_mapping(weights).items()}
        p64 = {k: jnp.asarray(oracle._as_f64(v)) for k, v in branch_params.items()}
        full_sites = _abstract_sites(x.shape, w64, p64, config, branch_apply, sites)
        if chunk_tokens == tokens:  # one chunk: the one-shot run itself, in its own shapes
            per_token = [False] * len(full_sites)
        else:
            chunk_sites = _abstract_sites((1, chunk_tokens, *x.shape[2:]), w64, p64, config, branch_apply, sites)
            wider_sites = _abstract_sites((1, chunk_tokens + 1, *x.shape[2:]), w64, p64, config, branch_apply, sites)
            per_token = _token_sites(chunk_sites, wider_sites, chunk_tokens)
            for (_, full), (site, shape), token in zip(full_sites, chunk_sites, per_token):
                if token and full != (*x.shape[:2], *shape[2:]):
                    raise AssertionError(f"rounding site {site!r} is {full} over every token, {shape} over a chunk")
        key_data = jnp.stack([jax.random.key_data(jax.random.key(0 if seed is None else seed)) for seed, _ in draws])
        shifted = jnp.asarray([seed is None for seed, _ in draws])
        program = oracle._oracle_program(branch_apply, config, sites, None)
        device = oracle.oracle_device()

    def chunk(start: int) -> OracleChunk:
        # In the thread that runs it: JAX's x64 and device settings are per thread.
        with jax.enable_x64(True), jax.default_device(device):
            stop = min(tokens, start + chunk_tokens)
            indices = chunk_bank_indices(full_sites, per_token, rules, start, stop, chunk_tokens)
            banks = bank_numbers(key_data, jnp.asarray(indices), shifted)
            x_chunk = jnp.asarray(oracle._as_f64(_chunk_of(x, start, stop, chunk_tokens)))
            ct_chunk = oracle._as_f64(_chunk_of(cotangent, start, stop, chunk_tokens))
            if chunk_tokens < tokens:
                ct_chunk[0, stop - start :] = 0.0  # the padding's cotangent: it adds nothing to a gradient
            ct_chunk = jnp.asarray(ct_chunk)
            per_batch = []
            for units in batch_units:  # in turn, on the same numbers; each batch's results kept for the chunk
                outputs = program(x_chunk, w64, p64, ct_chunk, banks, jnp.asarray(units))
                outputs = jax.tree.map(lambda a: np.asarray(a, dtype=np.float64), outputs)
                per_batch.append(
                    [
                        _unpadded(oracle._result(jax.tree.map(lambda a, i=i: a[i], outputs)), stop - start)
                        for i in range(len(draws))
                    ]
                )
            return OracleChunk(start, stop, per_batch[0], tuple(per_batch[1:]))

    starts = range(0, tokens, chunk_tokens)
    yield chunk(starts[0])  # alone: the programs compile once, before threads share them
    if in_flight == 1:
        yield from map(chunk, starts[1:])
        return
    # Chunks run side by side on threads (XLA:CPU keeps a few cores busy with one program), yielded
    # in token order: each chunk's values are the same whoever runs it, and so are the sums.
    with concurrent.futures.ThreadPoolExecutor(in_flight, thread_name_prefix="oracle-chunk") as pool:
        running: collections.deque = collections.deque()
        for start in starts[1:]:
            while running and (len(running) == in_flight or (room is not None and not room())):
                yield running.popleft().result()
            running.append(pool.submit(chunk, start))
        while running:
            yield running.popleft().result()


@functools.lru_cache(maxsize=32)
def _sites_of_shape(shape, weight_shapes, param_shapes, config, branch_apply, sites):
    x = jax.ShapeDtypeStruct(shape, jnp.float64)
    w = {k: jax.ShapeDtypeStruct(s, jnp.float64) for k, s in weight_shapes}
    p = {k: jax.ShapeDtypeStruct(s, jnp.float64) for k, s in param_shapes}
    return tuple(oracle._recorded_sites(x, w, p, x, config, branch_apply, sites))


def _abstract_sites(shape, w64, p64, config, branch_apply, sites) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """The (site, shape) of every rounding call of one draw on inputs x of `shape` (an abstract trace)."""
    weight_shapes = tuple(sorted((k, tuple(v.shape)) for k, v in w64.items()))
    param_shapes = tuple(sorted((k, tuple(v.shape)) for k, v in p64.items()))
    return _sites_of_shape(tuple(shape), weight_shapes, param_shapes, config, branch_apply, sites)
