"""Causes and declared effects on disk (``<cache>/causes``): naming failing rows' causes and measuring
declared precision choices run hypotheses through the float64 oracle (seconds a case, gigabytes of
leaves), while the answers are small. Keyed by the code computing them (`cause_sources`), the
environment and backend, the case, its fixture and oracle answer, and for the causes every row but
its timing and every path's leaves by their bits."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from mhc_parity.harness.engine.causes import rows_needing_causes
from mhc_parity.harness.engine.oracle_path import arithmetic_material
from mhc_parity.harness.engine.precision_choices import DeclaredEffects
from mhc_parity.harness.engine.store_keys import arrays_digest, environment_material, jsonable, traced_sources_digest
from mhc_parity.records.artifact_store import ArtifactStore
from mhc_parity.records.cache_root import cache_root
from mhc_parity.records.code import import_closure
from mhc_parity.records.schema import TIMING_COLUMNS

# Bump when an entry's layout or its key material changes meaning.
CAUSE_STORE_FORMAT = 2
# The modules that name causes and measure declared effects (the hypotheses, the oracle and
# the attribution are what they import).
CAUSE_ENTRY = ("mhc_parity.harness.engine.causes", "mhc_parity.harness.engine.precision_choices")
# The fields `annotate_causes` sets on a failing row.
CAUSE_FIELDS = ("cause", "cause_id", "cause_explained")


def cause_sources() -> tuple[str, ...]:
    """Project files a case's causes and declared effects are computed from."""
    return import_closure(CAUSE_ENTRY)


def _oracle_material(oracle) -> dict:
    """The oracle's answer (`OracleOutputs`): its leaves by their bits, its statistics by value."""
    return {
        "leaves": arrays_digest(oracle.leaves),
        "sensitivity": {leaf: oracle.sensitivity[leaf].as_dict() for leaf in sorted(oracle.sensitivity)},
        "systematic": {leaf: oracle.systematic[leaf] for leaf in sorted(oracle.systematic)},
        "backend_shift": {leaf: oracle.backend_shift[leaf] for leaf in sorted(oracle.backend_shift)},
    }


def _same(a, b) -> bool:
    """Equal, NaN equal to NaN (a row's missing numbers)."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return type(a) is type(b) and a == b


class CauseStore:
    """Causes and declared effects on disk (``<cache>/causes``); `hits`, `misses` and
    `rejected` count this object's lookups (`store.hits` ...)."""

    def __init__(self, folder=None):
        self.store = ArtifactStore(folder if folder is not None else cache_root() / "causes", "causes")

    @staticmethod
    def _material(kind: str, case, fixture, oracle, **specific) -> dict | None:
        sources = traced_sources_digest(CAUSE_ENTRY, ())
        if sources is None:
            return None
        return jsonable(
            {
                "format": CAUSE_STORE_FORMAT,
                "kind": kind,
                "sources": sources,
                "environment": environment_material(),
                "arithmetic": arithmetic_material(case),
                "case": dataclasses.asdict(case),
                "fixture": fixture.digest(),
                "oracle": _oracle_material(oracle),
                **specific,
            }
        )

    def declared_effects(self, choices: Sequence, case, fixture, oracle, compute: Callable[[], DeclaredEffects]):
        """`compute()` (an implementation's `DeclaredEffects` of `choices` on `case`), or its stored answer."""
        material = self._material(
            "declared_effects", case, fixture, oracle, choices=[dataclasses.asdict(c) for c in choices]
        )
        if material is None:
            return compute()
        payload = self.store.load(material)
        if payload is not None:
            return DeclaredEffects(**json.loads(payload))
        effects = compute()
        self.store.save(material, json.dumps(dataclasses.asdict(effects)).encode())
        return effects

    def causes(
        self,
        rows: Sequence[dict],
        case,
        fixture,
        oracle,
        candidate_leaves: Mapping[str, Mapping[str, np.ndarray]],
        candidate_sensitivity: Mapping[str, Mapping],
        compute: Callable[[], list[dict]],
    ) -> list[dict]:
        """`compute()` (`annotate_causes` of `rows`), or `rows` with the stored cause fields set.

        A case without a row that needs a cause is computed (nothing to compute), not looked up.
        """
        if not rows_needing_causes(rows, candidate_leaves, oracle.leaves):
            return compute()
        material = self._material(
            "causes",
            case,
            fixture,
            oracle,
            rows=[{k: v for k, v in row.items() if k not in TIMING_COLUMNS} for row in rows],
            candidates={path: arrays_digest(leaves) for path, leaves in sorted(candidate_leaves.items())},
            candidate_sensitivity={
                path: {leaf: s.as_dict() for leaf, s in sorted(widened.items())}
                for path, widened in sorted(candidate_sensitivity.items())
            },
        )
        if material is None:
            return compute()
        payload = self.store.load(material)
        if payload is not None:
            annotated = list(rows)
            for index, fields in json.loads(payload):
                annotated[index] = {**annotated[index], **fields}
            return annotated
        annotated = compute()
        changes = self._changes(rows, annotated)
        if changes is not None:
            self.store.save(material, json.dumps(changes).encode())
        return annotated

    @staticmethod
    def _changes(rows: Sequence[dict], annotated: Sequence[dict]) -> list | None:
        """[[row index, its cause fields], ...] for the rows `annotated` changed, or None where it
        changed anything else (then nothing is stored: the answer would not be the fields alone)."""
        if len(rows) != len(annotated):
            return None
        changes = []
        for index, (before, after) in enumerate(zip(rows, annotated)):
            if after is before:
                continue
            if any(not _same(before.get(k), after.get(k)) for k in set(before) | set(after) if k not in CAUSE_FIELDS):
                return None
            changes.append([index, {k: jsonable(after[k]) for k in CAUSE_FIELDS if k in after}])
        return changes

    def counts(self) -> dict[str, int]:
        return {"causes_stored_loaded": self.store.hits, "causes_stored_missed": self.store.misses}
