"""bench/parity_bench.py: the warm scenario's repeats stand for one run, the one of median wall."""

from __future__ import annotations

import importlib.util
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _bench():
    spec = importlib.util.spec_from_file_location("parity_bench", ROOT / "bench" / "parity_bench.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _figures(wall: float, runner_wall: float, overhead: float) -> dict:
    return {
        "process_wall_s": wall,
        "runner_wall_s": runner_wall,
        "startup_and_reports_s": wall - runner_wall,
        "overhead_s": overhead,
        "jobs": 1,
    }


def test_the_median_run_stands_whole_with_every_run_listed_in_order():
    bench = _bench()
    tries = [_figures(3.9, 2.0, 0.6), _figures(3.2, 1.9, 0.4), _figures(3.5, 2.1, 0.5)]
    chosen = bench.median_run(tries)
    assert {k: v for k, v in chosen.items() if k != "repeats"} == tries[2]  # one run's figures, not a mix
    assert chosen["repeats"] == [(3.9, pytest.approx(2.5)), (3.2, pytest.approx(1.7)), (3.5, pytest.approx(1.9))]
    assert "repeats" not in tries[2]  # the run's own figures are left as they were


def test_a_single_run_is_reported_as_it_is():
    bench = _bench()
    run = _figures(70.0, 68.0, 5.0)
    assert bench.median_run([run]) == run
