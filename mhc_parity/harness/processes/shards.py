"""`mhc-parity run --shard K/N`: the selection's sorted case names dealt round-robin (position i to
shard (i mod N) + 1), so N jobs given one selection cover it exactly once on any machine."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence

_SHARD = re.compile(r"^\s*(\d+)\s*/\s*(\d+)\s*$")


@dataclasses.dataclass(frozen=True)
class Shard:
    """Shard `index` (1-based) of `count`."""

    index: int
    count: int

    @property
    def label(self) -> str:
        return f"{self.index}/{self.count}"


def parse_shard(text: str) -> Shard:
    """`"K/N"` with 1 <= K <= N; ValueError with a one-line message otherwise."""
    match = _SHARD.match(text or "")
    if not match:
        raise ValueError(f"--shard must look like K/N (e.g. 2/4), got {text!r}")
    index, count = int(match.group(1)), int(match.group(2))
    if count < 1 or not 1 <= index <= count:
        raise ValueError(f"--shard K/N needs 1 <= K <= N, got {text!r}")
    return Shard(index, count)


def shard_names(names: Sequence[str], shard: Shard) -> set[str]:
    """The names of `names` that belong to `shard` (round-robin over the sorted names)."""
    ordered = sorted(names)
    return {name for position, name in enumerate(ordered) if position % shard.count == shard.index - 1}


def shard_cases(cases: Sequence, shard: Shard) -> list:
    """The cases of `shard`, in the selection's order; ValueError if it gets none."""
    mine = shard_names([c.name for c in cases], shard)
    chosen = [c for c in cases if c.name in mine]
    if not chosen:
        raise ValueError(f"--shard {shard.label} selects no case: the selection has only {len(cases)} case(s)")
    return chosen
