"""The judging's gain criterion re-applied to stored rows, offline: how close correct code sits.

    .venv/bin/python bench/probes/gain_rule_check.py ROWS.csv [MORE.csv ...] [--shapes SWEEP_ROWS.csv]

ROWS: a sweep's rows.csv, a run's rows.csv or a baseline file (`baselines/*.csv`). Prints per
(comparison, act dtype, dtype, leaf kind) the rows judged, the largest gain usage
|gain| / (ratio·max(|partner gain|, q_gain·S_gain) + floor·max|o|/‖o‖₂) under the packaged
policy, how many exceed 1, and the same usage with no floor at all (the spread alone).

What a file lacks is filled the way that can only raise the usage: a baseline keeps no partner
gain, so a vs_reference row takes its partner's own vs_oracle row's gain, or 0; rows written
before `oracle_peak_to_l2` take it from --shapes (rows of the same cases, e.g. a CPU run's,
matched by case name without its -seedN: the oracle's value is the same on any machine), else
1/√N of the leaf's `shape`, the smallest it can be, else no floor; no `oracle_draws` reads as 16 (the CPU runs' count).
"""

from __future__ import annotations

import argparse
import math
import re
import sys

import pandas as pd

from mhc_parity.harness.judging.policy_file import load_policy
from mhc_parity.records import dtypes
from mhc_parity.records.gain_rule import gain_floor
from mhc_parity.records.rate_quantiles import quantile

ORACLE_RATIO_COMPARISONS = ("vs_oracle", "vs_reference")


def _read(path: str) -> pd.DataFrame:
    return pd.read_csv(path, comment="#", keep_default_na=True, low_memory=False)


def _act_dtype(row) -> str:
    if isinstance(row.get("act_dtype"), str) and row["act_dtype"]:
        return row["act_dtype"]
    return "bfloat16" if "-bf16-" in str(row["case"]) else "float32"


def _base_case(case: str) -> str:
    return re.sub(r"-seed\d+$", "", str(case))


def _peaks(frames: list[pd.DataFrame]) -> dict:
    """(case without -seedN, leaf) -> max|o|/‖o‖₂: recorded where a file has it (the oracle's
    value is the same on any machine), else 1/√N of the leaf's `shape`."""
    peaks, sizes = {}, {}
    for frame in frames:
        for r in frame.to_dict("records"):
            key = (_base_case(r["case"]), r["leaf"])
            peak = float(r.get("oracle_peak_to_l2", math.nan))
            if math.isfinite(peak):
                peaks[key] = peak
            elif isinstance(r.get("shape"), str) and r["shape"]:
                sizes[key] = 1.0 / math.sqrt(math.prod(int(d) for d in r["shape"].split("x")))
    return {**sizes, **peaks}


def usages(frame: pd.DataFrame, policy, peaks: dict) -> pd.DataFrame:
    """One record per oracle-ratio row with a gain: its group and its gain usages."""
    rate = policy.confidence.false_positive_rate
    frame = frame[frame["comparison"].isin(ORACLE_RATIO_COMPARISONS)]
    own = {
        (r["case"], r["candidate"].split("/")[0], r["leaf"]): r["cand_oracle_gain"]
        for r in frame[frame["comparison"] == "vs_oracle"].to_dict("records")
    }
    out = []
    for r in frame.to_dict("records"):
        gain, s_gain = float(r["cand_oracle_gain"]), float(r["oracle_sensitivity_gain"])
        if not (math.isfinite(gain) and r.get("verdict") in ("pass", "fail")):
            continue
        act = _act_dtype(r)
        rule = policy.rule_for(
            comparison=r["comparison"], leaf_kind=r["leaf_kind"], dtype=r["dtype"], act_dtype=act, partitioning="*"
        )
        bound = rule.bound
        partner = r.get("partner_oracle_gain", math.nan)
        if not math.isfinite(float(partner)):
            partner = (
                0.0
                if r["comparison"] == "vs_oracle"
                else own.get((r["case"], r["partner"].split("/")[0], r["leaf"]), 0.0)
            )
        draws = r.get("oracle_draws", math.nan)
        draws = 16 if not math.isfinite(float(draws)) else int(draws)
        q = quantile(rate, 1.0, draws)
        peak = float(r.get("oracle_peak_to_l2", math.nan))
        if not math.isfinite(peak):
            peak = peaks.get((_base_case(r["case"]), r["leaf"]), math.nan)
        explained = abs(float(partner)) if not math.isfinite(s_gain) else max(abs(float(partner)), q * s_gain)
        unit = _eps(getattr(rule, "eps_dtype", None) or r["dtype"])
        floor = gain_floor(bound.floor_ulps * unit, peak)
        out.append(
            dict(
                comparison=r["comparison"],
                act=act,
                dtype=r["dtype"],
                leaf_kind=r["leaf_kind"],
                usage=abs(gain) / (bound.ratio * explained + floor),
                spread_only=abs(gain) / (bound.ratio * explained) if explained > 0 else math.inf,
                row=f"{r['case']} {r['candidate']} {r['leaf']}",
            )
        )
    return pd.DataFrame(out)


def _eps(dtype: str) -> float:
    return dtypes.epsilon(str(dtype))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("rows", nargs="+")
    parser.add_argument("--shapes", action="append", default=[])
    args = parser.parse_args(argv)
    policy = load_policy(None)
    frames = [_read(p) for p in args.rows]
    peaks = _peaks(frames + [_read(p) for p in args.shapes])
    for path, frame in zip(args.rows, frames):
        table = usages(frame, policy, peaks)
        groups = table.groupby(["comparison", "act", "dtype", "leaf_kind"])
        summary = groups.agg(
            rows=("usage", "size"),
            max_usage=("usage", "max"),
            failing=("usage", lambda u: int((u > 1.0).sum())),
            max_spread_only=("spread_only", "max"),
        )
        print(f"{path}: {len(table)} rows, {int((table['usage'] > 1).sum())} failing the gain criterion")
        print(summary.to_string(float_format=lambda v: f"{v:.3g}"))
        worst = table.sort_values("usage").tail(3)
        print("largest:", "; ".join(f"{w.row} {w.usage:.3g}" for w in worst.itertuples()))
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
