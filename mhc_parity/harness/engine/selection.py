"""What a run asks for (`RunSelection`: `mhc-parity run`'s parser and `mhc_parity.harness.api.prepare`
both build it), checked before any compute (`configure`), and the run's records from it."""

from __future__ import annotations

import dataclasses
import datetime
import pathlib
import time
from typing import Any

from mhc_parity.cases import registry
from mhc_parity.cases.spec import Case, CaseSpecError, normalize_dtype
from mhc_parity.cases.toml_cases import USER_SUITE, register_case_file
from mhc_parity.harness.engine.devices import BackendError, default_devices
from mhc_parity.harness.engine.implementations import (
    BUILTIN,
    Implementation,
    ImplementationError,
    accommodation_record,
    load_externals,
)
from mhc_parity.harness.engine.plan import PathPlan, device_shortfalls, uncovered_judgements, unmatched_path_globs
from mhc_parity.harness.engine.precision_choices import precision_record
from mhc_parity.harness.engine.run_info import identity_environment, run_metadata
from mhc_parity.harness.errors import UsageError
from mhc_parity.harness.judging.policy import Policy, PolicyError
from mhc_parity.harness.judging.policy_file import is_packaged_default, load_policy
from mhc_parity.records.foreign_code import FOREIGN_KEY, code_record, foreign_material
from mhc_parity.records.manifest import Manifest, RunRequest
from mhc_parity.records.run_suite import DEFAULT_SUITE
from mhc_parity.records.text import plural

MAX_SEED = 2**63 - 1  # mhc_parity.cases.spec.Case.seed's range


@dataclasses.dataclass(frozen=True)
class RunSelection:
    """A run's request. implementations: `module:factory` specs, `Implementation`s or the
    objects a factory returns (`mhc_parity.harness.engine.implementations.load_externals`); suite /
    cases (name globs) / tags / dtype select cases (without suite and cases: the "default"
    suite, or the cases of `case_files`); seed replaces every selected case's seed; paths:
    path-name globs; policy: a tolerance TOML (None: the packaged one); lowering: the TPU
    lowering rows; inside_envelope: only the cases inside every implementation's envelope;
    causes: name the failing rows' causes (False: `--no-causes`, an edit loop's cheaper failing run)."""

    implementations: tuple[Any, ...] = ()
    suite: str | None = None
    cases: tuple[str, ...] | None = None
    tags: tuple[str, ...] | None = None
    dtype: str | None = None
    case_files: tuple[pathlib.Path, ...] = ()
    seed: int | None = None
    paths: tuple[str, ...] = ("*",)
    policy: pathlib.Path | None = None
    lowering: bool = True
    inside_envelope: bool = False
    causes: bool = True


@dataclasses.dataclass(frozen=True)
class Configuration:
    """A checked `RunSelection`: the policy, the external implementations loaded, the cases
    selected and the path plan."""

    policy: Policy
    externals: tuple[Implementation, ...]
    cases: tuple[Case, ...]
    plan: PathPlan


def select_cases(selection: RunSelection) -> list[Case]:
    """The cases `selection` asks for, with its seed applied; UsageError for unknown names."""
    reg = registry.fresh_registry()
    try:
        for path in selection.case_files:
            register_case_file(path, reg)
        suite = selection.suite
        if suite is None and selection.cases is None:
            suite = USER_SUITE if selection.case_files else DEFAULT_SUITE
        dtype = normalize_dtype(selection.dtype, field="--dtype") if selection.dtype else None
        selected = reg.select(
            suite=suite,
            names=None if selection.cases is None else list(selection.cases),
            tags=None if selection.tags is None else list(selection.tags),
            dtype=dtype,
        )
    except (CaseSpecError, KeyError, ValueError, OSError) as exc:
        raise UsageError(str(exc)) from exc
    if not selected:
        raise UsageError("no case matches the selection")
    if selection.seed is not None:
        if not 0 <= selection.seed <= MAX_SEED:
            raise UsageError(f"--seed must be an integer in [0, {MAX_SEED}], got {selection.seed}")
        selected = [c.replace(name=f"{c.name}-seed{selection.seed}", seed=selection.seed) for c in selected]
    return selected


def configure(selection: RunSelection) -> Configuration:
    """`selection` checked before any compute; UsageError for a JAX backend that cannot start,
    a selection or path glob that selects nothing, a token-sharded path this process lacks the
    CPU devices for (`device_shortfalls`: it would be skipped), an implementation that does not
    load, a policy without a rule for a comparison the run will make."""
    try:
        default_devices()  # a backend that cannot start (JAX_PLATFORMS) is a usage error, before any run folder
    except BackendError as exc:
        raise UsageError(str(exc)) from None
    try:
        policy = load_policy(selection.policy)
        externals = load_externals(list(selection.implementations))
    except (PolicyError, ImplementationError, OSError) as exc:
        raise UsageError(str(exc)) from exc
    cases = select_cases(selection)
    if selection.inside_envelope:
        cases = inside_envelopes(cases, externals)
    plan = PathPlan(
        implementations=tuple(BUILTIN.values()) + externals,
        path_globs=tuple(selection.paths),
        lowering=selection.lowering,
        causes=selection.causes,
    )
    unmatched = unmatched_path_globs(plan, cases)
    if unmatched:
        raise UsageError(unmatched[0])
    short = device_shortfalls(plan, cases)
    if short:
        more = f" (and {plural(len(short) - 1, 'more path')})" if len(short) > 1 else ""
        raise UsageError(f"{short[0]}{more}")
    uncovered = uncovered_judgements(policy, cases, plan)
    if uncovered:
        raise UsageError(
            f"policy {policy.source} cannot judge {len(uncovered)} kind(s) of comparison this run "
            f"makes; first: {uncovered[0]}"
        )
    return Configuration(policy, tuple(externals), tuple(cases), plan)


def inside_envelopes(cases, externals) -> list[Case]:
    """The cases inside the envelope of every implementation in `externals` (on every path of
    the case: unsharded and on its mesh); UsageError when none is, or none declares one."""
    declared = [impl for impl in externals if impl.envelope is not None]
    if not declared:
        raise UsageError("--inside-envelope: no --impl implementation declares an envelope")
    kept = [case for case in cases if not any(impl.envelope.case_reason(case) for impl in declared)]
    if not kept:
        first = cases[0]
        reason = next(impl.envelope.case_reason(first) for impl in declared if impl.envelope.case_reason(first))
        raise UsageError(f"--inside-envelope: no selected case is inside every envelope (e.g. {first.name}: {reason})")
    return kept


def new_manifest(
    selection: RunSelection,
    configuration: Configuration,
    command_line: str,
    *,
    cases=None,
    shard_label: str = "",
    whole_selection=(),
) -> Manifest:
    """The "running" manifest of the configured run. cases: the cases this run makes (default:
    every configured one); with --shard, `shard_label` and `whole_selection` (every case of
    the selection, of which `cases` is one share)."""
    cases = configuration.cases if cases is None else cases
    externals = configuration.externals
    request = RunRequest(
        suite=selection.suite,
        case_globs=selection.cases,
        tags=selection.tags,
        dtype=selection.dtype,
        case_files=tuple(str(p) for p in selection.case_files),
        seed=selection.seed,
        paths=tuple(selection.paths),
        implementations=tuple((impl.name, impl.spec) for impl in externals),
        lowering=selection.lowering,
        inside_envelope=selection.inside_envelope,
    )
    return Manifest.new(
        request=request,
        cases=cases,
        path_names=configuration.plan.selected_names(cases),
        policy=configuration.policy,
        extra_code_files=implementations_code(externals),
        command_line=command_line,
        shard=shard_label if whole_selection else "",
        shard_of=whole_selection,
        environment=identity_environment(),
    )


def implementations_code(externals) -> dict[str, str]:
    """The external implementations' code as manifest code files, read once per process
    (`mhc_parity.records.foreign_code.code_record`: the stores' keys hold the same record)."""
    files: dict[str, str] = {}
    for impl in externals:
        if impl.source_file:
            module = impl.spec.partition(":")[0] or impl.module
            record = code_record(module, impl.source_file)
            if record is not None:
                files.update(record.files)
    return files


def finished_metadata(manifest, policy, cases, done, runner, wall_start, implementations=()) -> dict:
    """The reports' run metadata: environment, times, policy, suite, timings, the stores' counts, the
    foreign code their keys cover (`stores_keyed_by_foreign_code`: None where none was loaded), and
    the implementations' declared precision choices and accommodations."""
    metadata = run_metadata(cases)
    metadata.update(precision_record(implementations))
    metadata.update(accommodation_record(implementations))
    metadata.update(
        command_line=manifest.command_line,
        start_time=manifest.started,
        end_time=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        wall_seconds=round(time.perf_counter() - wall_start, 3),
        policy_file=str(policy.source),
        policy_hash=policy.digest,
        policy_is_default=is_packaged_default(policy),  # the reports say so when it is not
        suite=manifest.request.suite or "",
        case_count=len(cases),
        resumed_cases=len(done),
        jobs=getattr(runner, "jobs", 1),
        **{name: round(seconds, 3) for name, seconds in runner.timings.items()},
        **runner.work_counts(),
        stores_keyed_by_foreign_code=(foreign_material() or {}).get(FOREIGN_KEY),
    )
    return metadata
