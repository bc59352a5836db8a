"""The process kept quiet while a program is timed: background work waits, timing waits for it.

A parity run obtains work ahead in a thread pool (`mhc_parity.harness.engine.runner.Runner.run`):
the oracle answers of the next cases (float64 XLA programs on every host core) and their paths'
programs (Python tracing and lowering, which holds the GIL, then XLA's compile). A program timed
while that runs is timed with it: its dispatch and its wait need the GIL and host cores the
background holds (docs/speed.md: the 185 ms `reference/unsharded` of issue 55). So every task of
the pool runs inside `QUIET.background()`, and a path's device time is taken inside
`QUIET.alone()`, which waits for the background tasks under way to end and holds off new ones
until the timing is done. Background tasks may run together; a waiting timer goes first (no new
task starts once one waits), so the timing phase is not starved by a queue of compiles.

The lock is process-wide: it quiets this process's threads, not other processes (`--jobs N`
workers on a CPU; an accelerator is owned by one process, `--jobs auto` gives it one worker).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator


class QuietLock:
    """A readers-writer lock: many `background()` holders at once, or one `alone()` holder."""

    def __init__(self):
        self._condition = threading.Condition()
        self._background = 0  # background tasks under way
        self._alone = False  # a timer holds the process
        self._waiting = 0  # timers waiting for the background to end

    @contextlib.contextmanager
    def background(self) -> Iterator[None]:
        """Run the block as background work: it waits while a timer holds or waits for the process."""
        with self._condition:
            self._condition.wait_for(lambda: not self._alone and not self._waiting)
            self._background += 1
        try:
            yield
        finally:
            with self._condition:
                self._background -= 1
                self._condition.notify_all()

    @contextlib.contextmanager
    def alone(self, timeout_s: float | None = None) -> Iterator[bool]:
        """Run the block with no background work under way; it waits for the tasks under way to
        end, at most `timeout_s` seconds (None: as long as they take). Yields True when the
        process is quiet; False when the wait timed out (a task stuck in the code under test):
        the block then runs beside it, and must not claim it ran alone.

        Never wait inside it for a background task (a future of the pool): one not yet started
        cannot start until the block ends.
        """
        with self._condition:
            self._waiting += 1
            try:
                quiet = self._condition.wait_for(lambda: not self._alone and not self._background, timeout_s)
            finally:
                self._waiting -= 1
                self._condition.notify_all()  # background work held off by this wait may start again
            self._alone = quiet
        try:
            yield quiet
        finally:
            if quiet:
                with self._condition:
                    self._alone = False
                    self._condition.notify_all()

    def run_in_background(self, function: Callable, *args, **kwargs):
        """`function(*args, **kwargs)` inside `background()`: what a pool is given to run."""
        with self.background():
            return function(*args, **kwargs)


# The one lock of the process: the run's pool tasks and the timing phase share it.
QUIET = QuietLock()
