"""Ctrl-C and SIGTERM as one KeyboardInterrupt for the commands that write a run folder, and what a
stopped run prints. No JAX: `merge` and the watchdog process import it."""

from __future__ import annotations

import signal


class SignalsInterrupt:
    """While active, SIGINT and SIGTERM raise a KeyboardInterrupt named after the signal (`signum`, `name`).

    Both are installed: a process whose parent ignores SIGINT inherits the ignoring (seen under
    pytest-xdist). `mhc-parity run` installs them before it imports any `--impl` module.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM)
    signum = signal.SIGINT  # until a signal comes (also for a KeyboardInterrupt raised before __enter__)

    def __init__(self, watchdog=None):
        """watchdog: a `Watchdog` armed while these handlers are in place and told each time one runs; it
        stops the process when they cannot run (code under test holding the GIL)."""
        self.watchdog = watchdog

    def __enter__(self):
        self.signum = signal.SIGINT
        self._previous = {signum: signal.signal(signum, self._interrupt) for signum in self.SIGNALS}
        if self.watchdog is not None:
            self.watchdog.arm(self.SIGNALS)
        return self

    def _interrupt(self, signum, frame):
        self.signum = signum
        if self.watchdog is not None:
            self.watchdog.acknowledge()
        raise KeyboardInterrupt(self.name)

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name

    @property
    def exit_code(self) -> int:
        """128 + the signal's number, as a shell reports a process the signal ended."""
        return 128 + self.signum

    def __exit__(self, *exc_info):
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        if self.watchdog is not None:
            self.watchdog.disarm()
        return False


def interruption_message(manifest, signal_name: str, folder) -> str:
    """What a stopped run says (two lines): the signal, the cases kept in `folder`, and the
    command that finishes the run (`mhc_parity.records.manifest.Manifest.resume_command`)."""
    return (
        f"mhc-parity: interrupted ({signal_name}) after {manifest.cases_done} of {len(manifest.cases)} cases; "
        f"finished cases are kept in {folder}. Finish the run with:\n  {manifest.resume_command()}"
    )
