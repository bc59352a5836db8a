"""The kinds of tolerance rule: each a small frozen class with its numbers, `judge` and `describe`.

A bound holds a few `LeafMetrics` fields to limits in ulps: `unit` is eps of the rule's unit dtype. Errors
are normalised by max|expected| (or the L2 norm), so k ulps is at least k ulps of the largest compared
value.

  exact                  max_abs_err == 0
  ulps_of_max            max_rel_err <= max_rel_ulps * unit
  ulps_plus_sensitivity  max_rel_err <= max_rel_ulps * unit + ratio_sensitivity * S_max
                         (S: the oracle's sensitivity, 0 when not measured)
  oracle_ratio           for the max and the RMS error,
                           cand_oracle_err <= ratio * max(partner_oracle_err, q * S) + floor_ulps * unit
                         (q: `confidence.quantile` of the leaf's degrees of freedom, 1 without a
                         `Confidence`); AND the systematic criterion where the policy adds it;
                         OR max_rel_err <= direct_ulps * unit (0: off); AND, where the policy
                         adds it, the same inequality for the gain (never rescued by direct),
                         its floor times max|o|/‖o‖₂

`judge` returns an `Outcome`: usage = measured / allowed of the binding criterion (> 1 fails; the worst of
conditions that must all hold, the better of alternatives), that criterion and the failure's reason. A NaN
measurement or limit is usage inf. The non-finite checks before any bound are `policy.Policy.judge`'s.
"""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar

from mhc_parity.harness.judging.confidence import quantile
from mhc_parity.harness.judging.metrics import LeafMetrics
from mhc_parity.records.gain_rule import gain_floor
from mhc_parity.records.text import format_number

# How a number of a rule is validated: "ulps" >= 1 (nothing below one ulp of the compared
# values), "ratio" >= 1 (a candidate is never required to beat its partner), "ulps_or_off"
# 0 (the criterion is off) or >= 1.
ULPS, RATIO, ULPS_OR_OFF = "ulps", "ratio", "ulps_or_off"


def _number(value: float) -> str:
    return format_number(value, 4)


def usage_of(measured: float, allowed: float) -> float:
    """measured / allowed; NaN on either side -> inf (NaN never passes); 0/0 -> 0; x/0 -> inf."""
    if math.isnan(measured) or math.isnan(allowed):
        return math.inf
    if allowed == 0.0:
        return 0.0 if measured == 0.0 else math.inf
    return measured / allowed


@dataclasses.dataclass(frozen=True)
class Condition:
    """One metric held to one limit; `limit_text` says how the limit was made."""

    metric: str
    measured: float
    allowed: float
    limit_text: str

    @property
    def usage(self) -> float:
        return usage_of(self.measured, self.allowed)

    @property
    def reason(self) -> str:
        if math.isnan(self.measured):
            return f"{self.metric} is NaN (limit {self.limit_text})"
        if math.isnan(self.allowed):
            return f"{self.metric}={_number(self.measured)} cannot be judged: its limit is NaN ({self.limit_text})"
        return f"{self.metric}={_number(self.measured)} > {self.limit_text}"


@dataclasses.dataclass(frozen=True)
class Outcome:
    """A bound's verdict on one leaf: usage (> 1 fails), the binding condition whose usage it is, and on a
    failure why."""

    usage: float
    reason: str = ""
    binding: Condition | None = None

    @property
    def passed(self) -> bool:
        return self.usage <= 1.0

    @property
    def allowed(self) -> float:
        return math.nan if self.binding is None else self.binding.allowed

    @property
    def metric(self) -> str:
        return "" if self.binding is None else self.binding.metric


def all_hold(conditions: list[Condition]) -> Outcome:
    """Every condition must hold: the usage, condition and reason of the worst one."""
    worst = max(conditions, key=lambda c: c.usage)
    return Outcome(worst.usage, "" if worst.usage <= 1.0 else worst.reason, worst)


def _declared_text(declared: float) -> str:
    return f"+2*declared({_number(declared)})" if declared > 0 else ""


class Bound:
    """A rule kind; subclasses are frozen dataclasses whose fields are the rule's numbers.

    numbers: field -> validation (ULPS, RATIO, ULPS_OR_OFF); reads: the metrics it reads (a NaN in any fails
    before the bound); uses_oracle: it needs the oracle's errors.
    """

    kind: ClassVar[str]
    numbers: ClassVar[dict[str, str]]
    reads: ClassVar[tuple[str, ...]]
    uses_oracle: ClassVar[bool] = False

    def judge(self, m: LeafMetrics, unit: float, declared: float = 0.0) -> Outcome:
        """The outcome for metrics `m` in units `unit`. declared: the largest deviation the candidate's
        declared precision choices make on the leaf (max|e|/max|oracle|); the ulps kinds allow twice it (two
        orders of a declared narrow sum), the oracle's kinds get it through the sensitivity."""
        raise NotImplementedError

    def describe(self) -> str:
        """The bound with its numbers, e.g. 'max_rel<=64ulp'."""
        raise NotImplementedError


@dataclasses.dataclass(frozen=True)
class Exact(Bound):
    """`exact`: bit-identical, max_abs_err == 0 (usage 0 when identical, inf otherwise)."""

    kind: ClassVar[str] = "exact"
    numbers: ClassVar[dict[str, str]] = {}
    reads: ClassVar[tuple[str, ...]] = ("max_abs_err",)

    def judge(self, m: LeafMetrics, unit: float, declared: float = 0.0) -> Outcome:
        return all_hold([Condition("max_abs_err", m.max_abs_err, 0.0, "0 (bit-identical)")])

    def describe(self) -> str:
        return "exact (max_abs_err == 0)"


@dataclasses.dataclass(frozen=True)
class UlpsOfMax(Bound):
    """`max_rel<=K ulp`: max|candidate - partner| / max|partner| <= K ulps."""

    max_rel_ulps: float
    kind: ClassVar[str] = "ulps_of_max"
    numbers: ClassVar[dict[str, str]] = {"max_rel_ulps": ULPS}
    reads: ClassVar[tuple[str, ...]] = ("max_rel_err",)

    def judge(self, m: LeafMetrics, unit: float, declared: float = 0.0) -> Outcome:
        limit = self.max_rel_ulps * unit + 2 * declared
        text = f"{self.max_rel_ulps:g}ulp{_declared_text(declared)}={_number(limit)}"
        return all_hold([Condition("max_rel_err", m.max_rel_err, limit, text)])

    def describe(self) -> str:
        return f"max_rel<={self.max_rel_ulps:g}ulp"


@dataclasses.dataclass(frozen=True)
class UlpsPlusSensitivity(Bound):
    """`max_rel<=K ulp+F*sensitivity`: as above, plus F times the oracle's sensitivity S, the
    error one rounding per operation explains at the leaf."""

    max_rel_ulps: float
    ratio_sensitivity: float
    kind: ClassVar[str] = "ulps_plus_sensitivity"
    numbers: ClassVar[dict[str, str]] = {"max_rel_ulps": ULPS, "ratio_sensitivity": RATIO}
    reads: ClassVar[tuple[str, ...]] = ("max_rel_err",)

    def judge(self, m: LeafMetrics, unit: float, declared: float = 0.0) -> Outcome:
        sensitivity = 0.0 if math.isnan(m.oracle_sensitivity_max) else m.oracle_sensitivity_max
        limit = self.max_rel_ulps * unit + self.ratio_sensitivity * sensitivity + 2 * declared
        text = (
            f"{self.max_rel_ulps:g}ulp+{self.ratio_sensitivity:g}*sensitivity({_number(sensitivity)})"
            f"{_declared_text(declared)}={_number(limit)}"
        )
        return all_hold([Condition("max_rel_err", m.max_rel_err, limit, text)])

    def describe(self) -> str:
        return f"max_rel<={self.max_rel_ulps:g}ulp+{self.ratio_sensitivity:g}*sensitivity"


@dataclasses.dataclass(frozen=True)
class Systematic:
    """`systematic t<=T or Mx`: no error shared by every token, beyond T or M x what the
    rounding model itself shows (the policy adds it to oracle-ratio bounds on `leaf_kinds`).

    A leaf passes it when cand_systematic_t <= max(t_floor, ratio * E_t), with E_t the
    larger of the partner's t and the t the rounding model itself produces
    (oracle_systematic_t), or when that group's shift is at most the rule's floor
    (floor_ulps ulps) plus the shift the backend's own primitives may share there
    (oracle_backend_shift: 0 on a CPU): an error shared by every token, larger than rounding
    explains and than a few ulps, fails even when the leaf's max and RMS errors are within
    their ratio.
    """

    leaf_kinds: tuple[str, ...]
    t_floor: float
    ratio: float
    rationale: str = dataclasses.field(default="", compare=False)

    def describe(self) -> str:
        return f"systematic t<={self.t_floor:g} or {self.ratio:g}x"

    def condition(self, m: LeafMetrics, floor: float, floor_ulps: float) -> tuple[Condition, str]:
        """(the binding condition, failure text): the t bound or the shift floor, whichever has the smaller
        usage (either passing passes)."""
        explained = max((t for t in (m.partner_systematic_t, m.oracle_systematic_t) if not math.isnan(t)), default=0.0)
        t_limit = max(self.t_floor, self.ratio * explained)
        t_text = f"max({self.t_floor:g}, {self.ratio:g}*{_number(explained)})={_number(t_limit)}"
        shift_text = f"{floor_ulps:g}ulp={_number(floor)}"
        if m.oracle_backend_shift > 0.0:  # NaN (no backend term) compares False
            # A backend primitive's error is a fixed function of its input: tokens that feed it
            # alike share it (TPU v5e, the sigmoid through softplus: 5.7e-5 on every token).
            floor += m.oracle_backend_shift
            shift_text = f"{floor_ulps:g}ulp+backend shift({_number(m.oracle_backend_shift)})={_number(floor)}"
        alternatives = [
            Condition("cand_systematic_t", m.cand_systematic_t, t_limit, t_text),
            Condition("cand_systematic_shift", m.cand_systematic_shift, floor, shift_text),
        ]
        text = (
            f"cand_systematic_t={_number(m.cand_systematic_t)} > {t_text} with shift "
            f"{_number(m.cand_systematic_shift)} > {shift_text}: an error shared by every token"
        )
        return min(alternatives, key=lambda c: c.usage), text


@dataclasses.dataclass(frozen=True)
class Confidence:
    """`at p=P`: the sensitivity S enters a bound as q·S, with q the quantile that a correct
    implementation's error exceeds with probability P given the leaf's degrees of freedom
    and the number of draws S averages (`mhc_parity.harness.judging.confidence.quantile`); `+gain`
    (on `gain_leaf_kinds`): the same criterion on the error's component along the leaf itself,
    its floor on the gain's own scale, never rescued by `direct`."""

    false_positive_rate: float
    gain_leaf_kinds: tuple[str, ...]
    rationale: str = dataclasses.field(default="", compare=False)

    def quantile(self, dof: float, draws: float) -> float:
        return quantile(self.false_positive_rate, dof, draws)

    def describe(self) -> str:
        return f"at p={self.false_positive_rate:g}"


@dataclasses.dataclass(frozen=True)
class OracleRatio(Bound):
    """`ratio<=R +F ulp | direct<=D ulp`: the error against the float64 oracle (max and
    RMS) <= R x max(the partner's, S) + F ulps; or, where a D is shown, within D ulps of
    the partner."""

    ratio: float
    floor_ulps: float
    direct_ulps: float
    systematic: Systematic | None = None
    confidence: Confidence | None = None
    gain: bool = False
    kind: ClassVar[str] = "oracle_ratio"
    numbers: ClassVar[dict[str, str]] = {"ratio": RATIO, "floor_ulps": ULPS, "direct_ulps": ULPS_OR_OFF}
    reads: ClassVar[tuple[str, ...]] = (
        "cand_oracle_max_err",
        "partner_oracle_max_err",
        "cand_oracle_rms_err",
        "partner_oracle_rms_err",
        "max_rel_err",
    )
    uses_oracle: ClassVar[bool] = True

    def judge(self, m: LeafMetrics, unit: float, declared: float = 0.0) -> Outcome:
        floor = self.floor_ulps * unit
        # (candidate's metric, partner's metric, the sensitivity, its degrees of freedom)
        criteria = [
            ("cand_oracle_max_err", "partner_oracle_max_err", m.oracle_sensitivity_max, m.oracle_sensitivity_dof_max),
            ("cand_oracle_rms_err", "partner_oracle_rms_err", m.oracle_sensitivity_rms, m.oracle_sensitivity_dof_rms),
        ]
        ratio = all_hold([self._condition(m, *criterion, floor, f"{self.floor_ulps:g}ulp") for criterion in criteria])
        binding, reasons = ratio.binding, [ratio.reason] if ratio.reason else []
        if self.systematic is not None and not math.isnan(m.cand_systematic_t):
            systematic, text = self.systematic.condition(m, floor, self.floor_ulps)
            if systematic.usage > 1.0:
                reasons.append(text)
            binding = max(binding, systematic, key=lambda c: c.usage)
        direct_limit = self.direct_ulps * unit
        if self.direct_ulps:
            direct = Condition("max_rel_err", m.max_rel_err, direct_limit, f"direct {self.direct_ulps:g}ulp")
            binding = min(binding, direct, key=lambda c: c.usage)
            if binding.usage <= 1.0:
                reasons = []  # rescued: indistinguishable from the partner
            else:
                reasons.append(
                    f"and not indistinguishable: max_rel_err={_number(m.max_rel_err)} > "
                    f"direct {self.direct_ulps:g}ulp={_number(direct_limit)}"
                )
        if self.gain:
            # A coherent scale is no rounding however close to the partner each element is:
            # `direct` never rescues it. The floor is the element floor on the gain's scale.
            gain_floor_ = gain_floor(floor, m.oracle_peak_to_l2)
            floor_text = f"{self.floor_ulps:g}ulp*peak/l2({_number(m.oracle_peak_to_l2)})"
            gain = self._condition(
                m, "cand_oracle_gain", "partner_oracle_gain", m.oracle_sensitivity_gain, 1.0, gain_floor_, floor_text
            )
            if gain.usage > 1.0:
                reasons.append(f"{gain.reason}: a coherent scale along the leaf")
            binding = max(binding, gain, key=lambda c: c.usage)
        if binding.usage <= 1.0:
            return Outcome(binding.usage, binding=binding)
        return Outcome(binding.usage, "; ".join(reasons), binding)

    def _condition(
        self, m: LeafMetrics, cand_metric: str, partner_metric: str, sensitivity: float, dof: float, floor, floor_text
    ) -> Condition:
        """cand <= ratio * max(partner, q * S) + floor for one metric (sizes: the gain is signed)."""
        cand, partner = abs(getattr(m, cand_metric)), abs(getattr(m, partner_metric))
        q = 1.0 if self.confidence is None else self.confidence.quantile(dof, m.oracle_draws)
        explained = partner if math.isnan(sensitivity) else max(partner, q * sensitivity)
        limit = math.nan if math.isnan(partner) else self.ratio * explained + floor
        what = f"{partner_metric}({_number(partner)})"
        if not math.isnan(sensitivity):
            scaled = "sensitivity" if q == 1.0 else f"{_number(q)}*sensitivity"
            what = f"max({what}, {scaled}({_number(sensitivity)}))"
        return Condition(cand_metric, cand, limit, f"{self.ratio:g}*{what}+{floor_text}={_number(limit)}")

    def describe(self) -> str:
        text = f"ratio<={self.ratio:g} +{self.floor_ulps:g}ulp"
        if self.confidence is not None:
            text += f" {self.confidence.describe()}"
        if self.gain:
            text += " +gain"
        if self.direct_ulps:
            text += f" | direct<={self.direct_ulps:g}ulp"
        if self.systematic is not None:
            text += f"; {self.systematic.describe()}"
        return text


KINDS: dict[str, type[Bound]] = {kind.kind: kind for kind in (Exact, UlpsOfMax, UlpsPlusSensitivity, OracleRatio)}


def notation() -> list[str]:
    """How each kind's `describe` reads: the first paragraph of each class's docstring."""
    return [" ".join(cls.__doc__.split("\n\n")[0].split()) for cls in (*KINDS.values(), Confidence, Systematic)]
