"""Path-name globs. A path is named `<implementation>/<partitioning>` and `--paths` takes fnmatch globs; an
implementation's name is taken literally (``kern[v2]`` must not be read as a set).
"""

from __future__ import annotations

import re


def literal_glob(text: str) -> str:
    """`text` as an fnmatch pattern matching it alone: `*`, `?`, `[` each in a set of its own (fnmatch has no escape
    function)."""
    return re.sub(r"([*?[])", r"[\1]", text)


def implementation_glob(name: str) -> str:
    """The path-name glob of every path of implementation `name`, e.g. ``kern[[]v2]/*``."""
    return f"{literal_glob(name)}/*"


def implementation_of(candidate: str) -> str:
    """The implementation of a path name ("interpret/sharded(...)" -> "interpret")."""
    return candidate.split("/", 1)[0]
