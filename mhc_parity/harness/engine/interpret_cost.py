"""An interpret-mode path's estimated seconds (elements of x times its platform's measured seconds per
element, plus a compile) and `interpret_refusal`: a path over `INTERPRET_BUDGET_S` is not run, its
rows `skip`. Only measured platforms have an entry: an interpret path on a TPU always runs."""

from __future__ import annotations

import dataclasses

import jax

from mhc_parity.harness.engine.implementations import is_builtin


@dataclasses.dataclass(frozen=True)
class ElementCost:
    """Seconds one run of an interpret path's program (forward and VJP) takes per element of x,
    the seconds of its compile, and where they were measured."""

    seconds_per_element: float
    compile_s: float
    measured: str


# `python bench/interpret_cost.py` (8.4 M elements of x) on a shared 2-core x86-64 CPU, jax 0.12:
# float32 8.2e-8 s an element and 1.8 s to compile, bfloat16 6.6e-8 and 2.3 s; the slower of each is
# taken. The `tpu` suite's largest case (33.5 M elements) then takes about 5 s a host path: it runs.
SECONDS_PER_ELEMENT = {
    "cpu": ElementCost(8.2e-8, 2.3, "bench/interpret_cost.py on a 2-core x86-64 CPU, MLP branch, 8.4 M elements"),
}
# The longest an interpret path may be expected to run: a shard of a run must fit one
# 10-minute call of a lent TPU machine with its oracle and other paths (docs/accelerators.md).
INTERPRET_BUDGET_S = 60.0


def path_platform(path) -> str:
    """The platform `path` runs on: the host CPU for a host path, else the default backend."""
    return "cpu" if path.host else jax.default_backend()


def interpret_estimate_s(case, path) -> float | None:
    """The estimated seconds of `path`'s program for `case` (one compile and one run), or None
    where `path` is not this project's interpret mode or its platform's cost is not measured."""
    if not (is_builtin(path.impl) and path.impl.kernel and path.impl.interpret):
        return None
    cost = SECONDS_PER_ELEMENT.get(path_platform(path))
    if cost is None:
        return None
    batch, sequence, streams, embedding = case.shape
    return cost.compile_s + cost.seconds_per_element * batch * sequence * streams * embedding


def interpret_refusal(case, path, budget_s: float | None = None) -> str:
    """Why `path` is not run for `case` ("" where it is): an interpret path whose estimate is over
    `budget_s` (default `INTERPRET_BUDGET_S`), with the estimate and where its cost was measured."""
    budget_s = INTERPRET_BUDGET_S if budget_s is None else budget_s
    estimate = interpret_estimate_s(case, path)
    if estimate is None or estimate <= budget_s:
        return ""
    batch, sequence, streams, embedding = case.shape
    cost = SECONDS_PER_ELEMENT[path_platform(path)]
    return (
        f"interpret mode at {batch * sequence * streams * embedding:,} elements of x on {path_platform(path)} "
        f"would take about {estimate:,.0f} s ({cost.seconds_per_element:.2g} s an element, measured by "
        f"{cost.measured}), over the {budget_s:,.0f} s an interpret path may take; not run"
    )
