"""The process kept quiet while a program is timed (mhc_parity/harness/engine/quiet.py)."""

from __future__ import annotations

import threading

from mhc_parity.harness.engine.quiet import QuietLock
from tests.support import background_under_way


def test_timing_waits_for_the_background_under_way_and_says_when_it_gave_up():
    lock = QuietLock()
    with background_under_way(lock):
        with lock.alone(0.1) as quiet:
            assert not quiet  # the task is still under way: the block must not claim it ran alone
    with lock.alone(10) as quiet:
        assert quiet


def test_no_background_task_starts_while_a_program_is_timed():
    lock, ran = QuietLock(), threading.Event()

    def task():
        with lock.background():
            ran.set()

    with lock.alone() as quiet:
        assert quiet
        thread = threading.Thread(target=task)
        thread.start()
        assert not ran.wait(0.3)  # held off for as long as the timing lasts
    thread.join(10)
    assert ran.is_set()


def test_background_tasks_run_together_and_a_waiting_timer_goes_first():
    lock, both, release, late = QuietLock(), threading.Barrier(3, timeout=10), threading.Event(), threading.Event()

    def task():
        with lock.background():
            both.wait()  # two tasks inside at once
            release.wait(30)

    tasks = [threading.Thread(target=task) for _ in range(2)]
    for thread in tasks:
        thread.start()
    both.wait()
    timer_quiet = []

    def timer():
        with lock.alone(30) as quiet:
            timer_quiet.append((quiet, late.is_set()))

    def late_task():
        with lock.background():
            late.set()

    timing = threading.Thread(target=timer)
    timing.start()
    while not lock._waiting:  # the timer waits for the two tasks
        threading.Event().wait(0.01)
    newcomer = threading.Thread(target=late_task)
    newcomer.start()
    assert not late.wait(0.2)  # a task arriving while a timer waits does not start before it
    release.set()
    for thread in (*tasks, timing, newcomer):
        thread.join(10)
    assert timer_quiet == [(True, False)] and late.is_set()
