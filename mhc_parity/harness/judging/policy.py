"""The tolerance policy: one declarative TOML file of rules, and the verdict of a leaf.

The file (default: `mhc_parity/harness/judging/tolerances.toml`, shipped with the package; every resolved
bound is listed in docs/tolerances.md, `mhc-parity policy --table`) holds
`version = 2`, an optional `[systematic]` table and a list of `[[rule]]` tables. A rule:

* match keys: `comparison` (one of `POLICY_COMPARISONS`, never "*"), `dtype` (the
  compared leaf's dtype), `act_dtype` (the case's activation dtype; optional, default
  "*"), `leaf_kind` (one of `POLICY_LEAF_KINDS`) and `partitioning` (optional, default
  "*": "manual" for a candidate whose kernels run per shard inside shard_map, "auto"
  for one XLA partitions); each of the last four is a name or "*";
* `kind` (`mhc_parity.harness.judging.bounds.KINDS`: exact, ulps_of_max, ulps_plus_sensitivity,
  oracle_ratio) and exactly that kind's numbers, in ulps of the rule's unit dtype
  (`eps_dtype` if given, else the compared leaf's dtype);
* `rationale`: why these numbers, in one to three lines;
* optionally `eps_dtype`: ulps of this dtype instead of the leaf's, e.g. bfloat16 eps
  for a float32 leaf computed from bfloat16 activations.

`[systematic]` (`leaf_kinds`, `t_floor`, `ratio`, `rationale`) adds the systematic-error
criterion (`mhc_parity.harness.judging.bounds.Systematic`) to every oracle_ratio rule on those leaf kinds.
`[confidence]` (`false_positive_rate`, `gain_leaf_kinds`, `rationale`) states the
probability with which a correct implementation may exceed an oracle_ratio bound: the
sensitivity enters every such bound through its quantile at that rate
(`mhc_parity.harness.judging.bounds.Confidence`), and the rules on `gain_leaf_kinds` also hold the
error's component along the leaf itself.

Validation rejects any tolerance below one ulp of the compared values: every ulps
number must be >= 1 (a `direct_ulps` of 0 only switches the direct criterion off),
ratios >= 1, and an `eps_dtype` finer than a dtype the rule can match.

Rule selection: among the rules whose keys match, a rule beats another if its set of
specific (non-"*") keys is a strict superset of the other's; the unique best rule
applies. No match, or two incomparable matches, is a PolicyError naming the combination,
and `parse_policy` already rejects a file where any concrete combination is ambiguous.

Verdict, before any bound: a NaN/Inf in the candidate always fails (the reason says
whether the oracle/partner have non-finite values too; "where the oracle has none" is
the case that matters most); a NaN/Inf in the partner, or in the oracle for a bound
that uses it, fails; a NaN in any metric the bound reads fails. A bound that uses the
oracle, given metrics measured without one (all four oracle errors NaN, inputs finite),
raises ValueError: a harness bug, recorded as an `error` row. `bound_usage` and the
rest: `mhc_parity.harness.judging.bounds`. Non-finite failures report usage inf.

"lowering" and "compile" rows (leaf kind "program", `PROGRAM_COMPARISONS`) are judged by
the lowering or the compile itself, not by this policy; the file may not mention them.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import itertools
import math
import tomllib
from dataclasses import dataclass
from pathlib import Path

from mhc_parity.harness.judging.bounds import (
    KINDS,
    RATIO,
    ULPS,
    ULPS_OR_OFF,
    Bound,
    Confidence,
    OracleRatio,
    Systematic,
)
from mhc_parity.harness.judging.metrics import LeafMetrics, dtype_name, eps
from mhc_parity.records.schema import COMPARISONS, LEAF_KINDS, PROGRAM_COMPARISONS

__all__ = [
    "DEFAULT_POLICY_PATH",
    "DTYPES",
    "Judgement",
    "PARTITIONINGS",
    "POLICY_COMPARISONS",
    "POLICY_LEAF_KINDS",
    "Policy",
    "PolicyError",
    "Resolved",
    "Rule",
    "is_packaged_default",
    "load_policy",
    "parse_policy",
]

DEFAULT_POLICY_PATH = Path(__file__).with_name("tolerances.toml")

POLICY_COMPARISONS = tuple(c for c in COMPARISONS if c not in PROGRAM_COMPARISONS)
POLICY_LEAF_KINDS = tuple(k for k in LEAF_KINDS if k != "program")
DTYPES = ("float32", "bfloat16", "float16")
MATCH_KEYS = ("comparison", "partitioning", "dtype", "act_dtype", "leaf_kind")
# How a token-sharded candidate is partitioned: "manual" — the kernels run per shard
# inside shard_map, so every token is computed exactly as unsharded; "auto" — XLA's
# partitioner splits the program and may re-block its matmuls per shard.
PARTITIONINGS = ("manual", "auto")
SUPPORTED_VERSION = 2
_REQUIRED = ("comparison", "dtype", "leaf_kind", "kind", "rationale")
_NUMBER_FIELDS = frozenset(name for kind in KINDS.values() for name in kind.numbers)
_ALLOWED = frozenset(MATCH_KEYS + ("kind", "rationale", "eps_dtype")) | _NUMBER_FIELDS
_TOP_LEVEL = frozenset({"version", "rule", "systematic", "confidence"})
_CONFIDENCE_KEYS = frozenset({"false_positive_rate", "gain_leaf_kinds", "rationale"})
_SYSTEMATIC_KEYS = frozenset({"leaf_kinds", "t_floor", "ratio", "rationale"})
# What became of the fields of version 1 files.
_VERSION_1_NOTE = (
    "version 1 files had ratio_max and ratio_rms (now one 'ratio', they were always equal) "
    "and the rel_bound kind (unused, removed)"
)


class PolicyError(ValueError):
    """A malformed policy file, or a combination the policy does not cover.

    A configuration error (CLI exit code 2), never a parity failure.
    """


@dataclass(frozen=True)
class Rule:
    """One validated rule: where it applies (match keys), its bound, and why."""

    index: int
    comparison: str
    dtype: str
    act_dtype: str
    leaf_kind: str
    bound: Bound
    rationale: str
    eps_dtype: str | None = None
    partitioning: str = "*"

    @property
    def kind(self) -> str:
        return self.bound.kind

    @property
    def keys(self) -> dict[str, str]:
        return {k: getattr(self, k) for k in MATCH_KEYS}

    @property
    def label(self) -> str:
        """e.g. 'rule 3 (comparison=vs_oracle, partitioning=*, dtype=*, act_dtype=bfloat16, leaf_kind=output)'."""
        keys = ", ".join(f"{k}={v}" for k, v in self.keys.items())
        return f"rule {self.index} ({keys})"

    @property
    def pattern(self) -> str:
        """The match keys it names besides the comparison, e.g. 'act_dtype=bfloat16 dtype=float32';
        '*' for a comparison's catch-all. Unlike the index, unchanged when rules are added."""
        named = [f"{k}={v}" for k, v in self.keys.items() if k != "comparison" and v != "*"]
        return " ".join(named) or "*"

    @property
    def specific(self) -> frozenset[str]:
        """The match keys this rule names exactly (comparison always)."""
        return frozenset(k for k in MATCH_KEYS if getattr(self, k) != "*")

    def matches(self, comparison: str, dtype: str, act_dtype: str, leaf_kind: str, partitioning: str = "*") -> bool:
        wanted = {
            "comparison": comparison,
            "partitioning": partitioning,
            "dtype": dtype,
            "act_dtype": act_dtype,
            "leaf_kind": leaf_kind,
        }
        return all(getattr(self, k) in ("*", wanted[k]) for k in MATCH_KEYS)


@dataclass(frozen=True)
class Resolved:
    """The bound one concrete combination is held to: its rule, the bound (with the
    systematic criterion where the policy adds it) and the dtype its ulps are counted in."""

    rule: Rule
    bound: Bound
    unit_dtype: str

    @property
    def description(self) -> str:
        """e.g. 'ratio<=2 +4ulp | direct<=2ulp [ulp=float32 eps; rule 0]' (a row's `bound`)."""
        return f"{self.bound.describe()} [ulp={self.unit_dtype} eps; rule {self.rule.index}]"


@dataclass(frozen=True)
class Judgement:
    """The verdict of one leaf under the policy.

    verdict: "pass" or "fail"; bound: the rule and its numbers; bound_usage:
    measured/allowed for the binding criterion (>1 fails; inf for non-finite
    failures); reason: why it failed, naming metric, value and limit ("" on pass);
    allowed_error, bound_metric: the binding criterion's limit and the metric it holds
    (`mhc_parity.harness.judging.bounds.Outcome`), the numbers bound_usage divides, so a row states its
    limit as a number; NaN and "" where no bound was applied (non-finite values).
    quantile_max, quantile_rms: q of the policy's stated rate for the leaf's max and RMS
    sensitivity (`Policy.quantiles`), what the gate's growth rule scales the sensitivity by.
    """

    verdict: str
    bound: str
    bound_usage: float
    reason: str
    allowed_error: float = math.nan
    bound_metric: str = ""
    quantile_max: float = math.nan
    quantile_rms: float = math.nan

    def as_row_fields(self) -> dict:
        return {
            "verdict": self.verdict,
            "bound": self.bound,
            "bound_usage": self.bound_usage,
            "allowed_error": self.allowed_error,
            "bound_metric": self.bound_metric,
            "reason": self.reason,
            "oracle_quantile_max": self.quantile_max,
            "oracle_quantile_rms": self.quantile_rms,
        }


@dataclass(frozen=True)
class Policy:
    """A validated tolerance policy. `digest` is the sha256 of the file's bytes."""

    rules: tuple[Rule, ...]
    digest: str
    source: str
    systematic: Systematic | None = None
    confidence: Confidence | None = None
    # resolve()'s answers by combination: a run judges every leaf, of few combinations,
    # and finding the most specific rule scans every rule.
    _resolved: dict = dataclasses.field(default_factory=dict, init=False, repr=False, compare=False)

    def rule_for(self, *, comparison: str, leaf_kind: str, dtype, act_dtype, partitioning: str = "*") -> Rule:
        """The unique most specific rule for a combination; PolicyError if none/ambiguous."""
        dtype, act_dtype = _dtype_or_error(dtype, "dtype"), _dtype_or_error(act_dtype, "act_dtype")
        combo = (
            f"(comparison={comparison}, partitioning={partitioning}, dtype={dtype}, "
            f"act_dtype={act_dtype}, leaf_kind={leaf_kind})"
        )
        if comparison not in POLICY_COMPARISONS:
            raise PolicyError(f"comparison {comparison!r} is not judged by the policy {combo}")
        if leaf_kind not in POLICY_LEAF_KINDS:
            raise PolicyError(f"leaf kind {leaf_kind!r} is not judged by the policy {combo}")
        best = _most_specific(
            [r for r in self.rules if r.matches(comparison, dtype, act_dtype, leaf_kind, partitioning)]
        )
        if not best:
            raise PolicyError(f"no tolerance rule in {self.source} matches {combo}")
        if len(best) > 1:
            raise PolicyError(f"ambiguous tolerance rules for {combo}: " + "; ".join(r.label for r in best))
        return best[0]

    def resolve(self, *, comparison: str, leaf_kind: str, dtype, act_dtype, partitioning: str = "*") -> Resolved:
        """The bound a combination is held to (see `Resolved`); PolicyError as `rule_for`."""
        dtype, act_dtype = _dtype_or_error(dtype, "dtype"), _dtype_or_error(act_dtype, "act_dtype")
        combination = (comparison, leaf_kind, dtype, act_dtype, partitioning)
        resolved = self._resolved.get(combination)
        if resolved is None:
            rule = self.rule_for(
                comparison=comparison, leaf_kind=leaf_kind, dtype=dtype, act_dtype=act_dtype, partitioning=partitioning
            )
            bound = rule.bound
            if isinstance(bound, OracleRatio) and self.systematic and leaf_kind in self.systematic.leaf_kinds:
                bound = dataclasses.replace(bound, systematic=self.systematic)
            if isinstance(bound, OracleRatio) and self.confidence:
                gain = leaf_kind in self.confidence.gain_leaf_kinds
                bound = dataclasses.replace(bound, confidence=self.confidence, gain=gain)
            resolved = self._resolved[combination] = Resolved(rule, bound, rule.eps_dtype or dtype)
        return resolved

    def judge(
        self,
        metrics: LeafMetrics,
        *,
        comparison: str,
        leaf_kind: str,
        dtype,
        act_dtype,
        partitioning: str = "*",
        declared: float = 0.0,
    ) -> Judgement:
        """Verdict of one leaf's metrics under the bound for this combination.

        dtype: the compared leaf's dtype; act_dtype: the case's activation dtype (names
        or dtypes); declared: the candidate's declared precision choices' deviation on the
        leaf (`mhc_parity.harness.judging.bounds.Bound.judge`). Raises PolicyError for an uncovered or
        invalid combination.
        """
        resolved = self.resolve(
            comparison=comparison, leaf_kind=leaf_kind, dtype=dtype, act_dtype=act_dtype, partitioning=partitioning
        )
        bound, description = resolved.bound, resolved.description
        quantiles = self.quantiles(metrics)
        unusable = _unusable_metrics(metrics, bound, resolved.rule)
        if unusable:
            return Judgement("fail", description, math.inf, unusable, *(math.nan, ""), *quantiles)
        outcome = bound.judge(metrics, eps(resolved.unit_dtype), declared)
        verdict = "pass" if outcome.passed else "fail"
        return Judgement(
            verdict, description, outcome.usage, outcome.reason, outcome.allowed, outcome.metric, *quantiles
        )

    def quantiles(self, metrics: LeafMetrics) -> tuple[float, float]:
        """q for the leaf's max and RMS sensitivity at the policy's stated false-positive rate
        (`mhc_parity.harness.judging.confidence.quantile` of their degrees of freedom and draws),
        as every `oracle_ratio` bound scales the sensitivity; 1 for a policy that states no
        rate, as those bounds take it."""
        if self.confidence is None:
            return 1.0, 1.0
        return (
            self.confidence.quantile(metrics.oracle_sensitivity_dof_max, metrics.oracle_draws),
            self.confidence.quantile(metrics.oracle_sensitivity_dof_rms, metrics.oracle_draws),
        )

    def uncovered(
        self, dtypes=("float32", "bfloat16"), act_dtypes=("float32", "bfloat16")
    ) -> list[tuple[str, str, str, str]]:
        """Combinations (comparison, dtype, act_dtype, leaf_kind) some partitioning leaves unmatched."""
        return [
            combo
            for combo in itertools.product(POLICY_COMPARISONS, dtypes, act_dtypes, POLICY_LEAF_KINDS)
            if not all(any(r.matches(*combo, p) for r in self.rules) for p in PARTITIONINGS)
        ]


def _unusable_metrics(m: LeafMetrics, bound: Bound, rule: Rule) -> str:
    """Why no bound can pass these metrics ("" if one can): non-finite values, NaN metrics.

    Raises ValueError for a bound that uses the oracle given metrics made without one.
    """
    if m.nan_count or m.inf_count:
        others = m.partner_nan_count + m.partner_inf_count + m.oracle_nan_count + m.oracle_inf_count
        where = (
            "where the oracle and partner have none"
            if others == 0
            else f"(partner {m.partner_nan_count} NaN/{m.partner_inf_count} Inf, "
            f"oracle {m.oracle_nan_count} NaN/{m.oracle_inf_count} Inf)"
        )
        return f"candidate has {m.nan_count} NaN and {m.inf_count} Inf {where}; non-finite values never pass"
    if m.partner_nan_count or m.partner_inf_count:
        return f"partner has {m.partner_nan_count} NaN and {m.partner_inf_count} Inf; nothing can pass against it"
    if bound.uses_oracle and (m.oracle_nan_count or m.oracle_inf_count):
        return f"oracle has {m.oracle_nan_count} NaN and {m.oracle_inf_count} Inf; cannot judge against it"
    oracle_errors = (m.cand_oracle_max_err, m.partner_oracle_max_err, m.cand_oracle_rms_err, m.partner_oracle_rms_err)
    if bound.uses_oracle and all(math.isnan(v) for v in oracle_errors):
        # all four NaN with finite inputs is the signature of a missing oracle:
        # a harness bug, reported as an error rather than a verdict
        raise ValueError(
            f"{rule.label} is an {bound.kind} rule but the oracle errors are NaN with finite "
            f"inputs: leaf_metrics was called without an oracle"
        )
    nan_read = [f for f in bound.reads if math.isnan(getattr(m, f))]
    if nan_read:  # cannot come from leaf_metrics with finite inputs; NaN never passes
        return f"{', '.join(nan_read)} {'is' if len(nan_read) == 1 else 'are'} NaN"
    return ""


def _most_specific(rules: list[Rule]) -> list[Rule]:
    """The maximal rules under strict-superset order of their specific keys."""
    return [r for r in rules if not any(o.specific > r.specific for o in rules)]


def _dtype_or_error(dtype, field: str) -> str:
    try:
        name = dtype_name(dtype)
    except ValueError as exc:
        raise PolicyError(f"{field}: {exc}") from exc
    if name not in DTYPES:
        raise PolicyError(f"{field}: dtype {name!r} is not judged by the policy; expected one of {DTYPES}")
    return name


def _checked_number(key: str, value, check: str, err) -> float:
    """`value` as a float if it passes `check` (ULPS, RATIO, ULPS_OR_OFF); else err(...)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise err(key, f"must be a finite number, got {value!r}")
    value = float(value)
    if check == RATIO and value < 1.0:
        raise err(key, f"{value:g} < 1: a candidate cannot be required to beat the partner")
    if check == ULPS_OR_OFF and value != 0.0 and value < 1.0:
        raise err(key, f"{value:g} is below one ulp of the compared values (use 0 to disable, or >= 1)")
    if check == ULPS and value < 1.0:
        raise err(key, f"{value:g} is below one ulp of the compared values (must be >= 1)")
    return value


def _validate_rule(index: int, raw) -> Rule:
    if not isinstance(raw, dict):
        raise PolicyError(f"rule {index}: must be a table, got {type(raw).__name__}")
    shown = ", ".join(f"{k}={raw.get(k, '?')}" for k in MATCH_KEYS if k in raw)
    where = f"rule {index} ({shown})"

    def err(field: str, msg: str) -> PolicyError:
        return PolicyError(f"{where}: field {field!r}: {msg}")

    for key in raw:
        if key not in _ALLOWED:
            hint = f"; {_VERSION_1_NOTE}" if key in ("ratio_max", "ratio_rms", "rms_rel_ulps") else ""
            raise err(key, f"unknown key (allowed: {sorted(_ALLOWED)}){hint}")
    for key in _REQUIRED:
        if key not in raw:
            raise err(key, "missing")
    fields: dict = {"index": index}
    for key in ("comparison", "partitioning", "dtype", "act_dtype", "leaf_kind", "kind", "rationale", "eps_dtype"):
        if key in raw and not isinstance(raw[key], str):
            raise err(key, f"must be a string, got {raw[key]!r}")
    comparison = raw["comparison"]
    if comparison not in POLICY_COMPARISONS:
        judged_itself = comparison in PROGRAM_COMPARISONS
        hint = f" ({comparison} rows are judged by the {comparison} itself)" if judged_itself else ""
        raise err("comparison", f"unknown comparison {comparison!r}; expected one of {POLICY_COMPARISONS}{hint}")
    leaf_kind = raw["leaf_kind"]
    if leaf_kind != "*" and leaf_kind not in POLICY_LEAF_KINDS:
        raise err("leaf_kind", f"unknown leaf kind {leaf_kind!r}; expected '*' or one of {POLICY_LEAF_KINDS}")
    partitioning = raw.get("partitioning", "*")
    if partitioning != "*" and partitioning not in PARTITIONINGS:
        raise err("partitioning", f"unknown partitioning {partitioning!r}; expected '*' or one of {PARTITIONINGS}")
    fields["partitioning"] = partitioning
    for key in ("dtype", "act_dtype"):
        value = raw.get(key, "*")
        if value != "*" and value not in DTYPES:
            raise err(key, f"unknown dtype {value!r}; expected '*' or one of {DTYPES}")
        fields[key] = value
    kind = KINDS.get(raw["kind"])
    if kind is None:
        hint = f"; {_VERSION_1_NOTE}" if raw["kind"] == "rel_bound" else ""
        raise err("kind", f"unknown rule kind {raw['kind']!r}; expected one of {sorted(KINDS)}{hint}")
    if not raw["rationale"].strip():
        raise err("rationale", "must explain the numbers (empty)")
    for key in _NUMBER_FIELDS:
        if key in raw and key not in kind.numbers:
            raise err(key, f"not a field of a {kind.kind!r} rule (its fields: {list(kind.numbers) or 'none'})")
    numbers = {}
    for key, check in kind.numbers.items():
        if key not in raw:
            raise err(key, f"missing (a {kind.kind!r} rule needs {list(kind.numbers)})")
        numbers[key] = _checked_number(key, raw[key], check, err)
    eps_dtype = raw.get("eps_dtype")
    if eps_dtype is not None:
        if eps_dtype not in DTYPES:
            raise err("eps_dtype", f"unknown dtype {eps_dtype!r}; expected one of {DTYPES}")
        matchable = DTYPES if fields["dtype"] == "*" else (fields["dtype"],)
        finer = [d for d in matchable if eps(eps_dtype) < eps(d)]
        if finer:
            raise err(
                "eps_dtype",
                f"{eps_dtype} eps is finer than one ulp of {finer[0]} leaves this rule can match "
                f"(a sub-ulp tolerance); restrict 'dtype' or use a coarser eps_dtype",
            )
    return Rule(
        comparison=comparison,
        leaf_kind=leaf_kind,
        bound=kind(**numbers),
        rationale=raw["rationale"].strip(),
        eps_dtype=eps_dtype,
        **fields,
    )


def _validate_systematic(raw, source: str) -> Systematic:
    where = f"{source}: [systematic]"
    if not isinstance(raw, dict):
        raise PolicyError(f"{where}: must be a table")
    unknown = set(raw) - _SYSTEMATIC_KEYS
    missing = _SYSTEMATIC_KEYS - set(raw)
    if unknown or missing:
        raise PolicyError(f"{where}: unknown keys {sorted(unknown)}, missing keys {sorted(missing)}")
    kinds = raw["leaf_kinds"]
    if not isinstance(kinds, list) or not kinds or any(k not in POLICY_LEAF_KINDS for k in kinds):
        raise PolicyError(f"{where}: field 'leaf_kinds' must list leaf kinds of {POLICY_LEAF_KINDS}, got {kinds!r}")
    numbers = {}
    for key in ("t_floor", "ratio"):
        value = raw[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 1:
            raise PolicyError(f"{where}: field {key!r} must be a finite number >= 1, got {value!r}")
        numbers[key] = float(value)
    if not isinstance(raw["rationale"], str) or not raw["rationale"].strip():
        raise PolicyError(f"{where}: field 'rationale' must explain the numbers")
    return Systematic(tuple(kinds), numbers["t_floor"], numbers["ratio"], raw["rationale"].strip())


def _validate_confidence(raw, source: str) -> Confidence:
    where = f"{source}: [confidence]"
    if not isinstance(raw, dict):
        raise PolicyError(f"{where}: must be a table")
    unknown, missing = set(raw) - _CONFIDENCE_KEYS, _CONFIDENCE_KEYS - set(raw)
    if unknown or missing:
        raise PolicyError(f"{where}: unknown keys {sorted(unknown)}, missing keys {sorted(missing)}")
    rate = raw["false_positive_rate"]
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0.0 < rate < 0.5:
        raise PolicyError(f"{where}: field 'false_positive_rate' must be a probability in (0, 0.5), got {rate!r}")
    kinds = raw["gain_leaf_kinds"]
    if not isinstance(kinds, list) or any(k not in POLICY_LEAF_KINDS for k in kinds):
        raise PolicyError(
            f"{where}: field 'gain_leaf_kinds' must list leaf kinds of {POLICY_LEAF_KINDS}, got {kinds!r}"
        )
    if not isinstance(raw["rationale"], str) or not raw["rationale"].strip():
        raise PolicyError(f"{where}: field 'rationale' must explain the rate")
    return Confidence(float(rate), tuple(kinds), raw["rationale"].strip())


def parse_policy(text: str, *, source: str = "<string>") -> Policy:
    """Parse and validate policy TOML text. Raises PolicyError naming rule and field."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise PolicyError(f"{source}: not valid TOML: {exc}") from exc
    for key in data:
        if key not in _TOP_LEVEL:
            raise PolicyError(f"{source}: field {key!r}: unknown top-level key (allowed: {sorted(_TOP_LEVEL)})")
    if data.get("version") != SUPPORTED_VERSION:
        note = f" ({_VERSION_1_NOTE})" if data.get("version") == 1 else ""
        raise PolicyError(f"{source}: field 'version': must be {SUPPORTED_VERSION}, got {data.get('version')!r}{note}")
    raw_rules = data.get("rule")
    if not isinstance(raw_rules, list) or not raw_rules:
        raise PolicyError(f"{source}: field 'rule': needs at least one [[rule]] table")
    rules = tuple(_validate_rule(i, raw) for i, raw in enumerate(raw_rules))
    systematic = _validate_systematic(data["systematic"], source) if "systematic" in data else None
    confidence = _validate_confidence(data["confidence"], source) if "confidence" in data else None

    seen: dict[tuple, Rule] = {}
    for rule in rules:
        key = tuple(rule.keys.values())
        if key in seen:
            raise PolicyError(f"{rule.label}: duplicate of {seen[key].label}")
        seen[key] = rule
    # Every concrete combination must resolve to at most one most-specific rule.
    for combo in itertools.product(POLICY_COMPARISONS, DTYPES, DTYPES, POLICY_LEAF_KINDS, PARTITIONINGS):
        best = _most_specific([r for r in rules if r.matches(*combo)])
        if len(best) > 1:
            raise PolicyError(
                f"{source}: ambiguous rules for (comparison={combo[0]}, dtype={combo[1]}, "
                f"act_dtype={combo[2]}, leaf_kind={combo[3]}, partitioning={combo[4]}): "
                + "; ".join(r.label for r in best)
                + "; add a rule naming all of their keys"
            )
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
    return Policy(rules=rules, digest=digest, source=source, systematic=systematic, confidence=confidence)


def is_packaged_default(policy: Policy) -> bool:
    """Whether `policy` is the packaged tolerances.toml, byte for byte (wherever it was read
    from): the reports say so when it is not, since its bounds then differ from the defaults."""
    return policy.digest == _packaged_digest()


@functools.cache
def _packaged_digest() -> str:
    return hashlib.sha256(DEFAULT_POLICY_PATH.read_bytes()).hexdigest()


def load_policy(path=None) -> Policy:
    """Load and validate a policy file (default: the packaged tolerances.toml).

    `digest` is the sha256 of the file's bytes. Raises PolicyError on any problem,
    including an unreadable file.
    """
    path = Path(path) if path is not None else DEFAULT_POLICY_PATH
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise PolicyError(f"cannot read policy file {path}: {exc}") from exc
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PolicyError(f"{path}: not UTF-8: {exc}") from exc
    policy = parse_policy(text, source=str(path))
    return dataclasses.replace(policy, digest=hashlib.sha256(raw).hexdigest(), source=str(path))
