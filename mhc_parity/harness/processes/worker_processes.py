"""How `mhc-parity run --jobs N` starts its workers: forked from multiprocessing's fork server, which
imports `WORKER_MODULES` once and never starts a JAX backend (spawned where there is no fork server).
A worker ends when the command does, however it ends (`end_with_parent`, `exit_with`: a kill -9 runs no
cleanup, and a worker blocked on its task queue holds a write end of it, so never sees end-of-file). It
adopts the parent's os.environ (`adopt_environment`), since a forked one inherits the server's. No JAX here."""

from __future__ import annotations

import ctypes
import multiprocessing
import multiprocessing.context
import multiprocessing.forkserver
import os
import pathlib
import select
import signal
import sys
import threading
import time

from mhc_parity.records.settings import setting

try:
    import resource
except ImportError:  # Windows
    resource = None

# What a worker needs imported: mhc_parity.harness.processes.parallel brings JAX, Flax, mhc and the runner.
# This module first: importing it, the fork server ends itself with the command (`_SERVER_OF`).
WORKER_MODULES = (__name__, "mhc_parity.harness.processes.parallel")
# Set, to the command's pid, in the environment the fork server starts with (and only there:
# `start_worker_server`), so that the server, and no other process, knows itself at import.
_SERVER_OF = "MHC_PARITY_FORK_SERVER_OF"
# The project's import namespace (`mhc_parity.records.project_code.NAMESPACE`; this module imports
# nothing of the project, so the fork server's first import stays light).
_NAMESPACE = __name__.split(".")[0]


def worker_context(preload: tuple[str, ...] = ()) -> multiprocessing.context.BaseContext:
    """The multiprocessing context workers start in: forkserver, preloading `WORKER_MODULES`
    (and `project_modules(preload)`, when it starts the server), or spawn."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(list(WORKER_MODULES) + project_modules(preload))
    return context


def project_modules(modules) -> list[str]:
    """The names among `modules` inside this project's namespace, which the fork server may import for
    every worker (`mhc_parity.maxtext_parity`: MaxText takes seconds to import). A user's module might
    start a JAX backend, which a forked worker must not inherit, so each worker imports it itself. The
    server skips a module that cannot be imported."""
    return [name for name in dict.fromkeys(modules) if name == _NAMESPACE or name.startswith(_NAMESPACE + ".")]


def start_worker_server(preload: tuple[str, ...] = ()) -> None:
    """Start the fork server now (it imports `WORKER_MODULES` in the background, then the
    project's modules among `preload`: `project_modules`); a no-op where workers are spawned,
    or when this process's server already runs. Call it from the thread that lives as long as
    the command (the main thread): the server ends with it (`end_with_parent`), and the one
    `ParallelRunner` uses is the one started here."""
    if worker_context(preload).get_start_method() != "forkserver":
        return
    previous = os.environ.get(_SERVER_OF)
    os.environ[_SERVER_OF] = str(os.getpid())
    try:
        multiprocessing.forkserver.ensure_running()
    finally:
        if previous is None:
            os.environ.pop(_SERVER_OF, None)
        else:
            os.environ[_SERVER_OF] = previous


def environment_of_this_process() -> tuple[tuple[str, str], ...]:
    """os.environ as it is now, to hand a worker (`adopt_environment`)."""
    return tuple(os.environ.items())


def adopt_environment(environment: tuple[tuple[str, str], ...]) -> None:
    """Make this (worker) process's os.environ exactly `environment`: the parent's.

    Not JAX's configuration: JAX reads its JAX_* variables when it is imported, which for
    a forked worker happened in the server. Set them before the first run with workers.
    """
    os.environ.clear()
    os.environ.update(environment)


# A worker's exit status when the command's process is gone.
EXIT_PARENT_GONE = 1
# prctl(2): the signal this process gets when its parent ends.
_PR_SET_PDEATHSIG = 1


def end_with_parent() -> bool:
    """Have the kernel SIGKILL this process when its parent ends (PR_SET_PDEATHSIG), whatever it runs then;
    exit at once if the parent ended already; False off Linux. The parent is the thread that started
    this process, so start it from a thread that lives as long as the process."""
    if not sys.platform.startswith("linux"):
        return False
    parent = os.getppid()
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return False
    if prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        return False
    if os.getppid() != parent:  # it ended before the request was made
        os._exit(EXIT_PARENT_GONE)
    return True


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by another user: not ours, so ours is gone
        return False
    return True


def exit_with(pid: int, *, poll_s: float = 1.0) -> threading.Thread:
    """End this process (`os._exit`) as soon as process `pid` ends: a daemon thread waits on
    a pidfd of it (Linux), else polls it every `poll_s` seconds."""

    def watch():
        try:
            handle = os.pidfd_open(pid)
        except (AttributeError, OSError):  # no pidfd here, or `pid` already gone
            while _alive(pid):
                time.sleep(poll_s)
        else:
            select.select([handle], [], [])  # readable once the process has ended
        os._exit(EXIT_PARENT_GONE)

    watcher = threading.Thread(target=watch, name=f"exit-with-{pid}", daemon=True)
    watcher.start()
    return watcher


def peak_resident_bytes() -> int | None:
    """This process's peak resident memory in bytes (None without `resource`). A forked worker is no child
    of the command's process (its RUSAGE_CHILDREN never sees it): workers report their own with their rows."""
    if resource is None:
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # bytes on macOS, KiB on Linux


# The memory a machine allows its processes together, where that is less than /proc/meminfo
# shows (a container or sandbox limited from outside: the lent TPU VM reports 45 GiB and allows
# 40 GiB). Bytes, or a number with K, M, G or T (powers of 1024): `records.settings`.
MEMORY_LIMIT_ENV_VAR = "MHC_PARITY_MEMORY_LIMIT"


def memory_limit_bytes() -> int | None:
    """`$MHC_PARITY_MEMORY_LIMIT` in bytes, or None where it is unset. SettingError naming the
    variable for a value that is not a finite positive size."""
    return setting(MEMORY_LIMIT_ENV_VAR)


def _meminfo_kib() -> dict[str, int]:
    """/proc/meminfo's lines as name -> KiB (empty where it cannot be read)."""
    found = {}
    try:
        for line in pathlib.Path("/proc/meminfo").read_text().splitlines():
            name, _, value = line.partition(":")
            fields = value.split()
            if fields and fields[0].isdigit():
                found[name] = int(fields[0])
    except OSError:
        pass
    return found


def _in_use_bytes(meminfo: dict[str, int]) -> int | None:
    if "MemTotal" not in meminfo or "MemAvailable" not in meminfo:
        return None
    return (meminfo["MemTotal"] - meminfo["MemAvailable"]) * 1024


def memory_in_use_bytes() -> int | None:
    """The memory the system counts in use (MemTotal − MemAvailable), or None if unknown."""
    return _in_use_bytes(_meminfo_kib())


def available_memory_bytes() -> int | None:
    """The memory the system can give new processes (MemAvailable), no more than `$MHC_PARITY_MEMORY_LIMIT`
    less what is in use; None if unknown."""
    meminfo = _meminfo_kib()
    if "MemAvailable" not in meminfo:
        return None
    available = meminfo["MemAvailable"] * 1024
    limit, used = memory_limit_bytes(), _in_use_bytes(meminfo)
    if limit is None or used is None:
        return available
    return max(0, min(available, limit - used))


if os.environ.get(_SERVER_OF) == str(os.getppid()):  # this is the fork server the command started
    end_with_parent()
