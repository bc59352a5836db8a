"""Worker processes' case stages relayed to the parent's progress line: `poster` in the worker,
`StepRelay` in the parent. Progress only: a message lost changes no row."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterable

# How often the reading thread looks for its stop signal between messages.
POLL_S = 0.2


def poster(steps) -> Callable[[object, str], None]:
    """A worker's `on_step`: posts (case name, stage) on `steps` (a multiprocessing queue), never raising."""

    def post(case, step: str) -> None:
        try:
            steps.put((case.name, step))
        except (OSError, ValueError):  # the queue closed with the parent: progress only
            pass

    return post


class StepRelay:
    """Reads `steps` in a thread and calls `on_step(case, stage)` for the cases of `cases` (by name)."""

    def __init__(self, steps, cases: Iterable, on_step: Callable[[object, str], None]):
        self.steps = steps
        self._cases = {case.name: case for case in cases}
        self._on_step = on_step
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, name="worker-steps", daemon=True)

    def __enter__(self) -> StepRelay:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _read(self) -> None:
        while not self._stop.is_set():
            try:
                name, step = self.steps.get(timeout=POLL_S)
            except queue.Empty:
                continue
            except (OSError, ValueError, EOFError):  # the queue closed under the reader
                return
            case = self._cases.get(name)
            if case is not None:
                self._on_step(case, step)
