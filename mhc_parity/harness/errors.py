"""The typed errors of the public API (`mhc_parity.harness.api`), each with a one-line message.

Every error a caller can fix by changing what it asked for is a `ParityError`: the CLI
prints its message on one line and exits 2, the pytest plugin turns it into a usage
error. Anything else escaping the API is a bug of the harness (or of the implementation
under test, which the runner records as an `error` row instead of raising).
"""

from __future__ import annotations

from mhc_parity.records.settings import SettingError, check_settings


class ParityError(Exception):
    """Base of the API's errors: the message is one line naming the problem."""


class ConfigurationError(ParityError, ValueError):
    """A selection, implementation or policy that cannot run: an unknown case, suite or path
    glob, an implementation that does not load, a policy without a rule the run needs."""


class BaselineError(ParityError, ValueError):
    """A baseline that cannot judge this run: unreadable, of another implementation, made under
    another tolerance policy or at another matmul precision."""


class ReportError(ParityError, OSError):
    """A report folder or baseline file that cannot be written."""


class ResourceError(ParityError, RuntimeError):
    """The machine ran out of what a run needs (memory for a case, a worker process): not a
    parity failure. The message names the case; the cases finished before it are kept."""


class UsageError(ConfigurationError):
    """A bad argument or configuration, named as the command line spells it; exit code 2."""


# The unknown-setting warnings already given in this process: a pytest session checks the
# settings when it starts and again in `api.prepare`, and says each once.
_WARNED: set[str] = set()


def checked_settings() -> tuple[str, ...]:
    """`mhc_parity.records.settings.check_settings` as the API reports it: a refused value a
    ConfigurationError (one line naming the variable); else the warnings for unknown names not
    yet given in this process."""
    try:
        warnings = check_settings()
    except SettingError as error:
        raise ConfigurationError(str(error)) from None
    new = tuple(w for w in warnings if w not in _WARNED)
    _WARNED.update(new)
    return new
