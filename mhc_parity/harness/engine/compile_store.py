"""TPU compile results on disk, so a warm run neither lowers nor compiles: `compiled` keys one program's
result by its lowered module's text, the target and the environment (the compiler's versions and
settings among it; open while code is patched: the key is the content); `results` keys a (case,
target, mesh)'s results by sources, like the lowering results."""

from __future__ import annotations

import dataclasses
import hashlib
import json

from mhc_parity.harness.engine.compile_rows import CompileResult
from mhc_parity.harness.engine.operation import OPERATION
from mhc_parity.harness.engine.program_store import LOWERING_ENTRY, STORE_FORMAT, stored_results
from mhc_parity.harness.engine.store_keys import environment_material, implementation_case_material
from mhc_parity.records.artifact_store import ArtifactStore
from mhc_parity.records.cache_root import cache_root

# The programs' code and what compiles them into rows.
COMPILE_ENTRY = (*LOWERING_ENTRY, "mhc_parity.harness.engine.compile_rows")


def _encode(results: list[CompileResult]) -> bytes:
    return json.dumps([dataclasses.asdict(r) for r in results]).encode()


def _decode(payload: bytes) -> list[CompileResult]:
    return [CompileResult(**fields) for fields in json.loads(payload)]


class CompileStore:
    """TPU compile results (module docstring); `counts()` for the run's metadata."""

    def __init__(self, folder=None):
        root = folder if folder is not None else cache_root()
        self.programs = ArtifactStore(root / "tpu_compiles", "tpu-compile", open_while_code_patched=True)
        self.runs = ArtifactStore(root / "tpu_compile_runs", "tpu-compile-run")

    def compiled(self, text: str, target: dict, compute) -> CompileResult:
        """The result of compiling the module `text` for `target` (`compile_rows.target_key`);
        `compute()` compiles it on a miss."""
        material = {
            "format": STORE_FORMAT,
            "module": hashlib.sha256(text.encode()).hexdigest(),
            "target": target,
            "environment": environment_material(),
        }
        payload = self.programs.load(material)
        if payload is not None:
            (stored,) = _decode(payload)
            return dataclasses.replace(stored, seconds=0.0)
        result = compute()
        self.programs.save(material, _encode([result]))
        return result

    def results(self, arguments: dict, compute) -> list[CompileResult]:
        """Every program's result for the JSON-able `arguments` they are built from; `compute()`
        lowers and compiles them (through `compiled`) on a miss. A hit's `seconds` is this
        lookup's share of the load time."""
        material = {"arguments": arguments}
        traced = (COMPILE_ENTRY, OPERATION.ORACLE_MODULES)
        return stored_results(self.runs, material, traced, CompileResult, compute)

    def implementation_results(self, impl, case, target: dict, compute) -> list[CompileResult]:
        """`results` for an implementation's own programs (`kernel_programs`), keyed by what it is
        (`implementation_material`) and the case; computed, not stored, where its code cannot be read."""
        material = implementation_case_material(impl, case)
        if material is None:
            return compute()
        return self.results({**material, **target}, compute)

    def counts(self) -> dict[str, int]:
        return {
            "tpu_compiles_stored_loaded": self.programs.hits,
            "tpu_compiles_stored_missed": self.programs.misses,
            "tpu_compile_runs_stored_loaded": self.runs.hits,
            "tpu_compile_runs_stored_missed": self.runs.misses,
        }
