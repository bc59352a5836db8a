"""The tolerance policy file: `tolerances.toml` read, validated and made a `Policy`.

The file holds `version = 2`, optional `[systematic]` and `[confidence]` tables and `[[rule]]` tables. A
rule: match keys `comparison` (never "*"), `dtype` (the leaf's), `leaf_kind`, and optionally `act_dtype`
(the case's) and `partitioning` ("manual": kernels per shard in shard_map, "auto": XLA partitions), each but
`comparison` a name or "*" (the optional ones' default); `kind` (`bounds.KINDS`) and exactly its numbers, in ulps of
`eps_dtype` if given, else the leaf's dtype; a `rationale`. `[systematic]` adds `bounds.Systematic` to the
oracle_ratio rules on its `leaf_kinds`; `[confidence]` states the rate at which a correct implementation may
exceed an oracle_ratio bound (`bounds.Confidence`).

Validation rejects any tolerance below one ulp: ulps numbers >= 1 (`direct_ulps` 0 is off), ratios >= 1, no
`eps_dtype` finer than a dtype the rule can match.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import itertools
import math
import tomllib
from pathlib import Path

from mhc_parity.harness.judging.bounds import KINDS, RATIO, ULPS, ULPS_OR_OFF, Confidence, Systematic
from mhc_parity.harness.judging.metrics import eps
from mhc_parity.harness.judging.policy import (
    DTYPES,
    MATCH_KEYS,
    PARTITIONINGS,
    POLICY_COMPARISONS,
    POLICY_LEAF_KINDS,
    Policy,
    PolicyError,
    Rule,
    most_specific,
)
from mhc_parity.records.schema import PROGRAM_COMPARISONS

__all__ = ["DEFAULT_POLICY_PATH", "SUPPORTED_VERSION", "is_packaged_default", "load_policy", "parse_policy"]

DEFAULT_POLICY_PATH = Path(__file__).with_name("tolerances.toml")
SUPPORTED_VERSION = 2
_REQUIRED = ("comparison", "dtype", "leaf_kind", "kind", "rationale")
_NUMBER_FIELDS = frozenset(name for kind in KINDS.values() for name in kind.numbers)
_ALLOWED = frozenset(MATCH_KEYS + ("kind", "rationale", "eps_dtype")) | _NUMBER_FIELDS
_TOP_LEVEL = frozenset({"version", "rule", "systematic", "confidence"})
_CONFIDENCE_KEYS = frozenset({"false_positive_rate", "gain_leaf_kinds", "rationale"})
_SYSTEMATIC_KEYS = frozenset({"leaf_kinds", "t_floor", "ratio", "rationale"})
# What became of the fields of version 1 files.
_VERSION_1_NOTE = (
    "version 1 files had ratio_max and ratio_rms (now one 'ratio', they were always equal) "
    "and the rel_bound kind (unused, removed)"
)


def _checked_number(key: str, value, check: str, err) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise err(key, f"must be a finite number, got {value!r}")
    value = float(value)
    if check == RATIO and value < 1.0:
        raise err(key, f"{value:g} < 1: a candidate cannot be required to beat the partner")
    if check == ULPS_OR_OFF and value != 0.0 and value < 1.0:
        raise err(key, f"{value:g} is below one ulp of the compared values (use 0 to disable, or >= 1)")
    if check == ULPS and value < 1.0:
        raise err(key, f"{value:g} is below one ulp of the compared values (must be >= 1)")
    return value


def _validate_rule(index: int, raw) -> Rule:
    if not isinstance(raw, dict):
        raise PolicyError(f"rule {index}: must be a table, got {type(raw).__name__}")
    shown = ", ".join(f"{k}={raw.get(k, '?')}" for k in MATCH_KEYS if k in raw)
    where = f"rule {index} ({shown})"

    def err(field: str, msg: str) -> PolicyError:
        return PolicyError(f"{where}: field {field!r}: {msg}")

    for key in raw:
        if key not in _ALLOWED:
            hint = f"; {_VERSION_1_NOTE}" if key in ("ratio_max", "ratio_rms", "rms_rel_ulps") else ""
            raise err(key, f"unknown key (allowed: {sorted(_ALLOWED)}){hint}")
    for key in _REQUIRED:
        if key not in raw:
            raise err(key, "missing")
    fields: dict = {"index": index}
    for key in ("comparison", "partitioning", "dtype", "act_dtype", "leaf_kind", "kind", "rationale", "eps_dtype"):
        if key in raw and not isinstance(raw[key], str):
            raise err(key, f"must be a string, got {raw[key]!r}")
    comparison = raw["comparison"]
    if comparison not in POLICY_COMPARISONS:
        judged_itself = comparison in PROGRAM_COMPARISONS
        hint = f" ({comparison} rows are judged by the {comparison} itself)" if judged_itself else ""
        raise err("comparison", f"unknown comparison {comparison!r}; expected one of {POLICY_COMPARISONS}{hint}")
    leaf_kind = raw["leaf_kind"]
    if leaf_kind != "*" and leaf_kind not in POLICY_LEAF_KINDS:
        raise err("leaf_kind", f"unknown leaf kind {leaf_kind!r}; expected '*' or one of {POLICY_LEAF_KINDS}")
    partitioning = raw.get("partitioning", "*")
    if partitioning != "*" and partitioning not in PARTITIONINGS:
        raise err("partitioning", f"unknown partitioning {partitioning!r}; expected '*' or one of {PARTITIONINGS}")
    fields["partitioning"] = partitioning
    for key in ("dtype", "act_dtype"):
        value = raw.get(key, "*")
        if value != "*" and value not in DTYPES:
            raise err(key, f"unknown dtype {value!r}; expected '*' or one of {DTYPES}")
        fields[key] = value
    kind = KINDS.get(raw["kind"])
    if kind is None:
        hint = f"; {_VERSION_1_NOTE}" if raw["kind"] == "rel_bound" else ""
        raise err("kind", f"unknown rule kind {raw['kind']!r}; expected one of {sorted(KINDS)}{hint}")
    if not raw["rationale"].strip():
        raise err("rationale", "must explain the numbers (empty)")
    for key in _NUMBER_FIELDS:
        if key in raw and key not in kind.numbers:
            raise err(key, f"not a field of a {kind.kind!r} rule (its fields: {list(kind.numbers) or 'none'})")
    numbers = {}
    for key, check in kind.numbers.items():
        if key not in raw:
            raise err(key, f"missing (a {kind.kind!r} rule needs {list(kind.numbers)})")
        numbers[key] = _checked_number(key, raw[key], check, err)
    eps_dtype = raw.get("eps_dtype")
    if eps_dtype is not None:
        if eps_dtype not in DTYPES:
            raise err("eps_dtype", f"unknown dtype {eps_dtype!r}; expected one of {DTYPES}")
        matchable = DTYPES if fields["dtype"] == "*" else (fields["dtype"],)
        finer = [d for d in matchable if eps(eps_dtype) < eps(d)]
        if finer:
            raise err(
                "eps_dtype",
                f"{eps_dtype} eps is finer than one ulp of {finer[0]} leaves this rule can match "
                f"(a sub-ulp tolerance); restrict 'dtype' or use a coarser eps_dtype",
            )
    return Rule(
        comparison=comparison,
        leaf_kind=leaf_kind,
        bound=kind(**numbers),
        rationale=raw["rationale"].strip(),
        eps_dtype=eps_dtype,
        **fields,
    )


def _validate_systematic(raw, source: str) -> Systematic:
    where = f"{source}: [systematic]"
    if not isinstance(raw, dict):
        raise PolicyError(f"{where}: must be a table")
    unknown = set(raw) - _SYSTEMATIC_KEYS
    missing = _SYSTEMATIC_KEYS - set(raw)
    if unknown or missing:
        raise PolicyError(f"{where}: unknown keys {sorted(unknown)}, missing keys {sorted(missing)}")
    kinds = raw["leaf_kinds"]
    if not isinstance(kinds, list) or not kinds or any(k not in POLICY_LEAF_KINDS for k in kinds):
        raise PolicyError(f"{where}: field 'leaf_kinds' must list leaf kinds of {POLICY_LEAF_KINDS}, got {kinds!r}")
    numbers = {}
    for key in ("t_floor", "ratio"):
        value = raw[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 1:
            raise PolicyError(f"{where}: field {key!r} must be a finite number >= 1, got {value!r}")
        numbers[key] = float(value)
    if not isinstance(raw["rationale"], str) or not raw["rationale"].strip():
        raise PolicyError(f"{where}: field 'rationale' must explain the numbers")
    return Systematic(tuple(kinds), numbers["t_floor"], numbers["ratio"], raw["rationale"].strip())


def _validate_confidence(raw, source: str) -> Confidence:
    where = f"{source}: [confidence]"
    if not isinstance(raw, dict):
        raise PolicyError(f"{where}: must be a table")
    unknown, missing = set(raw) - _CONFIDENCE_KEYS, _CONFIDENCE_KEYS - set(raw)
    if unknown or missing:
        raise PolicyError(f"{where}: unknown keys {sorted(unknown)}, missing keys {sorted(missing)}")
    rate = raw["false_positive_rate"]
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0.0 < rate < 0.5:
        raise PolicyError(f"{where}: field 'false_positive_rate' must be a probability in (0, 0.5), got {rate!r}")
    kinds = raw["gain_leaf_kinds"]
    if not isinstance(kinds, list) or any(k not in POLICY_LEAF_KINDS for k in kinds):
        raise PolicyError(
            f"{where}: field 'gain_leaf_kinds' must list leaf kinds of {POLICY_LEAF_KINDS}, got {kinds!r}"
        )
    if not isinstance(raw["rationale"], str) or not raw["rationale"].strip():
        raise PolicyError(f"{where}: field 'rationale' must explain the rate")
    return Confidence(float(rate), tuple(kinds), raw["rationale"].strip())


def parse_policy(text: str, *, source: str = "<string>") -> Policy:
    """Parse and validate policy TOML text; PolicyError naming rule and field."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise PolicyError(f"{source}: not valid TOML: {exc}") from exc
    for key in data:
        if key not in _TOP_LEVEL:
            raise PolicyError(f"{source}: field {key!r}: unknown top-level key (allowed: {sorted(_TOP_LEVEL)})")
    if data.get("version") != SUPPORTED_VERSION:
        note = f" ({_VERSION_1_NOTE})" if data.get("version") == 1 else ""
        raise PolicyError(f"{source}: field 'version': must be {SUPPORTED_VERSION}, got {data.get('version')!r}{note}")
    raw_rules = data.get("rule")
    if not isinstance(raw_rules, list) or not raw_rules:
        raise PolicyError(f"{source}: field 'rule': needs at least one [[rule]] table")
    rules = tuple(_validate_rule(i, raw) for i, raw in enumerate(raw_rules))
    systematic = _validate_systematic(data["systematic"], source) if "systematic" in data else None
    confidence = _validate_confidence(data["confidence"], source) if "confidence" in data else None

    seen: dict[tuple, Rule] = {}
    for rule in rules:
        key = tuple(rule.keys.values())
        if key in seen:
            raise PolicyError(f"{rule.label}: duplicate of {seen[key].label}")
        seen[key] = rule
    # Every concrete combination must resolve to at most one most-specific rule.
    for combo in itertools.product(POLICY_COMPARISONS, DTYPES, DTYPES, POLICY_LEAF_KINDS, PARTITIONINGS):
        best = most_specific([r for r in rules if r.matches(*combo)])
        if len(best) > 1:
            raise PolicyError(
                f"{source}: ambiguous rules for (comparison={combo[0]}, dtype={combo[1]}, "
                f"act_dtype={combo[2]}, leaf_kind={combo[3]}, partitioning={combo[4]}): "
                + "; ".join(r.label for r in best)
                + "; add a rule naming all of their keys"
            )
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
    return Policy(rules=rules, digest=digest, source=source, systematic=systematic, confidence=confidence)


def is_packaged_default(policy: Policy) -> bool:
    """Whether `policy` is the packaged tolerances.toml byte for byte (the reports say so when it is not)."""
    return policy.digest == _packaged_digest()


@functools.cache
def _packaged_digest() -> str:
    return hashlib.sha256(DEFAULT_POLICY_PATH.read_bytes()).hexdigest()


def load_policy(path=None) -> Policy:
    """Load and validate a policy file (default: the packaged one); `digest` is the sha256 of its bytes.
    PolicyError on any problem, an unreadable file included."""
    path = Path(path) if path is not None else DEFAULT_POLICY_PATH
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise PolicyError(f"cannot read policy file {path}: {exc}") from exc
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PolicyError(f"{path}: not UTF-8: {exc}") from exc
    policy = parse_policy(text, source=str(path))
    return dataclasses.replace(policy, digest=hashlib.sha256(raw).hexdigest(), source=str(path))
