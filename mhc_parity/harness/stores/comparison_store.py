"""A disk store of a case's judged rows: the judgement is a pure function of what it compares.

A case's comparison rows (vs_oracle, vs_reference, vs_unsharded, with their bounds, verdicts
and causes: `mhc_parity.harness.engine.runner.Runner`) are computed from the paths' results —
each path's outputs, bit for bit, or why it gave none — the oracle's answer, the fixture, the
policy and the project's code, on this machine's libraries. `ComparisonStore` keeps them in
``<cache>/comparisons`` (`mhc_parity.records.artifact_store`: verified when read) under a key of
all of these (`key_material`):

- every project source file (`mhc_parity.records.project_code.project_code_files`: the metrics, the
  bounds, the causes, the oracle and everything else the manifest's code digest covers);
- the policy's digest; the case's full spec; the fixture's digest, every input bit (the
  oracle's answer is a function of it, the code and the environment below);
- per path of the case, in order: its name, its verdict and reason where it gave no outputs,
  its devices, and the digest of every output leaf's name, dtype, shape and bytes;
- NumPy, ml_dtypes, JAX, jaxlib, Flax and Python versions, JAX settings, `XLA_FLAGS` and the
  host CPU (`mhc_parity.harness.stores.program_store.environment_material`);
- the backend's arithmetic terms and the case's noise units
  (`mhc_parity.harness.engine.oracle_path.arithmetic_material`): the bounds widen with both, so
  rows judged under another backend's (or an edited) probe table are not replayed.

So a run still executes every program — a path whose outputs moved by one bit is judged
again — and only the metrics, bounds and causes of outputs already judged are not computed
again. The rows' timing columns are this run's (`with_timings`). A process that patches code
at run time is given no store (the kill matrix, tests with monkeypatch), and while a fault is
injected no store reads or writes (`mhc_parity.records.foreign_code.code_patched`); a process that loaded
foreign code keys its entries by that code too, as every store does
(`mhc_parity.records.foreign_code.write_key`: its import may have patched what judges its rows).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import pickle
from collections.abc import Mapping, Sequence

import ml_dtypes

from mhc_parity.harness.engine import oracle_path
from mhc_parity.harness.stores.program_store import environment_material
from mhc_parity.records.artifact_store import ArtifactStore
from mhc_parity.records.cache_root import cache_root
from mhc_parity.records.files import digest_arrays
from mhc_parity.records.project_code import digest_of, project_code_files
from mhc_parity.records.schema import TIMING_COLUMNS

# Bump when an entry's layout or its key material changes meaning. 2: a path's stored timing
# is its `TIMING_COLUMNS` cells (execute_first_s, execute_runs added). 3: the backend terms and
# noise units are in the key (`arithmetic`). 4: `bytes_moved` is one of the stored timing cells.
COMPARISON_FORMAT = 4


@functools.cache
def project_code_digest() -> str:
    """The digest of every project source file (the manifest's code digest of a run with no
    external implementation); once per process: the run's code does not change under it."""
    return digest_of(project_code_files())


def path_material(name: str, *, verdict: str, reason: str, devices: str, leaves: Mapping | None) -> list:
    """What one path's result contributes to a case's key: its outputs' digest, or why it gave none."""
    outputs = None if leaves is None else digest_arrays({leaf: leaves[leaf] for leaf in sorted(leaves)})
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
        "environment": {**environment_material(), "ml_dtypes": ml_dtypes.__version__},
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
