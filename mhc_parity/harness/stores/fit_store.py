"""A disk store of the causes' fits: the per-token error that best explains a candidate's errors.

A fitted hypothesis (`mhc_parity.harness.judging.attribution.fitted_errors`) is a least-squares
solve by conjugate gradients: a few dozen runs of the float64 oracle's Jacobian and of its
transpose on the case's fixture, the costliest part of naming a failing row's cause (the kill
matrix makes one per failing candidate of every case under every logic fault). Its solution p
is one number per token, a function of nothing but

- the Jacobian: the case's fixture, configuration and branch, the oracle's code, the JAX /
  jaxlib / NumPy versions, `XLA_FLAGS` and the host CPU (`oracle_cache.key_material`);
- the hypothesis (its site and how the gradients see it: its name) and p's shape;
- the σ per leaf the errors are measured in (their float64 bits);
- the candidate's scaled errors (`mhc_parity.records.files.digest_arrays`: every leaf's name,
  dtype, shape and bytes);
- the fit's own code: `FIT_ENTRY`'s import closure less the operation's program modules
  (`fit_sources`: the oracle's sources, the attribution and the causes; a test checks a fit
  runs no other project file), so a kernel edit keeps every entry whose errors it keeps.

Under a key of all of these an entry holds p and the leaves it was fitted over; the fit's
errors are then J·p from it, the very bits the solve ends with (`fitted_errors`). Entries are
verified when read (`ArtifactStore`), and a process that loaded foreign code writes them under
keys that also cover that code, as every store does (`mhc_parity.records.foreign_code.write_key`).
A fit runs no patched code whatever is injected (no seam is in `fit_sources`:
tests/test_faults.py), so the kill matrix stores and loads them under faults
(`ArtifactStore(open_while_code_patched=True)`)."""

from __future__ import annotations

import base64
import json
import pathlib
from collections.abc import Mapping, Sequence

import numpy as np

from mhc_parity.harness.engine.operation import OPERATION
from mhc_parity.harness.stores.oracle_cache import key_material, oracle_source_digest
from mhc_parity.records.artifact_store import ArtifactStore, canonical_json
from mhc_parity.records.cache_root import cache_root
from mhc_parity.records.code import closure_digest, import_closure
from mhc_parity.records.files import digest_arrays

# Bump when an entry's layout or its key material changes meaning.
FIT_FORMAT = 1
# The module whose code computes a fit (the attribution's CGLS through the oracle's response).
FIT_ENTRY = ("mhc_parity.harness.engine.causes",)


def fit_sources() -> tuple[str, ...]:
    """Project files a fit is computed from (`mhc_parity.records.code.import_closure`)."""
    return import_closure(FIT_ENTRY, OPERATION.PROGRAM_MODULES)


class FitSolutions:
    """The stored solutions of one fitted hypothesis on one case, in one set of units
    (`FitStore.solutions`): get(errors) -> (p, leaves) or None; put(errors, p, leaves)."""

    def __init__(self, store: ArtifactStore, material: dict):
        self._store, self._material = store, material

    def _key(self, errors: Mapping[str, np.ndarray]) -> dict:
        return {**self._material, "errors": digest_arrays({leaf: errors[leaf] for leaf in sorted(errors)})}

    def get(self, errors: Mapping[str, np.ndarray]) -> tuple[np.ndarray, list[str]] | None:
        """The solution p (float64, the hypothesis' shape) and the leaves fitted over, or None."""
        key = self._key(errors)
        payload = self._store.load(key)
        if payload is None:
            return None
        try:
            entry = json.loads(payload)
            p = np.frombuffer(base64.b64decode(entry["p"]), "<f8").reshape(entry["shape"]).astype(np.float64)
            leaves = [str(leaf) for leaf in entry["leaves"]]
        except (ValueError, KeyError, TypeError) as error:  # a verified entry this code cannot read
            self._store.reject(key, f"{type(error).__name__}: {error}")
            return None
        if list(p.shape) != self._material["shape"]:
            self._store.reject(key, f"p of shape {list(p.shape)}, the hypothesis' is {self._material['shape']}")
            return None
        return p, leaves

    def put(self, errors: Mapping[str, np.ndarray], p: np.ndarray, leaves: Sequence[str]) -> None:
        value = np.ascontiguousarray(p, "<f8")
        entry = {"p": base64.b64encode(value.tobytes()).decode(), "shape": list(value.shape), "leaves": list(leaves)}
        self._store.save(self._key(errors), canonical_json(entry))


class FitStore:
    """The fits' solutions on disk (``<cache>/fits``). `hits`, `misses` and `rejected` count
    this object's lookups (`counts`)."""

    def __init__(self, folder: pathlib.Path | None = None):
        self.store = ArtifactStore(
            folder if folder is not None else cache_root() / "fits", "fit", open_while_code_patched=True
        )
        self.sources = closure_digest(FIT_ENTRY, OPERATION.PROGRAM_MODULES)
        self._oracle_sources = oracle_source_digest()

    def solutions(
        self, case, fixture, hypothesis: str, shape: Sequence[int], scales: Mapping[str, float]
    ) -> FitSolutions:
        """The solutions of `hypothesis` (its name; p of `shape`) on `case`'s `fixture`, its
        errors in units of `scales` (leaf -> σ)."""
        material = {
            "format": FIT_FORMAT,
            "sources": self.sources,
            "case": key_material(case, fixture, self._oracle_sources),
            "hypothesis": hypothesis,
            "shape": [int(n) for n in shape],
            "scales": [[leaf, float(scales[leaf]).hex()] for leaf in sorted(scales)],
        }
        return FitSolutions(self.store, material)

    def counts(self) -> dict[str, int]:
        return {"fits_stored_loaded": self.store.hits, "fits_stored_missed": self.store.misses}
