"""`mhc-parity` (also `python -m mhc_parity.harness`): the one command line of the project.

Each command of `COMMANDS` is a module of `mhc_parity.harness.commands` (`cases`: `mhc_parity.cases`),
loaded only when run. Exit codes: `mhc_parity.command_line.EXIT_CODES`; errors are one line on stderr.
"""

from __future__ import annotations

import atexit
import difflib
import functools
import importlib
import os
import sys
import threading

from mhc_parity.command_line import EXIT_USAGE, error, exit_codes_text, warning
from mhc_parity.harness.env import collector_paused_for_imports, ensure_host_devices, pace_garbage_collector
from mhc_parity.harness.errors import ConfigurationError, checked_settings
from mhc_parity.harness.processes.worker_processes import start_worker_server
from mhc_parity.jax_support import UnsupportedJaxError
from mhc_parity.records.outputs import exit_code_through_closed_stdout
from mhc_parity.version import version

# command -> (module:function taking the remaining arguments, one-line help).
COMMANDS = {
    "run": ("mhc_parity.harness.commands.run:main", "run cases through every path and write reports"),
    "gate": ("mhc_parity.harness.commands.gate:main", "compare a finished run against a baseline"),
    "baseline": (
        "mhc_parity.harness.commands.baseline:main",
        "write a finished run as the baseline CSV (--impl: an implementation's, run first)",
    ),
    "render": ("mhc_parity.harness.commands.render:main", "write every report format again from a finished run"),
    "policy": ("mhc_parity.harness.commands.policy:main", "check the tolerance policy; print every resolved bound"),
    "faults": (
        "mhc_parity.harness.commands.faults:main",
        "the fault kill matrix, or with --seeds the false-positive sweep",
    ),
    "merge": ("mhc_parity.harness.commands.merge:main", "join the run folders of `run --shard K/N` into one run"),
    "cases": ("mhc_parity.cases.__main__:main", "list the cases (--case-file: a file's), suites or init families"),
}
HELP = "help"
# Commands that never start JAX: no XLA flags to set before them.
WITHOUT_JAX = ("cases",)


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = [f"  {name:<{width}}  {help_text}" for name, (_, help_text) in COMMANDS.items()]
    lines.append(f"  {HELP:<{width}}  the help of a command: mhc-parity help COMMAND")
    return (
        "usage: mhc-parity COMMAND [options]   (mhc-parity help COMMAND; --version)\n\ncommands:\n"
        + "\n".join(lines)
        + "\n\n"
        + exit_codes_text()
    )


def unknown_command(command: str) -> int:
    """The error line for a command that does not exist, with the nearest one if any; EXIT_USAGE."""
    near = difflib.get_close_matches(command, [*COMMANDS, HELP], n=1)
    hint = f"; did you mean {near[0]!r}?" if near else " (mhc-parity --help lists them)"
    return error(f"unknown command {command!r}{hint}")


def requests_workers(command: str, arguments: list[str]) -> bool:
    """Whether `arguments` ask `run` for worker processes (`--jobs` other than 1), by a quick look before
    the parser: a spelling it misses only starts the workers' server later."""
    if command != "run":
        return False
    for index, argument in enumerate(arguments):
        if argument.startswith("--jobs="):
            return argument.partition("=")[2] != "1"
        if argument == "--jobs" and index + 1 < len(arguments):
            return arguments[index + 1] != "1"
    return False


def impl_modules(arguments: list[str]) -> tuple[str, ...]:
    """The modules of the `--impl MODULE:FACTORY` arguments, by a quick look for the workers' server to
    import (one missed is imported by each worker itself)."""
    found = []
    for index, argument in enumerate(arguments):
        if argument.startswith("--impl="):
            found.append(argument.partition("=")[2])
        elif argument == "--impl" and index + 1 < len(arguments):
            found.append(arguments[index + 1])
    return tuple(spec.partition(":")[0] for spec in found if spec.partition(":")[0])


def main(argv: list[str] | None = None, *, own_process: bool = False) -> int:
    """Dispatch `argv` (default: sys.argv[1:]) to its command; returns the exit code. own_process: the
    process ends with the command, so what importing it built is frozen out of the cycle collector's sight."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0 if argv else EXIT_USAGE
    if argv[0] in ("-V", "--version"):
        print(f"mhc-parity {version()}")
        return 0
    command, rest = argv[0], argv[1:]
    if command == HELP:  # `mhc-parity help [COMMAND]`, as git's
        if not rest:
            print(usage())
            return 0
        command, rest = rest[0], ["--help"]
    if command not in COMMANDS:
        return unknown_command(command)
    try:
        for note in checked_settings():  # every MHC_PARITY_* value, before any work
            warning(note)
        if command not in WITHOUT_JAX:
            ensure_host_devices()  # before any command computes: XLA reads its flags once
    except (UnsupportedJaxError, ConfigurationError) as exc:
        return error(str(exc))
    pace_garbage_collector()
    if requests_workers(command, rest):  # it imports what workers need while this process imports the command
        start_worker_server(impl_modules(rest))
    module_name, _, function = COMMANDS[command][0].partition(":")
    with collector_paused_for_imports(freeze=own_process):
        module = importlib.import_module(module_name)
    return getattr(module, function)(rest)


def import_from_working_directory() -> None:
    """Put the working directory first on sys.path, as `python -m` does (the script's sys.path starts with
    its bin folder, so `--impl my_module:factory` would not import); not under safe-path mode."""
    if sys.flags.safe_path:
        return
    try:
        cwd = os.getcwd()
    except OSError:  # a working directory removed under the process: nothing to import from it
        return
    if not any(os.path.abspath(entry or os.curdir) == cwd for entry in sys.path):
        sys.path.insert(0, cwd)


def _threads_still_working() -> bool:
    return any(t.is_alive() and not t.daemon for t in threading.enumerate() if t is not threading.current_thread())


def entry() -> None:
    """The process entry point: exit with `main()`'s code, or 141 without a traceback when stdout's reader
    went away. After a signal, a closed pipe, or with a worker thread still running (a thread stuck in the
    code under test, programs compiling ahead), exit at once; otherwise run the exit handlers and skip only
    the interpreter's teardown."""
    import_from_working_directory()
    code = exit_code_through_closed_stdout(functools.partial(main, own_process=True))
    if code > 128 or _threads_still_working():
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    _exit_after_handlers(code)


def _exit_after_handlers(code: int) -> None:
    """`sys.exit(code)` less the interpreter's teardown (most of a second after a run, docs/speed.md): the
    `atexit` handlers run and stdout/stderr are flushed. Every file a command writes is closed before it
    returns."""
    atexit._run_exitfuncs()  # CPython's own: what sys.exit runs before its teardown
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
