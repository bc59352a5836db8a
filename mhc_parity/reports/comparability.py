"""Whether a baseline can judge a current run whatever their rows (the refusals `gate`, the API and `run --baseline`
share), and which of the run's rows it judges.
"""

from __future__ import annotations

from mhc_parity.records.environment import precision_conflicts, run_precision
from mhc_parity.records.rows import ReportInputError
from mhc_parity.reports.coverage import environment_refusal
from mhc_parity.reports.ownership import implementation_rows, ownership_refusal


def current_cases(current) -> list[str]:
    """The cases the current run selected (its manifest's list, else those with rows)."""
    if current.manifest is not None:
        return list(current.manifest.cases)
    return list(dict.fromkeys(current.frame["case"]))


def precision_refusal(baseline, current) -> str:
    """The one-line refusal when the runs' matmul precisions conflict, else ""."""
    base, now = run_precision(baseline), run_precision(current)
    try:
        conflicts = precision_conflicts(base, now)
    except ReportInputError as exc:
        return f"cannot compare matmul precisions: {exc}"
    if not conflicts:
        return ""
    where = lambda run: run.metadata.get("backend") or "unrecorded backend"  # noqa: E731
    return (
        f"baseline {baseline.source} ran its matmuls at {base} ({where(baseline)}), the current run "
        f"at {now} ({where(current)}); make a baseline at this precision on this kind of backend "
        "(or judge it with `mhc-parity gate --allow-precision-change`)"
    )


def comparability_refusal(
    baseline, current, *, allow_policy_change: bool = False, allow_precision_change: bool = False
) -> str:
    """Why `baseline` cannot judge `current` (two `LoadedRun`s), one line, or "": another implementation's baseline, or
    another policy, matmul precision or backend (unless allowed). Reads records and the baseline's rows only, so `run
    --baseline` refuses before it runs."""
    refusal = ownership_refusal(baseline, current)
    if refusal:
        return refusal
    if (
        baseline.policy_hash
        and current.policy_hash
        and baseline.policy_hash != current.policy_hash
        and not allow_policy_change
    ):
        return (
            f"baseline {baseline.source} was produced under policy {baseline.policy_hash}, "
            f"the current run under {current.policy_hash}; regenerate the baseline with "
            "`make baseline` (or judge it with `mhc-parity gate --allow-policy-change`)"
        )
    if allow_precision_change:
        return ""
    return precision_refusal(baseline, current) or environment_refusal(baseline, current)


def gated_frame(baseline, current):
    """The current rows `baseline` judges (an implementation's baseline: that implementation's rows)."""
    if baseline.implementation:
        return implementation_rows(current.frame, baseline.implementation)
    return current.frame
