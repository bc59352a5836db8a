"""What a run's environment record (`run_info.run_metadata`; a baseline header keeps the same keys) says about comparing
it with another run.

  backend, device_kind      e.g. "tpu", "TPU v5 lite"
  matmul_precision          setting=operand rounding per precision setting used, e.g. "highest=float32" (CPU),
                            "default=bfloat16,highest=bfloat16x6" (TPU)
  xla_cpu_isa, host_cpu_isa the instruction set XLA:CPU targets and the host's newest, e.g. "AVX", "AVX512_BF16"
  libtpu_version            the libtpu JAX loads (version, or build stamp and sha256); "" if none
  backend_arithmetic_*      the rounding model's terms for the backend's float32 primitives ("none" on a CPU),
                            their probe table and digest

Runs are comparable only if every precision setting both used meant the same rounding (`precision_conflicts`). Different
instruction sets are comparable but float32 sums may differ by a few ulps (`isa_difference`). Legacy: a record without
`matmul_precision` reads as `LEGACY_MATMUL_PRECISION` if its backend is "cpu" or unrecorded (only CPUs had been run),
else unknown (None).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mhc_parity.records.schema import ReportInputError

PRECISION_KEY = "matmul_precision"
# The CPU instruction sets a run's XLA code targets and its host has (module docstring).
ISA_KEYS = ("xla_cpu_isa", "host_cpu_isa")
# The keys a baseline header carries besides its format and policy hash.
HEADER_KEYS = ("backend", "device_kind", PRECISION_KEY, *ISA_KEYS)
LEGACY_MATMUL_PRECISION = "highest=float32"
LIBTPU_KEY = "libtpu_version"
BACKEND_TERMS_KEY = "backend_arithmetic_terms"
BACKEND_SOURCE_KEY = "backend_arithmetic_source"
BACKEND_DIGEST_KEY = "backend_arithmetic_digest"
# `BACKEND_TERMS_KEY`'s value where the model widened nothing (every primitive within it).
NO_BACKEND_TERMS = "none"


def format_precision_record(roundings: Mapping[str, str]) -> str:
    """``setting=rounding`` pairs sorted by setting and joined by commas."""
    return ",".join(f"{setting}={roundings[setting]}" for setting in sorted(roundings))


def parse_precision_record(text: str) -> dict[str, str]:
    """The setting -> rounding mapping of a record; ReportInputError if malformed."""
    pairs = {}
    for item in str(text).split(","):
        setting, sep, rounding = item.partition("=")
        if not sep or not setting or not rounding:
            raise ReportInputError(f"malformed matmul_precision record {text!r} (expected setting=rounding,...)")
        pairs[setting] = rounding
    return pairs


def precision_of(fields: Mapping[str, Any]) -> str | None:
    """A record's matmul precision, with the legacy rule of the module docstring."""
    value = fields.get(PRECISION_KEY)
    if value not in (None, ""):
        return str(value)
    if str(fields.get("backend") or "cpu") == "cpu":
        return LEGACY_MATMUL_PRECISION
    return None


def run_precision(run) -> str | None:
    """The matmul precision of a loaded run (`mhc_parity.reports.sources.LoadedRun`), None if unknown."""
    if not run.is_baseline and not run.metadata:
        return None  # a bare row file: nothing was recorded
    return precision_of(run.metadata)


def precision_conflicts(first: str | None, second: str | None) -> list[str]:
    """Settings both records used with different roundings, as "setting: a vs b" (empty if none or unknown)."""
    if first is None or second is None:
        return []
    a, b = parse_precision_record(first), parse_precision_record(second)
    return [
        f"{setting}: {a[setting]} vs {b[setting]}"
        for setting in sorted(a.keys() & b.keys())
        if a[setting] != b[setting]
    ]


def environment_of(rows: Any) -> dict[str, str]:
    """The `HEADER_KEYS` a loaded run or baseline recorded ({} for plain rows)."""
    fields = getattr(rows, "metadata", None) or getattr(rows, "environment", None) or {}
    return {key: str(fields[key]) for key in HEADER_KEYS if fields.get(key) not in (None, "")}


def isa_difference(baseline: Mapping[str, Any], current: Mapping[str, Any]) -> str:
    """One line on how the recorded instruction sets (`ISA_KEYS`) of `baseline` and `current` (an environment record
    each) differ; "" when they agree or neither records them."""
    recorded = [{key: str(fields.get(key) or "") for key in ISA_KEYS} for fields in (baseline, current)]
    if recorded[0] == recorded[1] or not any(any(r.values()) for r in recorded):
        return ""
    base, run = (_isa_text(r) for r in recorded)
    return (
        f"instruction set: the baseline's XLA:CPU code ran {base}, this run's {run}: float32 sums may "
        f"round differently by a few ulps, which the growth rule allows as far as the rounding model "
        f"explains it (docs/gate.md)"
    )


def _isa_text(record: Mapping[str, str]) -> str:
    if not any(record.values()):
        return "on an unrecorded instruction set"
    code, host = record["xla_cpu_isa"] or "?", record["host_cpu_isa"] or "?"
    return f"at {code} (host {host})"
