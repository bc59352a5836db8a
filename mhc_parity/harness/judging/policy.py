"""The tolerance policy (one TOML file of rules; parsed by `policy_file`) and the verdict of a leaf.

Rule selection: among matching rules, one beats another if its specific (non-"*") keys are a strict superset
of the other's; no match or two incomparable best ones is a PolicyError. Before any bound: a NaN/Inf in the
candidate, the partner, or the oracle of a bound that uses it fails, as does a NaN in a metric the bound
reads (usage inf); an oracle bound given metrics made without an oracle raises ValueError (a harness bug: an
`error` row). Program rows ("lowering", "compile") are not judged here.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from dataclasses import dataclass

from mhc_parity.harness.judging.bounds import Bound, Confidence, OracleRatio, Systematic
from mhc_parity.harness.judging.metrics import LeafMetrics, dtype_name, eps
from mhc_parity.records.schema import COMPARISONS, LEAF_KINDS, PROGRAM_COMPARISONS

__all__ = [
    "DTYPES",
    "Judgement",
    "PARTITIONINGS",
    "POLICY_COMPARISONS",
    "POLICY_LEAF_KINDS",
    "Policy",
    "PolicyError",
    "Resolved",
    "Rule",
]

POLICY_COMPARISONS = tuple(c for c in COMPARISONS if c not in PROGRAM_COMPARISONS)
POLICY_LEAF_KINDS = tuple(k for k in LEAF_KINDS if k != "program")
DTYPES = ("float32", "bfloat16", "float16")
MATCH_KEYS = ("comparison", "partitioning", "dtype", "act_dtype", "leaf_kind")
# "manual": kernels run per shard in shard_map, every token as unsharded; "auto": XLA's
# partitioner splits the program and may re-block its matmuls per shard.
PARTITIONINGS = ("manual", "auto")


class PolicyError(ValueError):
    """A malformed policy file or an uncovered combination: a configuration error (exit 2), never a parity
    failure."""


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
        keys = ", ".join(f"{k}={v}" for k, v in self.keys.items())
        return f"rule {self.index} ({keys})"

    @property
    def pattern(self) -> str:
        """The match keys it names besides the comparison, e.g. 'act_dtype=bfloat16 dtype=float32' ('*' if
        none): unlike the index, unchanged when rules are added."""
        named = [f"{k}={v}" for k, v in self.keys.items() if k != "comparison" and v != "*"]
        return " ".join(named) or "*"

    @property
    def specific(self) -> frozenset[str]:
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
    """The bound one combination is held to (with the policy's systematic and confidence criteria) and the
    dtype its ulps are counted in."""

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

    bound_usage: measured / allowed of the binding criterion (> 1 fails; inf for non-finite failures);
    allowed_error, bound_metric: that criterion's limit and metric (NaN and "" where no bound was applied);
    quantile_max, quantile_rms: `Policy.quantiles`, which the gate's growth rule uses.
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
    """A validated tolerance policy; `digest` is the sha256 of the file's bytes."""

    rules: tuple[Rule, ...]
    digest: str
    source: str
    systematic: Systematic | None = None
    confidence: Confidence | None = None
    # resolve()'s answers by combination: finding the most specific rule scans every rule.
    _resolved: dict = dataclasses.field(default_factory=dict, init=False, repr=False, compare=False)

    def rule_for(self, *, comparison: str, leaf_kind: str, dtype, act_dtype, partitioning: str = "*") -> Rule:
        """The unique most specific rule for a combination; PolicyError if none or ambiguous."""
        dtype, act_dtype = _dtype_or_error(dtype, "dtype"), _dtype_or_error(act_dtype, "act_dtype")
        combo = (
            f"(comparison={comparison}, partitioning={partitioning}, dtype={dtype}, "
            f"act_dtype={act_dtype}, leaf_kind={leaf_kind})"
        )
        if comparison not in POLICY_COMPARISONS:
            raise PolicyError(f"comparison {comparison!r} is not judged by the policy {combo}")
        if leaf_kind not in POLICY_LEAF_KINDS:
            raise PolicyError(f"leaf kind {leaf_kind!r} is not judged by the policy {combo}")
        best = most_specific(
            [r for r in self.rules if r.matches(comparison, dtype, act_dtype, leaf_kind, partitioning)]
        )
        if not best:
            raise PolicyError(f"no tolerance rule in {self.source} matches {combo}")
        if len(best) > 1:
            raise PolicyError(f"ambiguous tolerance rules for {combo}: " + "; ".join(r.label for r in best))
        return best[0]

    def resolve(self, *, comparison: str, leaf_kind: str, dtype, act_dtype, partitioning: str = "*") -> Resolved:
        """The bound a combination is held to; PolicyError as `rule_for`."""
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
        """Verdict of one leaf's metrics. dtype: the compared leaf's dtype; act_dtype: the case's activation
        dtype; declared: as `Bound.judge`. PolicyError for an uncovered or invalid combination."""
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
        """q for the leaf's max and RMS sensitivity at the policy's stated false-positive rate, as the
        `oracle_ratio` bounds scale it; 1 without a stated rate."""
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
    """Why no bound can pass these metrics ("" if one can); ValueError for an oracle bound given metrics
    made without an oracle."""
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
        raise ValueError(
            f"{rule.label} is an {bound.kind} rule but the oracle errors are NaN with finite "
            f"inputs: leaf_metrics was called without an oracle"
        )
    nan_read = [f for f in bound.reads if math.isnan(getattr(m, f))]
    if nan_read:  # cannot come from leaf_metrics with finite inputs; NaN never passes
        return f"{', '.join(nan_read)} {'is' if len(nan_read) == 1 else 'are'} NaN"
    return ""


def most_specific(rules: list[Rule]) -> list[Rule]:
    return [r for r in rules if not any(o.specific > r.specific for o in rules)]


def _dtype_or_error(dtype, field: str) -> str:
    try:
        name = dtype_name(dtype)
    except ValueError as exc:
        raise PolicyError(f"{field}: {exc}") from exc
    if name not in DTYPES:
        raise PolicyError(f"{field}: dtype {name!r} is not judged by the policy; expected one of {DTYPES}")
    return name
