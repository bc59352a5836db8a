"""The process kept quiet while a program is timed: the run's pool tasks (the next cases' oracle answers
and compiles) run inside `QUIET.background()`, a path's timing inside `QUIET.alone()`, which waits for
them and holds off new ones (docs/speed.md, issue 55). A waiting timer goes first. It quiets this
process's threads only, not `--jobs N` workers."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator


class QuietLock:
    """A readers-writer lock: many `background()` holders at once, or one `alone()` holder."""

    def __init__(self):
        self._condition = threading.Condition()
        self._background = 0  # background tasks under way
        self._alone = False  # a timer holds the process
        self._waiting = 0  # timers waiting for the background to end
        self.waited_s = 0.0  # seconds timers spent waiting for it, in all (the run's `quiet_wait_s`)

    @property
    def busy(self) -> bool:
        """Whether background work is under way (a timer now would wait for it)."""
        with self._condition:
            return self._background > 0

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
        """Run the block with no background work under way, waiting at most `timeout_s` (None: no limit)
        for the tasks under way. Yields True when quiet; False when the wait timed out (a task stuck in
        the code under test): the block then runs beside it and must not claim it ran alone.

        Never wait inside it for a pool future: one not yet started cannot start until the block ends.
        """
        start = time.perf_counter()
        with self._condition:
            self._waiting += 1
            try:
                quiet = self._condition.wait_for(lambda: not self._alone and not self._background, timeout_s)
            finally:
                self._waiting -= 1
                self.waited_s += time.perf_counter() - start
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
