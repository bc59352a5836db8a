"""Progress on stderr: a live line on a terminal, plain lines and a heartbeat elsewhere.

On a terminal one line (never wider than it, or it wraps) is redrawn every `TTY_REFRESH_S` by a background
thread: bar, elapsed, ETA, verdict counts and each running case's stage. Elsewhere each finished case prints
a line, and a heartbeat names the running ones after `heartbeat_s` of silence.
"""

from __future__ import annotations

import os
import shutil
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable

DEFAULT_HEARTBEAT_S = 20.0
TTY_REFRESH_S = 1.0
# The first cases pay for a cold start (imports, shared programs, workers): an ETA from one was 100x off.
ETA_AFTER_CASES = 3


def terminal_columns(stream) -> int:
    """The width of `stream`'s terminal: $COLUMNS where set, else the stream's, else
    `shutil.get_terminal_size`."""
    if not os.environ.get("COLUMNS", "").strip().isdigit():
        try:
            columns = os.get_terminal_size(stream.fileno()).columns
        except (AttributeError, OSError, ValueError):
            columns = 0
        if columns > 0:
            return columns
    return shutil.get_terminal_size().columns


def fit(text: str, columns: int) -> str:
    """`text` cut to one line of `columns`, one column left free (a full line wraps on some terminals); a
    cut line ends with "…"."""
    room = max(columns - 1, 1)
    return text if len(text) <= room else text[: room - 1] + "…"


class Progress:
    """Counts finished cases and shows what is running; `close()` stops the thread. cost: a case's relative
    cost, which weighs the ETA (default: every case the same)."""

    def __init__(
        self,
        total: int,
        *,
        already_done: int = 0,
        enabled: bool = True,
        stream=None,
        heartbeat_s: float = DEFAULT_HEARTBEAT_S,
        remaining_cost: float | None = None,
        cost: Callable[[object], float] | None = None,
    ):
        self.total = total
        self.done = already_done
        self.enabled = enabled
        self.stream = stream or sys.stderr
        self.tty = self.enabled and self.stream.isatty()
        self.heartbeat_s = heartbeat_s
        self.start_time = time.perf_counter()
        self.fresh_done = 0
        self.verdicts: Counter = Counter()
        self._cost = cost or (lambda case: 1.0)
        self._cost_left = float(total - already_done) if remaining_cost is None else remaining_cost
        self._cost_done = 0.0
        self._running_cases: dict[str, tuple[str, float]] = {}  # case name -> (stage, since)
        self._finished: set[str] = set()
        self._last_line = self.start_time
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- output ------------------------------------------------------------------------

    def _write(self, text: str) -> None:
        if not self.enabled:
            return
        with self._lock:
            if self.tty:
                self.stream.write("\r\033[K" + fit(text, terminal_columns(self.stream)))
            else:
                self.stream.write(text + "\n")
            self.stream.flush()
            self._last_line = time.perf_counter()

    def eta_seconds(self) -> float | None:
        """Seconds left: the cost left over the cost done per second; None until `ETA_AFTER_CASES` cases
        finished in this run."""
        if self.fresh_done < min(ETA_AFTER_CASES, self.total) or self._cost_done <= 0:
            return None
        elapsed = time.perf_counter() - self.start_time
        return max(self._cost_left, 0.0) * elapsed / self._cost_done

    def _bar(self) -> str:
        width = 24
        filled = int(width * self.done / max(self.total, 1))
        elapsed = time.perf_counter() - self.start_time
        eta = self.eta_seconds()
        eta_text = "" if eta is None or self.done >= self.total else f" eta {eta:4.0f}s"
        counts = " ".join(f"{v}={n}" for v, n in sorted(self.verdicts.items()))
        bar = f"[{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total} {elapsed:5.0f}s{eta_text}"
        return f"{bar} {counts}" if counts else bar

    def _running(self) -> str:
        """e.g. "interpret/unsharded for 12s: case lite-..."; stages first, so a line cut to the terminal
        keeps them."""
        now = time.perf_counter()
        running = list(self._running_cases.items())
        if not running:
            return ""
        if len(running) == 1:
            name, (stage, since) = running[0]
            return f"{stage or 'starting'} for {now - since:.0f}s: case {name}"
        stages = "; ".join(f"{stage or 'starting'} {now - since:.0f}s" for _, (stage, since) in running)
        return f"{stages}: cases " + ", ".join(name for name, _ in running)

    # -- events from the run -------------------------------------------------------------

    def start(self, case) -> None:
        """A case begins (with worker processes: the run starts waiting for it)."""
        if case.name not in self._running_cases:
            self._running_cases[case.name] = ("", time.perf_counter())
        self._ensure_thread()
        if self.tty:
            self._write(f"{self._bar()} {self._running()}")

    def step(self, case, step: str) -> None:
        if case.name not in self._finished:
            self._running_cases[case.name] = (step, time.perf_counter())
            self._ensure_thread()

    def finish(self, case, rows) -> None:
        self.done += 1
        self.fresh_done += 1
        cost = self._cost(case)
        self._cost_done += cost
        self._cost_left -= cost
        self.verdicts.update(r["verdict"] for r in rows)
        self._finished.add(case.name)
        self._running_cases.pop(case.name, None)
        self._write(f"{self._bar()} {case.name}" if not self.tty else self._bar())

    def close(self) -> None:
        """Stop the heartbeat and end the terminal line (later calls do nothing)."""
        if self._stop.is_set():
            return
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self.tty:
            with self._lock:
                self.stream.write("\n")
                self.stream.flush()

    # -- the heartbeat thread ------------------------------------------------------------

    def _ensure_thread(self) -> None:
        if self.enabled and self._thread is None:
            self._thread = threading.Thread(target=self._beat, name="progress-heartbeat", daemon=True)
            self._thread.start()

    def _beat(self) -> None:
        while True:
            if self.tty or not self._running_cases:  # redraw the clock / wait for the next case
                wait = min(TTY_REFRESH_S, self.heartbeat_s)
            else:
                wait = max(self._last_line + self.heartbeat_s - time.perf_counter(), 0.0)
            if self._stop.wait(wait):
                return
            running = self._running()
            if not running:
                continue
            if self.tty:
                self._write(f"{self._bar()} {running}")
            elif time.perf_counter() - self._last_line >= self.heartbeat_s:
                self._write(f"... still running {running} ({self.done}/{self.total} cases done)")
