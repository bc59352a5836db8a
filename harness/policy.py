"""The tolerance policy: one declarative TOML file of rules, and the verdict of a leaf.

The file (default: `harness/tolerances.toml`, shipped with the package) holds
`version = 1` and a list of `[[rule]]` tables. Each rule has

* match keys — `comparison` (one of `POLICY_COMPARISONS`, never "*"), `dtype` (the
  compared leaf's dtype), `act_dtype` (the case's activation dtype; optional, default
  "*"), `leaf_kind` (one of `POLICY_LEAF_KINDS`) and `partitioning` (optional,
  default "*": "manual" for a candidate whose kernels run per shard inside
  shard_map, "auto" for one XLA partitions); each of the last four is a name or "*";
* `kind` and exactly that kind's numbers (all numbers are in ulps, i.e. multiples of
  eps of the rule's eps dtype — `eps_dtype` if given, else the compared leaf's dtype):

  ``exact``         max_abs_err == 0 (bit-identical). No numbers.
  ``ulps_of_max``   max_rel_err <= max_rel_ulps·eps.
  ``rel_bound``     max_rel_err <= max_rel_ulps·eps and rel_rms_err <= rms_rel_ulps·eps.
  ``ulps_plus_sensitivity``  max_rel_err <= max_rel_ulps·eps
                    + ratio_sensitivity·oracle_sensitivity_max (0 when not measured):
                    two orders of one sum differ by about its condition number times a
                    rounding, which is what the oracle's sensitivity measures.
  ``oracle_ratio``  pass if the *ratio criterion* holds,
                      cand_oracle_max_err <= ratio_max·E_max + floor_ulps·eps
                      and cand_oracle_rms_err <= ratio_rms·E_rms + floor_ulps·eps,
                    with E = max(partner_oracle_err, oracle_sensitivity) — the partner's
                    error against the oracle or, where larger, the error one rounding
                    per operation explains at this leaf (NaN sensitivity: the partner's
                    alone; on vs_oracle rows the partner is the oracle, so E is the
                    sensitivity) — or the *direct criterion* holds,
                    max_rel_err <= direct_ulps·eps (the two are indistinguishable;
                    direct_ulps = 0 disables it);

* `rationale` — why these numbers (required: the reasoning lives next to the numbers);
* optionally `eps_dtype` — measure the ulps in this dtype's eps instead of the leaf's,
  e.g. bfloat16 eps for a float32 intermediate computed from bfloat16 activations.

All error metrics are normalised by max|expected| (or ‖expected‖₂), so k·eps is at
least k ulps of the largest compared value. Validation rejects any tolerance below one
ulp of the compared values: every `*_ulps` number and `floor_ulps` must be >= 1 (a
`direct_ulps` of 0 only switches the direct criterion off), ratios must be >= 1, and an
`eps_dtype` finer than a dtype the rule can match is rejected.

Rule selection: among the rules whose keys match (comparison, dtype, act_dtype,
leaf_kind), a rule beats another if its set of specific (non-"*") keys is a strict
superset of the other's. The unique best rule applies. If no rule matches, or two
matches are incomparable (e.g. one names the dtype, the other the leaf kind, and no
rule names both), `judge` raises PolicyError naming the combination — and `load_policy`
already rejects a file where any concrete combination would be ambiguous.

Verdict, before any bound: a NaN/Inf in the candidate always fails (the reason says
whether the oracle/partner have non-finite values too — "where the oracle has none" is
the case that matters most); a NaN/Inf in the partner, or in the oracle for an
`oracle_ratio` rule, fails (nothing meaningful can pass); a NaN in any metric the rule
reads fails. Comparisons are written so that NaN can only ever fail. An `oracle_ratio`
rule given metrics measured without an oracle (all four oracle errors NaN, inputs finite)
raises ValueError: that is a harness bug, to be recorded as an `error` row.

`bound_usage` is measured/allowed for the binding criterion (>1 ⇔ fail): the largest
usage among the conditions that must all hold; for `oracle_ratio` (ratio OR direct) the
smaller of the two criteria's usages, i.e. the criterion that passes most comfortably
(on a pass via the direct criterion alone that is the direct criterion's usage).
"exact" reports 0 when identical, inf otherwise. Non-finite failures report inf.

"lowering" rows (leaf kind "program") are judged by the lowering check itself, not by
this policy; the file may not mention them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import math
import tomllib
from dataclasses import dataclass
from pathlib import Path

from harness.metrics import LeafMetrics, dtype_name, eps
from harness.schema import COMPARISONS, LEAF_KINDS

__all__ = [
    "DEFAULT_POLICY_PATH",
    "DTYPES",
    "Judgement",
    "PARTITIONINGS",
    "POLICY_COMPARISONS",
    "POLICY_LEAF_KINDS",
    "Policy",
    "PolicyError",
    "RULE_KINDS",
    "Rule",
    "load_policy",
    "parse_policy",
]

DEFAULT_POLICY_PATH = Path(__file__).with_name("tolerances.toml")

POLICY_COMPARISONS = tuple(c for c in COMPARISONS if c != "lowering")
POLICY_LEAF_KINDS = tuple(k for k in LEAF_KINDS if k != "program")
DTYPES = ("float32", "bfloat16", "float16")

# kind -> its numeric fields (all required, none allowed for other kinds)
RULE_KINDS: dict[str, tuple[str, ...]] = {
    "exact": (),
    "ulps_of_max": ("max_rel_ulps",),
    "rel_bound": ("max_rel_ulps", "rms_rel_ulps"),
    "oracle_ratio": ("ratio_max", "ratio_rms", "floor_ulps", "direct_ulps"),
    "ulps_plus_sensitivity": ("max_rel_ulps", "ratio_sensitivity"),
}
NUMBER_FIELDS = (
    "max_rel_ulps", "rms_rel_ulps", "ratio_max", "ratio_rms", "floor_ulps", "direct_ulps", "ratio_sensitivity",
)
MATCH_KEYS = ("comparison", "partitioning", "dtype", "act_dtype", "leaf_kind")
# How a token-sharded candidate is partitioned: "manual" — the kernels run per shard
# inside shard_map, so every token is computed exactly as unsharded; "auto" — XLA's
# partitioner splits the program and may re-block its matmuls per shard.
PARTITIONINGS = ("manual", "auto")
_REQUIRED = ("comparison", "dtype", "leaf_kind", "kind", "rationale")
_ALLOWED = frozenset(MATCH_KEYS + ("kind", "rationale", "eps_dtype") + NUMBER_FIELDS)
_TOP_LEVEL = frozenset({"version", "rule", "systematic"})
_SYSTEMATIC_KEYS = frozenset({"leaf_kinds", "t_floor", "ratio", "rationale"})
SUPPORTED_VERSION = 1
# The LeafMetrics fields each rule kind reads (a NaN in any of them fails).
_READS: dict[str, tuple[str, ...]] = {
    "exact": ("max_abs_err",),
    "ulps_of_max": ("max_rel_err",),
    "rel_bound": ("max_rel_err", "rel_rms_err"),
    "oracle_ratio": ("cand_oracle_max_err", "partner_oracle_max_err", "cand_oracle_rms_err",
                     "partner_oracle_rms_err", "max_rel_err"),
    "ulps_plus_sensitivity": ("max_rel_err",),
}


class PolicyError(ValueError):
    """A malformed policy file, or a combination the policy does not cover.

    A configuration error (CLI exit code 2), never a parity failure.
    """


@dataclass(frozen=True)
class Rule:
    """One validated rule. Numbers not used by `kind` are None."""

    index: int
    comparison: str
    dtype: str
    act_dtype: str
    leaf_kind: str
    kind: str
    rationale: str
    eps_dtype: str | None = None
    partitioning: str = "*"
    max_rel_ulps: float | None = None
    rms_rel_ulps: float | None = None
    ratio_max: float | None = None
    ratio_rms: float | None = None
    floor_ulps: float | None = None
    direct_ulps: float | None = None
    ratio_sensitivity: float | None = None

    @property
    def keys(self) -> dict[str, str]:
        return {k: getattr(self, k) for k in MATCH_KEYS}

    @property
    def label(self) -> str:
        """e.g. 'rule 3 (comparison=vs_oracle, dtype=*, act_dtype=bfloat16, leaf_kind=output)'."""
        keys = ", ".join(f"{k}={v}" for k, v in self.keys.items())
        return f"rule {self.index} ({keys})"

    @property
    def specific(self) -> frozenset[str]:
        """The match keys this rule names exactly (comparison always)."""
        return frozenset(k for k in MATCH_KEYS if getattr(self, k) != "*")

    def matches(self, comparison: str, dtype: str, act_dtype: str, leaf_kind: str, partitioning: str = "*") -> bool:
        wanted = {
            "comparison": comparison, "partitioning": partitioning, "dtype": dtype,
            "act_dtype": act_dtype, "leaf_kind": leaf_kind,
        }
        return all(getattr(self, k) in ("*", wanted[k]) for k in MATCH_KEYS)

    def describe(self, unit_dtype: str) -> str:
        """Human-readable bound with its numbers, e.g.
        'ratio_max<=2 ratio_rms<=2 +4ulp | direct<=2ulp [ulp=float32 eps; rule 0]'."""
        if self.kind == "exact":
            return f"exact (max_abs_err == 0) [rule {self.index}]"
        if self.kind == "ulps_of_max":
            body = f"max_rel<={self.max_rel_ulps:g}ulp"
        elif self.kind == "rel_bound":
            body = f"max_rel<={self.max_rel_ulps:g}ulp rms_rel<={self.rms_rel_ulps:g}ulp"
        elif self.kind == "ulps_plus_sensitivity":
            body = f"max_rel<={self.max_rel_ulps:g}ulp+{self.ratio_sensitivity:g}*sensitivity"
        else:
            body = f"ratio_max<={self.ratio_max:g} ratio_rms<={self.ratio_rms:g} +{self.floor_ulps:g}ulp"
            if self.direct_ulps:
                body += f" | direct<={self.direct_ulps:g}ulp"
        return f"{body} [ulp={unit_dtype} eps; rule {self.index}]"


@dataclass(frozen=True)
class SystematicRule:
    """The systematic-error criterion, added to every oracle_ratio rule on `leaf_kinds`.

    A leaf passes it when cand_systematic_t <= max(t_floor, ratio * E_t), with E_t the
    larger of the partner's t and the t the rounding model itself produces
    (oracle_systematic_t), or when the shift of that group is at most the rule's floor
    (floor_ulps * eps): an error shared by every token that is larger than what rounding
    explains, and larger than a few ulps, fails even when the leaf's max and RMS errors
    are within their ratios.
    """

    leaf_kinds: tuple[str, ...]
    t_floor: float
    ratio: float
    rationale: str

    def describe(self) -> str:
        return f"systematic t<={self.t_floor:g} or {self.ratio:g}x"


@dataclass(frozen=True)
class Judgement:
    """The verdict of one leaf under the policy.

    verdict: "pass" or "fail"; bound: the rule and its numbers; bound_usage:
    measured/allowed for the binding criterion (>1 fails; inf for non-finite
    failures); reason: why it failed, naming metric, value and limit ("" on pass).
    """

    verdict: str
    bound: str
    bound_usage: float
    reason: str

    def as_row_fields(self) -> dict:
        return {"verdict": self.verdict, "bound": self.bound, "bound_usage": self.bound_usage, "reason": self.reason}


def _usage(measured: float, allowed: float) -> float:
    """measured / allowed; NaN measured -> inf (NaN never passes); 0/0 -> 0; x/0 -> inf."""
    if math.isnan(measured):
        return math.inf
    if allowed == 0.0:
        return 0.0 if measured == 0.0 else math.inf
    return measured / allowed


def _fmt(x: float) -> str:
    return f"{x:.4g}"


@dataclass(frozen=True)
class Policy:
    """A validated tolerance policy. `digest` is the sha256 of the file's bytes."""

    rules: tuple[Rule, ...]
    digest: str
    source: str
    systematic: SystematicRule | None = None

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
            raise PolicyError(
                f"ambiguous tolerance rules for {combo}: " + "; ".join(r.label for r in best)
            )
        return best[0]

    def judge(
        self, metrics: LeafMetrics, *, comparison: str, leaf_kind: str, dtype, act_dtype, partitioning: str = "*"
    ) -> Judgement:
        """Verdict of one leaf's metrics under the rule for this combination.

        dtype: the compared leaf's dtype; act_dtype: the case's activation dtype (names
        or dtypes). Raises PolicyError for an uncovered or invalid combination.
        """
        rule = self.rule_for(
            comparison=comparison, leaf_kind=leaf_kind, dtype=dtype, act_dtype=act_dtype, partitioning=partitioning
        )
        unit_dtype = rule.eps_dtype or dtype_name(dtype)
        bound = rule.describe(unit_dtype)

        def fail(reason: str, usage: float = math.inf) -> Judgement:
            return Judgement("fail", bound, usage, reason)

        m = metrics
        if m.nan_count or m.inf_count:
            others = m.partner_nan_count + m.partner_inf_count + m.oracle_nan_count + m.oracle_inf_count
            where = (
                "where the oracle and partner have none"
                if others == 0
                else f"(partner {m.partner_nan_count} NaN/{m.partner_inf_count} Inf, "
                f"oracle {m.oracle_nan_count} NaN/{m.oracle_inf_count} Inf)"
            )
            return fail(
                f"candidate has {m.nan_count} NaN and {m.inf_count} Inf {where}; non-finite values never pass"
            )
        if m.partner_nan_count or m.partner_inf_count:
            return fail(
                f"partner has {m.partner_nan_count} NaN and {m.partner_inf_count} Inf; nothing can pass against it"
            )
        if rule.kind == "oracle_ratio" and (m.oracle_nan_count or m.oracle_inf_count):
            return fail(f"oracle has {m.oracle_nan_count} NaN and {m.oracle_inf_count} Inf; cannot judge against it")

        if rule.kind == "oracle_ratio" and all(
            math.isnan(v) for v in (m.cand_oracle_max_err, m.partner_oracle_max_err,
                                    m.cand_oracle_rms_err, m.partner_oracle_rms_err)
        ):
            # all four NaN with finite inputs is the signature of a missing oracle:
            # a harness bug, reported as an error rather than a verdict
            raise ValueError(
                f"{rule.label} is an oracle_ratio rule but the oracle errors are NaN with finite "
                f"inputs: leaf_metrics was called without an oracle"
            )
        nan_read = [f for f in _READS[rule.kind] if math.isnan(getattr(m, f))]
        if nan_read:  # cannot come from leaf_metrics with finite inputs; NaN never passes
            return fail(f"{', '.join(nan_read)} {'is' if len(nan_read) == 1 else 'are'} NaN")

        e = eps(unit_dtype)
        if rule.kind == "exact":
            return self._conditions(fail, bound, [("max_abs_err", m.max_abs_err, 0.0, "0 (bit-identical)")])
        if rule.kind == "ulps_of_max":
            lim = rule.max_rel_ulps * e
            return self._conditions(
                fail, bound, [("max_rel_err", m.max_rel_err, lim, f"{rule.max_rel_ulps:g}ulp={_fmt(lim)}")]
            )
        if rule.kind == "ulps_plus_sensitivity":
            sens = 0.0 if math.isnan(m.oracle_sensitivity_max) else m.oracle_sensitivity_max
            lim = rule.max_rel_ulps * e + rule.ratio_sensitivity * sens
            text = f"{rule.max_rel_ulps:g}ulp+{rule.ratio_sensitivity:g}*sensitivity({_fmt(sens)})={_fmt(lim)}"
            return self._conditions(fail, bound, [("max_rel_err", m.max_rel_err, lim, text)])
        if rule.kind == "rel_bound":
            lim_max, lim_rms = rule.max_rel_ulps * e, rule.rms_rel_ulps * e
            return self._conditions(
                fail,
                bound,
                [
                    ("max_rel_err", m.max_rel_err, lim_max, f"{rule.max_rel_ulps:g}ulp={_fmt(lim_max)}"),
                    ("rel_rms_err", m.rel_rms_err, lim_rms, f"{rule.rms_rel_ulps:g}ulp={_fmt(lim_rms)}"),
                ],
            )
        # oracle_ratio
        floor = rule.floor_ulps * e
        ratio_conds = []
        for name, cand, part, sens, ratio in (
            ("max", m.cand_oracle_max_err, m.partner_oracle_max_err, m.oracle_sensitivity_max, rule.ratio_max),
            ("rms", m.cand_oracle_rms_err, m.partner_oracle_rms_err, m.oracle_sensitivity_rms, rule.ratio_rms),
        ):
            # The error to be no worse than: the partner's, or — where larger — the error
            # the arithmetic explains at this leaf (the oracle's sensitivity, if measured).
            explained = part if math.isnan(sens) else max(part, sens)
            lim = math.nan if math.isnan(part) else ratio * explained + floor
            what = f"partner_oracle_{name}_err({_fmt(part)})"
            if not math.isnan(sens):
                what = f"max({what}, sensitivity({_fmt(sens)}))"
            desc = f"{ratio:g}*{what}+{rule.floor_ulps:g}ulp={_fmt(lim)}"
            ratio_conds.append((f"cand_oracle_{name}_err", cand, lim, desc))
        ratio_usage, ratio_worst = _worst(ratio_conds)
        reasons = [_limit_reason(*ratio_worst)] if ratio_usage > 1.0 else []
        systematic = self.systematic
        if systematic and leaf_kind in systematic.leaf_kinds and not math.isnan(m.cand_systematic_t):
            bound += f" + {systematic.describe()}"
            usage_t, usage_shift, text = _systematic_usage(systematic, m, floor, rule.floor_ulps)
            if min(usage_t, usage_shift) > 1.0:
                reasons.append(text)
            ratio_usage = max(ratio_usage, min(usage_t, usage_shift))
        direct_lim = rule.direct_ulps * e
        direct_usage = _usage(m.max_rel_err, direct_lim) if rule.direct_ulps else math.inf
        usage = min(ratio_usage, direct_usage)
        if usage <= 1.0:
            return Judgement("pass", bound, usage, "")
        reason = "; ".join(reasons)
        if rule.direct_ulps:
            reason += (
                f"; and not indistinguishable: max_rel_err={_fmt(m.max_rel_err)} > "
                f"direct {rule.direct_ulps:g}ulp={_fmt(direct_lim)}"
            )
        return Judgement("fail", bound, usage, reason)

    @staticmethod
    def _conditions(fail, bound: str, conds: list) -> Judgement:
        """All of `conds` ((metric, measured, allowed, limit text)) must hold."""
        usage, worst = _worst(conds)
        if usage <= 1.0:
            return Judgement("pass", bound, usage, "")
        return fail(_limit_reason(*worst), usage)

    def uncovered(self, dtypes=("float32", "bfloat16"), act_dtypes=("float32", "bfloat16")) -> list[tuple[str, str, str, str]]:
        """Combinations (comparison, dtype, act_dtype, leaf_kind) some partitioning leaves unmatched."""
        return [
            combo
            for combo in itertools.product(POLICY_COMPARISONS, dtypes, act_dtypes, POLICY_LEAF_KINDS)
            if not all(any(r.matches(*combo, p) for r in self.rules) for p in PARTITIONINGS)
        ]


def _systematic_usage(systematic: SystematicRule, m: LeafMetrics, floor: float, floor_ulps: float):
    """(usage of the t bound, usage of the shift floor, failure text) of the systematic criterion."""
    explained = max((t for t in (m.partner_systematic_t, m.oracle_systematic_t) if not math.isnan(t)), default=0.0)
    t_limit = max(systematic.t_floor, systematic.ratio * explained)
    usage_t = _usage(m.cand_systematic_t, t_limit)
    usage_shift = _usage(m.cand_systematic_shift, floor)
    text = (
        f"cand_systematic_t={_fmt(m.cand_systematic_t)} > max({systematic.t_floor:g}, "
        f"{systematic.ratio:g}*{_fmt(explained)})={_fmt(t_limit)} with shift "
        f"{_fmt(m.cand_systematic_shift)} > {floor_ulps:g}ulp={_fmt(floor)}: an error shared by every token"
    )
    return usage_t, usage_shift, text


def _worst(conds: list) -> tuple[float, tuple]:
    """Largest usage among conditions (metric, measured, allowed, text) and its condition.

    A NaN measured value or a NaN limit counts as usage inf: NaN never passes.
    """
    scored = [(math.inf if math.isnan(c[2]) else _usage(c[1], c[2]), c) for c in conds]
    return max(scored, key=lambda t: t[0])


def _limit_reason(metric: str, measured: float, allowed: float, limit_text: str) -> str:
    if math.isnan(measured):
        return f"{metric} is NaN (limit {limit_text})"
    if math.isnan(allowed):
        return f"{metric}={_fmt(measured)} cannot be judged: its limit is NaN ({limit_text})"
    return f"{metric}={_fmt(measured)} > {limit_text}"


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


def _validate_rule(index: int, raw) -> Rule:
    if not isinstance(raw, dict):
        raise PolicyError(f"rule {index}: must be a table, got {type(raw).__name__}")
    shown = ", ".join(f"{k}={raw.get(k, '?')}" for k in MATCH_KEYS if k in raw)
    where = f"rule {index} ({shown})"

    def err(field: str, msg: str) -> PolicyError:
        return PolicyError(f"{where}: field {field!r}: {msg}")

    for key in raw:
        if key not in _ALLOWED:
            raise err(key, f"unknown key (allowed: {sorted(_ALLOWED)})")
    for key in _REQUIRED:
        if key not in raw:
            raise err(key, "missing")
    fields: dict = {"index": index}
    for key in ("comparison", "partitioning", "dtype", "act_dtype", "leaf_kind", "kind", "rationale", "eps_dtype"):
        if key in raw and not isinstance(raw[key], str):
            raise err(key, f"must be a string, got {raw[key]!r}")
    comparison = raw["comparison"]
    if comparison not in POLICY_COMPARISONS:
        hint = " (lowering rows are judged by the lowering check)" if comparison == "lowering" else ""
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
    kind = raw["kind"]
    if kind not in RULE_KINDS:
        raise err("kind", f"unknown rule kind {kind!r}; expected one of {sorted(RULE_KINDS)}")
    if not raw["rationale"].strip():
        raise err("rationale", "must explain the numbers (empty)")
    needed = RULE_KINDS[kind]
    for key in NUMBER_FIELDS:
        if key in raw and key not in needed:
            raise err(key, f"not a field of a {kind!r} rule (its fields: {list(needed) or 'none'})")
    for key in needed:
        if key not in raw:
            raise err(key, f"missing (a {kind!r} rule needs {list(needed)})")
        value = raw[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise err(key, f"must be a finite number, got {value!r}")
        value = float(value)
        if key.startswith("ratio_"):
            if value < 1.0:
                raise err(key, f"{value:g} < 1: a candidate cannot be required to beat the partner")
        elif key == "direct_ulps":
            if value != 0.0 and value < 1.0:
                raise err(key, f"{value:g} is below one ulp of the compared values (use 0 to disable, or >= 1)")
        elif value < 1.0:
            raise err(key, f"{value:g} is below one ulp of the compared values (must be >= 1)")
        fields[key] = value
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
        comparison=comparison, leaf_kind=leaf_kind, kind=kind, rationale=raw["rationale"].strip(),
        eps_dtype=eps_dtype, **fields,
    )


def _validate_systematic(raw, source: str) -> SystematicRule:
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
    return SystematicRule(tuple(kinds), numbers["t_floor"], numbers["ratio"], raw["rationale"].strip())


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
        raise PolicyError(f"{source}: field 'version': must be {SUPPORTED_VERSION}, got {data.get('version')!r}")
    raw_rules = data.get("rule")
    if not isinstance(raw_rules, list) or not raw_rules:
        raise PolicyError(f"{source}: field 'rule': needs at least one [[rule]] table")
    rules = tuple(_validate_rule(i, raw) for i, raw in enumerate(raw_rules))
    systematic = _validate_systematic(data["systematic"], source) if "systematic" in data else None

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
                + " — add a rule naming all of their keys"
            )
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
    return Policy(rules=rules, digest=digest, source=source, systematic=systematic)


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
