"""The tolerance policy: one declarative TOML file of rules, and the verdict of a leaf.

The file and its validation: `mhc_parity.harness.judging.policy_file` (`load_policy`,
`parse_policy`).

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
# How a token-sharded candidate is partitioned: "manual" — the kernels run per shard
# inside shard_map, so every token is computed exactly as unsharded; "auto" — XLA's
# partitioner splits the program and may re-block its matmuls per shard.
PARTITIONINGS = ("manual", "auto")


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
        best = most_specific(
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


def most_specific(rules: list[Rule]) -> list[Rule]:
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
