"""What an interpret-mode path would cost, and when it is too much to run.

Pallas's interpret mode runs the kernels' bodies as XLA operations, a grid step at a time. Its
cost grows with the elements of x, so at some size a path is not worth its time: an interpret
path whose estimated run is over `INTERPRET_BUDGET_S` is not run, and its rows are `skip` rows
that say so, with the estimate and where its cost per element was measured (`interpret_refusal`).
Measured, the host CPU's interpret mode is cheaper than feared: the `tpu` suite's largest case
(8192 tokens of 4 x 1024) costs about 5 s a path there, so the token-sharded paths a one-chip
machine moves to its host (`...@cpu`, `mhc_parity.harness.engine.devices`) run; a case some
twenty times larger would be refused.

The estimate is the elements of x (tokens x streams x embedding) times the measured seconds per
element of one run of the path's program, its forward and VJP (`SECONDS_PER_ELEMENT`, by the
platform it runs on), plus one compile. Only platforms measured have an entry: an interpret path
on a TPU (XLA on the chip) is run whatever its size, and its rows' `execute_s` measures it.
"""

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


# `python bench/interpret_cost.py` (interpret/unsharded, the median of 2 runs after a warm-up, the
# MLP branch, 2048 tokens of 4 x 1024: 8.4 M elements of x) on this project's shared, loaded 2-core
# x86-64 CPU (jax 0.12): float32 0.69 s a run (8.2e-8 s an element), 1.8 s to compile; bfloat16
# 0.55 s (6.6e-8), 2.3 s. The slower of each is taken. A host with more cores runs it faster: the
# estimate errs long there. At the `tpu` suite's largest (33.5 M elements) that is about 5 s a
# path: its host paths run.
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
