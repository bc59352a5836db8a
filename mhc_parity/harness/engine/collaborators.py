"""What a `Runner` works with besides its policy, as one declared bundle (`Collaborators`): where
fixtures, oracle answers and compiled programs come from, the stores of earlier results, the causes'
hypotheses and the rows another run recorded. What a collaborator can do beyond the required is
declared on its type (`OracleSource`, `PathPrograms`), so the runner never probes for it."""

from __future__ import annotations

import concurrent.futures
import dataclasses
from collections.abc import Callable, Sequence
from typing import Protocol

from mhc_parity.cases.fixtures import make_fixture
from mhc_parity.harness.engine.cause_store import CauseStore
from mhc_parity.harness.engine.causes import HypothesisOracle
from mhc_parity.harness.engine.comparison_store import ComparisonStore
from mhc_parity.harness.engine.compile_store import CompileStore
from mhc_parity.harness.engine.oracle_cache import OracleCache
from mhc_parity.harness.engine.oracle_path import OracleOutputs
from mhc_parity.harness.engine.oracle_process import compute_apart
from mhc_parity.harness.engine.paths import Path, PathOutputs
from mhc_parity.harness.engine.program_cache import ProgramCache
from mhc_parity.harness.engine.program_store import LoweringStore

# Asked (case, candidate path, comparison, partner path or None for the oracle) before a
# comparison is made: the rows another run of the case made for it, if they are this run's
# too (the kill matrix's clean rows, where a perturbation changes neither path), else None.
RecordedRows = Callable[[object, Path, str, Path | None], Sequence[dict] | None]


def no_recorded_rows(case, candidate: Path, comparison: str, partner: Path | None) -> None:
    """`RecordedRows` of a run that makes every comparison itself."""
    return None


class OracleSource(Protocol):
    """`oracle(case, fixture)`: the case's float64 answer; thread-safe where `Runner.run` asks it
    ahead. `counts()`: its lookups for the run's metadata (`OracleCache`'s; {} for none)."""

    def __call__(self, case, fixture) -> OracleOutputs: ...

    def counts(self) -> dict[str, int]: ...


@dataclasses.dataclass(frozen=True)
class OracleFunction:
    """An oracle given as a plain `function(case, fixture)`: it answers every call, nothing is counted."""

    function: Callable[[object, object], OracleOutputs]

    def __call__(self, case, fixture) -> OracleOutputs:
        return self.function(case, fixture)

    def counts(self) -> dict[str, int]:
        return {}


class PathPrograms(Protocol):
    """Where the runner gets each path's outputs (`ProgramCache`): `prepare` compiles what a case's
    paths need, `run` runs one path. Capabilities, declared by the type: `compiles_ahead` (then
    `compile_ahead` and `settle_pending` work, and `Runner.run` obtains the next cases' programs in a
    pool), `times_on_device` (then `device_time` times a path's program alone on an accelerator).
    `counts()`: its store's lookups for the run's metadata."""

    compiles_ahead: bool
    times_on_device: bool

    def prepare(self, paths: Sequence[Path], case, fixture) -> None: ...

    def run(self, path: Path, case, fixture) -> PathOutputs: ...

    def compile_ahead(self, pool: concurrent.futures.Executor, paths: Sequence[Path], case, fixture) -> None: ...

    def settle_pending(self, *, grace_s: float = 0.0) -> None: ...

    def device_time(self, path: Path, case, fixture) -> tuple[float, int]: ...

    def counts(self) -> dict[str, int | float]: ...


class RunOnlyPrograms:
    """A base for `PathPrograms` that only prepare and run (the kill matrix's recording caches):
    nothing compiled ahead (`Runner.run` takes one case at a time), nothing timed alone (every
    path keeps its first call's time), nothing counted. Subclasses define `prepare` and `run`."""

    compiles_ahead = False
    times_on_device = False

    def compile_ahead(self, pool, paths, case, fixture) -> None:
        raise NotImplementedError(f"{type(self).__name__} declares compiles_ahead False")

    def settle_pending(self, *, grace_s: float = 0.0) -> None:
        raise NotImplementedError(f"{type(self).__name__} declares compiles_ahead False")

    def device_time(self, path, case, fixture) -> tuple[float, int]:
        raise NotImplementedError(f"{type(self).__name__} declares times_on_device False")

    def counts(self) -> dict[str, int | float]:
        return {}


def _default_oracle() -> OracleCache:
    return OracleCache(apart=compute_apart)


@dataclasses.dataclass(frozen=True)
class Collaborators:
    """A runner's collaborators. fixture_loader(case) -> Fixture and oracle: `make_fixture` and an
    `OracleCache` computing large answers apart, both cached on disk by content. programs: a
    `ProgramCache` without a disk store. lowering_store, compile_store, cause_store, comparison_store:
    earlier results reused where given (None: computed every time). hypotheses: the causes'
    hypotheses (the kill matrix shares one across a case's passes). recorded_rows: see `RecordedRows`.
    `Runner.with_disk_stores` gives a parity run's."""

    fixture_loader: Callable = make_fixture
    oracle: OracleSource = dataclasses.field(default_factory=_default_oracle)
    programs: PathPrograms = dataclasses.field(default_factory=ProgramCache)
    lowering_store: LoweringStore | None = None
    compile_store: CompileStore | None = None
    cause_store: CauseStore | None = None
    comparison_store: ComparisonStore | None = None
    hypotheses: HypothesisOracle = dataclasses.field(default_factory=HypothesisOracle)
    recorded_rows: RecordedRows = no_recorded_rows

    def counts(self) -> dict[str, int | float]:
        """The oracle's lookups, then the program, lowering, compile, cause and comparison stores'."""
        counts = {**self.oracle.counts(), **self.programs.counts()}
        for store in (self.lowering_store, self.compile_store, self.cause_store, self.comparison_store):
            if store is not None:
                counts.update(store.counts())
        return counts
