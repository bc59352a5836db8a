"""Whether a baseline can judge a run whatever their rows, and whether rows may replace a baseline (the refusals the
gate, the API, `run --baseline` and `baseline` share, each one line).

Judging: another implementation's baseline (`ownership_refusal`: a `baseline --impl` file keeps one implementation's
rows, `<name>/...`, names it in its header and judges only a run of it), another policy, matmul precision or backend
(`comparability_refusal`); cases or paths it never ran, which would be "new rows" whose regressions pass
(`coverage_refusal`). Another device kind is a note (`device_note`); recorded external implementations the run did not
test are left out (`untested_implementations`).

Replacing: never one suite's rows over the baseline of another, nor, over one recording none, rows lacking some of its
cases (`overwrite_refusal`), nor rows covering fewer paths, lowering or implementations (`narrowing_refusal`, unless
`--allow-narrower`): the gate would stop judging what they drop. `diff_baselines` says what a replacement changes.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable
from pathlib import Path

import pandas as pd

from mhc_parity.records.environment import precision_conflicts, run_precision
from mhc_parity.records.identity import Selection, external_implementations
from mhc_parity.records.path_names import implementation_of
from mhc_parity.records.rows import ReportInputError
from mhc_parity.records.schema import IDENTITY_COLUMNS
from mhc_parity.reports.gate.baseline_file import (
    BASELINE_COLUMNS,
    BODY_DIGEST_KEY,
    DIGEST_KEY,
    ROWS_KEY,
    SUITE_KEY,
    is_baseline_file,
    parse_header,
    read_first_line,
    selection_of,
    unchecked_rows,
)

BASELINE_FOLDER = Path("baselines")
ALLOW_NARROWER = "--allow-narrower"
ELSEWHERE = "write them to another file (--to FILE; with make: BASELINE=FILE on its command line)"


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


def implementation_rows(frame: pd.DataFrame, name: str) -> pd.DataFrame:
    """The rows of `frame` whose candidate is a path of implementation `name`."""
    return frame[frame["candidate"].astype(str).str.startswith(f"{name}/")]


def implementation_names(run) -> list[str]:
    """The external implementations a loaded run ran: its manifest's request, else a baseline file's own implementation,
    else []."""
    if run.manifest is not None:
        return [name for name, _ in run.manifest.request.implementations]
    return [run.implementation] if getattr(run, "implementation", None) else []


def resolve_implementation(run, wanted: str) -> str:
    """The name of the run's implementation given by name or `module:factory` spec; ValueError (one line) if it has none
    such."""
    pairs = list(run.manifest.request.implementations) if run.manifest is not None else []
    for name, spec in pairs:
        if wanted in (name, spec):
            return name
    known = ", ".join(f"{name} ({spec})" if spec and spec != name else name for name, spec in pairs) or "none"
    raise ValueError(f"{run.source} has no rows of implementation {wanted!r} (its external implementations: {known})")


def ownership_refusal(baseline, current) -> str:
    """Why `baseline` cannot judge `current` (two `LoadedRun`s), or "". An implementation's baseline judges only a run
    of it; the built-in paths' baseline refuses a run of external implementations it holds no rows of (every row would
    be missing or new)."""
    owner = baseline.implementation
    ran = implementation_names(current)
    if owner:
        if owner in ran or (current.manifest is None and len(implementation_rows(current.frame, owner))):
            return ""
        return (
            f"baseline {baseline.source} belongs to implementation {owner!r}; the current run "
            f"{current.source} has no rows of it (its external implementations: {', '.join(ran) or 'none'}); "
            f"gate each implementation against its own baseline (`mhc-parity baseline --impl MODULE:FACTORY`)"
        )
    foreign = [name for name in ran if not len(implementation_rows(baseline.frame, name))]
    if foreign and len(foreign) == len(ran):
        return (
            f"baseline {baseline.source} is the built-in paths' baseline and holds no rows of "
            f"implementation {foreign[0]!r}; make its own with `mhc-parity baseline --impl MODULE:FACTORY`"
        )
    return ""


def default_baseline_path(name: str) -> Path:
    """baselines/<name>.csv, with characters a file name should not hold (':', '/', spaces) as '_'."""
    return BASELINE_FOLDER / (re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._") + ".csv")


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
    baseline, which `ownership_refusal` judges)."""
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


def describe_suite(suite: str | None) -> str:
    if suite is None:
        return "rows that record no suite (their run's manifest was not kept)"
    kind = "suite" if " " not in suite and not suite.startswith("-") else "selection"
    return f"{kind} {suite!r}"


def baseline_cases(path: Path) -> set[str]:
    """The case names in baseline file `path`, read leniently (it is about to be replaced: its digest does not
    matter)."""
    return set(_baseline_rows(path)["case"])


def _baseline_rows(path: Path) -> pd.DataFrame:
    rows = unchecked_rows(path.read_text(encoding="utf-8", errors="replace"))
    pairs = [(row["case"], row.get("candidate") or "") for row in rows if row.get("case")]
    return pd.DataFrame(pairs, columns=["case", "candidate"])


def narrowing_refusal(
    target: Path, selection: Selection, *, elsewhere: str = ELSEWHERE, option: str = ALLOW_NARROWER
) -> str:
    """Why rows covering `selection` must not replace baseline `target` ("" if they may): it covers cases, paths or
    external implementations they lack. `option` lets them through."""
    target = Path(target)
    if not is_baseline_file(target):
        return ""
    old = selection_of(_baseline_rows(target), parse_header(read_first_line(target)) or {})
    lost = selection.uncovered(old)
    dropped = [name for name in old.implementations if name not in selection.implementations]
    if dropped:
        lost.append(f"implementations {', '.join(dropped)}")
    if not lost:
        return ""
    return (
        f"{target} covers more than these rows: {'; '.join(lost)} would be dropped, and the gate would stop "
        f"judging them; refusing to narrow it: {elsewhere}, or pass {option} to replace it"
    )


def overwrite_refusal(target: Path, suite: str | None, cases: Iterable[str], *, elsewhere: str = ELSEWHERE) -> str:
    """Why the rows of `suite` (holding `cases`) must not be written over `target` ("" if they may): it is a baseline
    recording another suite or, recording none, holding cases they lack. Non-baseline targets are left to the writer's
    checks."""
    target = Path(target)
    if not is_baseline_file(target):
        return ""
    recorded = (parse_header(read_first_line(target)) or {}).get(SUITE_KEY)
    if recorded:
        if recorded == suite:
            return ""
        return (
            f"{target} is the baseline of {describe_suite(recorded)}; refusing to write the rows of "
            f"{describe_suite(suite)} over it: {elsewhere}"
        )
    lost = sorted(baseline_cases(target) - set(cases))
    if not lost:
        return ""
    return (
        f"{target} records no suite and holds {len(lost)} case(s) that the rows of {describe_suite(suite)} "
        f"lack (e.g. {lost[0]}); refusing to drop them: {elsewhere}, or delete {target} first"
    )


# Header keys that describe the body rather than how it was made: a row change shows in the rows.
BODY_KEYS = (ROWS_KEY, DIGEST_KEY, BODY_DIGEST_KEY)


@dataclasses.dataclass(frozen=True)
class BaselineDiff:
    """What a new baseline text changes against an old one, row by row (by row identity), as the cells the files
    hold."""

    added: tuple[tuple[str, ...], ...]
    removed: tuple[tuple[str, ...], ...]
    # (row key, ((column, old cell, new cell), ...)) for each row whose cells changed
    changed: tuple[tuple[tuple[str, ...], tuple[tuple[str, str, str], ...]], ...]
    # (header key, old value, new value) for each header field that changed, less the body's record
    header: tuple[tuple[str, str, str], ...]
    rows: int  # in the new text

    @property
    def unchanged(self) -> bool:
        return not (self.added or self.removed or self.changed or self.header)


def _rows_by_key(text: str) -> dict[tuple[str, ...], dict[str, str]]:
    return {tuple(row[c] for c in IDENTITY_COLUMNS): row for row in unchecked_rows(text)}


def diff_baselines(old_text: str, new_text: str) -> BaselineDiff:
    """Rows `new_text` adds, removes and changes against `old_text` (a column only one has compares as empty), and the
    header fields it changes (row count and digests aside)."""
    old, new = _rows_by_key(old_text), _rows_by_key(new_text)
    changed = []
    for key in sorted(old.keys() & new.keys()):
        columns = [c for c in BASELINE_COLUMNS if c not in IDENTITY_COLUMNS]
        cells = tuple((c, old[key].get(c) or "", new[key].get(c) or "") for c in columns)
        moved = tuple(cell for cell in cells if cell[1] != cell[2])
        if moved:
            changed.append((key, moved))
    old_header = parse_header(old_text.split("\n", 1)[0]) or {}
    new_header = parse_header(new_text.split("\n", 1)[0]) or {}
    header = tuple(
        (k, old_header.get(k, ""), new_header.get(k, ""))
        for k in dict.fromkeys([*old_header, *new_header])
        if k not in BODY_KEYS and old_header.get(k, "") != new_header.get(k, "")
    )
    return BaselineDiff(
        added=tuple(sorted(new.keys() - old.keys())),
        removed=tuple(sorted(old.keys() - new.keys())),
        changed=tuple(changed),
        header=header,
        rows=len(new),
    )
