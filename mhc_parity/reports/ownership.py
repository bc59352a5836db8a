"""Which implementation a baseline belongs to, and one implementation's rows (those whose candidate is one of its paths,
`<name>/...`). A `baseline --impl` file keeps only those and names the implementation in its header; the gate then
judges that implementation's rows alone.
"""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd

BASELINE_FOLDER = Path("baselines")


def implementation_rows(frame: pd.DataFrame, name: str) -> pd.DataFrame:
    """The rows of `frame` whose candidate is a path of implementation `name`."""
    return frame[frame["candidate"].astype(str).str.startswith(f"{name}/")]


def implementation_names(run) -> list[str]:
    """The external implementations a loaded run ran: its manifest's request, else a baseline file's own implementation,
    else []."""
    if run.manifest is not None:
        return [name for name, _ in run.manifest.request.implementations]
    return [run.implementation] if getattr(run, "implementation", None) else []


def resolve_implementation(run, wanted: str) -> str:
    """The name of the run's implementation given by name or `module:factory` spec; ValueError (one line) if it has none
    such."""
    pairs = list(run.manifest.request.implementations) if run.manifest is not None else []
    for name, spec in pairs:
        if wanted in (name, spec):
            return name
    known = ", ".join(f"{name} ({spec})" if spec and spec != name else name for name, spec in pairs) or "none"
    raise ValueError(f"{run.source} has no rows of implementation {wanted!r} (its external implementations: {known})")


def ownership_refusal(baseline, current) -> str:
    """Why `baseline` cannot judge `current` (two `LoadedRun`s), or "". An implementation's baseline judges only a run
    of it; the built-in paths' baseline refuses a run of external implementations it holds no rows of (every row would
    be missing or new)."""
    owner = baseline.implementation
    ran = implementation_names(current)
    if owner:
        if owner in ran or (current.manifest is None and len(implementation_rows(current.frame, owner))):
            return ""
        return (
            f"baseline {baseline.source} belongs to implementation {owner!r}; the current run "
            f"{current.source} has no rows of it (its external implementations: {', '.join(ran) or 'none'}); "
            f"gate each implementation against its own baseline (`mhc-parity baseline --impl MODULE:FACTORY`)"
        )
    foreign = [name for name in ran if not len(implementation_rows(baseline.frame, name))]
    if foreign and len(foreign) == len(ran):
        return (
            f"baseline {baseline.source} is the built-in paths' baseline and holds no rows of "
            f"implementation {foreign[0]!r}; make its own with `mhc-parity baseline --impl MODULE:FACTORY`"
        )
    return ""


def default_baseline_path(name: str) -> Path:
    """baselines/<name>.csv, with characters a file name should not hold (':', '/', spaces) as '_'."""
    return BASELINE_FOLDER / (re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._") + ".csv")
