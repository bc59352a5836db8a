"""User-defined cases from a TOML file (``--case-file``; format in docs/running.md): ``[defaults]``
and ``[[case]]`` tables of `Case` fields plus ``suites``. An unknown key or a wrong type is a
`CaseFileError` naming the file, the case and the field.
"""

from __future__ import annotations

import difflib
import tomllib
from collections.abc import Iterable
from pathlib import Path

from mhc_parity.cases.registry import DuplicateCaseError, Registry
from mhc_parity.cases.spec import Case, CaseSpecError, case_field_names, normalize_dtype
from mhc_parity.records.run_suite import USER_SUITE

TOP_LEVEL_KEYS = ("defaults", "case")
EXTRA_CASE_KEYS = ("suites",)

_INT_FIELDS = (
    "batch",
    "sequence",
    "streams",
    "embedding",
    "seed",
    "block_tokens",
    "block_tokens_bwd",
    "block_features",
)
_STR_FIELDS = (
    "name",
    "dtype",
    "weight_dtype",
    "variant",
    "branch",
    "init",
    "matmul_precision",
    "expect",
    "expect_reason",
)
_REQUIRED = ("name", "batch", "sequence", "streams", "embedding")


class CaseFileError(CaseSpecError):
    """A malformed case file; the message names the file, the case and the field."""


def _type_problem(field: str, value) -> str | None:
    if field in _INT_FIELDS and (not isinstance(value, int) or isinstance(value, bool)):
        return f"must be an integer, got {type(value).__name__} {value!r}"
    if field in _STR_FIELDS and not isinstance(value, str):
        return f"must be a string, got {type(value).__name__} {value!r}"
    if field == "mesh" and not (
        isinstance(value, list)
        and len(value) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    ):
        return f"must be a [data, fsdp] pair of integers (omit it for unsharded), got {value!r}"
    if field in ("tags", "suites") and not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
        return f"must be a list of strings, got {value!r}"
    return None


def _check_keys(table: dict, allowed: Iterable[str], where: str, path: Path) -> None:
    allowed = tuple(allowed)
    unknown = [k for k in table if k not in allowed]
    if unknown:
        hints = []
        for key in unknown:
            close = difflib.get_close_matches(key, allowed, n=1)
            hints.append(f"{key!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
        raise CaseFileError(f"{path}: {where}: unknown field(s) {', '.join(hints)}; allowed: {', '.join(allowed)}")


def parse_case_table(table: dict, defaults: dict, *, path: Path, position: int) -> tuple[Case, tuple[str, ...]]:
    """One ``[[case]]`` table (merged over ``[defaults]``) -> (Case, suites)."""
    label = (
        f"case {table.get('name')!r} (entry {position})"
        if isinstance(table.get("name"), str)
        else (f"case entry {position}")
    )
    _check_keys(table, case_field_names() + EXTRA_CASE_KEYS, label, path)
    merged = dict(defaults)
    for key, value in table.items():
        base = merged.get(key)
        if key in ("tags", "suites") and isinstance(base, list) and isinstance(value, list):
            merged[key] = base + [v for v in value if v not in base]  # [defaults] tags + own tags
        else:
            merged[key] = value
    for field, value in merged.items():
        problem = _type_problem(field, value)
        if problem:
            raise CaseFileError(f"{path}: {label}: field {field!r} {problem}")
    missing = [f for f in _REQUIRED if f not in merged]
    if missing:
        raise CaseFileError(f"{path}: {label}: missing required field(s) {', '.join(map(repr, missing))}")
    suites = tuple(merged.pop("suites", ()))
    try:
        for field in ("dtype", "weight_dtype"):
            if field in merged:
                merged[field] = normalize_dtype(merged[field], field=field, case=merged["name"])
        if "mesh" in merged:
            merged["mesh"] = tuple(merged["mesh"])
        if "tags" in merged:
            merged["tags"] = tuple(merged["tags"])
        case = Case(**merged)
    except CaseSpecError as error:
        raise CaseFileError(f"{path}: {label}: {error}") from None
    return case, suites


def load_case_entries(path: str | Path) -> tuple[tuple[Case, tuple[str, ...]], ...]:
    """Every (Case, extra suites) of a case file, validated; CaseFileError otherwise."""
    path = Path(path)
    try:
        with open(path, "rb") as stream:
            document = tomllib.load(stream)
    except FileNotFoundError:
        raise CaseFileError(f"{path}: case file not found") from None
    except tomllib.TOMLDecodeError as error:
        raise CaseFileError(f"{path}: not valid TOML: {error}") from None
    except UnicodeDecodeError as error:
        raise CaseFileError(f"{path}: not a UTF-8 text file ({error.reason} at byte {error.start})") from None
    _check_keys(document, TOP_LEVEL_KEYS, "top level", path)
    defaults = document.get("defaults", {})
    if not isinstance(defaults, dict):
        raise CaseFileError(f"{path}: [defaults] must be a table")
    _check_keys(defaults, tuple(f for f in case_field_names() if f != "name") + EXTRA_CASE_KEYS, "[defaults]", path)
    tables = document.get("case", [])
    if not isinstance(tables, list) or not all(isinstance(t, dict) for t in tables):
        raise CaseFileError(f"{path}: cases must be given as [[case]] tables")
    if not tables:
        raise CaseFileError(f"{path}: no [[case]] tables")
    entries, seen = [], {}
    for position, table in enumerate(tables, start=1):
        case, suites = parse_case_table(table, defaults, path=path, position=position)
        if case.name in seen:
            raise CaseFileError(
                f"{path}: case {case.name!r} (entry {position}): duplicate name, also entry {seen[case.name]}"
            )
        seen[case.name] = position
        entries.append((case, suites))
    return tuple(entries)


def load_case_file(path: str | Path) -> tuple[Case, ...]:
    """The cases of a case file, in file order (suites ignored; see `register_case_file`)."""
    return tuple(case for case, _ in load_case_entries(path))


def register_case_file(path: str | Path, registry: Registry) -> tuple[Case, ...]:
    """Load a case file into `registry`: every case joins suite "user" and its own `suites`.
    Raises CaseFileError (malformed) or DuplicateCaseError (name taken); then nothing is registered."""
    entries = load_case_entries(path)
    clashes = [case.name for case, _ in entries if case.name in registry]
    if clashes:
        raise DuplicateCaseError(f"{path}: case name(s) already registered: {', '.join(clashes)}")
    for case, suites in entries:
        registry.register(case, (USER_SUITE,) + tuple(s for s in suites if s != USER_SUITE), origin=str(path))
    return tuple(case for case, _ in entries)
