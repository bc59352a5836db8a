"""The typed errors of the public API, each with a one-line message.

A `ParityError` is one the caller can fix: the CLI prints it and exits 2, the pytest plugin makes it a usage
error. Anything else escaping the API is a bug (the implementation's errors are `error` rows).
"""

from __future__ import annotations

from mhc_parity.records.settings import SettingError, check_settings


class ParityError(Exception):
    """Base of the API's errors: the message is one line naming the problem."""


class ConfigurationError(ParityError, ValueError):
    """A selection, implementation or policy that cannot run (unknown case, suite or path glob, an
    implementation that does not load, a policy without a rule the run needs)."""


class BaselineError(ParityError, ValueError):
    """A baseline that cannot judge this run: unreadable, another implementation's, another tolerance
    policy's or matmul precision's."""


class ReportError(ParityError, OSError):
    """A report folder or baseline file that cannot be written."""


class ResourceError(ParityError, RuntimeError):
    """The machine ran out of what a run needs (memory for a case, a worker process): not a parity failure.
    The cases finished before it are kept."""


class UsageError(ConfigurationError):
    """A bad argument or configuration, named as the command line spells it; exit code 2."""


# Unknown-setting warnings already given: a pytest session checks the settings twice.
_WARNED: set[str] = set()


def checked_settings() -> tuple[str, ...]:
    """`check_settings` as the API reports it: a refused value is a ConfigurationError; else the warnings
    for unknown names not yet given in this process."""
    try:
        warnings = check_settings()
    except SettingError as error:
        raise ConfigurationError(str(error)) from None
    new = tuple(w for w in warnings if w not in _WARNED)
    _WARNED.update(new)
    return new
