"""The gate's judgement of a run against a baseline, made in one place (`judge`): `mhc-parity gate`, the API and the
reports of `run --baseline` / `render --baseline` all call it, so a report's first screen and `make gate` cannot
disagree. A `Judgement` is the gate's result or one line saying why it refuses (exit 2). `gate_run` also checks the
parameters and refuses an unfinished run or one made by other code than the checkout.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from mhc_parity.records.environment import isa_difference
from mhc_parity.records.manifest import Manifest
from mhc_parity.records.rows import ReportInputError
from mhc_parity.records.text import plural
from mhc_parity.reports.gate.baseline_file import LEGACY_OPTION, Baseline
from mhc_parity.reports.gate.comparability import (
    comparability_refusal,
    coverage_refusal,
    current_cases,
    device_note,
    gated_frame,
    untested_implementations,
    without_implementations,
)
from mhc_parity.reports.gate.drift import (
    DEFAULT_GROWTH_FACTOR,
    DEFAULT_NOISE_FLOOR_ULPS,
    PARAMETER_NAMES,
    parameter_problem,
)
from mhc_parity.reports.gate.rule import (
    ROW_COUNT_WORDS,
    GateFinding,
    GateResult,
    findings_table,
    gate_frame,
    gate_frames,
    spaced,
    typed_gate_frame,
)
from mhc_parity.reports.sources import (
    CODE_CHANGE_OPTION,
    POLICY_HASH_KEY,
    LoadedRun,
    baseline_as_run,
    check_current_code,
    load_baseline_or_run,
    load_run,
)
from mhc_parity.reports.tables import Table

# Findings the first screen lists before pointing at the drift section for the rest.
FIRST_SCREEN_FINDINGS = 5
# Drift first (what a parity verdict cannot show), the run's own failing rows last (shown already).
FIRST_SCREEN_CATEGORIES = ("regression", "new_nonfinite", "lost_coverage", "missing", "baseline_gap", "failure")
PASS, FAIL, REFUSED = "PASS", "FAIL", "REFUSED"


@dataclasses.dataclass(frozen=True)
class Judgement:
    """The gate's verdict on one run against one baseline (named by its path). result: None when it refuses; refusal:
    why ("" when it judged); scope: lines saying what it judged when not every row; note: what a legacy baseline's
    digest did not vouch for; isa_note: instruction-set and device-kind differences ("" if none)."""

    baseline: str
    result: GateResult | None
    refusal: str = ""
    scope: tuple[str, ...] = ()
    note: str = ""
    isa_note: str = ""

    @property
    def remarks(self) -> tuple[str, ...]:
        """The non-empty lines printed under the verdict besides its scope: legacy, ISA and gain notes."""
        gain_note = self.result.gain_note if self.result is not None else ""
        return tuple(line for line in (self.note, self.isa_note, gain_note) if line)

    @property
    def verdict(self) -> str:
        """PASS, FAIL, or REFUSED (the gate cannot judge the run against this baseline)."""
        if self.result is None:
            return REFUSED
        return PASS if self.result.ok else FAIL

    @property
    def failed(self) -> bool:
        """The gate judged and found something failing (a refusal is not a failure)."""
        return self.verdict == FAIL


def judge(
    baseline: LoadedRun,
    current: LoadedRun,
    *,
    growth_factor: float = DEFAULT_GROWTH_FACTOR,
    noise_floor_ulps: float = DEFAULT_NOISE_FLOOR_ULPS,
    allow_policy_change: bool = False,
    allow_precision_change: bool = False,
    only_current_cases: bool = False,
) -> Judgement:
    """`current` judged against `baseline` (loaded runs). only_current_cases: judge only the baseline rows of the cases
    the current run selected. ValueError for parameters the gate cannot judge with (`parameter_problem`)."""

    isa_note = " ".join(
        n for n in (isa_difference(baseline.metadata, current.metadata), device_note(baseline, current)) if n
    )

    def refused(reason: str) -> Judgement:
        return Judgement(str(baseline.source), None, refusal=reason, note=baseline.note, isa_note=isa_note)

    if not len(baseline.frame):
        return refused(f"baseline {baseline.source} has no rows; regenerate it with `make baseline`")
    if not len(current.frame):
        return refused(f"current run {current.source} has no rows; did the run write anything?")
    refusal = comparability_refusal(
        baseline, current, allow_policy_change=allow_policy_change, allow_precision_change=allow_precision_change
    )
    if refusal:
        return refused(refusal)
    scope = [f"gating implementation {baseline.implementation!r}: its rows only"] if baseline.implementation else []
    untested = untested_implementations(baseline, current)
    judged = without_implementations(baseline.frame, untested)
    if untested:
        scope.append(
            f"not judging the baseline's {len(baseline.frame) - len(judged)} rows of implementation(s) "
            f"{', '.join(untested)}: this run did not test them (no --impl of them)"
        )
    current_frame = gated_frame(baseline, current)
    refusal = coverage_refusal(baseline, judged, current_frame)
    if refusal:
        return refused(refusal)
    if only_current_cases:
        cases = current_cases(current)
        judged = judged[judged["case"].isin(cases)]
        kept = judged["case"].nunique()
        if not kept:
            return refused(f"--only-current-cases: none of the current run's {len(cases)} cases is in the baseline")
        scope.append(
            f"gating only the current run's cases: {kept} of {baseline.frame['case'].nunique()} baseline cases"
        )
    try:
        result = gate_frames(
            typed_gate_frame(judged, source="baseline"),
            typed_gate_frame(current_frame, source="current run"),
            growth_factor=growth_factor,
            noise_floor_ulps=noise_floor_ulps,
        )
    except ReportInputError as exc:
        return refused(f"unusable input: {exc}")
    return Judgement(str(baseline.source), result, scope=tuple(scope), note=baseline.note, isa_note=isa_note)


@dataclasses.dataclass(frozen=True)
class GateRun:
    """What `gate_run` did: the judgement (`problem` saying which kind of refusal) and the two sides as read (None where
    reading failed)."""

    judgement: Judgement
    baseline: LoadedRun | None = None
    current: LoadedRun | None = None
    # "" when judged; "parameters" or "input" when refused before judging; "judgement" when `judge` refused
    problem: str = ""


def gate_run(
    baseline: str | Path,
    current: str | Path | LoadedRun,
    *,
    growth_factor: float = DEFAULT_GROWTH_FACTOR,
    noise_floor_ulps: float = DEFAULT_NOISE_FLOOR_ULPS,
    allow_policy_change: bool = False,
    allow_precision_change: bool = False,
    only_current_cases: bool = False,
    allow_code_change: bool = False,
    allow_legacy: bool = False,
    legacy_option: str = LEGACY_OPTION,
    code_change_option: str = CODE_CHANGE_OPTION,
    parameter_names: tuple[str, str] = PARAMETER_NAMES,
) -> GateRun:
    """`mhc-parity gate` (and `mhc_parity.harness.gate`): the parameters checked, `baseline` read as a baseline file or
    finished run (legacy only with `allow_legacy`), `current` read as a finished run (or given as a `LoadedRun`) and
    refused if made by other code than the checkout unless `allow_code_change`, then `judge`d. The `*_option` and
    `parameter_names` arguments name the caller's options in refusals. Never raises for bad input."""

    def refused(problem: str, reason: str, base=None, run=None) -> GateRun:
        return GateRun(Judgement(str(baseline), None, refusal=reason), base, run, problem)

    reason = parameter_problem(growth_factor, noise_floor_ulps, parameter_names)
    if reason:
        return refused("parameters", reason)
    try:
        base = load_baseline_or_run(baseline, allow_legacy=allow_legacy, legacy_option=legacy_option)
        run = current if isinstance(current, LoadedRun) else load_run(current)
        if not allow_code_change:
            check_current_code(run, code_change_option)
    except ReportInputError as exc:
        return refused("input", f"cannot read input: {exc}")
    judgement = judge(
        base,
        run,
        growth_factor=growth_factor,
        noise_floor_ulps=noise_floor_ulps,
        allow_policy_change=allow_policy_change,
        allow_precision_change=allow_precision_change,
        only_current_cases=only_current_cases,
    )
    return GateRun(judgement, base, run, "judgement" if judgement.result is None else "")


def as_baseline(baseline: Any) -> LoadedRun:
    """A report's baseline as the `LoadedRun` `judge` takes: a loaded run or baseline as is, a path via
    `load_baseline_or_run` (legacy refused), plain rows as a baseline recording no policy, precision or implementation.
    """
    if isinstance(baseline, LoadedRun):
        return baseline
    if isinstance(baseline, Baseline):
        return baseline_as_run(baseline)
    if isinstance(baseline, (str, Path)):
        return load_baseline_or_run(baseline)
    rows = baseline if isinstance(baseline, pd.DataFrame) else list(baseline)
    return LoadedRun(gate_frame(rows, source="baseline"), Path("the baseline rows"), None, {}, True)


def written_run(
    frame: pd.DataFrame, metadata: Mapping[str, Any], manifest: Manifest | None, source: str | Path
) -> LoadedRun:
    """The run a report is written for, as `load_run` will read it back from `source`."""
    policy_hash = manifest.policy_digest if manifest is not None else metadata.get(POLICY_HASH_KEY) or None
    return LoadedRun(frame, Path(source), policy_hash, dict(metadata), False, manifest)


def judges_own_cases(manifest: Manifest | None) -> bool:
    """Whether a run selected part of its suite (globs, tags, dtype, a shard): its report then judges only its own
    cases, as `gate --only-current-cases`."""
    if manifest is None:
        return False
    request = manifest.request
    return any(value is not None for value in (request.case_globs, request.tags, request.dtype)) or bool(manifest.shard)


def headline(judgement: Judgement) -> str:
    """One line for the first screen: the gate's verdict, what makes it fail, or why it refuses."""
    where = f"Gate against {judgement.baseline}"
    result = judgement.result
    if result is None:
        return f"{where}: not judged: {judgement.refusal} (`mhc-parity gate` refuses it too, with exit 2)"
    if result.ok:
        return (
            f"{where}: PASS: {result.matched_rows} rows matched, no oracle error grew more than "
            f"×{result.growth_factor:g} over its baseline and past the rounding spread "
            f"(above a {result.noise_floor_ulps:g}-ulp noise floor)"
        )
    counts = result.counts()
    parts = [_count_phrase(c, counts[c], result.growth_factor) for c in FIRST_SCREEN_CATEGORIES if counts[c]]
    return f"{where}: FAIL: " + ", ".join(parts) + f" ({result.matched_rows} rows matched)"


def _count_phrase(category: str, count: int, growth_factor: float) -> str:
    noun, said = ROW_COUNT_WORDS[category]
    return f"{plural(count, noun)} {said.format(factor=growth_factor)}".rstrip()


def first_findings(result: GateResult, limit: int = FIRST_SCREEN_FINDINGS) -> tuple[GateFinding, ...]:
    """The failing findings the first screen lists, at most `limit`, in `FIRST_SCREEN_CATEGORIES` order (regressions
    first, largest growth first)."""
    ordered = [f for category in FIRST_SCREEN_CATEGORIES for f in result.by_category(category)]
    return tuple(ordered[:limit])


def first_findings_table(result: GateResult) -> Table:
    """`first_findings` as the table every first screen shows, each led by its category."""
    return findings_table(first_findings(result), category=spaced)


def hidden_findings(result: GateResult, limit: int = FIRST_SCREEN_FINDINGS) -> int:
    """How many failing findings `first_findings` leaves out."""
    return max(0, len(result.failing_findings()) - limit)
