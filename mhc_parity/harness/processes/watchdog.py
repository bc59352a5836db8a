"""A run's watchdog: SIGINT and SIGTERM stop `mhc-parity run` even while code under test holds the GIL
in native code, where Python's handlers cannot run. Python's C-level handler still writes the
signal's number to a wakeup fd (`signal.set_wakeup_fd`): a pipe to this small process (no JAX, its own
process group). Unacknowledged by the handler within `STUCK_GRACE_S`, the watchdog marks the manifest
interrupted, prints the resume line and ends the command by the same signal (SA_RESETHAND makes its
second delivery fatal), else SIGKILL. It ends itself at the pipe's end-of-file."""

from __future__ import annotations

import contextlib
import ctypes
import os
import pathlib
import platform
import select
import signal
import subprocess
import sys
import threading
import time

from mhc_parity.harness.processes.interrupts import interruption_message

# How long a signal's handler has to say it runs before the watchdog takes over (it runs
# within milliseconds when the main thread can get the GIL, even on a loaded machine).
STUCK_GRACE_S = 3.0
# How long a handler that ran has to end the run (the runner gives programs being compiled
# 5 s: `mhc_parity.harness.engine.cases_ahead.STOP_GRACE_S`) before the watchdog takes over all the same.
CLEANUP_GRACE_S = 30.0
# How long the command has to end by its signal before SIGKILL.
KILL_GRACE_S = 5.0
# The word the command's handler writes on the pipe; a signal's byte is its number (never 0).
ACKNOWLEDGED = 0


class Watchdog:
    """The command's side: `arm` (start the watchdog process for the run in `folder`),
    `acknowledge` (from the Python handler), `disarm`. `mhc_parity.harness.processes.interrupts.
    SignalsInterrupt` calls them; outside the main thread, or off POSIX, it does nothing."""

    def __init__(self, folder: str | os.PathLike):
        self.folder = pathlib.Path(folder)
        self._process: subprocess.Popen | None = None
        self._pipe: tuple[int, int] | None = None
        self._previous_wakeup: int | None = None

    def arm(self, signums) -> None:
        """Start the watchdog and route `signums`' deliveries to it; without a watchdog (none can
        start) the handlers work as before."""
        if os.name != "posix" or threading.current_thread() is not threading.main_thread():
            return
        read_end, write_end = os.pipe()
        try:
            self._process = subprocess.Popen(
                [sys.executable, "-m", __name__, str(os.getpid()), str(read_end), str(self.folder)],
                pass_fds=(read_end,),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                process_group=0,
                env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)},
            )
        except OSError:
            os.close(read_end)
            os.close(write_end)
            return
        # The read end stays open here too: a watchdog that died leaves a pipe that fills, not
        # one whose writes fail (Python would print each failure).
        self._pipe = (read_end, write_end)
        os.set_blocking(write_end, False)
        try:
            self._previous_wakeup = signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
        except ValueError:  # not allowed here (an embedding interpreter): no watchdog, it ends at end-of-file
            self._previous_wakeup = None
            self.disarm()
            return
        reset_on_delivery(signums)

    def acknowledge(self) -> None:
        """Tell the watchdog that a signal's handler runs (so the command handles the signal)."""
        if self._pipe is not None:
            try:
                os.write(self._pipe[1], bytes([ACKNOWLEDGED]))
            except OSError:
                pass

    def disarm(self) -> None:
        """Stop routing signals to the watchdog and end it (it reads end-of-file)."""
        if self._pipe is None:
            return
        if self._previous_wakeup is not None:
            signal.set_wakeup_fd(self._previous_wakeup)
        for fd in self._pipe:
            os.close(fd)
        self._pipe = None
        try:
            self._process.wait(timeout=KILL_GRACE_S)
        except subprocess.TimeoutExpired:  # it is ending this process: nothing to wait for
            pass


# -- making a caught signal fatal on its second delivery (Linux) ----------------------------

_SA_RESETHAND = 0x80000000


class _SigAction(ctypes.Structure):
    """glibc's and musl's `struct sigaction` on Linux x86-64 and AArch64 (spare room after it,
    so that a larger one could not overrun it)."""

    _fields_ = [
        ("handler", ctypes.c_void_p),
        ("mask", ctypes.c_uint8 * 128),
        ("flags", ctypes.c_uint),
        ("restorer", ctypes.c_void_p),
        ("spare", ctypes.c_uint8 * 64),
    ]


def reset_on_delivery(signums) -> bool:
    """Give each of `signums` SA_RESETHAND, its handler kept: the kernel restores the default
    action as it delivers the signal, so a second one ends the process by the signal itself,
    whoever holds the GIL. `signal.signal` installs a handler without it again. Linux on
    x86-64 or AArch64 only; False elsewhere or if it could not be done."""
    if not sys.platform.startswith("linux") or platform.machine() not in ("x86_64", "aarch64"):
        return False
    try:
        sigaction = ctypes.CDLL(None, use_errno=True).sigaction
    except (OSError, AttributeError):
        return False
    sigaction.argtypes = [ctypes.c_int, ctypes.POINTER(_SigAction), ctypes.POINTER(_SigAction)]
    for signum in signums:
        action = _SigAction()
        if sigaction(signum, None, ctypes.byref(action)) != 0:
            return False
        if action.handler in (None, int(signal.SIG_IGN)):  # default or ignored: not a handler to keep
            return False
        action.flags |= _SA_RESETHAND
        if sigaction(signum, ctypes.byref(action), None) != 0:
            return False
    return True


# -- the watchdog process -----------------------------------------------------------------


def watch(pid: int, pipe: int, folder: pathlib.Path) -> None:
    """Watch command `pid` through `pipe` (the read end) until it ends; stop it as the module
    docstring says when a signal's handler cannot run."""
    signum, acknowledged, deadline = None, False, None
    while True:
        timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
        ready, _, _ = select.select([pipe], [], [], timeout)
        if not ready:
            _stop(pid, pipe, folder, signum)
            return
        data = os.read(pipe, 512)
        if not data:  # the command ended, or its run did
            if signum is not None:  # e.g. ended by a second signal (fatal) before it said so itself
                _record_interrupted(folder, signum)
            return
        for byte in data:
            if byte == ACKNOWLEDGED and signum is not None and not acknowledged:
                acknowledged, deadline = True, time.monotonic() + CLEANUP_GRACE_S
            elif byte in (signal.SIGINT, signal.SIGTERM) and signum is None:
                signum, deadline = byte, time.monotonic() + STUCK_GRACE_S


def _record_interrupted(folder: pathlib.Path, signum: int):
    """The run's manifest, marked "interrupted" by `signum` if it still says "running" (None
    if the folder has no readable manifest)."""
    from mhc_parity.records.manifest import (  # only a stuck run needs it
        RUNNING,
        ManifestError,
        read_manifest,
        record_stop,
    )

    try:
        manifest = read_manifest(folder)
    except ManifestError:
        return None
    if manifest is not None and manifest.state == RUNNING:
        manifest = manifest.interrupted(signal.Signals(signum).name)
        record_stop(folder, manifest)
    return manifest


def _ended(pipe: int, timeout: float) -> bool:
    """Whether the command ends (its end of `pipe` closes) within `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        ready, _, _ = select.select([pipe], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            return False
        if not os.read(pipe, 512):
            return True


def _stop(pid: int, pipe: int, folder: pathlib.Path, signum: int) -> None:
    """Finish the run for the stuck command `pid` and end it by `signum` (then SIGKILL)."""
    if _ended(pipe, 0.0):  # it ended meanwhile (and `pid` may be another process's now)
        return
    manifest = _record_interrupted(folder, signum)
    if manifest is not None:
        with contextlib.suppress(OSError, ValueError, AttributeError):  # no stderr (closed): the kill matters more
            message = interruption_message(manifest, signal.Signals(signum).name, folder)
            print("\n" + message, file=sys.stderr, flush=True)
    os.kill(pid, signum)
    if not _ended(pipe, KILL_GRACE_S):
        os.kill(pid, signal.SIGKILL)


def main(argv: list[str]) -> int:
    """`python -m mhc_parity.harness.processes.watchdog PID PIPE_FD FOLDER` (started by `Watchdog.arm`)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the command's to handle
    signal.signal(signal.SIGTTOU, signal.SIG_IGN)  # a background group may still write to the terminal
    pid, pipe, folder = int(argv[0]), int(argv[1]), pathlib.Path(argv[2])
    watch(pid, pipe, folder)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
