"""The float64 oracle (`mhc_parity.mhc.oracle`) run on a case's fixture, and its rounding units."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from mhc_parity.mhc import oracle, rounding_model
from mhc_parity.mhc.oracle_chunks import run_oracle_chunks


def oracle_draws(case, fixture, branch, draws: Sequence[tuple]) -> list[oracle.OracleResult]:
    """Each draw of the oracle on `fixture` (x, weights, branch_params, cotangent), in one
    compiled program (`mhc_parity.mhc.oracle.run_oracle_batch`): per draw its `forward` (forward leaf
    -> float64 array), `d_x`, `d_weights` (weight name -> gradient) and `d_branch` (branch
    parameter -> gradient). draws: (seed, units) per draw, (0, None) the exact one;
    branch: the case's `mhc_parity.cases.branches.Branch` (its apply and the rounding sites it
    declares inside itself)."""
    return on_fixture(oracle.run_oracle_batch, case, fixture, branch, draws=draws)


def oracle_chunks(
    case, fixture, branch, draws: Sequence[tuple], chunk_tokens: int, in_flight: int = 1, room=None, other_units=()
):
    """`oracle_draws`, `chunk_tokens` tokens at a time, up to `in_flight` chunks at once while
    `room()` allows (`mhc_parity.mhc.oracle_chunks.run_oracle_chunks`): an iterator of `OracleChunk`s in token
    order, each with its token range [start, stop) of the flattened (batch · sequence) tokens
    and per draw the chunk's token-major leaves (tokens first) and its share of the weight and
    branch gradients; and the same for each batch of `other_units` (the draws' seeds at other
    units: their random numbers made once a chunk)."""
    return on_fixture(
        run_oracle_chunks,
        case,
        fixture,
        branch,
        draws=draws,
        chunk_tokens=chunk_tokens,
        in_flight=in_flight,
        room=room,
        other_units=other_units,
    )


def on_fixture(run, case, fixture, branch, **options):
    """`run(x, weights, branch_apply, branch_params, cotangent, config, branch_sites=..., **options)`
    (an oracle entry point: `mhc_parity.mhc.oracle.run_oracle_batch`,
    `mhc_parity.mhc.oracle_roundings.run_oracle_roundings`) on the case's fixture, config and branch."""
    return run(
        fixture.x,
        fixture.weights,
        branch.apply,
        fixture.branch_params,
        fixture.cotangent,
        case.mhc_config(),
        branch_sites=branch.rounding_sites,
        **options,
    )


def oracle_unit_roundoffs(
    case, matmul_operand_roundoff: float, backend_terms: Mapping[str, float] | None = None
) -> dict[str, float]:
    """The unit roundoff of every precision class of the oracle's rounding draws for `case`
    (`mhc_parity.mhc.rounding_model.unit_roundoffs`; backend_terms: primitive -> the relative
    error its outputs carry on the backend that runs the paths, past what the model assumes)."""
    return rounding_model.unit_roundoffs(case.dtype, case.weight_dtype, matmul_operand_roundoff, backend_terms)


def oracle_key(case) -> dict:
    """What of `case` besides its fixture and branch the oracle's answer depends on: the math
    configuration."""
    return dataclasses.asdict(case.mhc_config())
