"""Looking up things by name, with a did-you-mean hint for a typo."""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from typing import TypeVar

T = TypeVar("T")  # not PEP 695 syntax: the package runs on Python 3.11


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """ "; did you mean 'a' or 'b'?" for close matches of `name`, else ""."""
    close = difflib.get_close_matches(str(name), list(known), n=3, cutoff=0.6)
    return f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""


def lookup(table: Mapping[str, T], name: str, what: str) -> T:
    """table[name]; a KeyError naming `what`, the known names and close matches."""
    try:
        return table[name]
    except KeyError:
        raise KeyError(f"unknown {what} {name!r} (known: {', '.join(table)}){did_you_mean(name, table)}") from None
