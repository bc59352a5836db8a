"""bench/parity_bench.py: the warm scenario's repeats stand for one run, the one of median wall."""

from __future__ import annotations

import shutil

import pytest

from tests.cli_support import ROOT, bench_script


def _bench():
    return bench_script("parity_bench")


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


def test_the_comparisons_count_as_the_harness_s_own_time_as_before_they_were_timed():
    bench = _bench()
    untimed = _figures(70.0, 68.0, 5.0)  # the comparisons inside the overhead
    timed = {**_figures(70.0, 68.0, 2.0), "compare_s": 3.0}
    assert bench.own_seconds(timed) == bench.own_seconds(untimed) == 7.0


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_bench_measures_make_parity_and_make_parity_maxtext_as_they_run():
    """`make bench` benchmarks both suites (issue 56, 8: the warm maxtext run and warm `make
    parity` are measured), each with the arguments its make target passes on a CPU."""
    from tests.test_make_parity import DEFAULT_BASELINE, make_n, planned_run, printed_lines

    bench = _bench()
    printed = make_n("bench")
    assert printed.returncode == 0, printed.stderr
    benched = [line for line in printed_lines(printed) if "bench/parity_bench.py" in line]
    assert len(benched) == 1 and "--suite default" in benched[0] and "--suite maxtext" in benched[0]
    parity, default = planned_run(), bench.SUITES["default"]
    assert "--suite default " in parity and parity.endswith(f"--jobs auto --baseline {DEFAULT_BASELINE}")
    assert default.arguments == ("--baseline", str(ROOT / DEFAULT_BASELINE)) and "auto" in default.jobs
    maxtext = planned_run(target="parity-maxtext").replace("'", "")
    assert " ".join(("--suite maxtext", *bench.SUITES["maxtext"].arguments)) in maxtext
    assert bench.SUITES["maxtext"].jobs == ("1",), "its cold run peaks near 10 GiB: one process"
