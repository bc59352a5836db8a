"""docs/results/*.md: a command's figures written with their provenance (date, commit, machine, command), so a doc links
to the file instead of restating a figure that drifts.
"""

from __future__ import annotations

import datetime
import pathlib
from collections.abc import Mapping
from typing import Any

from mhc_parity.records.files import atomic_write

RESULTS_FOLDER = pathlib.Path("docs/results")


def provenance_lines(command: str, metadata: Mapping[str, Any]) -> list[str]:
    """The header lines of a results file. metadata: a run's environment record (`run_metadata`); missing keys are left
    out."""
    date = metadata.get("end_time") or datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    machine = (
        ", ".join(str(metadata[key]) for key in ("host_cpu", "platform") if metadata.get(key)) or "unrecorded machine"
    )
    versions = ", ".join(
        f"{name} {metadata[key]}"
        for name, key in (("jax", "jax_version"), ("jaxlib", "jaxlib_version"), ("numpy", "numpy_version"))
        if metadata.get(key)
    )
    backend = f"; backend {metadata['backend']} ({metadata.get('device_kind', '?')})" if metadata.get("backend") else ""
    return [
        f"Written by `{command}` on {date}, commit `{metadata.get('git_commit') or 'unrecorded'}`.",
        f"Machine: {machine}{backend}; {versions or 'versions unrecorded'}.",
        "Rewritten by that command; do not edit by hand.",
    ]


def write_results(path: str | pathlib.Path, markdown: str, command: str, metadata: Mapping[str, Any]) -> pathlib.Path:
    """Write `markdown` (starting with its `# title` line) to `path` atomically, its provenance under the title."""
    title, _, body = markdown.partition("\n")
    document = "\n".join([title, "", *provenance_lines(command, metadata), "", body.lstrip("\n")]).rstrip() + "\n"
    path = pathlib.Path(path)
    atomic_write(path, document.encode("utf-8"))
    return path
