"""docs/results/*.md: a command's figures with where they come from.

The commands that measure something the docs cite (`mhc-parity faults` for the kill matrix
and the sweep, `bench/parity_bench.py`) write their Markdown there with the date, the
commit, the machine and the command that produced them (`make faults`, `make sweep`,
`make bench`), so a doc links to the file instead of restating a figure that drifts.
"""

from __future__ import annotations

import datetime
import pathlib
from collections.abc import Mapping
from typing import Any

from mhc_parity.records.files import atomic_write

RESULTS_FOLDER = pathlib.Path("docs/results")


def provenance_lines(command: str, metadata: Mapping[str, Any]) -> list[str]:
    """The header lines of a results file: command, date, commit, machine and versions.

    metadata: a run's environment record (`mhc_parity.harness.engine.run_info.run_metadata`: git_commit,
    host_cpu, platform, backend, device_kind, jax_version, ...); missing keys are left out.
    """
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
    """Write `markdown` (a document starting with its `# title` line) to `path` with its
    provenance under the title, atomically. Returns the path."""
    title, _, body = markdown.partition("\n")
    document = "\n".join([title, "", *provenance_lines(command, metadata), "", body.lstrip("\n")]).rstrip() + "\n"
    path = pathlib.Path(path)
    atomic_write(path, document.encode("utf-8"))
    return path
