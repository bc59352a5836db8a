"""Two paths' leaves, and the oracle's, into judged rows."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from mhc_parity.harness.engine.leaves import leaf_kind, token_axes
from mhc_parity.harness.judging.confidence import Sensitivity
from mhc_parity.harness.judging.metrics import MetricsMemo, leaf_metrics
from mhc_parity.harness.judging.policy import Policy
from mhc_parity.records.schema import TIMING_COLUMNS, empty_row


def case_fields(case) -> dict:
    return {
        "case": case.name,
        "act_dtype": case.dtype,
        "weight_dtype": case.weight_dtype,
        "variant": case.variant,
        "shape": case.shape_name,
        "mesh": case.mesh_name,
        "tags": " ".join(case.all_tags),
    }


def status_row(
    case, *, candidate: str, partner: str, comparison: str, verdict: str, reason: str, leaf: str = "*"
) -> dict:
    """A row with no metrics: skip, unsupported, error, or a whole-path failure."""
    return empty_row(
        **case_fields(case),
        candidate=candidate,
        partner=partner,
        comparison=comparison,
        leaf=leaf,
        leaf_kind="",
        verdict=verdict,
        reason=reason,
    )


def compare_leaves(
    case,
    *,
    candidate: str,
    partner: str,
    comparison: str,
    candidate_leaves: Mapping[str, np.ndarray],
    partner_leaves: Mapping[str, np.ndarray],
    oracle_leaves: Mapping[str, np.ndarray],
    policy: Policy,
    oracle_sensitivity: Mapping[str, Sensitivity] | None = None,
    oracle_systematic: Mapping[str, float] | None = None,
    oracle_backend_shift: Mapping[str, float] | None = None,
    partitioning: str,
    timing: tuple[float, ...] | None = None,
    memo: MetricsMemo | None = None,
    declared: Mapping[str, float] | None = None,
) -> list[dict]:
    """One judged row per leaf of the candidate, in its order; a leaf the partner or oracle lacks gets
    a `skip` row. The `oracle_*` mappings, leaf -> sensitivity, systematic t and backend shift, are
    `OracleOutputs`'; `timing` is the candidate's `TIMING_COLUMNS` cells (None: NaN) on every row;
    `memo` only saves recomputing what the case's comparisons share; `declared` is leaf -> the
    declared precision choices' largest deviation (the sensitivity is already widened by them)."""
    rows = []
    for leaf, cand in candidate_leaves.items():
        base = dict(case_fields(case), candidate=candidate, partner=partner, comparison=comparison, leaf=leaf)
        if leaf not in partner_leaves or leaf not in oracle_leaves:
            missing = partner if leaf not in partner_leaves else "oracle"
            rows.append(
                status_row(
                    case,
                    candidate=candidate,
                    partner=partner,
                    comparison=comparison,
                    verdict="skip",
                    reason=f"{missing} has no leaf {leaf}",
                    leaf=leaf,
                )
            )
            continue
        kind = leaf_kind(leaf)
        dtype = np.dtype(cand.dtype)
        metrics = leaf_metrics(
            cand,
            partner_leaves[leaf],
            oracle_leaves[leaf],
            dtype=dtype,
            sensitivity=None if oracle_sensitivity is None else oracle_sensitivity.get(leaf),
            token_axes=token_axes(leaf),
            oracle_systematic_t=(oracle_systematic or {}).get(leaf),
            oracle_backend_shift=(oracle_backend_shift or {}).get(leaf),
            memo=memo,
        )
        judgement = policy.judge(
            metrics,
            comparison=comparison,
            leaf_kind=kind,
            dtype=dtype,
            act_dtype=case.dtype,
            partitioning=partitioning,
            declared=(declared or {}).get(leaf, 0.0),
        )
        rows.append(
            empty_row(
                **base,
                leaf_kind=kind,
                dtype=dtype.name,
                **metrics.as_row_fields(),
                **judgement.as_row_fields(),
                **({} if timing is None else dict(zip(TIMING_COLUMNS, timing, strict=True))),
            )
        )
    return rows
