"""The float64 oracle as a path: `run_oracle_path` gives the exact leaves, named like a path's, and how
far one rounding per operation moves each (`OracleOutputs`), from the exact oracle and `NOISE_SAMPLES`
rounding draws run a chunk of tokens at a time."""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Mapping, Sequence

import jax
import numpy as np

from mhc_parity.cases.branches import get_branch
from mhc_parity.harness.engine.backend_arithmetic import measured_arithmetic, model_terms
from mhc_parity.harness.engine.kernel_primitives import measured_kernel_primitives, narrowed_terms
from mhc_parity.harness.engine.leaves import FORWARD_LEAVES, branch_leaf, token_axes, weight_leaf
from mhc_parity.harness.engine.operation import OPERATION
from mhc_parity.harness.judging.confidence import Sensitivity
from mhc_parity.harness.judging.error_statistics import draw_deviations, effective_dof, statistic_dof
from mhc_parity.harness.judging.token_statistics import TokenLeafDraws
from mhc_parity.mhc.precision import device_compute_capability, operand_rounding
from mhc_parity.records.settings import setting


@dataclasses.dataclass(frozen=True)
class OracleOutputs:
    """The oracle's exact leaves, and how far one rounding per operation moves each of them.

    sensitivity: leaf -> its `Sensitivity`, the RMS over `NOISE_SAMPLES` draws of the noisy oracle's
    relative deviation from the exact one (normalised like the metrics, and along the leaf), with the
    effective degrees of freedom: the error the case's arithmetic explains there, small for a
    well-conditioned leaf, large where the math itself cancels.
    """

    leaves: Mapping[str, np.ndarray]
    sensitivity: Mapping[str, Sensitivity]
    execute_s: float
    # token-major leaf -> the RMS over the draws of their systematic-error t statistic: the error shared
    # by every token that the rounding model itself produces.
    systematic: Mapping[str, float] = dataclasses.field(default_factory=dict)
    # token-major leaf -> the largest error shared by every token when each backend primitive is off by
    # its whole term alike on every token (its error is a fixed function of its input). Empty on a CPU.
    backend_shift: Mapping[str, float] = dataclasses.field(default_factory=dict)
    # The same statistics with only the backend terms a Mosaic kernel and XLA compute
    # differently (`kernel_pair_units`), for the comparisons of such a pair on the backend;
    # None where those are all the terms (a CPU, or no Mosaic table: every term widens).
    kernel_pair: PairStatistics | None = None
    # The peak resident memory (bytes) of an oracle's own process (`oracle_process`); None where it was
    # computed inside a run's process. budget_bytes: the memory budget it ran under.
    peak_bytes: int | None = None
    budget_bytes: int | None = None


@dataclasses.dataclass(frozen=True)
class PairStatistics:
    """`OracleOutputs`' sensitivity, systematic t and backend shift under other noise units."""

    sensitivity: Mapping[str, Sensitivity]
    systematic: Mapping[str, float]
    backend_shift: Mapping[str, float]


# Enough draws that the sensitivity's own noise stays inside the bound for a leaf with one
# error direction (`mhc_parity.harness.judging.confidence.quantile`: the factor such a leaf needs at
# the policy's rate falls steeply to 16 draws and slowly after); the draws run as one
# vmapped program, so each costs execution, not compilation.
NOISE_SAMPLES = 16
# Activation elements each chunk of the oracle holds: about 4 KiB of working set each, 2 GiB a chunk
# (`case_memory`). The default suite's largest cases hold exactly this many, so each runs in one chunk:
# the one-shot program, bit for bit.
ORACLE_CHUNK_ELEMENTS = 1 << 19
CHUNK_TOKENS_ENV_VAR = "MHC_PARITY_ORACLE_CHUNK_TOKENS"
# Seeds the rounding noise together with the case seed: reproducible, and independent
# of the fixture's own random streams.
NOISE_STREAM = 0x5E45


def named_leaves(draw) -> dict[str, np.ndarray]:
    """An oracle draw (`mhc_parity.harness.engine.operation.OracleDraw`) as leaves named like a path's."""
    leaves = {name: draw.forward[name] for name in FORWARD_LEAVES}
    leaves["d_x"] = draw.d_x
    leaves.update({weight_leaf(k): v for k, v in draw.d_weights.items()})
    leaves.update({branch_leaf(k): v for k, v in draw.d_branch.items()})
    return leaves


@dataclasses.dataclass(frozen=True)
class LeafDraw:
    """Leaves named like a path's as an `mhc_parity.harness.engine.operation.OracleDraw` (`leaves_as_draw`)."""

    forward: Mapping[str, np.ndarray]
    d_x: np.ndarray | None
    d_weights: Mapping[str, np.ndarray]
    d_branch: Mapping[str, np.ndarray]
    d_layer_output: np.ndarray | None = None


def leaves_as_draw(leaves: Mapping[str, np.ndarray]) -> LeafDraw:
    """The inverse of `named_leaves`: leaf -> array as a draw (a leaf not given is absent, d_x None)."""
    weights = {name: leaves[weight_leaf(name)] for name in OPERATION.WEIGHT_NAMES if weight_leaf(name) in leaves}
    prefix = branch_leaf("")
    return LeafDraw(
        forward={name: leaves[name] for name in FORWARD_LEAVES if name in leaves},
        d_x=leaves.get("d_x"),
        d_weights=weights,
        d_branch={leaf.removeprefix(prefix): v for leaf, v in leaves.items() if leaf.startswith(prefix)},
    )


def noise_seeds(case) -> tuple[int, ...]:
    """The seeds of the case's `NOISE_SAMPLES` rounding draws."""
    return tuple((case.seed * 1_000_003 + NOISE_STREAM * 16 + sample) % 2**31 for sample in range(NOISE_SAMPLES))


def noise_units(case) -> dict[str, float]:
    """The unit roundoff of every precision class of the case's rounding draws (the operation's
    rounding model: `mhc_parity.mhc.rounding_model.unit_roundoffs` for the mHC layer)."""
    return OPERATION.oracle_unit_roundoffs(case, matmul_operand_roundoff(case), backend_terms())


def backend_shift_units(case, units: Mapping[str, float]) -> dict[str, float] | None:
    """The case's `noise_units` with only the backend's terms left (the classes that are 0
    without them), or None where the backend has no term."""
    without = OPERATION.oracle_unit_roundoffs(case, matmul_operand_roundoff(case), {})
    shift = {name: 0.0 if without[name] else unit for name, unit in units.items()}
    return shift if any(shift.values()) else None


def backend_terms() -> dict[str, float]:
    """primitive -> the relative error its outputs carry on the default backend past what the
    rounding model assumes (`mhc_parity.harness.engine.backend_arithmetic.model_terms`: all 0 on
    a CPU), from the probe's table of this backend (measured once, cached)."""
    return model_terms(measured_arithmetic())


def kernel_pair_units(case) -> dict[str, float] | None:
    """The case's `noise_units` for a comparison of a Mosaic kernel path with an XLA path on the
    default backend: only the backend terms whose primitives the two compile differently
    (`mhc_parity.harness.engine.kernel_primitives.narrowed_terms`), or None where that is every
    term (no Mosaic table for this backend, or no term to drop)."""
    terms = backend_terms()
    narrowed = narrowed_terms(terms, measured_kernel_primitives())
    if narrowed == terms:
        return None
    units = OPERATION.oracle_unit_roundoffs(case, matmul_operand_roundoff(case), narrowed)
    return None if units == noise_units(case) else units


@dataclasses.dataclass(frozen=True)
class OracleUnits:
    """The unit roundoffs a case's oracle draws at (`oracle_units`): the noisy draws' (`noise`),
    the backend-shift draw's (`shift`, None without backend terms) and, for a Mosaic-vs-XLA pair,
    both again (`pair`, `pair_shift`; None where there is no pair)."""

    noise: Mapping[str, float]
    shift: Mapping[str, float] | None
    pair: Mapping[str, float] | None
    pair_shift: Mapping[str, float] | None


def oracle_units(case) -> OracleUnits:
    """The case's `OracleUnits` on this process's default backend (they hold its measured terms
    and its matmul operand rounding): what a process without that backend needs to compute the
    same answer (`mhc_parity.harness.engine.oracle_process`)."""
    units, pair = noise_units(case), kernel_pair_units(case)
    pair_shift = None if pair is None else backend_shift_units(case, pair)
    return OracleUnits(units, backend_shift_units(case, units), pair, pair_shift)


def arithmetic_material(case) -> dict:
    """What a case's bounds and causes rest on besides its code, fixture and outputs, as store key
    material: the backend's terms, the case's `noise_units` and a Mosaic-vs-XLA pair's units where they
    differ. A judgement stored under other terms is not this run's."""
    pair_units = kernel_pair_units(case)
    return {
        "backend_terms": dict(sorted(backend_terms().items())),
        "noise_units": dict(sorted(noise_units(case).items())),
        **({"kernel_pair_units": dict(sorted(pair_units.items()))} if pair_units is not None else {}),
    }


def root_mean_square(values) -> float:
    """sqrt(mean(values²)), float64: how draws of one statistic are combined."""
    return float(np.sqrt(np.mean(np.square(values))))


def leaf_sensitivity(noisy: list[np.ndarray], exact: np.ndarray) -> Sensitivity:
    """The `Sensitivity` of one leaf from its noisy draws and the exact oracle (float64)."""
    max_devs, rms_devs, gains, deviations = draw_deviations(noisy, exact)
    return _sensitivity(max_devs, rms_devs, gains, effective_dof(deviations))


def _sensitivity(max_devs, rms_devs, gains, dof_rms: float) -> Sensitivity:
    """The `Sensitivity` of per-draw max and RMS deviations and gains, and their `effective_dof`."""
    return Sensitivity(
        max=root_mean_square(max_devs),
        rms=root_mean_square(rms_devs),
        gain=root_mean_square(gains),
        dof_max=statistic_dof(max_devs, dof_rms),
        dof_rms=dof_rms,
        draws=len(max_devs),
    )


def matmul_operand_roundoff(case) -> float:
    """How much the dots of the case's paths round float32 operands on the default backend, as a unit
    roundoff (a path moved to the host rounds no more): 0 at "highest" and on a CPU."""
    device = jax.devices()[0]
    return operand_rounding(case.matmul_precision, device.platform, device_compute_capability(device)).unit_roundoff


def oracle_chunk_tokens(case) -> int:
    """Tokens each chunk of the case's oracle holds: `ORACLE_CHUNK_ELEMENTS` activation elements' worth (at
    least one), or `$MHC_PARITY_ORACLE_CHUNK_TOKENS` where set. Part of the oracle cache's key: the chunks
    reassociate the sums over tokens."""
    tokens = setting(CHUNK_TOKENS_ENV_VAR)
    return tokens if tokens is not None else max(1, ORACLE_CHUNK_ELEMENTS // math.prod(case.shape[2:]))


def run_oracle_path(
    case,
    fixture,
    chunk_tokens: int | None = None,
    units: OracleUnits | None = None,
    in_flight: int = 1,
    room: Callable[[], bool] | None = None,
) -> OracleOutputs:
    """The exact float64 oracle's leaves (named like a path's) and their sensitivity.

    The draws round each value at the unit roundoff of the precision a correct implementation may hold
    it in (`mhc_parity.mhc.oracle`'s `ROUNDING_SITES`). The exact oracle and the draws run as one vmapped
    program, `chunk_tokens` tokens at a time (default `oracle_chunk_tokens`), the token-major leaves'
    statistics accumulated chunk by chunk; where `units.pair` is set, a second batch gives `kernel_pair`.
    units: default `oracle_units(case)`; in_flight: the most chunks at once, on threads, one more starting
    only while `room()` allows (default: always). Neither changes the values.
    """
    start = time.perf_counter()
    branch = get_branch(case.branch)
    chunk_tokens = oracle_chunk_tokens(case) if chunk_tokens is None else chunk_tokens
    units = oracle_units(case) if units is None else units
    batches = [(units.noise, units.shift)] + ([] if units.pair is None else [(units.pair, units.pair_shift)])
    exact, statistics = _chunked_statistics(case, fixture, branch, batches, chunk_tokens, in_flight, room)
    main = statistics[0]
    return OracleOutputs(
        exact,
        main.sensitivity,
        time.perf_counter() - start,
        systematic=main.systematic,
        backend_shift=main.backend_shift,
        kernel_pair=statistics[1] if units.pair is not None else None,
    )


def _chunked_statistics(
    case,
    fixture,
    branch,
    batches: Sequence[tuple[Mapping[str, float], Mapping[str, float] | None]],
    chunk_tokens: int,
    in_flight: int = 1,
    room: Callable[[], bool] | None = None,
) -> tuple[dict[str, np.ndarray], list[PairStatistics]]:
    """(the exact leaves, a `PairStatistics` per batch) from the exact oracle and, per batch
    (units, shift_units), the case's `NOISE_SAMPLES` draws at `units` and, where the backend has
    terms, the draw with only those applied alike on every token (`shift_units`:
    `backend_shift_units` of `units`, None without terms). Every batch runs on each chunk of
    `chunk_tokens` tokens with the same random numbers (its draws' seeds are the same), up to
    `in_flight` chunks at once while `room()` allows; the exact leaves are the first batch's (the
    exact draw has no units: the same bits in every batch)."""
    shifted = [shift is not None for _, shift in batches]
    seeds = [0, *noise_seeds(case)] + ([None] if any(shifted) else [])

    def draw_units(units, shift):  # per seed: the exact draw's none, the shift draw's `shift`
        return [None] + [units] * NOISE_SAMPLES + ([shift] if any(shifted) else [])

    (first, *others) = [draw_units(units, shift) for units, shift in batches]
    chunks = OPERATION.oracle_chunks(
        case, fixture, branch, list(zip(seeds, first)), chunk_tokens, in_flight, room, other_units=others
    )
    token_shape = tuple(case.shape[:2])
    exact: dict[str, np.ndarray] = {}
    # Per batch, per leaf summed over tokens: every draw's sum over the chunks so far (float64).
    sums: list[dict[str, list[np.ndarray]]] = [{} for _ in batches]
    statistics: list[dict[str, TokenLeafDraws]] = [{} for _ in batches]
    for chunk in chunks:
        for index, results in enumerate([chunk.results, *chunk.other_results]):
            leaves = [named_leaves(result) for result in results]
            for name, value in leaves[0].items():
                if token_axes(name):
                    if index == 0:
                        if name not in exact:
                            exact[name] = np.empty((math.prod(token_shape), *value.shape[1:]), np.float64)
                        exact[name][chunk.start : chunk.stop] = value
                    if name not in statistics[index]:
                        statistics[index][name] = TokenLeafDraws(NOISE_SAMPLES, shifted=shifted[index])
                    noisy = [draw[name] for draw in leaves[1 : 1 + NOISE_SAMPLES]]
                    statistics[index][name].add(value, noisy, leaves[-1][name] if shifted[index] else None)
                elif name in sums[index]:
                    for total, draw in zip(sums[index][name], leaves):
                        total += draw[name]
                else:
                    sums[index][name] = [np.array(draw[name], np.float64) for draw in leaves]
    for name in statistics[0]:
        exact[name] = exact[name].reshape(token_shape + exact[name].shape[1:])
    for name, values in sums[0].items():
        exact[name] = values[0]
    return exact, [
        _batch_statistics(exact, batch_sums, batch_statistics) for batch_sums, batch_statistics in zip(sums, statistics)
    ]


def _batch_statistics(exact, sums, statistics) -> PairStatistics:
    """One batch's `PairStatistics` from its per-leaf sums of every draw (leaves summed over
    tokens, the exact draw first) and its token-major leaves' accumulated draws."""
    sensitivity, systematic, backend_shift = {}, {}, {}
    for name, values in sums.items():
        sensitivity[name] = leaf_sensitivity(values[1 : 1 + NOISE_SAMPLES], exact[name])
    for name, accumulated in statistics.items():
        found = accumulated.finish(exact[name])
        sensitivity[name] = _sensitivity(found["max_devs"], found["rms_devs"], found["gains"], found["dof_rms"])
        systematic[name] = root_mean_square(found["systematic"])
        if accumulated.shifted:
            backend_shift[name] = found["shift"]
    ordered = {name: sensitivity[name] for name in exact}  # in the leaves' order
    return PairStatistics(sensitivity=ordered, systematic=systematic, backend_shift=backend_shift)
