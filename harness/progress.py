"""A one-line progress bar on stderr (plain lines when stderr is not a terminal)."""

from __future__ import annotations

import sys
import time
from collections import Counter


class Progress:
    """Counts finished cases; shows the current case, elapsed time and an ETA."""

    def __init__(self, total: int, *, already_done: int = 0, enabled: bool = True, stream=None):
        self.total = total
        self.done = already_done
        self.enabled = enabled
        self.stream = stream or sys.stderr
        self.tty = self.enabled and self.stream.isatty()
        self.start_time = time.perf_counter()
        self.fresh_done = 0
        self.verdicts: Counter = Counter()

    def _write(self, text: str) -> None:
        if not self.enabled:
            return
        if self.tty:
            self.stream.write("\r\033[K" + text[:200])
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

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

    def start(self, case) -> None:
        if self.tty:
            self._write(f"{self._bar()} {case.name}")

    def finish(self, case, rows) -> None:
        self.done += 1
        self.fresh_done += 1
        self.verdicts.update(r["verdict"] for r in rows)
        self._write(f"{self._bar()} {case.name}" if not self.tty else self._bar())

    def close(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()
