"""Path-name globs: a path is named `<implementation>/<partitioning>` (e.g.
``interpret/sharded(data=2,fsdp=4)``), and `--paths` selects paths by fnmatch globs of those
names. An implementation's name is its author's, so a glob built from it must take it
literally: a kernel named ``[r]eference`` would otherwise select the reference's paths, not
its own, and one named ``kern[v2]`` selects nothing."""

from __future__ import annotations

import re


def literal_glob(text: str) -> str:
    """`text` as an fnmatch pattern that matches it alone: each `*`, `?` and `[` in a set of its
    own (fnmatch has no escape function; a lone `]` is literal already)."""
    return re.sub(r"([*?[])", r"[\1]", text)


def implementation_glob(name: str) -> str:
    """The path-name glob of every path of implementation `name`, e.g. ``kern[[]v2]/*``."""
    return f"{literal_glob(name)}/*"


def implementation_of(candidate: str) -> str:
    """The implementation of a path name ("interpret/sharded(...)" -> "interpret")."""
    return candidate.split("/", 1)[0]
