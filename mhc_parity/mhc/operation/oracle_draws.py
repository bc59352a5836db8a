"""The float64 oracle (`mhc_parity.mhc.oracle`) run on a case's fixture, and its rounding units."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from mhc_parity.mhc import oracle, rounding_model
from mhc_parity.mhc.oracle_chunks import run_oracle_chunks


def oracle_draws(case, fixture, branch, draws: Sequence[tuple]) -> list[oracle.OracleResult]:
    """Each draw of the oracle on `fixture`, in one compiled program (`run_oracle_batch`): float64
    leaves and gradients. draws: (seed, units) per draw, (0, None) the exact one; branch: the
    case's `Branch` (apply and rounding sites)."""
    return on_fixture(oracle.run_oracle_batch, case, fixture, branch, draws=draws)


def oracle_chunks(
    case, fixture, branch, draws: Sequence[tuple], chunk_tokens: int, in_flight: int = 1, room=None, other_units=()
):
    """`oracle_draws` `chunk_tokens` tokens at a time (`run_oracle_chunks`): an iterator of
    `OracleChunk`s in token order, also for each batch of `other_units`."""
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
    """An oracle entry point `run` on the case's fixture, config and branch."""
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
    """`rounding_model.unit_roundoffs` for `case` (backend_terms: primitive -> its relative error
    on the paths' backend, past what the model assumes)."""
    return rounding_model.unit_roundoffs(case.dtype, case.weight_dtype, matmul_operand_roundoff, backend_terms)


def oracle_key(case) -> dict:
    """What the oracle's answer depends on besides fixture and branch: the math configuration."""
    return dataclasses.asdict(case.mhc_config())
