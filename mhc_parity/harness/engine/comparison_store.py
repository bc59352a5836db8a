"""A case's judged rows on disk (``<cache>/comparisons``), keyed by everything they are judged from
(`key_material`: each path's outputs bit for bit or why it gave none, the fixture, the case, the
policy, every project source file, the environment, the backend's terms and the noise units). A warm
run still executes every program; only outputs already judged skip their metrics, bounds and causes."""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import pickle
from collections.abc import Mapping, Sequence

from mhc_parity.harness.engine import oracle_path
from mhc_parity.harness.engine.store_keys import arrays_digest, environment_material
from mhc_parity.records.artifact_store import ArtifactStore
from mhc_parity.records.cache_root import cache_root
from mhc_parity.records.project_code import digest_of, project_code_files
from mhc_parity.records.schema import TIMING_COLUMNS

# Bump when an entry's layout or its key material changes meaning.
COMPARISON_FORMAT = 5


@functools.cache
def project_code_digest() -> str:
    """The digest of every project source file (the manifest's code digest of a run with no
    external implementation); once per process: the run's code does not change under it."""
    return digest_of(project_code_files())


def path_material(name: str, *, verdict: str, reason: str, devices: str, leaves: Mapping | None) -> list:
    """What one path's result contributes to a case's key: its outputs' digest, or why it gave none."""
    outputs = None if leaves is None else arrays_digest(leaves)
    return [name, verdict, reason, devices, outputs]


def key_material(case, fixture, policy_digest: str, paths: Sequence[list]) -> dict:
    """The key of a case's judged rows; `paths`: `path_material` of each of its paths, in order."""
    return {
        "format": COMPARISON_FORMAT,
        "code": project_code_digest(),
        "policy": policy_digest,
        "case": json.loads(json.dumps(dataclasses.asdict(case), sort_keys=True, default=str)),
        "fixture": fixture.digest(),
        "paths": list(paths),
        "environment": environment_material(),
        "arithmetic": oracle_path.arithmetic_material(case),
    }


def with_timings(rows: Sequence[dict], stored: Mapping[str, tuple], current: Mapping[str, tuple]) -> list[dict]:
    """`rows` judged in an earlier run, their timing columns this run's: a row timed there
    (its cells are its candidate's `stored` `TIMING_COLUMNS` cells) gets its candidate's
    `current` timing; status rows (no timing) are as they were."""
    timed = []
    for row in rows:
        before = stored.get(row["candidate"])
        cells = tuple(row[column] for column in TIMING_COLUMNS)
        if before is not None and not any(map(math.isnan, before)) and cells == tuple(before):
            row = {**row, **dict(zip(TIMING_COLUMNS, current[row["candidate"]]))}
        timed.append(row)
    return timed


class ComparisonStore:
    """Judged rows on disk by what they were judged from (module docstring); counts hits and misses."""

    def __init__(self, folder=None):
        self.store = ArtifactStore(folder if folder is not None else cache_root() / "comparisons", "comparison")

    def load(self, material: dict, timings: Mapping[str, tuple]) -> list[dict] | None:
        """The rows stored under `material` with this run's `timings` (path name -> the
        `TIMING_COLUMNS` cells of each path that ran), or None: none stored, or an invalid entry."""
        payload = self.store.load(material)
        if payload is None:
            return None
        try:
            stored_timings, rows = pickle.loads(payload)
        except (pickle.UnpicklingError, ValueError, TypeError, EOFError) as error:
            self.store.reject(material, f"unreadable rows ({error})")
            return None
        return with_timings(rows, stored_timings, timings)

    def save(self, material: dict, rows: Sequence[dict], timings: Mapping[str, tuple]) -> None:
        """Store `rows` (judged with `timings`, as `load` takes them) under `material`."""
        self.store.save(material, pickle.dumps((dict(timings), list(rows)), protocol=pickle.HIGHEST_PROTOCOL))

    def counts(self) -> dict[str, int]:
        return {"comparisons_stored_loaded": self.store.hits, "comparisons_stored_missed": self.store.misses}
