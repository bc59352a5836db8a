"""The kill matrix's records, per dtype slice, as plain data: `mhc_parity.harness.faults.matrix` fills them,
`mhc_parity.reports.kill_matrix` writes them.
"""

from __future__ import annotations

import dataclasses
import math

from mhc_parity.records.text import format_number

# The dtype slices of the kill matrix: a fault must be caught by the cases of each
# activation dtype alone (many production kernels support only bfloat16).
DTYPE_SLICES = ("bfloat16", "float32")
# Verdicts of a row that catch a perturbation (a row failing on clean code catches nothing).
CATCHING_VERDICTS = ("fail", "error")
FAULT_COMPARISONS = ("vs_oracle", "vs_reference", "vs_unsharded")
# Why a fault is listed (not seen, not failing the run) in a slice: its effect is below a correct
# path's own rounding (`Perturbation.unkillable_in`) or the backend shift (`BelowBackendShift`).
BELOW_ROUNDING = "below the slice's own rounding"
BELOW_BACKEND_SHIFT = "below the backend shift"
LISTING_KINDS = (BELOW_ROUNDING, BELOW_BACKEND_SHIFT)


def cell_float(row: dict, column: str) -> float:
    """A row's numeric cell as a float (NaN when absent, empty or not a number)."""
    try:
        return float(row.get(column))
    except (TypeError, ValueError):
        return math.nan


def usage_of(row: dict) -> float:
    return cell_float(row, "bound_usage")


def nan_low(value: float) -> float:
    """Sort key: NaN below everything."""
    return -math.inf if math.isnan(value) else value


@dataclasses.dataclass(frozen=True)
class Catch:
    """The rows of one (comparison, leaf) that caught a perturbation in one dtype slice."""

    comparison: str
    leaf: str
    leaf_kind: str
    rows: int
    cases: int
    errors: int
    max_bound_usage: float  # NaN when every catching row is an error row
    worst_case: str
    worst_candidate: str
    worst_reason: str


@dataclasses.dataclass(frozen=True)
class Closest:
    """The row that came closest to its bound under a perturbation without catching it."""

    case: str
    candidate: str
    comparison: str
    leaf: str
    bound: str
    usage: float  # bound_usage under the perturbation
    clean_usage: float  # the same row's bound_usage on the unmodified code

    @property
    def text(self) -> str:
        return (
            f"{self.leaf} ({self.comparison}, {self.candidate}, {self.case}): usage "
            f"{format_number(self.usage)} (clean {format_number(self.clean_usage)}) of {self.bound}"
        )


@dataclasses.dataclass(frozen=True)
class SliceVerdict:
    """A perturbation's outcome on the cases of one activation dtype."""

    dtype_slice: str
    legitimate: bool
    cases_run: tuple[str, ...]
    cases_caught: tuple[str, ...]
    catches: tuple[Catch, ...]
    closest: Closest | None
    unkillable_reason: str = ""
    listed_by: str = ""  # one of `LISTING_KINDS` where `unkillable_reason` lists the slice
    # The catching rows' most named cause, how many name it of those naming any, and whether it is the fault's own.
    top_cause: str = ""
    top_cause_id: str = ""
    top_cause_rows: int = 0
    cause_rows: int = 0
    own_cause: bool = False
    # Rows with a cause naming the fault's own, and naming a rounding not its own (confidently wrong).
    own_cause_rows: int = 0
    wrong_cause_rows: int = 0

    @property
    def caught(self) -> bool:
        return bool(self.catches)

    @property
    def cause_cell(self) -> str:
        """The top cause, its share of the rows with a cause, and whether it is the fault's own."""
        if not self.cause_rows:
            return "-"
        mark = "own cause" if self.own_cause else "NOT its own cause"
        return f"{self.top_cause} ({self.top_cause_rows}/{self.cause_rows} rows; {mark})"

    @property
    def own_share(self) -> float:
        """The share of the rows with a cause that name the perturbation's own (NaN without any)."""
        return self.own_cause_rows / self.cause_rows if self.cause_rows else float("nan")

    @property
    def status(self) -> str:
        """killed | listed | SURVIVED (faults); passes | FALSE POSITIVE (variants); not exercised. listed: nothing
        caught it and the catalogue lists the slice (`unkillable_reason`)."""
        if not self.cases_run:
            return "not exercised"
        if self.legitimate:
            return "FALSE POSITIVE" if self.caught else "passes"
        if self.caught:
            return "killed"
        return "listed" if self.unkillable_reason else "SURVIVED"

    @property
    def ok(self) -> bool:
        """Whether the slice lets the run pass (a listed one does)."""
        return self.status in ("killed", "listed", "passes", "not exercised")

    @property
    def margin(self) -> float:
        """Largest bound_usage among the catching rows (NaN when none, or all are errors)."""
        values = [c.max_bound_usage for c in self.catches if not math.isnan(c.max_bound_usage)]
        return max(values) if values else math.nan

    @property
    def only_errors(self) -> bool:
        return self.caught and all(c.errors == c.rows for c in self.catches)

    @property
    def cell(self) -> str:
        """One table cell: status, cases and margin or closest usage."""
        if not self.cases_run:
            return "-"
        counts = f"{len(self.cases_caught)}/{len(self.cases_run)}"
        if self.caught:
            margin = "error" if self.only_errors else f"{format_number(self.margin)}x"
            return f"{self.status} {counts} ({margin})"
        closest = f"closest {format_number(self.closest.usage)}" if self.closest else "no rows"
        return f"{self.status} ({closest})"


@dataclasses.dataclass(frozen=True)
class PerturbationResult:
    """One perturbation's line of the kill matrix: a verdict per dtype slice."""

    name: str
    seams: str
    description: str
    legitimate: bool
    slices: tuple[SliceVerdict, ...]
    ignored_clean_failures: int
    seconds: float
    causes: tuple[str, ...] = ()  # a precision fault's own causes (hypothesis-name globs); () a logic fault

    def slice(self, dtype_slice: str) -> SliceVerdict:
        return next(s for s in self.slices if s.dtype_slice == dtype_slice)

    @property
    def exercised(self) -> bool:
        return any(s.cases_run for s in self.slices)

    @property
    def ok(self) -> bool:
        """Faults: caught or listed in every slice they ran in; variants: caught nowhere."""
        return self.exercised and all(s.ok for s in self.slices)

    @property
    def listed_slices(self) -> tuple[SliceVerdict, ...]:
        return tuple(s for s in self.slices if s.status == "listed")

    @property
    def outcome(self) -> str:
        """A fault's headline outcome (`OUTCOMES`); a variant's "passes" or "FALSE POSITIVE"."""
        if not self.exercised:
            return NOT_EXERCISED
        if self.legitimate:
            return "passes" if self.ok else "FALSE POSITIVE"
        ran = [s for s in self.slices if s.cases_run]
        if any(s.status == "SURVIVED" for s in ran):
            return SURVIVED
        listed = sum(s.status == "listed" for s in ran)
        return CAUGHT if not listed else LISTED if listed == len(ran) else CAUGHT_IN_PART

    @property
    def status(self) -> str:
        if not self.exercised:
            return "not exercised"
        bad = [s for s in self.slices if not s.ok]
        if bad:
            return "; ".join(f"{s.status} in {s.dtype_slice}" for s in bad)
        if self.legitimate:
            return "passes"
        killed = [s.dtype_slice for s in self.slices if s.status == "killed"]
        listed = [s.dtype_slice for s in self.listed_slices]
        if not listed:
            return "killed"
        listing = f"listed in {', '.join(listed)} (not seen)"
        return f"killed in {', '.join(killed)}; {listing}" if killed else listing

    @property
    def catches(self) -> tuple[Catch, ...]:
        return tuple(c for s in self.slices for c in s.catches)


# A fault's outcome (`PerturbationResult.outcome`), in the headline's order.
CAUGHT, CAUGHT_IN_PART, LISTED, SURVIVED, NOT_EXERCISED = (
    "caught",
    "caught in part",
    "listed",
    "survived",
    "not exercised",
)
OUTCOMES = (CAUGHT, CAUGHT_IN_PART, LISTED, SURVIVED, NOT_EXERCISED)


@dataclasses.dataclass(frozen=True)
class FaultCounts:
    """Faults per outcome, over the matrix or in one slice. counts: outcome -> faults; listed_by: `LISTING_KINDS` entry
    -> listed faults (one listed for both kinds counts under each); total: the faults."""

    counts: tuple[tuple[str, int], ...]
    listed_by: tuple[tuple[str, int], ...]
    total: int

    def count(self, outcome: str) -> int:
        return dict(self.counts).get(outcome, 0)

    @property
    def text(self) -> str:
        """e.g. "15 caught, 2 listed (not seen: below the backend shift), 1 not exercised of 18" (zero counts other than
        caught left out)."""
        parts = [f"{self.count(CAUGHT)} caught"]
        if self.count(CAUGHT_IN_PART):
            parts.append(f"{self.count(CAUGHT_IN_PART)} caught in some slices and listed in the others")
        if self.count(LISTED):
            kinds = [(kind, n) for kind, n in self.listed_by if n]
            why = kinds[0][0] if len(kinds) == 1 else ", ".join(f"{n} {kind}" for kind, n in kinds)
            parts.append(f"{self.count(LISTED)} listed (not seen: {why})")
        parts += [f"{self.count(o)} {o}" for o in (SURVIVED, NOT_EXERCISED) if self.count(o)]
        return f"{', '.join(parts)} of {self.total}"


def fault_counts(results, dtype_slice: str | None = None) -> FaultCounts:
    """The faults of `results` (variants left out) counted by outcome, over every slice or in `dtype_slice` alone."""
    faults = [r for r in results if not r.legitimate]
    if dtype_slice is None:
        outcomes = [r.outcome for r in faults]
        # Each fault never seen counts once under each kind it is listed for.
        listings = [kind for r in faults if r.outcome == LISTED for kind in {s.listed_by for s in r.listed_slices}]
    else:
        slices = [r.slice(dtype_slice) for r in faults]
        by_status = {"killed": CAUGHT, "listed": LISTED, "SURVIVED": SURVIVED, "not exercised": NOT_EXERCISED}
        outcomes = [by_status[s.status] for s in slices]
        listings = [s.listed_by for s in slices if s.status == "listed"]
    return FaultCounts(
        counts=tuple((o, outcomes.count(o)) for o in OUTCOMES),
        listed_by=tuple((kind, listings.count(kind)) for kind in LISTING_KINDS),
        total=len(faults),
    )


@dataclasses.dataclass(frozen=True)
class KillMatrix:
    """The clean pass's rows and every perturbation's result, with the rows under each."""

    clean_rows: tuple[dict, ...]
    results: tuple[PerturbationResult, ...]
    perturbed_rows: tuple[tuple[str, tuple[dict, ...]], ...]

    @property
    def clean_failures(self) -> list[dict]:
        """Clean rows that fail: the rules flag the unmodified code (a false positive)."""
        return [r for r in self.clean_rows if r["verdict"] in CATCHING_VERDICTS]

    @property
    def ok(self) -> bool:
        return not self.clean_failures and all(r.ok for r in self.results)
