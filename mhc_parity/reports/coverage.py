"""Whether a baseline covers the run it would judge, and was made where the run was: a case or path it never ran would
be a "new row" whose regression passes. Refused (exit 2): uncovered rows (`coverage_refusal`) and another backend
(`environment_refusal`); another device kind is a note (`device_note`); recorded external implementations the run did
not test are left out (`untested_implementations`).
"""

from __future__ import annotations

from mhc_parity.records.identity import Selection, external_implementations
from mhc_parity.records.path_names import implementation_of


def selection_of_run(run) -> Selection:
    """What a loaded run or baseline covers: a baseline file's record, else its rows with what its manifest says of the
    rest."""
    if run.recorded_selection is not None:
        return run.recorded_selection
    manifest = run.manifest
    if manifest is None:
        return Selection.of_rows(run.frame)
    request = manifest.request
    return Selection.of_rows(
        run.frame,
        implementations=tuple(sorted(name for name, _ in request.implementations)),
        lowering=request.lowering,
        inside_envelope=request.inside_envelope,
    )


def untested_implementations(baseline, current) -> tuple[str, ...]:
    """External implementations `baseline` recorded that `current` did not test (() for an implementation's own
    baseline, which `ownership` judges)."""
    if baseline.implementation:
        return ()
    run = selection_of_run(current).implementations
    tested = set(run) | set(external_implementations(current.frame["candidate"]))
    return tuple(name for name in selection_of_run(baseline).implementations if name not in tested)


def without_implementations(frame, names):
    if not names:
        return frame
    return frame[~frame["candidate"].astype(str).map(implementation_of).isin(set(names))]


def coverage_refusal(baseline, baseline_frame, current_frame) -> str:
    """Why `baseline` (rows `baseline_frame`) cannot judge `current_frame`, one line, or "": cases or paths it never
    ran."""
    covered = Selection.of_rows(baseline_frame)
    missing = covered.uncovered(Selection.of_rows(current_frame))
    if not missing:
        return ""
    return (
        f"baseline {baseline.source} does not cover this run: {'; '.join(missing)} are not in it, so "
        f"a regression there would pass unseen; gate against a baseline of the run's selection "
        f"(mhc-parity baseline --from RUN --to FILE), or run only what the baseline holds"
    )


def environment_refusal(baseline, current) -> str:
    """The one line refusing a baseline made on another backend (both recorded), else ""."""
    base, now = _recorded(baseline, current, "backend")
    if base == now:
        return ""
    return (
        f"baseline {baseline.source} was made on backend {base} ({_kind(baseline)}), the current run on "
        f"{now} ({_kind(current)}): its numbers cannot judge this backend's; gate against a baseline made "
        f"on this backend (or judge it with `mhc-parity gate --allow-precision-change`)"
    )


def device_note(baseline, current) -> str:
    """One line when the device kinds differ (both recorded), else ""."""
    base, now = _recorded(baseline, current, "device_kind")
    if base == now:
        return ""
    return (
        f"device: the baseline ran on {base}, this run on {now}: another chip of the backend may round "
        f"differently; the growth rule allows what the rounding model explains"
    )


def _recorded(baseline, current, key: str) -> tuple[str, str]:
    """Both runs' recorded `key`; ("", "") where either lacks it."""
    base, now = (str(run.metadata.get(key) or "") for run in (baseline, current))
    return (base, now) if base and now else ("", "")


def _kind(run) -> str:
    return str(run.metadata.get("device_kind") or "unrecorded device")
