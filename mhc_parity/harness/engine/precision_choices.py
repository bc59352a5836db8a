"""Precision choices an implementation makes on purpose (`precision_choices` on its factory's object):
each an operation hypothesis that joins that implementation's rounding model only, widening its rows'
sensitivity by the choice's own effect against the oracle (docs/judging.md). A backend-dependent
choice names a `backend_probe.LAYOUTS` layout and is made only where the probe finds it narrow."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

import numpy as np

from mhc_parity.cases.fixtures import fixture_elements
from mhc_parity.harness.engine.backend_probe import LAYOUTS, LayoutSum, probe_backend, probe_record
from mhc_parity.harness.engine.causes import MAX_ATTRIBUTED_ELEMENTS
from mhc_parity.harness.engine.leaves import token_axes
from mhc_parity.harness.engine.operation import OPERATION
from mhc_parity.harness.errors import ConfigurationError
from mhc_parity.harness.judging.confidence import Sensitivity
from mhc_parity.harness.judging.error_statistics import draw_deviations, l2_norm, systematic_error, upcast


@dataclasses.dataclass(frozen=True)
class PrecisionChoice:
    """One rounding or narrow sum an implementation makes on purpose.

    hypothesis: the operation's hypothesis that computes it (for mHC e.g.
    "accumulate:projection:second_cotangent:bfloat16:1"); why: where in the implementation's code and
    why; probe: "" (always made) or a `backend_probe.LAYOUTS` name: made only where the backend
    accumulates that layout narrowly.
    """

    hypothesis: str
    why: str
    probe: str = ""

    def __post_init__(self):
        if not (isinstance(self.hypothesis, str) and self.hypothesis):
            raise ConfigurationError(f"a precision choice names a hypothesis, got {self.hypothesis!r}")
        if not (isinstance(self.why, str) and self.why.strip()):
            raise ConfigurationError(f"precision choice {self.hypothesis!r} says where and why it is made")
        problem = OPERATION.name_problem(self.hypothesis)
        if problem:
            raise ConfigurationError(f"precision choice {self.hypothesis!r}: {problem}")
        if self.probe and self.probe not in LAYOUTS:
            raise ConfigurationError(
                f"precision choice {self.hypothesis!r}: probe {self.probe!r} is not one of {sorted(LAYOUTS)}"
            )

    def made(self, probe: Mapping[str, LayoutSum] | None) -> bool:
        """Whether the choice is made on this backend (`probe`: its measurement; needed when `self.probe`)."""
        return not self.probe or bool(probe and probe[self.probe].narrow)

    def describe(self, probe: Mapping[str, LayoutSum] | None) -> str:
        """The choice in words, with its evidence and whether it is made here."""
        if not self.probe:
            return f"{self.hypothesis}: {self.why}"
        if not probe:
            return f"{self.hypothesis}: {self.why} [{self.probe} not probed]"
        made = "made" if self.made(probe) else "not made"
        return f"{self.hypothesis}: {self.why} [{made} on this backend: {probe[self.probe].evidence()}]"


def declared_choices(obj, label: str) -> tuple[PrecisionChoice, ...]:
    """An implementation object's `precision_choices` (absent: none); ConfigurationError for
    anything but `PrecisionChoice`s."""
    raw = getattr(obj, "precision_choices", ()) or ()
    choices = tuple(raw)
    for choice in choices:
        if not isinstance(choice, PrecisionChoice):
            raise ConfigurationError(
                f"{label}: `precision_choices` holds mhc_parity.harness.engine.precision_choices.PrecisionChoice, "
                f"got {type(choice).__name__}"
            )
    return choices


def choice_effects(
    names: Sequence[str], hypotheses: Sequence, hypothesis_leaves: Sequence[Mapping[str, np.ndarray]]
) -> list[Mapping[str, np.ndarray]]:
    """The leaves of each made choice's hypothesis (`names`), from
    the case's `hypotheses` and their oracle leaves (`mhc_parity.harness.engine.causes.HypothesisOracle`).
    A hypothesis the case does not have (a sum of one term, a dtype no narrower) changes nothing."""
    by_name = {h.name: leaves for h, leaves in zip(hypotheses, hypothesis_leaves)}
    return [by_name[name] for name in names if name in by_name]


@dataclasses.dataclass(frozen=True)
class DeclaredEffects:
    """What an implementation's made choices move, per leaf: rms (‖e‖₂/‖oracle‖₂), max
    (max|e|/max|oracle|) and gain (the component along the leaf, `error_statistics.gain`) of
    their deviations from the oracle, each summed over the choices in quadrature, and for a
    token-major leaf the largest systematic t among them (`error_statistics.systematic_error`).
    Empty for an implementation without any."""

    rms: Mapping[str, float] = dataclasses.field(default_factory=dict)
    max: Mapping[str, float] = dataclasses.field(default_factory=dict)
    gain: Mapping[str, float] = dataclasses.field(default_factory=dict)
    systematic: Mapping[str, float] = dataclasses.field(default_factory=dict)

    def widened(self, sensitivity: Mapping[str, Sensitivity]) -> dict[str, Sensitivity]:
        """leaf -> the sensitivity with these deviations added in quadrature, as one more
        independent term of the model (its degrees of freedom stay the model's)."""
        widened = dict(sensitivity)
        for leaf, s in sensitivity.items():
            if leaf in self.rms:
                widened[leaf] = dataclasses.replace(
                    s,
                    rms=math.hypot(s.rms, self.rms[leaf]),
                    max=math.hypot(s.max, self.max[leaf]),
                    gain=math.hypot(s.gain, self.gain[leaf]),
                )
        return widened

    def widened_systematic(self, systematic: Mapping[str, float]) -> dict[str, float]:
        """leaf -> the model's systematic t, or a choice's where it is larger: a rounded
        parameter shifts every token alike, as the choice says it may."""
        return {leaf: max(t, self.systematic.get(leaf, 0.0)) for leaf, t in systematic.items()}


def declared_effects(
    oracle_leaves: Mapping[str, np.ndarray], effects: Sequence[Mapping[str, np.ndarray]]
) -> DeclaredEffects:
    """The `DeclaredEffects` of the choices' leaves `effects` (`choice_effects`) against the oracle."""
    found: dict[str, dict[str, float]] = {"rms": {}, "max": {}, "gain": {}, "systematic": {}}
    for leaf, exact in oracle_leaves.items():
        exact = upcast(exact)
        values = [leaves[leaf] for leaves in effects if leaf in leaves]
        if not (values and l2_norm(exact) > 0):
            continue
        max_devs, rms_devs, gains, _ = draw_deviations(values, exact)  # as the sensitivity's draws
        if not (any(rms_devs) or any(max_devs)):
            continue
        found["rms"][leaf], found["max"][leaf], found["gain"][leaf] = (
            math.hypot(*rms_devs),
            math.hypot(*max_devs),
            math.hypot(*gains),
        )
        largest_t = max(systematic_error(value, exact)[0] for value in values) if token_axes(leaf) else 0.0
        if largest_t:
            found["systematic"][leaf] = largest_t
    return DeclaredEffects(**found)


def measured_effects(choices: Sequence[PrecisionChoice], case, fixture, oracle_leaves, hypotheses) -> DeclaredEffects:
    """What the `choices` this backend makes move on `case`, leaf by leaf: the made choices' hypotheses
    through the oracle (`hypotheses`, a `HypothesisOracle`) against its leaves. Empty for a case too
    large for the hypotheses (`MAX_ATTRIBUTED_ELEMENTS`): stricter, never laxer."""
    probes = [probe_backend() if c.probe else None for c in choices]
    made = [c.hypothesis for c, p in zip(choices, probes) if c.made(p)]
    if not made or fixture_elements(case) > MAX_ATTRIBUTED_ELEMENTS:
        return DeclaredEffects()
    drawn, drawn_leaves = hypotheses(case, fixture)
    return declared_effects(oracle_leaves, choice_effects(made, drawn, drawn_leaves))


def precision_record(implementations) -> dict:
    """The run's record of declared choices: `precision_choices` (implementation -> each
    choice in words, with its evidence) and, where a choice rests on it, `backend_probe`.
    Empty where no implementation declares any."""
    declared = {impl.name: impl.precision_choices for impl in implementations if impl.precision_choices}
    if not declared:
        return {}
    probe = probe_backend() if any(c.probe for choices in declared.values() for c in choices) else None
    record: dict = {"precision_choices": {name: [c.describe(probe) for c in cs] for name, cs in declared.items()}}
    if probe is not None:
        record["backend_probe"] = probe_record(probe)
    return record
