"""The command that reruns only a finished run's failing cases (pytest's `--lf`): rebuilt from the manifest's request
(and `KEPT_OPTIONS` / `KEPT_FLAGS` from its command line) with `--cases`, into `<out>-rerun` so the full run's reports
stay, against the same `--baseline`.
"""

from __future__ import annotations

import contextlib
import shlex
from collections.abc import Iterable, Sequence
from pathlib import Path

import pandas as pd

from mhc_parity.records.manifest import Manifest
from mhc_parity.reports.gate.judgement import Judgement
from mhc_parity.reports.gate.rule import FAILING_CATEGORIES
from mhc_parity.reports.summary import FAILING_VERDICTS

RERUN_SUFFIX = "-rerun"
# Options the request does not hold but the rerun needs, read from the recorded command line.
KEPT_OPTIONS = ("--policy",)
KEPT_FLAGS = ("--allow-legacy-baseline",)


def failing_cases(
    frame: pd.DataFrame, judgement: Judgement | None = None, run_cases: Sequence[str] = ()
) -> tuple[str, ...]:
    """Cases with a `fail` or `error` row or a row the gate failed (only of `run_cases`, when given), in `run_cases`
    order, else by name."""
    cases = set(frame.loc[frame["verdict"].isin(FAILING_VERDICTS), "case"].astype(str)) if len(frame) else set()
    if judgement is not None and judgement.result is not None:
        gated = {f.case for c in FAILING_CATEGORIES for f in judgement.result.by_category(c)}
        cases |= gated & set(run_cases) if run_cases else gated
    order = {name: index for index, name in enumerate(run_cases)}
    return tuple(sorted(cases, key=lambda name: (order.get(name, len(order)), name)))


def rerun_folder(out: str | Path) -> str:
    """`out-rerun`: where the rerun writes (a rerun's own folder is reused)."""
    text = str(out).rstrip("/") or "."
    return text if text.endswith(RERUN_SUFFIX) else text + RERUN_SUFFIX


def rerun_command(manifest: Manifest, cases: Iterable[str], out: str | Path, baseline: str | None = None) -> str:
    """`mhc-parity run --cases A,B ... --out OUT-rerun [--baseline B]`, or "" without cases."""
    cases = list(cases)
    if not cases:
        return ""
    request = manifest.request
    joined = any("," in name for name in cases)
    words = ["mhc-parity", "run"]
    if request.suite is not None:
        words += ["--suite", request.suite]
    words += ["--cases", *cases] if joined else ["--cases", ",".join(cases)]
    if tuple(request.paths) != ("*",):
        words += ["--paths", *request.paths]
    # A factory that returns several implementations is recorded once per implementation.
    for spec in dict.fromkeys(spec for _name, spec in request.implementations):
        words += ["--impl", spec]
    for case_file in request.case_files:
        words += ["--case-file", str(case_file)]
    if request.seed is not None:
        words += ["--seed", str(request.seed)]
    if not request.lowering:
        words.append("--no-lowering")
    words += _recorded_options(manifest.command_line)
    words += ["--out", rerun_folder(out)]
    if baseline:
        words += ["--baseline", str(baseline)]
    return shlex.join(words)


def run_rerun_command(frame: pd.DataFrame, manifest: Manifest | None, judgement: Judgement | None, out) -> str:
    if manifest is None:
        return ""
    cases = failing_cases(frame, judgement, manifest.cases)
    return rerun_command(manifest, cases, out, judgement.baseline if judgement is not None else None)


def _recorded_options(command_line: str) -> list[str]:
    words: list[str] = []
    with contextlib.suppress(ValueError):  # unbalanced quotes (an edited manifest): none kept
        words = shlex.split(command_line)
    kept: list[str] = []
    for index, word in enumerate(words):
        name, _, value = word.partition("=")
        if name in KEPT_OPTIONS:
            given = value if value else (words[index + 1] if index + 1 < len(words) else "")
            kept += [name, given]
        elif word in KEPT_FLAGS:
            kept.append(word)
    return kept
