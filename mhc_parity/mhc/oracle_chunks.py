"""The float64 oracle's draws a token chunk at a time, so host memory is bounded whatever the
token count: tokens are independent forward and in d_x, and weight gradients are sums over
tokens (the caller adds the chunks' shares in float64). Each chunk's bank holds the numbers the
one-shot run gives its positions, so chunked draws equal one-shot draws up to float64
reassociation (docs/ARCHITECTURE.md).
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
    """The oracle's draws on tokens [start, stop) of the flattened batch · sequence: per draw,
    token-major leaves shaped (stop - start, ...) and d_weights / d_branch summed over these
    tokens. other_results: the same per batch of `other_units`."""

    start: int
    stop: int
    results: list[oracle.OracleResult]
    other_results: tuple[list[oracle.OracleResult], ...] = ()


def chunk_count(tokens: int, chunk_tokens: int) -> int:
    return -(-tokens // chunk_tokens)


@jax.jit
def bank_numbers(key_data, indices, ones=None):
    """The numbers at `indices` (M,) uint64 of the banks `jax.random.uniform(key, (size,),
    float64, -1, 1)` of D keys (`key_data` (D, 2) uint32), whatever the size: (D, M) float64.
    ones: (D,) bool rows set to 1.0 in the same array (banks are gigabytes). Under x64."""
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
    """Per site call, whether it is per token: its shape grows in a chunk one token wider."""
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
    """(chunk bank size,) uint64: where each number a chunk's draw takes lies in the one-shot
    run's bank, in `RoundingNoise`'s order (forward then backward per call, backend-only sites
    last). full_sites: the one-shot run's (site, shape) calls; tokens [start, stop) padded to
    `chunk_tokens` with the last one."""
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
    """Tokens [start, stop) of `array` (B, S, ...) as (1, chunk_tokens, ...), padded with the last;
    `array` itself where one chunk holds every token."""
    if chunk_tokens >= math.prod(array.shape[:2]):
        return array
    flat = array.reshape(-1, *array.shape[2:])
    rows = np.minimum(np.arange(start, start + chunk_tokens), stop - 1)
    return flat[rows][None]


def _unpadded(result: oracle.OracleResult, count: int) -> oracle.OracleResult:
    """A chunk's result with its token-major leaves cut to the first `count` tokens, (count, ...)."""

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
    """`oracle.run_oracle_batch`'s draws `chunk_tokens` tokens at a time: one `OracleChunk` per
    chunk, in token order. Up to `in_flight` chunks run on threads (the same values), another
    starting only while `room()` allows. other_units: further batches of units per draw, run
    on each chunk's same random numbers."""
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
        program = oracle._oracle_program(branch_apply, config, sites)
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
    # XLA:CPU keeps only a few cores busy with one program.
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
    """The (site, shape) of every rounding call of one draw on x of `shape`."""
    weight_shapes = tuple(sorted((k, tuple(v.shape)) for k, v in w64.items()))
    param_shapes = tuple(sorted((k, tuple(v.shape)) for k, v in p64.items()))
    return _sites_of_shape(tuple(shape), weight_shapes, param_shapes, config, branch_apply, sites)
