"""What each path of a case did (`PathResult`): ran, where, and how long on its device, or why it
gave no outputs; and the status rows (`skip`, `unsupported`, `fail`, `error`) of a path that did not
run or must fail anyway."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence

import jax

from mhc_parity.harness.engine.collaborators import PathPrograms
from mhc_parity.harness.engine.compare import status_row
from mhc_parity.harness.engine.devices import Placement, PlacementError, path_placement, precision_label
from mhc_parity.harness.engine.execution_timing import times_alone
from mhc_parity.harness.engine.failures import error_text, last_frame, out_of_memory, out_of_memory_error
from mhc_parity.harness.engine.interpret_cost import interpret_refusal
from mhc_parity.harness.engine.kernel_blocks import path_blocks
from mhc_parity.harness.engine.paths import Path, PathOutputs
from mhc_parity.harness.engine.plan import comparisons_of
from mhc_parity.harness.engine.quiet import QUIET
from mhc_parity.mhc.common import UnsupportedInputError
from mhc_parity.mhc.precision import device_compute_capability

# How long a case's timing phase waits for the background work under way (the next cases'
# oracle answers and compiles) to end: an oracle at the `tpu` suite's sizes takes minutes. Past
# it (a task stuck in the code under test) the paths keep their first call's time, one run.
QUIET_WAIT_S = 900.0


@dataclasses.dataclass(frozen=True)
class PathResult:
    outputs: PathOutputs | None = None
    verdict: str = ""  # set when the path did not produce outputs (or must fail anyway)
    reason: str = ""
    placement: Placement | None = None  # where it ran (None if it could not be placed)


def skip_reason(path: Path, case) -> str:
    """Why `path` skips `case` ("" where it runs it)."""
    impl = path.impl
    reason = impl.case_skip_reason(case)
    if reason:
        return reason
    if impl.needs_backend and jax.default_backend() != impl.needs_backend:
        return f"{impl.name} needs a {impl.needs_backend} backend; this process runs on {jax.default_backend()}"
    return interpret_refusal(case, path)  # interpret mode at a size too costly to run


def runnable(paths: Sequence[Path], case) -> list[Path]:
    """The paths that do not skip `case` and hold it in their envelope (whose programs are worth compiling)."""
    return [p for p in paths if not skip_reason(p, case) and not p.impl.envelope_reason(case, p.mesh)]


def run_path(programs: PathPrograms, path: Path, case, fixture) -> PathResult:
    """`path` run on `case` (its first call, timed), or why it was not. Memory running out is the
    machine's limit, not the code's: a `ResourceError`, not a result."""
    skip = skip_reason(path, case)
    if skip:
        return PathResult(verdict="skip", reason=skip)
    outside = path.impl.envelope_reason(case, path.mesh)
    if outside:  # declared up front: the implementation is not called
        return PathResult(verdict="unsupported", reason=f"{path.impl.name}: {outside}")
    try:
        placement = path_placement(path)
    except PlacementError as exc:
        return PathResult(verdict="skip", reason=str(exc))
    expects_rejection = case.expects_unsupported and path.impl.case_limits
    try:
        outputs = programs.run(path, case, fixture)
    except UnsupportedInputError as exc:
        return dataclasses.replace(unsupported_result(path, case, exc), placement=placement)
    except Exception as exc:  # reported as an `error` row; the run goes on
        if out_of_memory(exc):  # the machine's limit, not the code's: the run stops (exit 2)
            raise out_of_memory_error(case, path.name, exc) from exc
        return PathResult(
            verdict="error", reason=error_text(exc) + last_frame(exc, path.impl.code_root), placement=placement
        )
    if expects_rejection:
        return PathResult(
            outputs=outputs,
            verdict="fail",
            placement=placement,
            reason=f"{path.impl.name} accepted input the case expects it to reject ({case.expect_reason!r})",
        )
    return PathResult(outputs=outputs, placement=placement)


def unsupported_result(path: Path, case, exc: UnsupportedInputError) -> PathResult:
    """`path` (or the math itself) rejected `case`: `unsupported` where the case expects that rejection."""
    message = str(exc)
    if case.expects_unsupported and case.expect_reason in message:
        return PathResult(verdict="unsupported", reason=message)
    if case.expects_unsupported:
        return PathResult(verdict="fail", reason=f"rejected for another reason than {case.expect_reason!r}: {message}")
    return PathResult(verdict="fail", reason=f"{path.impl.name} rejected a supported case: {message}")


@dataclasses.dataclass(frozen=True)
class TimingPoint:
    """A case whose paths ran (their first calls), its programs waiting to be timed on the device:
    what `Runner.case_steps` yields, to be sent back `results` with the device times (`timed_together`).
    kept_bytes: the host arrays the case holds until it is judged (its paths' leaves and the oracle's)."""

    case: object
    paths: Sequence[Path]
    fixture: object
    results: dict[str, PathResult]
    kept_bytes: int


def timed_together(programs: PathPrograms, points: Sequence[TimingPoint]) -> list[dict[str, PathResult]]:
    """Each point's `results` with the first-call time of each path that ran on an accelerator replaced by
    its device time, with nothing else in the process running (one `QUIET.alone` for all the points: the
    background work under way is waited for once). A path whose timing raises becomes an `error` row;
    where the background work does not end within `QUIET_WAIT_S`, or `programs` cannot time on the
    device, every path keeps its first call's time."""
    timed = [[path for path in point.paths if _times_alone(point.results[path.name])] for point in points]
    if not any(timed) or not programs.times_on_device:
        return [point.results for point in points]
    with QUIET.alone(QUIET_WAIT_S) as quiet:
        if not quiet:
            return [point.results for point in points]
        return [_device_times(programs, point, paths) for point, paths in zip(points, timed)]


def waits_for_device(programs: PathPrograms, point: TimingPoint) -> bool:
    """Whether any of `point`'s paths is timed on the device (`timed_together` does nothing else)."""
    return programs.times_on_device and any(_times_alone(result) for result in point.results.values())


def _times_alone(result: PathResult) -> bool:
    return result.outputs is not None and result.verdict != "fail" and times_alone(result.placement.platform)


def _device_times(programs: PathPrograms, point: TimingPoint, timed: Sequence[Path]) -> dict[str, PathResult]:
    results = dict(point.results)
    for path in timed:
        result = results[path.name]
        try:
            run_s, runs = programs.device_time(path, point.case, point.fixture)
        except Exception as exc:
            if out_of_memory(exc):
                raise out_of_memory_error(point.case, path.name, exc) from exc
            reason = f"timing its program failed: {error_text(exc)}"
            results[path.name] = dataclasses.replace(result, verdict="error", outputs=None, reason=reason)
            continue
        outputs = dataclasses.replace(result.outputs, execute_s=run_s, execute_runs=runs)
        results[path.name] = dataclasses.replace(result, outputs=outputs)
    return results


def environment_fields(case, path: Path, placement: Placement | None) -> dict:
    """The `matmul_precision`, `devices` and `kernel_blocks` columns of a path's rows: the precision it
    effectively ran at on its devices and its kernels' blocks, or, for a path that could not be placed,
    the requested precision and no devices or blocks."""
    if placement is None:
        return {"matmul_precision": case.matmul_precision, "devices": "", "kernel_blocks": ""}
    device = placement.devices[0]
    precision = precision_label(case.matmul_precision, device.platform, device_compute_capability(device))
    blocks = path_blocks(case, path.impl, path.mesh)
    return {"matmul_precision": precision, "devices": placement.label, "kernel_blocks": blocks}


def status_rows(case, path: Path, paths: Sequence[Path], result: PathResult) -> Iterator[dict]:
    """One row per comparison of `path` (`comparisons_of`), each with `result`'s verdict and reason."""
    environment = environment_fields(case, path, result.placement)
    for comparison, partner in comparisons_of(path, paths):
        row = status_row(
            case,
            candidate=path.name,
            partner=partner,
            comparison=comparison,
            verdict=result.verdict,
            reason=result.reason,
        )
        yield {**row, **environment}
