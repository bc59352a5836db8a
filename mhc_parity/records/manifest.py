"""The run manifest (`manifest.json`): what a run folder holds and whether it can be trusted.

The runner writes it first ("running"), records each finished case (`CaseRecord`: row count and digest), writes the
reports (`REPORT_FILES`) and finishes it last ("complete"); Ctrl-C or SIGTERM make it "interrupted", a full disk or
exhausted memory "failed", a kill -9 leaves "running". Readers (`mhc_parity.reports.sources.load_run`) accept only a
complete manifest whose report has the same run id and exactly the recorded rows.

It records the request (`RunRequest`), the selected case names and `selection_digest` over their full specs, the planned
path names, the policy, the sha256 of every source under test and the environment; `--resume` refuses a request whose
`differences` are not empty. Plain Python: `mhc_parity/reports/` reads it too.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import hashlib
import json
import pathlib
import shlex
import uuid
from collections.abc import Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import Any

from mhc_parity.records.files import atomic_write
from mhc_parity.records.identity import Identity, Selection, environment_record, few_names, shown_value
from mhc_parity.records.outputs import WRITER_LOCK_FILE
from mhc_parity.records.project_code import code_files, current_sha256, digest_of, in_code_dirs, project_code_files
from mhc_parity.records.space_reserve import RESERVE_FILE, release_reserve

MANIFEST_FILE = "manifest.json"
MANIFEST_FORMAT = "mhc-parity-manifest"
# Version 2 records each finished case's row count and digest (`CaseRecord`); a version-1
# manifest cannot vouch for its rows and is refused.
MANIFEST_VERSION = 2
# The reports a complete run writes (the one list of their names: mhc_parity.reports.writers uses it).
REPORT_FILES = {
    "csv": "rows.csv",
    "json": "report.json",
    "html": "report.html",
    "markdown": "summary.md",
    "speed": "speed.csv",
}

RUNNING, COMPLETE, INTERRUPTED, FAILED = "running", "complete", "interrupted", "failed"
STATES = (RUNNING, COMPLETE, INTERRUPTED, FAILED)
SHORT_DIGEST = 12
# The commands that continue a run with --resume (a manifest records its command line).
RESUMABLE_COMMANDS = ("mhc-parity run ", "mhc-parity baseline ")


class ManifestError(ValueError):
    """A run folder without a usable manifest, or with one that is not complete."""


def now_iso() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def selection_digest(cases: Sequence) -> str:
    """sha256 over the full specs of the selected cases, in order (frozen dataclasses)."""
    specs = [dataclasses.asdict(case) for case in cases]
    return hashlib.sha256(json.dumps(specs, sort_keys=True).encode()).hexdigest()


@dataclasses.dataclass(frozen=True)
class RunRequest:
    """What `mhc-parity run` was asked, as given. implementations: (name, MODULE:FACTORY) of each `--impl`, in order."""

    suite: str | None
    case_globs: tuple[str, ...] | None
    tags: tuple[str, ...] | None
    dtype: str | None
    case_files: tuple[str, ...]
    seed: int | None
    paths: tuple[str, ...]
    implementations: tuple[tuple[str, str], ...]
    lowering: bool
    inside_envelope: bool = False

    def to_json(self) -> dict:
        return {
            **dataclasses.asdict(self),
            "implementations": [{"name": name, "spec": spec} for name, spec in self.implementations],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RunRequest:
        def optional_tuple(value):
            return None if value is None else tuple(value)

        return cls(
            suite=data["suite"],
            case_globs=optional_tuple(data["case_globs"]),
            tags=optional_tuple(data["tags"]),
            dtype=data["dtype"],
            case_files=tuple(data["case_files"]),
            seed=data["seed"],
            paths=tuple(data["paths"]),
            implementations=tuple((i["name"], i["spec"]) for i in data["implementations"]),
            lowering=bool(data["lowering"]),
            inside_envelope=bool(data.get("inside_envelope", False)),  # not recorded before it was asked
        )


@dataclasses.dataclass(frozen=True)
class CaseRecord:
    """A finished case as the manifest vouches for it: row count and sha256 over its rows in canonical form
    (`mhc_parity.records.store.case_records`)."""

    case: str
    rows: int
    digest: str

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CaseRecord:
        record = cls(case=str(data["case"]), rows=data["rows"], digest=str(data["digest"]))
        if isinstance(record.rows, bool) or not isinstance(record.rows, int) or record.rows < 0:
            raise ValueError(f"case {record.case!r}: row count {record.rows!r} is not a count")
        return record


@dataclasses.dataclass(frozen=True)
class Manifest:
    """run_id: random, kept across --resume. state: one of `STATES` (`reason` when interrupted or failed). cases:
    selected names in run order. path_names: planned path and lowering names. code_files: (path, sha256) of every source
    under test. case_records: in the order cases finished. rows: set once complete. resumed: when each --resume started.
    Times are ISO 8601 UTC."""

    run_id: str
    state: str
    request: RunRequest
    cases: tuple[str, ...]
    selection_digest: str
    path_names: tuple[str, ...]
    policy_source: str
    policy_digest: str
    code_digest: str
    code_files: tuple[tuple[str, str], ...]
    command_line: str
    started: str
    updated: str
    finished: str = ""
    resumed: tuple[str, ...] = ()
    case_records: tuple[CaseRecord, ...] = ()
    rows: int | None = None
    reason: str = ""
    # A `--shard K/N` run: "K/N" and the whole selection (names, digest); "" and () for a whole run.
    shard: str = ""
    shard_of: tuple[str, ...] = ()
    shard_of_digest: str = ""
    # `identity.environment_record` at the start; () in manifests older than it.
    environment: tuple[tuple[str, str], ...] = ()

    @classmethod
    def new(
        cls,
        *,
        request: RunRequest,
        cases: Sequence,
        path_names: Iterable[str],
        policy,
        extra_code_files: Mapping[str, str] = MappingProxyType({}),
        command_line: str,
        shard: str = "",
        shard_of: Sequence = (),
        environment: Mapping[str, Any] = MappingProxyType({}),
    ) -> Manifest:
        """A fresh "running" manifest for `cases` (Case objects) under `policy`. shard: "K/N" when `cases` are shard K
        of N of `shard_of` (Case objects); extra_code_files: external implementations' code; environment:
        `run_info.identity_environment`."""
        files = code_files(extra_code_files)
        stamp = now_iso()
        return cls(
            run_id=uuid.uuid4().hex,
            state=RUNNING,
            request=request,
            cases=tuple(c.name for c in cases),
            selection_digest=selection_digest(cases),
            path_names=tuple(sorted(set(path_names))),
            policy_source=str(policy.source),
            policy_digest=policy.digest,
            code_digest=digest_of(files),
            code_files=tuple(files.items()),
            command_line=command_line,
            started=stamp,
            updated=stamp,
            shard=shard,
            shard_of=tuple(c.name for c in shard_of),
            shard_of_digest=selection_digest(shard_of) if shard else "",
            environment=environment_record(environment) if environment else (),
        )

    # -- state transitions -----------------------------------------------------------

    def resumed_as(self, new: Manifest) -> Manifest:
        """This run, running again under `new`'s command line (once `differences(new)` is empty)."""
        stamp = now_iso()
        return dataclasses.replace(
            self,
            state=RUNNING,
            command_line=new.command_line,
            updated=stamp,
            finished="",
            resumed=self.resumed + (stamp,),
            rows=None,
            reason="",
        )

    def with_case(self, record: CaseRecord) -> Manifest:
        return dataclasses.replace(self, case_records=self.case_records + (record,), updated=now_iso())

    def with_cases(self, records: Iterable[CaseRecord]) -> Manifest:
        """This run with exactly `records` finished (a resume keeps those its stream still holds)."""
        return dataclasses.replace(self, case_records=tuple(records), updated=now_iso())

    def completed(self, rows: int) -> Manifest:
        stamp = now_iso()
        return dataclasses.replace(self, state=COMPLETE, rows=rows, updated=stamp, finished=stamp)

    def interrupted(self, reason: str) -> Manifest:
        return dataclasses.replace(self, state=INTERRUPTED, reason=reason, updated=now_iso())

    def failed(self, reason: str) -> Manifest:
        """Stopped by what the machine lacked (disk space, memory): resumable once it is there."""
        return dataclasses.replace(self, state=FAILED, reason=reason, updated=now_iso())

    # -- checks ----------------------------------------------------------------------

    @property
    def cases_done(self) -> int:
        return len(self.case_records)

    @property
    def is_complete(self) -> bool:
        return (
            self.state == COMPLETE
            and self.rows is not None
            and [r.case for r in self.case_records] == list(self.cases)
            and sum(r.rows for r in self.case_records) == self.rows
        )

    def progress_text(self) -> str:
        """e.g. "interrupted (SIGINT), 2 of 6 cases done"."""
        if self.state == RUNNING:
            state = "running, or killed"  # a kill -9 cannot update the manifest
        else:
            state = self.state + (f" ({self.reason})" if self.reason else "")
        return f"{state}, {self.cases_done} of {len(self.cases)} cases done"

    def resume_command(self, folder: str | pathlib.Path | None = None) -> str:
        """The command that finishes this run: its own, with --resume where it takes one (`RESUMABLE_COMMANDS`; others
        rerun as they were); folder: the run's current folder, given as its `--out`."""
        command = self.command_line
        if not command.startswith(RESUMABLE_COMMANDS):
            return command
        with contextlib.suppress(ValueError):  # unbalanced quotes (an edited manifest): as recorded
            command = command if folder is None else shlex.join(_with_out(shlex.split(command), str(folder)))
        return command if "--resume" in command.split() else f"{command} --resume"

    def require_complete(self, where: str, folder: str | pathlib.Path | None = None) -> None:
        """ManifestError (one line) unless the run finished; folder: where it is now, for the command it names to finish
        it."""
        if self.is_complete:
            return
        if self.state == COMPLETE:
            raise ManifestError(
                f"{where}: its manifest says complete, but its rows ({self.rows}) and case records "
                f"({self.cases_done} of {len(self.cases)} cases) do not add up (an edited manifest?); rerun it"
            )
        raise ManifestError(
            f"{where} holds an unfinished run ({self.progress_text()}); its rows are partial. "
            f"Finish it with `{self.resume_command(folder)}` or rerun it"
        )

    def rows_problem(self, found: Mapping[str, CaseRecord], *, exact: bool = True) -> str:
        """Why the rows `found` (per case, from `store.case_records`) are not those recorded ("" if they are). exact:
        unrecorded cases are a problem too; else they are left for the caller to drop (a resume redoes them: a kill can
        land between a case's rows and its record)."""
        recorded = {r.case: r for r in self.case_records}
        problems = []
        for case, record in recorded.items():
            seen = found.get(case)
            if seen is None:
                problems.append(f"case {case} ({record.rows} rows) is missing")
            elif seen.rows != record.rows:
                problems.append(f"case {case} has {seen.rows} rows, {record.rows} recorded")
            elif seen.digest != record.digest:
                problems.append(f"case {case}: its {seen.rows} rows differ from the recorded ones")
        if exact:
            strangers = [case for case in found if case not in recorded]
            if strangers:
                problems.append(f"rows of cases it did not record: {few_names(strangers)}")
        if not problems:
            return ""
        more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
        return problems[0] + more

    def changed_code_files(self) -> list[str]:
        """Recorded code that differs now: files under `CODE_DIRS` edited, added or removed, and other recorded files or
        distributions changed or gone."""
        recorded = dict(self.code_files)
        project = {k: v for k, v in recorded.items() if in_code_dirs(k)}
        current = project_code_files()
        changed = {k for k in project.keys() | current.keys() if project.get(k) != current.get(k)}
        changed |= {k for k, v in recorded.items() if k not in project and current_sha256(k) != v}
        return sorted(changed)

    def identity(self) -> Identity:
        return Identity(
            code=self.code_digest,
            policy=self.policy_digest,
            selection=Selection.of_manifest(self),
            selection_digest=self.selection_digest,
            environment=self.environment,
            code_files=self.code_files,
        )

    def differences(self, other: Manifest) -> list[str]:
        """Why `other` (a new request) is not this run, one phrase each ([] if none): the identities' differences, then
        the shard, seed and paths."""
        found = self.identity().differences(other.identity())
        if self.shard != other.shard:
            found.append(f"shard: {self.shard or 'none'} -> {other.shard or 'none'}")
        for name in ("seed", "paths"):
            before, after = getattr(self.request, name), getattr(other.request, name)
            if before != after:
                found.append(f"{name}: {shown_value(before)} -> {shown_value(after)}")
        return found

    # -- JSON ------------------------------------------------------------------------

    def to_json(self) -> dict:
        data = dataclasses.asdict(self)
        data["request"] = self.request.to_json()
        data["code_files"] = dict(self.code_files)
        data["environment"] = dict(self.environment)
        data["case_records"] = [record.to_json() for record in self.case_records]
        data["cases_done"] = self.cases_done  # for a reader of the file; derived from case_records
        return {"format": MANIFEST_FORMAT, "format_version": MANIFEST_VERSION, **data}

    @classmethod
    def from_json(cls, data: Any, where: str) -> Manifest:
        """Parse a manifest document; ManifestError naming `where` if it is not one."""
        problem = format_problem(data, name=MANIFEST_FORMAT, version=MANIFEST_VERSION, what="manifest")
        if problem:
            older = isinstance(data, dict) and data.get("format_version") == 1
            hint = ": it records no per-case row digests, so its rows cannot be checked; rerun it" if older else ""
            raise ManifestError(f"{where}: {problem}{hint}")
        try:
            fields = {f.name: data[f.name] for f in dataclasses.fields(cls) if f.name != "environment"}
            fields["environment"] = tuple((str(k), str(v)) for k, v in dict(data.get("environment") or {}).items())
            fields["request"] = RunRequest.from_json(fields["request"])
            for name in ("cases", "path_names", "resumed", "shard_of"):
                fields[name] = tuple(str(v) for v in fields[name])
            fields["code_files"] = tuple(sorted((str(k), str(v)) for k, v in dict(fields["code_files"]).items()))
            fields["case_records"] = tuple(CaseRecord.from_json(r) for r in fields["case_records"])
            manifest = cls(**fields)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ManifestError(f"{where}: malformed manifest ({type(exc).__name__}: {exc})") from None
        if data.get("cases_done", manifest.cases_done) != manifest.cases_done:
            raise ManifestError(
                f"{where}: cases_done {data['cases_done']!r} disagrees with its "
                f"{manifest.cases_done} case records (an edited manifest?)"
            )
        if manifest.state not in STATES:
            raise ManifestError(f"{where}: unknown run state {manifest.state!r} (expected one of {STATES})")
        return manifest

    def naming_fields(self) -> dict:
        """Flat fields naming this run, for the reports' environment block."""
        return {
            "run_id": self.run_id,
            "run_state": self.state,
            "run_cases": len(self.cases),
            "selection_digest": self.selection_digest,
            "code_digest": self.code_digest,
            **({"shard": self.shard} if self.shard else {}),
        }


def format_problem(document: Any, *, name: str, version: int, what: str) -> str:
    """Why `document` is not a JSON document of format `name`, `version` ("" if it is one)."""
    if not isinstance(document, dict) or document.get("format") != name:
        return f"not an mhc-parity {what} (no format={name!r})"
    if document.get("format_version") != version:
        return f"{what} format version {document.get('format_version')!r} is not supported (expected {version})"
    return ""


def _with_out(words: list[str], folder: str) -> list[str]:
    """`words` with `--out folder` (replacing the one there, or appended)."""
    for index, word in enumerate(words):
        if word == "--out" or word.startswith("--out="):
            return [*words[:index], "--out", folder, *words[index + 1 + (word == "--out") :]]
    return [*words, "--out", folder]


# ----------------------------------------------------------------------------- files


def manifest_path(folder: pathlib.Path) -> pathlib.Path:
    return pathlib.Path(folder) / MANIFEST_FILE


def write_manifest(folder: pathlib.Path, manifest: Manifest) -> pathlib.Path:
    """Write `folder/manifest.json` atomically."""
    path = manifest_path(folder)
    atomic_write(path, (json.dumps(manifest.to_json(), indent=1) + "\n").encode("utf-8"))
    return path


def record_stop(folder: pathlib.Path, manifest: Manifest) -> None:
    """Write a stopped run's manifest in the room its space reserve gives back, so a full disk does not leave "running";
    if even that fails, the old one stays (no reader trusts it either)."""
    release_reserve(folder)
    try:
        write_manifest(folder, manifest)
    except OSError:
        pass


def read_manifest(folder: pathlib.Path) -> Manifest | None:
    """The folder's manifest, None if it has none; ManifestError if it cannot be read."""
    path = manifest_path(folder)
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ManifestError(f"{path}: unreadable manifest ({exc})") from None
    return Manifest.from_json(data, str(path))


def foreign_folder_problem(folder: str | pathlib.Path) -> str:
    """Why a run must not be written into `folder` ("" when it may): it holds files but no run manifest, which the run
    would overwrite. An absent or empty folder (lock and reserve aside) or a run folder of any format version may be
    written."""
    folder = pathlib.Path(folder)
    try:
        entries = sorted(e.name for e in folder.iterdir() if e.name not in (WRITER_LOCK_FILE, RESERVE_FILE))
    except OSError:  # absent (created by the run), or no folder: `outputs.writable_folder` says so
        return ""
    if not entries:
        return ""
    try:
        document = json.loads(manifest_path(folder).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        document = None
    if isinstance(document, dict) and document.get("format") == MANIFEST_FORMAT:
        return ""
    return (
        f"{folder} holds files ({few_names(entries, 3)}) but no run manifest ({MANIFEST_FILE} of mhc-parity), "
        "so a run would replace them; choose a new or empty folder"
    )
