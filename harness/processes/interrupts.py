"""Ctrl-C and SIGTERM as one exception for the commands that write a run folder.

Light on purpose (no JAX): `merge` uses it too.
"""

from __future__ import annotations

import signal


class SignalsInterrupt:
    """While active, SIGINT (Ctrl-C) and SIGTERM interrupt the run: a KeyboardInterrupt whose
    message is the signal's name; `signum` and `name` say which came.

    Both handlers are installed here rather than relying on Python's default SIGINT
    handler: a process started by a parent that ignores SIGINT inherits the ignoring
    (seen under pytest-xdist: the run finished instead of stopping), and Ctrl-C must stop
    the run whoever started it.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __enter__(self):
        self.signum = signal.SIGINT
        self._previous = {signum: signal.signal(signum, self._interrupt) for signum in self.SIGNALS}
        return self

    def _interrupt(self, signum, frame):
        self.signum = signum
        raise KeyboardInterrupt(self.name)

    @property
    def name(self) -> str:
        """e.g. "SIGINT"."""
        return signal.Signals(self.signum).name

    @property
    def exit_code(self) -> int:
        """128 + the signal's number, as a shell reports a process the signal ended."""
        return 128 + self.signum

    def __exit__(self, *exc_info):
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        return False
