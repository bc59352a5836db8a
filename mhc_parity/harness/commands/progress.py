"""Progress on stderr: a live line on a terminal, plain lines and a heartbeat elsewhere.

On a terminal one line is redrawn in place: the bar, elapsed time, ETA, verdict counts
and what is running now (case and step: "oracle", a path name, "lowering"), refreshed
every `TTY_REFRESH_S` by a background thread so the clock moves while a long case runs.
Without a terminal (CI logs) each finished case prints a line, and the thread prints a
heartbeat naming the running case and step whenever `heartbeat_s` seconds pass without
a line, so a log never goes quiet for longer than that.
"""

from __future__ import annotations

import sys
import threading
import time
from collections import Counter

DEFAULT_HEARTBEAT_S = 20.0
TTY_REFRESH_S = 1.0


class Progress:
    """Counts finished cases and shows what is running; `close()` stops the thread."""

    def __init__(
        self,
        total: int,
        *,
        already_done: int = 0,
        enabled: bool = True,
        stream=None,
        heartbeat_s: float = DEFAULT_HEARTBEAT_S,
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
        self._case = ""
        self._step = ""
        self._step_start = self.start_time
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
                self.stream.write("\r\033[K" + text[:200])
            else:
                self.stream.write(text + "\n")
            self.stream.flush()
            self._last_line = time.perf_counter()

    def _bar(self) -> str:
        width = 24
        filled = int(width * self.done / max(self.total, 1))
        elapsed = time.perf_counter() - self.start_time
        eta = ""
        if self.fresh_done:
            remaining = (self.total - self.done) * elapsed / self.fresh_done
            eta = f" eta {remaining:4.0f}s"
        counts = " ".join(f"{v}={n}" for v, n in sorted(self.verdicts.items()))
        return f"[{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total} {elapsed:5.0f}s{eta} {counts}"

    def _running(self) -> str:
        """e.g. "case lite-...: interpret/unsharded for 12s"."""
        if not self._case:
            return ""
        step = f": {self._step}" if self._step else ""
        return f"case {self._case}{step} for {time.perf_counter() - self._step_start:.0f}s"

    # -- events from the run -------------------------------------------------------------

    def start(self, case) -> None:
        """A case begins."""
        self._case, self._step, self._step_start = case.name, "", time.perf_counter()
        self._ensure_thread()
        if self.tty:
            self._write(f"{self._bar()} {self._running()}")

    def step(self, case, step: str) -> None:
        """The running case moves to `step` (shown on the terminal and in the heartbeat)."""
        self._case, self._step, self._step_start = case.name, step, time.perf_counter()

    def finish(self, case, rows) -> None:
        """A case's rows are stored."""
        self.done += 1
        self.fresh_done += 1
        self.verdicts.update(r["verdict"] for r in rows)
        self._case = ""
        self._write(f"{self._bar()} {case.name}" if not self.tty else self._bar())

    def close(self) -> None:
        """Stop the heartbeat and end the terminal line (once; later calls do nothing)."""
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
            if self.tty or not self._case:  # redraw the clock / wait for the next case
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
