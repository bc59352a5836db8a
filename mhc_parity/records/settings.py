"""Every `MHC_PARITY_*` environment variable: one table (`SETTINGS`) and one parser each, checked before any work
(`check_settings`). A refused value is a usage error (exit 2), never a run of `error` rows; an unknown name only warns
(a variable of another version left in a shell must not stop a run).
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
from collections.abc import Callable, Mapping

PREFIX = "MHC_PARITY_"


class SettingError(ValueError):
    """A `MHC_PARITY_*` variable whose value its parser refuses; the message is one line."""


@dataclasses.dataclass(frozen=True)
class Setting:
    """One variable: `parse` takes its stripped, non-empty value and raises ValueError to refuse it; `accepts` says what
    it accepts; unset or empty means the default."""

    name: str
    parse: Callable[[str], object]
    accepts: str
    meaning: str


def _positive_integer(raw: str) -> int:
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError
    return int(raw)


def _own_process(raw: str) -> str:
    if raw.lower() not in ("always", "never"):
        raise ValueError
    return raw.lower()


_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def _size(raw: str) -> int:
    """Bytes, or a number with K, M, G or T (powers of 1024), at least one byte and finite."""
    number = raw.rstrip("KMGTkmgt")
    limit = float(number) * _UNITS[raw[len(number) :].upper()]  # KeyError: two units; ValueError: no number
    if not (math.isfinite(limit) and limit >= 1):
        raise ValueError
    return int(limit)


def _text(raw: str) -> str:
    return raw


SETTINGS = {
    s.name: s
    for s in (
        Setting("MHC_PARITY_CACHE", _text, "a folder path", "where the stores live (records.cache_root)"),
        Setting("MHC_PARITY_SUITE", _text, "a suite name", "the pytest plugin's default suite (else smoke)"),
        Setting(
            "MHC_PARITY_ORACLE_PROCESS",
            _own_process,
            "'always' or 'never'",
            "compute every case's oracle in a process of its own, or none (default: the tpu-tagged cases')",
        ),
        Setting(
            "MHC_PARITY_ORACLE_CHUNK_TOKENS",
            _positive_integer,
            "a positive integer",
            "tokens per chunk of the oracle (default: ORACLE_CHUNK_ELEMENTS' worth)",
        ),
        Setting(
            "MHC_PARITY_ORACLE_CHUNKS_IN_FLIGHT",
            _positive_integer,
            "a positive integer",
            "oracle chunks an oracle process runs at once (default 1)",
        ),
        Setting(
            "MHC_PARITY_MEMORY_LIMIT",
            _size,
            "a finite size of at least one byte: bytes, or a number with K, M, G or T",
            "the memory the machine allows, where less than /proc/meminfo shows",
        ),
        Setting(
            "MHC_PARITY_FORK_SERVER_OF",
            _positive_integer,
            "a process id",
            "internal: set while the workers' fork server starts (processes.worker_processes)",
        ),
    )
}


def setting(name: str, environ: Mapping[str, str] | None = None):
    """`name`'s parsed value, None if unset or empty; SettingError (one line) for a refused value."""
    spec = SETTINGS[name]
    raw = (os.environ if environ is None else environ).get(name, "").strip()
    if not raw:
        return None
    try:
        return spec.parse(raw)
    except (ValueError, KeyError, OverflowError):
        raise SettingError(f"${name} must be {spec.accepts}, got {raw!r}") from None


def check_settings(environ: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """SettingError (one line, every refused value) if a parser refuses one; else warnings for unknown `MHC_PARITY_*`
    names, each naming the closest known."""
    environ = os.environ if environ is None else environ
    refused = []
    for name in SETTINGS:
        try:
            setting(name, environ)
        except SettingError as error:
            refused.append(str(error))
    if refused:
        raise SettingError("; ".join(refused))
    warnings = []
    for name in sorted(n for n in environ if n.startswith(PREFIX) and n not in SETTINGS):
        close = difflib.get_close_matches(name, SETTINGS, n=1)
        hint = f" (did you mean ${close[0]}?)" if close else ""
        warnings.append(f"${name} is no mhc-parity setting and is ignored{hint}")
    return tuple(warnings)
