"""`mhc-parity merge OUT DIR...`: the run folders of `run --shard K/N` joined into one run.

Every DIR must hold a complete shard of one run: the same selection, request, policy, code and environment
(`ENVIRONMENT_KEYS`, backend terms included: shards under other terms judged other bounds), matmul-precision
settings that agree, shard numbers 1..N once each, each its exact share. Anything else is exit 2 and OUT is
not touched. OUT then gets what one run of the whole selection writes, rows in its case order; exit 0, or 2
where the merged run compared nothing (of an implementation). Never loads JAX.
"""

from __future__ import annotations

import dataclasses
import pathlib
import shlex
import sys
import uuid

from mhc_parity.harness.commands.common import EXIT_OK, Parser, error
from mhc_parity.harness.processes.interrupts import SignalsInterrupt
from mhc_parity.harness.processes.shards import parse_shard, shard_names
from mhc_parity.records.environment import (
    PRECISION_KEY,
    format_precision_record,
    parse_precision_record,
    precision_of,
)
from mhc_parity.records.identity import ENVIRONMENT_KEYS
from mhc_parity.records.manifest import Manifest, ManifestError, foreign_folder_problem, now_iso, read_manifest
from mhc_parity.records.outputs import OutputPathError, WriterLock, cannot_write, writable_folder
from mhc_parity.records.store import RowStore, StoreError
from mhc_parity.reports import ReportInputError
from mhc_parity.reports.causes import uncompared
from mhc_parity.reports.sources import load_run
from mhc_parity.reports.terminal import nothing_compared_message
from mhc_parity.reports.writers import tested_implementations, write_run_folder

# Metadata summed over the shards: the runner's timings (`runner.TIMINGS`, not imported: no JAX
# here) and its work counts.
SUMMED_KEYS = (
    "fixtures_s",
    "oracle_s",
    "paths_s",
    "programs_wait_s",
    "first_calls_s",
    "quiet_wait_s",
    "device_timing_s",
    "effects_s",
    "compare_s",
    "causes_s",
    "lowering_s",
    "compile_s",
    "oracle_computed",
    "oracle_cached",
    "programs_compiled",
    "programs_loaded",
    "programs_stored_loaded",
    "programs_stored_missed",
    "programs_traced_to_key",
    "programs_lowered_to_key",
    "program_keys_s",
    "programs_load_s",
    "programs_trace_s",
    "programs_compile_s",
    "lowerings_stored_loaded",
    "lowerings_stored_missed",
    "tpu_compiles_stored_loaded",
    "tpu_compiles_stored_missed",
    "tpu_compile_runs_stored_loaded",
    "tpu_compile_runs_stored_missed",
    "causes_stored_loaded",
    "causes_stored_missed",
    "comparisons_stored_loaded",
    "comparisons_stored_missed",
    "resumed_cases",
)
# The largest over the shards.
MAXED_KEYS = ("worker_peak_rss_mib",)
# Said by a shard whose cases ran a matmul-precision setting as another (`run_info.precision_metadata`).
PRECISION_NOTE_KEY = "matmul_precision_note"


class MergeError(Exception):
    """Shards that cannot be merged; the message is the one line printed."""


@dataclasses.dataclass(frozen=True)
class ShardRun:
    """One shard's folder: its manifest, report metadata and rows (in run order)."""

    folder: pathlib.Path
    manifest: Manifest
    metadata: dict
    rows: list


def read_shard(folder: pathlib.Path) -> ShardRun:
    try:
        manifest = read_manifest(folder)
        if manifest is None:
            raise MergeError(f"{folder}: no manifest.json (not a run folder)")
        manifest.require_complete(str(folder), folder)
        metadata = load_run(folder).metadata
        rows, found = RowStore(folder).finished()
    except (ManifestError, ReportInputError, StoreError, OSError) as exc:
        raise MergeError(str(exc)) from None
    if not manifest.shard:
        raise MergeError(f"{folder}: a whole run, not a shard (made without --shard K/N)")
    problem = manifest.rows_problem(found)
    if problem:
        raise MergeError(f"{folder}: its row stream does not match its manifest ({problem})")
    return ShardRun(folder, manifest, metadata, rows)


def _agreement_problem(first: ShardRun, other: ShardRun) -> str:
    """Why `other` is not a shard of the same run as `first` ("" if it is)."""
    a, b = first.manifest, other.manifest
    checks = (
        ("shard count", a.shard.split("/")[1], b.shard.split("/")[1]),
        ("selection", a.shard_of, b.shard_of),
        ("selection digest (case specs)", a.shard_of_digest, b.shard_of_digest),
        ("request", a.request, b.request),
        ("policy digest", a.policy_digest, b.policy_digest),
        ("code digest", a.code_digest, b.code_digest),
        *((f"environment {key}", first.metadata.get(key), other.metadata.get(key)) for key in ENVIRONMENT_KEYS),
    )
    for what, mine, theirs in checks:
        if mine != theirs:
            theirs_shown, mine_shown = where_they_differ(str(theirs), str(mine))
            return (
                f"{other.folder} is not a shard of the run in {first.folder}: {what} differs "
                f"({theirs_shown} vs {mine_shown})"
            )
    return ""


def where_they_differ(a: str, b: str, width: int = 60) -> tuple[str, str]:
    """`a` and `b` cut to `width` characters around their first difference ("..." where cut)."""
    first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    start = max(0, first - width // 3)

    def cut(text: str) -> str:
        part = text[start : start + width]
        return ("..." if start else "") + part + ("..." if start + width < len(text) else "")

    return cut(a), cut(b)


def merged_precision(shards: list[ShardRun]) -> str | None:
    """The whole run's matmul-precision record, every setting a shard used with its operand rounding; None
    where no shard records one. MergeError where two shards give one setting different roundings, or one
    records none."""
    if not any(shard.metadata.get(PRECISION_KEY) for shard in shards):
        return None  # legacy shards, none recorded: the merged run records none either
    records = [(shard, precision_of(shard.metadata)) for shard in shards]
    known = [(shard, record) for shard, record in records if record is not None]
    if len(known) < len(records):
        lacking = next(shard for shard, record in records if record is None)
        raise MergeError(f"{lacking.folder}: records no {PRECISION_KEY}, where {known[0][0].folder} does")
    roundings: dict[str, tuple[str, pathlib.Path]] = {}
    for shard, record in known:
        try:
            parsed = parse_precision_record(record)
        except ReportInputError as exc:
            raise MergeError(f"{shard.folder}: {exc}") from None
        for setting, rounding in parsed.items():
            seen, where = roundings.setdefault(setting, (rounding, shard.folder))
            if seen != rounding:
                raise MergeError(
                    f"{shard.folder} is not a shard of the run in {where}: environment {PRECISION_KEY} "
                    f"gives {setting!r} another operand rounding ({rounding} vs {seen})"
                )
    return format_precision_record({setting: rounding for setting, (rounding, _) in roundings.items()})


def check_shards(shards: list[ShardRun]) -> None:
    first = shards[0]
    for other in shards[1:]:
        problem = _agreement_problem(first, other)
        if problem:
            raise MergeError(problem)
    merged_precision(shards)
    count = int(first.manifest.shard.split("/")[1])
    seen: dict[int, pathlib.Path] = {}
    for shard in shards:
        index = parse_shard(shard.manifest.shard).index
        if index in seen:
            raise MergeError(f"shard {shard.manifest.shard} given twice: {seen[index]} and {shard.folder}")
        seen[index] = shard.folder
        expected = shard_names(first.manifest.shard_of, parse_shard(shard.manifest.shard))
        if set(shard.manifest.cases) != expected:
            raise MergeError(
                f"{shard.folder}: holds cases {sorted(shard.manifest.cases)[:3]}..., not exactly "
                f"shard {shard.manifest.shard} of the selection"
            )
    missing = [f"{k}/{count}" for k in range(1, count + 1) if k not in seen]
    if missing:
        raise MergeError(f"shard(s) {', '.join(missing)} missing: {len(shards)} of {count} shards given")


def merged_manifest(shards: list[ShardRun], rows: int, command_line: str) -> Manifest:
    first = shards[0].manifest
    records = {record.case: record for shard in shards for record in shard.manifest.case_records}
    stamp = now_iso()
    return dataclasses.replace(
        first,
        run_id=uuid.uuid4().hex,
        state="complete",
        cases=first.shard_of,
        selection_digest=first.shard_of_digest,
        path_names=tuple(sorted({name for s in shards for name in s.manifest.path_names})),
        command_line=command_line,
        started=min(s.manifest.started for s in shards),
        updated=stamp,
        finished=stamp,
        resumed=(),
        case_records=tuple(records[case] for case in first.shard_of),
        rows=rows,
        reason="",
        shard="",
        shard_of=(),
        shard_of_digest="",
    )


def _in_shard_order(shards: list[ShardRun]) -> list[ShardRun]:
    return sorted(shards, key=lambda s: parse_shard(s.manifest.shard).index)


def merged_metadata(shards: list[ShardRun], command_line: str) -> dict:
    """The first shard's metadata with the times, sums and case count of the whole."""
    metadata = dict(shards[0].metadata)
    for key in ("run_id", "run_state", "run_cases", "selection_digest", "code_digest", "shard"):
        metadata.pop(key, None)  # the merged manifest's identity replaces these
    metadata.update(
        command_line=command_line,
        start_time=min(s.metadata.get("start_time", "") for s in shards),
        end_time=max(s.metadata.get("end_time", "") for s in shards),
        wall_seconds=max(s.metadata.get("wall_seconds", 0.0) for s in shards),
        case_count=len(shards[0].manifest.shard_of),
        merged_shards=", ".join(
            f"{s.manifest.shard} {s.manifest.run_id[:12]} ({s.metadata.get('platform', '')})"
            for s in _in_shard_order(shards)
        ),
    )
    for key, value in ((PRECISION_KEY, merged_precision(shards)), (PRECISION_NOTE_KEY, _joined_notes(shards))):
        metadata.pop(key, None)
        if value:
            metadata[key] = value
    for keys, combine in ((SUMMED_KEYS, lambda values: round(sum(values), 3)), (MAXED_KEYS, max)):
        for key in keys:
            values = [s.metadata[key] for s in shards if key in s.metadata]
            metadata.pop(key, None)
            if values:
                metadata[key] = combine(values)
    return metadata


def _joined_notes(shards: list[ShardRun]) -> str:
    notes = (s.metadata.get(PRECISION_NOTE_KEY) for s in _in_shard_order(shards))
    return "; ".join(dict.fromkeys(note for note in notes if note))


@dataclasses.dataclass(frozen=True)
class Merged:
    """A merged run written: its report paths, and the line saying what it compared nothing of ("" if none)."""

    paths: dict
    nothing_compared: str


def merge(out: pathlib.Path, folders: list[pathlib.Path], command_line: str) -> Merged:
    resolved = {f.resolve() for f in folders}
    if out.resolve() in resolved:
        raise MergeError(f"OUT {out} is one of the shard folders; merge into another folder")
    shards = [read_shard(folder) for folder in folders]
    check_shards(shards)
    try:
        out = writable_folder(out)
    except OutputPathError as exc:
        raise MergeError(f"OUT: {exc}") from None
    problem = foreign_folder_problem(out)
    if problem:
        raise MergeError(f"OUT: {problem}")
    try:
        writer = WriterLock(out, command_line)  # one writer per run folder
    except OutputPathError as exc:  # held by another writer, or not a lock of ours
        raise MergeError(f"OUT: {exc}") from None
    with writer:
        try:
            return _write_merged(out, shards, command_line)
        except OSError as exc:  # a full disk: the folder's manifest says failed (mhc_parity.reports.writers)
            raise MergeError(f"OUT: {cannot_write(exc, out)}") from None


def _write_merged(out: pathlib.Path, shards: list[ShardRun], command_line: str) -> Merged:
    by_case: dict[str, list] = {}
    for shard in shards:
        for row in shard.rows:
            by_case.setdefault(row["case"], []).append(row)
    selection = shards[0].manifest.shard_of
    rows = [row for case in selection for row in by_case.get(case, [])]
    manifest = merged_manifest(shards, len(rows), command_line)
    paths = write_run_folder(out, rows, merged_metadata(shards, command_line), manifest)
    tested = tested_implementations(manifest)
    return Merged(paths, nothing_compared_message(rows, tested) if uncompared(rows, tested) else "")


def main(argv: list[str]) -> int:
    parser = Parser(prog="mhc-parity merge", description="Join the run folders of `run --shard K/N` into one run.")
    parser.add_argument("out", type=pathlib.Path, metavar="OUT", help="folder for the merged run")
    parser.add_argument("shards", type=pathlib.Path, nargs="+", metavar="DIR", help="the shards' run folders")
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    command_line = "mhc-parity merge " + shlex.join(str(a) for a in argv)
    signals = SignalsInterrupt()
    try:
        with signals:
            merged = merge(args.out, list(args.shards), command_line)
    except MergeError as exc:
        return error(str(exc))
    except KeyboardInterrupt:  # the shards are untouched; OUT holds no run a reader accepts
        print(
            f"mhc-parity: interrupted ({signals.name}) while merging; {args.out} holds no usable run. "
            f"Merge again with: {command_line}",
            file=sys.stderr,
        )
        return signals.exit_code
    print(f"merged {len(args.shards)} shard(s) into {args.out}")
    for fmt, path in merged.paths.items():
        print(f"{fmt:>8}: {path}")
    if merged.nothing_compared:
        return error(merged.nothing_compared)
    return EXIT_OK
