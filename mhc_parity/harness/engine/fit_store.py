"""The causes' fits on disk (``<cache>/fits``): a fitted hypothesis' solution p, one number per token,
the costliest part of naming a cause. Keyed by the oracle's key material, the hypothesis, p's shape,
the σ per leaf, the candidate's scaled errors and the fit's sources (`fit_sources`); open under
faults, since a fit runs no patched code (tests/test_faults.py)."""

from __future__ import annotations

import base64
import json
import pathlib
from collections.abc import Mapping, Sequence

import numpy as np

from mhc_parity.harness.engine.operation import OPERATION
from mhc_parity.harness.engine.oracle_cache import key_material, oracle_source_digest
from mhc_parity.harness.engine.store_keys import arrays_digest
from mhc_parity.records.artifact_store import ArtifactStore, canonical_json
from mhc_parity.records.cache_root import cache_root
from mhc_parity.records.code import closure_digest, import_closure

# Bump when an entry's layout or its key material changes meaning.
FIT_FORMAT = 2
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
        return {**self._material, "errors": arrays_digest(errors)}

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
