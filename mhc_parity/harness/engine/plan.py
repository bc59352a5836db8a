"""The matrix a run will make, known before anything is computed: every path, comparison and leaf (with
its dtype) of the selected cases, so that a `--paths` glob selecting nothing, a comparison the policy
has no rule for, or a case this machine will not compute (`numbers_refusal`) is known up front. Leaf
dtypes: the forward leaves' are the operation's, `d_x`'s the activation dtype, every other
gradient's its primal's (`expected_layout`)."""

from __future__ import annotations

import dataclasses
import fnmatch
from collections.abc import Iterable, Sequence

import jax

from mhc_parity.cases.branches import get_branch
from mhc_parity.cases.fixtures import expected_layout
from mhc_parity.cases.names import did_you_mean
from mhc_parity.cases.spec import TPU_TAG
from mhc_parity.harness.engine.compile_rows import compile_names_for
from mhc_parity.harness.engine.devices import host_device_shortfall, host_fallback, mesh_size
from mhc_parity.harness.engine.implementations import REFERENCE, Implementation, is_builtin
from mhc_parity.harness.engine.leaves import branch_leaf, leaf_kind, weight_leaf
from mhc_parity.harness.engine.lowering_rows import case_meshes, implementation_lowering_name, lowering_path_name
from mhc_parity.harness.engine.operation import OPERATION
from mhc_parity.harness.engine.paths import ORACLE_PATH, Path
from mhc_parity.harness.env import device_count_advice
from mhc_parity.harness.judging.policy import Policy, PolicyError
from mhc_parity.records.path_names import implementation_glob


@dataclasses.dataclass(frozen=True)
class PathPlan:
    """Which implementations and paths run: implementations in order, path-name globs; lowering:
    the TPU lowering rows; causes: name the failing rows' causes (`mhc_parity.harness.engine.causes`)."""

    implementations: tuple[Implementation, ...]
    path_globs: tuple[str, ...] = ("*",)
    lowering: bool = True
    causes: bool = True

    def selects(self, path_name: str) -> bool:
        return any(fnmatch.fnmatchcase(path_name, g) for g in self.path_globs)

    def all_paths_for(self, case) -> list[Path]:
        """Every path of the case, selected or not: each implementation unsharded, then sharded. Where the
        accelerator has too few devices, the sharded paths of implementations that run anywhere move to the
        host CPU with their unsharded host twin (`devices`); Mosaic's sharded path stays, to be skipped."""
        paths = [Path(impl, None) for impl in self.implementations]
        if case.mesh is not None:
            mesh = tuple(case.mesh)
            if host_fallback(mesh[0] * mesh[1]):
                paths += [Path(impl, None, host=True) for impl in self.implementations if impl.runs_on_host]
                paths += [Path(impl, mesh, host=impl.runs_on_host) for impl in self.implementations]
            else:
                paths += [Path(impl, mesh) for impl in self.implementations]
        return paths

    def paths_for(self, case) -> list[Path]:
        """The case's selected paths (see `all_paths_for`)."""
        return [p for p in self.all_paths_for(case) if self.selects(p.name)]

    def needs_numbers(self, case) -> bool:
        """Whether the case's rows need its fixture, its oracle answer and their memory: some
        selected path (not only lowering and compile rows) that this machine does not refuse
        (`numbers_refusal`)."""
        return bool(self.paths_for(case)) and not numbers_refusal(case)

    def lowering_names_for(self, case) -> list[str]:
        """The case's lowering and compile row candidates, selected or not (none without `lowering`): this
        project's kernels', those of each implementation that lowers its own, then the compile rows'."""
        if not self.lowering:
            return []
        meshes = case_meshes(case)
        names = [lowering_path_name(mesh) for mesh in meshes]
        for impl in self.implementations:
            if impl.lower is not None:
                names += [implementation_lowering_name(impl.name, mesh) for mesh in meshes]
        return names + compile_names_for(case, self.implementations)

    def compiles(self, case) -> bool:
        """Whether the case gets compile rows in this plan (`mhc_parity.harness.engine.compile_rows`)."""
        return self.lowering and bool(compile_names_for(case))

    def known_names(self, cases: Iterable) -> list[str]:
        """Every path and lowering name the cases could produce, in first-seen order."""
        names: dict[str, None] = {}
        for case in cases:
            names.update(dict.fromkeys(p.name for p in self.all_paths_for(case)))
            names.update(dict.fromkeys(self.lowering_names_for(case)))
        return list(names)

    def selected_names(self, cases: Iterable) -> list[str]:
        """The path and lowering names this plan runs for the cases."""
        return [name for name in self.known_names(cases) if self.selects(name)]


def numbers_refusal(case) -> str:
    """Why this process computes none of `case`'s numbers ("" where it does): a `tpu`-tagged case off a
    TPU, where its paths would run in interpret mode. Its paths are then `skip` rows with this reason;
    its lowering and compile rows are made on any host."""
    if TPU_TAG not in case.all_tags:
        return ""
    backend = jax.default_backend()
    if backend == "tpu":
        return ""
    return (
        f"case is tagged {TPU_TAG!r} (only worth running with compiled kernels): its numbers are computed on a TPU, "
        f"and this process runs on {backend}; its lowering and compile rows are made here"
    )


def comparisons_of(path: Path, planned: Sequence[Path]) -> list[tuple[str, str]]:
    """(comparison, partner name) pairs `path` is the candidate of, among `planned` paths:
    the oracle; this project's reference; the implementation's own `partner` (also a
    `vs_reference` row, told apart by its partner column); itself unsharded."""
    names = {p.name for p in planned}
    pairs = [("vs_oracle", ORACLE_PATH)]
    reference = Path(REFERENCE, path.mesh, path.host)
    if path.impl.name != REFERENCE.name and reference.name in names:
        pairs.append(("vs_reference", reference.name))
    if path.impl.partner:  # its own project's reference, judged like this project's
        partner = Path(Implementation(path.impl.partner), path.mesh, path.host)
        if partner.name in names:
            pairs.append(("vs_reference", partner.name))
    if path.mesh is not None and path.unsharded.name in names:
        pairs.append(("vs_unsharded", path.unsharded.name))
    return pairs


def compiler_of(path: Path) -> str:
    """Who compiles the path's primitives: "mosaic" (this project's kernels compiled for the
    accelerator), "xla" (the reference, or the kernels in interpret mode, on the default backend),
    "host" (a path moved to the host CPU) or "unknown" (an external implementation: whether it
    runs Pallas kernels, and how, is its own)."""
    if path.host:
        return "host"
    if not is_builtin(path.impl):
        return "unknown"
    return "mosaic" if path.impl.kernel and not path.impl.interpret else "xla"


def mosaic_xla_pair(candidate: Path, partner: Path | None) -> bool:
    """Whether a comparison sets a Mosaic kernel path against an XLA path on the same backend, which
    differ only by the primitives the two compile differently
    (`mhc_parity.harness.engine.oracle_path.OracleOutputs.kernel_pair`). partner None: the oracle."""
    return partner is not None and {compiler_of(candidate), compiler_of(partner)} == {"mosaic", "xla"}


def planned_leaves(case) -> dict[str, str]:
    """Leaf name -> dtype name of every leaf a path of `case` produces (module docstring)."""
    layout = expected_layout(case)
    act_dtype = layout["x"][0]
    leaves = OPERATION.forward_leaf_dtypes(act_dtype)
    leaves["d_x"] = act_dtype
    for role, (dtype, _) in layout.items():
        group, _, name = role.partition(".")
        if group == "weights":
            leaves[weight_leaf(name)] = dtype
        elif group == "branch":
            leaves[branch_leaf(name)] = dtype
    return leaves


def unmatched_path_globs(plan: PathPlan, cases: Sequence) -> list[str]:
    """One message per `--paths` glob that selects no path of `cases` (with a hint)."""
    known = plan.known_names(cases)
    # Hints also offer "impl/*", the usual way to pick one implementation.
    suggestions = known + list(dict.fromkeys(implementation_glob(name.split("/", 1)[0]) for name in known))
    problems = []
    for glob in plan.path_globs:
        if any(fnmatch.fnmatchcase(name, glob) for name in known):
            continue
        hint = did_you_mean(glob, suggestions)
        if glob.split("/", 1)[0] == ORACLE_PATH:
            hint = "; the oracle is not a path: it always runs as every path's reference point"
        problems.append(
            f"--paths {glob!r} selects no path of the selected cases{hint} (their paths: {', '.join(known)})"
        )
    return problems


def device_shortfalls(plan: PathPlan, cases: Sequence) -> list[str]:
    """One message per selected path of `cases` this process lacks the CPU devices for
    (`mhc_parity.harness.engine.devices.host_device_shortfall`): its runner would skip it, and a
    run of fewer rows must not pass for a whole one. A case whose numbers this machine refuses
    (`numbers_refusal`) runs no path, so it lacks nothing."""
    problems = []
    for case in cases:
        for path in plan.paths_for(case) if plan.needs_numbers(case) else ():
            lacking = host_device_shortfall(path)
            if lacking:
                needed = mesh_size(path)
                problems.append(
                    f"{case.name}: {path.name} needs {needed} devices; {device_count_advice(needed, needed - lacking)}"
                )
    return problems


@dataclasses.dataclass(frozen=True)
class JudgementKey:
    """One kind of judgement a run makes: what the policy is asked to resolve."""

    comparison: str
    partitioning: str
    act_dtype: str
    dtype: str
    leaf_kind: str

    def resolve(self, policy: Policy):
        """The policy's `Resolved` bound for this key (PolicyError if it has none)."""
        return policy.resolve(
            comparison=self.comparison,
            leaf_kind=self.leaf_kind,
            dtype=self.dtype,
            act_dtype=self.act_dtype,
            partitioning=self.partitioning,
        )


def planned_judgements(cases: Sequence, plan: PathPlan) -> list[JudgementKey]:
    """Every kind of judgement the plan makes for `cases`, in first-seen order. Paths an implementation
    skips for a case are left out, paths skipped for the machine (mosaic off a TPU) kept: the same on
    every machine."""
    keys: dict[JudgementKey, None] = {}
    for case in cases:
        paths = plan.paths_for(case)
        leaves = planned_leaves(case)
        elementwise = get_branch(case.branch).elementwise
        for path in paths:
            if path.impl.case_skip_reason(case) or path.impl.envelope_reason(case, path.mesh):
                continue
            partitioning = path.impl.partitioning(elementwise)
            for comparison, _ in comparisons_of(path, paths):
                for leaf, dtype in leaves.items():
                    keys[JudgementKey(comparison, partitioning, case.dtype, dtype, leaf_kind(leaf))] = None
    return list(keys)


def uncovered_judgements(policy: Policy, cases: Sequence, plan: PathPlan) -> list[str]:
    """One message per kind of judgement the run would make that `policy` has no unique rule for."""
    problems = []
    for key in planned_judgements(cases, plan):
        try:
            key.resolve(policy)
        except PolicyError as exc:
            problems.append(str(exc))
    return problems
