"""`python -m harness faults`: the kill matrix of the fault catalogue, and the false-positive sweep.

Kill matrix (default)::

    python -m harness faults [--suite default] [--cases GLOB...] [--faults GLOB...] [--out out/faults] [--jobs N]

1. A clean pass runs the selected cases through every path of the unmodified code
   (lowering rows excluded: no fault touches them). Its rows are the reference verdicts,
   and every path's outputs are kept in memory.
2. For each fault (`harness.faults.CATALOGUE`, filtered by --faults): inject it, then,
   with a fresh Runner and program cache (JAX caches cleared by the injection), run the
   cases the fault can affect. Paths the fault cannot change are not re-run: their clean
   outputs are reused, and so are fixtures and float64 oracle results.
3. A fault is *killed* by a row whose verdict is fail or error under the fault while the
   same row (case, candidate, partner, leaf) did not fail in the clean pass. Its margin
   is the largest `bound_usage` among those rows (error rows are shown as errors).
   Rows that already fail on clean code are not evidence and are ignored (and counted).

Each pass is single-threaded (XLA compilation dominates), so `--jobs N` deals the faults
to N spawned processes, each repeating the clean pass: on 2 cores `--jobs 2` roughly
halves the wall time. `--list` prints the catalogue.

Writes kill_matrix.csv (one line per fault × comparison × leaf that caught it),
kill_matrix.md, kill_matrix.json and clean_rows.csv into --out, prints the matrix and the
surviving faults. Exit 0 every fault killed, 1 a fault survived (also a fault no selected
case exercises), 2 a usage error (unknown suite, case or fault glob).

False-positive sweep::

    python -m harness faults --seeds N [--suite default] [--cases GLOB...] [--out out/sweep]

runs the UNMODIFIED code over the cases with seeds 0..N-1 (case names get a ``-seed<s>``
suffix), writes headroom.csv / sweep.md / sweep.json / failures.csv, prints per
(comparison, dtype, leaf kind) the largest `bound_usage` of any passing row (how close
correct code comes to its bound), and exits 1 if any row fails or errors.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import dataclasses
import datetime
import json
import math
import pathlib
import sys
import time
from typing import Callable, Iterable, Sequence

from harness.faults import CATALOGUE, Fault, SeamError, UnknownFaultError, select_faults

EXIT_OK, EXIT_SURVIVOR, EXIT_USAGE = 0, 1, 2
DEFAULT_FAULTS_OUT = pathlib.Path("out/faults")
DEFAULT_SWEEP_OUT = pathlib.Path("out/sweep")
CATCHING_VERDICTS = ("fail", "error")
FAULT_COMPARISONS = ("vs_oracle", "vs_reference", "vs_unsharded")


class UsageError(Exception):
    """A bad argument; exit code 2."""


# ------------------------------------------------------------------------------ running


class _RecordingProgramCache:
    """A `ProgramCache` that remembers each (case, path)'s outputs — or exception — in `memo`."""

    def __init__(self, memo: dict):
        from harness.paths import ProgramCache

        self._cache = ProgramCache()
        self.memo = memo

    def run(self, path, case, fixture):
        key = (case.name, path.name)
        try:
            outputs = self._cache.run(path, case, fixture)
        except Exception as exc:
            self.memo[key] = exc
            raise
        self.memo[key] = outputs
        return outputs


class _FaultScopedProgramCache:
    """A fresh `ProgramCache` for the paths `fault` affects; recorded clean results for the rest."""

    def __init__(self, memo: dict, fault: Fault):
        from harness.paths import ProgramCache

        self._cache = ProgramCache()
        self.memo = memo
        self.fault = fault

    def run(self, path, case, fixture):
        key = (case.name, path.name)
        if not self.fault.affects_path(path) and key in self.memo:
            recorded = self.memo[key]
            if isinstance(recorded, BaseException):
                raise recorded
            return recorded
        return self._cache.run(path, case, fixture)


class _SharedInputs:
    """Fixtures and float64 oracle results, computed once per case for every pass.

    Neither depends on `mhc`'s paths (the oracle imports nothing from `mhc`), so no
    fault can change them. `reusing_oracle()` routes the runner's oracle calls here.
    """

    def __init__(self):
        self._fixtures: dict = {}
        self._oracles: dict = {}

    def fixture(self, case):
        if case not in self._fixtures:
            from cases.fixtures import make_fixture

            self._fixtures[case] = make_fixture(case)
        return self._fixtures[case]

    @contextlib.contextmanager
    def reusing_oracle(self):
        import harness.runner as runner_module

        original = runner_module.run_oracle_path

        def run_oracle_path_once(case, fixture):
            if case not in self._oracles:
                self._oracles[case] = original(case, fixture)
            return self._oracles[case]

        runner_module.run_oracle_path = run_oracle_path_once
        try:
            yield
        finally:
            runner_module.run_oracle_path = original


def _plan():
    from harness.implementations import BUILTIN
    from harness.runner import PathPlan

    return PathPlan(implementations=tuple(BUILTIN.values()), lowering=False)


def _log(message: str, *, quiet: bool = False) -> None:
    if not quiet:
        print(message, file=sys.stderr, flush=True)


def run_clean_pass(cases, policy, shared: _SharedInputs, memo: dict, *, quiet=False) -> list[dict]:
    """Rows of the unmodified code over `cases`; every path's outputs recorded in `memo`."""
    from harness.runner import Runner

    runner = Runner(policy, fixture_loader=shared.fixture, cache=_RecordingProgramCache(memo))
    rows: list[dict] = []
    with shared.reusing_oracle():
        for index, case in enumerate(cases, 1):
            start = time.perf_counter()
            case_rows = list(runner.run_case(case, _plan()))
            rows.extend(case_rows)
            bad = sum(r["verdict"] in CATCHING_VERDICTS for r in case_rows)
            note = f", {bad} failing row(s)" if bad else ""
            _log(f"  clean [{index}/{len(cases)}] {case.name} ({time.perf_counter() - start:.1f}s{note})", quiet=quiet)
    return rows


def run_fault_pass(fault: Fault, cases, policy, shared: _SharedInputs, memo: dict) -> list[dict]:
    """Rows of `cases` (those the fault can affect) with `fault` injected."""
    import jax

    from harness.runner import Runner

    rows: list[dict] = []
    with fault.injected(), shared.reusing_oracle():
        runner = Runner(policy, fixture_loader=shared.fixture, cache=_FaultScopedProgramCache(memo, fault))
        for case in cases:
            rows.extend(runner.run_case(case, _plan()))
    jax.clear_caches()
    return rows


# ----------------------------------------------------------------------------- judging


def _usage(row: dict) -> float:
    value = row.get("bound_usage")
    try:
        value = float(value)
    except (TypeError, ValueError):
        return math.nan
    return value


def _format_usage(value: float) -> str:
    if math.isnan(value):
        return "n/a"
    if math.isinf(value):
        return "inf"
    if value >= 100:
        return f"{value:.3g}"
    return f"{value:.2f}"


@dataclasses.dataclass(frozen=True)
class Catch:
    """The rows of one (comparison, leaf) that caught a fault."""

    comparison: str
    leaf: str
    leaf_kind: str
    rows: int
    cases: int
    errors: int
    max_bound_usage: float  # NaN when every catching row is an error row
    worst_case: str
    worst_candidate: str
    worst_reason: str


@dataclasses.dataclass(frozen=True)
class FaultResult:
    """One fault's line of the kill matrix."""

    name: str
    seam: str
    description: str
    cases_run: tuple[str, ...]
    cases_killed: tuple[str, ...]
    catches: tuple[Catch, ...]
    ignored_clean_failures: int
    seconds: float

    @property
    def killed(self) -> bool:
        return bool(self.catches)

    @property
    def status(self) -> str:
        if self.killed:
            return "killed"
        return "survived" if self.cases_run else "not exercised"

    @property
    def only_errors(self) -> bool:
        return self.killed and all(c.errors == c.rows for c in self.catches)

    @property
    def margin(self) -> float:
        """Largest bound_usage among the catching rows (NaN when they are all errors)."""
        values = [c.max_bound_usage for c in self.catches if not math.isnan(c.max_bound_usage)]
        return max(values) if values else math.nan

    @property
    def margin_text(self) -> str:
        if not self.killed:
            return "-"
        if self.only_errors:
            return "error"
        text = f"{_format_usage(self.margin)}x"
        return text + " (+errors)" if any(c.errors for c in self.catches) else text

    def comparison_summary(self, comparison: str) -> str:
        """`leaf, leaf (max usage)` for one comparison, or '-'."""
        catches = [c for c in self.catches if c.comparison == comparison]
        if not catches:
            return "-"
        usages = [c.max_bound_usage for c in catches if not math.isnan(c.max_bound_usage)]
        worst = _format_usage(max(usages)) + "x" if usages else "error"
        leaves = [c.leaf for c in sorted(catches, key=lambda c: -_sort_usage(c))]
        shown = ", ".join(leaves[:4]) + (f" +{len(leaves) - 4}" if len(leaves) > 4 else "")
        return f"{shown} ({worst})"


def _sort_usage(catch: Catch) -> float:
    if catch.errors == catch.rows:
        return math.inf
    return catch.max_bound_usage


def judge_fault(fault: Fault, fault_rows: Sequence[dict], clean_rows: Sequence[dict],
                cases_run: Sequence[str], seconds: float) -> FaultResult:
    """Which rows caught `fault`: failing/erroring under it, not failing on clean code."""
    from harness.schema import row_key

    clean = {row_key(r): r["verdict"] for r in clean_rows}
    grouped: dict[tuple[str, str], list[dict]] = {}
    ignored = 0
    for row in fault_rows:
        if row["verdict"] not in CATCHING_VERDICTS:
            continue
        if clean.get(row_key(row)) in CATCHING_VERDICTS:
            ignored += 1
            continue
        grouped.setdefault((row["comparison"], row["leaf"]), []).append(row)
    catches = []
    for (comparison, leaf), rows in grouped.items():
        judged = [r for r in rows if r["verdict"] == "fail"]
        usages = [_usage(r) for r in judged]
        finite = [u for u in usages if not math.isnan(u)]
        worst = max(judged, key=lambda r: _nan_low(_usage(r))) if judged else rows[0]
        catches.append(Catch(
            comparison=comparison, leaf=leaf, leaf_kind=str(rows[0].get("leaf_kind", "")),
            rows=len(rows), cases=len({r["case"] for r in rows}),
            errors=sum(r["verdict"] == "error" for r in rows),
            max_bound_usage=max(finite) if finite else math.nan,
            worst_case=str(worst["case"]), worst_candidate=str(worst["candidate"]),
            worst_reason=str(worst.get("reason", ""))[:300],
        ))
    order = {c: i for i, c in enumerate(FAULT_COMPARISONS)}
    catches.sort(key=lambda c: (order.get(c.comparison, 99), -_nan_low(c.max_bound_usage), c.leaf))
    killed_cases = {r["case"] for rows in grouped.values() for r in rows}
    return FaultResult(
        name=fault.name, seam=fault.seam.name, description=fault.description,
        cases_run=tuple(cases_run), cases_killed=tuple(c for c in cases_run if c in killed_cases),
        catches=tuple(catches), ignored_clean_failures=ignored, seconds=seconds,
    )


def _nan_low(value: float) -> float:
    return -math.inf if math.isnan(value) else value


# ----------------------------------------------------------------------------- writing


def _markdown_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def kill_matrix_markdown(results: Sequence[FaultResult], clean_failures: int) -> str:
    """The kill matrix as a Markdown document (table + survivors + fault descriptions)."""
    killed = sum(r.killed for r in results)
    lines = [
        "# Fault kill matrix",
        "",
        f"{killed}/{len(results)} faults killed. A cell lists the leaves whose rows failed under the "
        "fault (and passed on clean code), worst first, with the largest bound_usage "
        "(measured/allowed; >1 fails).",
        "",
        "| fault | seam | status | cases killed/run | vs_oracle | vs_reference | vs_unsharded | margin |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        cells = [f"`{r.name}`", f"`{r.seam}`", r.status, f"{len(r.cases_killed)}/{len(r.cases_run)}"]
        cells += [r.comparison_summary(c) for c in FAULT_COMPARISONS]
        cells.append(r.margin_text)
        lines.append("| " + " | ".join(_markdown_cell(c) for c in cells) + " |")
    survivors = [r for r in results if not r.killed]
    lines += ["", "## Surviving faults", ""]
    lines += [f"- `{r.name}` ({r.status}, {len(r.cases_run)} case(s) run)" for r in survivors] or ["none"]
    if clean_failures:
        lines += ["", f"**Warning:** {clean_failures} row(s) fail on the unmodified code; they cannot "
                  "count as evidence against any fault (see clean_rows.csv)."]
    lines += ["", "## What each fault models", ""]
    lines += [f"- `{r.name}` — patches `{r.seam}`: {r.description}" for r in results]
    return "\n".join(lines) + "\n"


def print_kill_matrix(results: Sequence[FaultResult], stream=None) -> None:
    """A one-screen plain-text kill matrix."""
    stream = stream or sys.stdout
    header = ("fault", "status", "killed/run", "caught by (comparison: worst leaf)", "margin")
    table = []
    for r in results:
        firsts = []
        for comparison in FAULT_COMPARISONS:
            catches = [c for c in r.catches if c.comparison == comparison]
            if catches:
                worst = max(catches, key=_sort_usage)
                firsts.append(f"{comparison.removeprefix('vs_')}:{worst.leaf}[{len(catches)}]")
        table.append((r.name, r.status, f"{len(r.cases_killed)}/{len(r.cases_run)}",
                      " ".join(firsts) or "-", r.margin_text))
    widths = [max(len(str(row[i])) for row in [header, *table]) for i in range(len(header))]
    for row in [header, ["-" * w for w in widths], *table]:
        print("  ".join(str(cell).ljust(w) for cell, w in zip(row, widths)).rstrip(), file=stream)


def _write_csv(path: pathlib.Path, header: Sequence[str], rows: Iterable[Sequence]) -> None:
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        writer.writerows(rows)


def write_rows_csv(path: pathlib.Path, rows: Sequence[dict]) -> None:
    from harness.schema import ROW_COLUMNS

    _write_csv(path, ROW_COLUMNS, ([row.get(c, "") for c in ROW_COLUMNS] for row in rows))


def _json_number(value: float):
    if math.isnan(value):
        return None
    if math.isinf(value):
        return "inf"
    return value


def write_kill_matrix(results: Sequence[FaultResult], clean_rows: Sequence[dict], out: pathlib.Path,
                      metadata: dict) -> dict[str, pathlib.Path]:
    """kill_matrix.csv / .md / .json and clean_rows.csv into `out`; returns the paths."""
    out.mkdir(parents=True, exist_ok=True)
    paths = {
        "csv": out / "kill_matrix.csv", "markdown": out / "kill_matrix.md",
        "json": out / "kill_matrix.json", "clean rows": out / "clean_rows.csv",
    }
    header = ("fault", "seam", "status", "comparison", "leaf", "leaf_kind", "rows_caught", "cases_caught",
              "error_rows", "max_bound_usage", "worst_case", "worst_candidate", "worst_reason")
    lines = []
    for r in results:
        if not r.catches:
            lines.append((r.name, r.seam, r.status) + ("",) * (len(header) - 3))
        for c in r.catches:
            lines.append((r.name, r.seam, r.status, c.comparison, c.leaf, c.leaf_kind, c.rows, c.cases,
                          c.errors, c.max_bound_usage, c.worst_case, c.worst_candidate, c.worst_reason))
    _write_csv(paths["csv"], header, lines)
    clean_failures = [r for r in clean_rows if r["verdict"] in CATCHING_VERDICTS]
    paths["markdown"].write_text(kill_matrix_markdown(results, len(clean_failures)))
    document = {
        "metadata": metadata,
        "killed": sum(r.killed for r in results),
        "faults": len(results),
        "survivors": [r.name for r in results if not r.killed],
        "clean_failures": [
            {k: row[k] for k in ("case", "candidate", "partner", "leaf", "verdict", "reason")}
            for row in clean_failures
        ],
        "results": [
            {
                "name": r.name, "seam": r.seam, "description": r.description, "status": r.status,
                "margin": _json_number(r.margin) if not r.only_errors else "error",
                "cases_run": list(r.cases_run), "cases_killed": list(r.cases_killed),
                "ignored_clean_failures": r.ignored_clean_failures, "seconds": round(r.seconds, 2),
                "catches": [
                    {**dataclasses.asdict(c), "max_bound_usage": _json_number(c.max_bound_usage)}
                    for c in r.catches
                ],
            }
            for r in results
        ],
    }
    paths["json"].write_text(json.dumps(document, indent=2) + "\n")
    write_rows_csv(paths["clean rows"], clean_rows)
    return paths


# ---------------------------------------------------------------------------- sweeping


@dataclasses.dataclass(frozen=True)
class Headroom:
    """The closest passing rows of one (comparison, dtype, leaf kind) came to their bound."""

    comparison: str
    dtype: str
    leaf_kind: str
    passing_rows: int
    failing_rows: int
    max_bound_usage: float
    worst_case: str
    worst_candidate: str
    worst_leaf: str
    worst_bound: str


def seeded_cases(cases: Sequence, seeds: int) -> list:
    """Every case at seeds 0..seeds-1, named `<case>-seed<s>` (seed-major order)."""
    return [case.replace(name=f"{case.name}-seed{s}", seed=s) for s in range(seeds) for case in cases]


def headroom_table(rows: Sequence[dict]) -> list[Headroom]:
    """Per (comparison, dtype, leaf_kind): passing/failing counts and the largest passing usage."""
    groups: dict[tuple[str, str, str], list[dict]] = {}
    for row in rows:
        if row["comparison"] in FAULT_COMPARISONS and row["verdict"] in ("pass", "fail", "error"):
            groups.setdefault((row["comparison"], str(row["dtype"]), str(row["leaf_kind"])), []).append(row)
    table = []
    for (comparison, dtype, kind), group in sorted(groups.items()):
        passing = [r for r in group if r["verdict"] == "pass"]
        usages = [(_nan_low(_usage(r)), r) for r in passing]
        worst = max(usages, key=lambda item: item[0])[1] if usages else None
        table.append(Headroom(
            comparison=comparison, dtype=dtype, leaf_kind=kind, passing_rows=len(passing),
            failing_rows=len(group) - len(passing),
            max_bound_usage=_usage(worst) if worst else math.nan,
            worst_case=str(worst["case"]) if worst else "", worst_candidate=str(worst["candidate"]) if worst else "",
            worst_leaf=str(worst["leaf"]) if worst else "", worst_bound=str(worst["bound"]) if worst else "",
        ))
    return table


def sweep_markdown(table: Sequence[Headroom], failures: Sequence[dict], seeds: int, case_count: int) -> str:
    lines = [
        "# False-positive sweep",
        "",
        f"Unmodified code, {case_count} case(s) × seeds 0..{seeds - 1}. Headroom: the largest bound_usage "
        "of any passing row (1.0 = at the bound).",
        "",
        "| comparison | dtype | leaf kind | passing | failing | max usage (passing) | closest row |",
        "|---|---|---|---|---|---|---|",
    ]
    for h in table:
        closest = f"{h.worst_case} {h.worst_candidate} {h.worst_leaf}" if h.worst_case else "-"
        lines.append(f"| {h.comparison} | {h.dtype} | {h.leaf_kind} | {h.passing_rows} | {h.failing_rows} | "
                     f"{_format_usage(h.max_bound_usage)} | {_markdown_cell(closest)} |")
    lines += ["", f"## Failing rows ({len(failures)})", ""]
    for row in failures[:200]:
        lines.append(f"- {row['verdict']} `{row['case']}` {row['candidate']} {row['comparison']} "
                     f"`{row['leaf']}` usage {_format_usage(_usage(row))}: {_markdown_cell(str(row['reason']))}")
    if not failures:
        lines.append("none")
    return "\n".join(lines) + "\n"


def run_sweep(cases, seeds: int, policy, out: pathlib.Path, *, quiet=False) -> int:
    """The false-positive sweep; returns the exit code (1 if any row fails or errors)."""
    from harness.runner import Runner

    seeded = seeded_cases(cases, seeds)
    runner = Runner(policy)
    rows: list[dict] = []
    start = time.perf_counter()
    for index, case in enumerate(seeded, 1):
        case_start = time.perf_counter()
        case_rows = list(runner.run_case(case, _plan()))
        rows.extend(case_rows)
        bad = sum(r["verdict"] in CATCHING_VERDICTS for r in case_rows)
        _log(f"  sweep [{index}/{len(seeded)}] {case.name} ({time.perf_counter() - case_start:.1f}s"
             f"{f', {bad} FAILING row(s)' if bad else ''})", quiet=quiet)
    failures = [r for r in rows if r["verdict"] in CATCHING_VERDICTS]
    table = headroom_table(rows)
    out.mkdir(parents=True, exist_ok=True)
    header = [f.name for f in dataclasses.fields(Headroom)]
    _write_csv(out / "headroom.csv", header, ([getattr(h, f) for f in header] for h in table))
    write_rows_csv(out / "failures.csv", failures)
    (out / "sweep.md").write_text(sweep_markdown(table, failures, seeds, len(cases)))
    (out / "sweep.json").write_text(json.dumps({
        "seeds": seeds, "cases": [c.name for c in cases], "rows": len(rows), "failing_rows": len(failures),
        "wall_seconds": round(time.perf_counter() - start, 1),
        "headroom": [{**dataclasses.asdict(h), "max_bound_usage": _json_number(h.max_bound_usage)} for h in table],
    }, indent=2) + "\n")
    _print_headroom(table)
    print(f"sweep: {len(rows)} rows over {len(seeded)} seeded cases, {len(failures)} failing "
          f"({time.perf_counter() - start:.0f}s); reports in {out}")
    for row in failures[:12]:
        print(f"  {row['verdict']}  {row['case']}  {row['candidate']} {row['comparison']}  {row['leaf']}  "
              f"{str(row['reason'])[:120]}")
    return EXIT_SURVIVOR if failures else EXIT_OK


def _print_headroom(table: Sequence[Headroom]) -> None:
    header = ("comparison", "dtype", "leaf kind", "pass", "fail", "max usage", "closest row")
    body = [(h.comparison, h.dtype, h.leaf_kind, str(h.passing_rows), str(h.failing_rows),
             _format_usage(h.max_bound_usage), f"{h.worst_case} {h.worst_leaf}".strip()) for h in table]
    widths = [max(len(r[i]) for r in [header, *body]) for i in range(len(header))]
    for row in [header, tuple("-" * w for w in widths), *body]:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())


# --------------------------------------------------------------------------------- CLI


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m harness faults",
        description="Kill matrix of the fault catalogue; with --seeds N, the false-positive sweep.",
    )
    parser.add_argument("--suite", default=None, help="case suite (default: 'default' unless --cases is given)")
    parser.add_argument("--cases", nargs="+", default=None, metavar="GLOB", help="case-name globs")
    parser.add_argument("--faults", nargs="+", default=None, metavar="GLOB",
                        help="fault-name globs, e.g. 'kernel.*' (default: the whole catalogue)")
    parser.add_argument("--out", type=pathlib.Path, default=None,
                        help=f"output folder (default: {DEFAULT_FAULTS_OUT}, or {DEFAULT_SWEEP_OUT} with --seeds)")
    parser.add_argument("--seeds", type=int, default=None, metavar="N",
                        help="run the false-positive sweep instead: unmodified code, seeds 0..N-1")
    parser.add_argument("--policy", type=pathlib.Path, default=None, help="tolerance policy TOML (default: packaged)")
    parser.add_argument("--list", action="store_true", help="print the fault catalogue and exit")
    parser.add_argument("--jobs", type=int, default=1, metavar="N",
                        help="run the faults in N processes (each repeats the clean pass; built-in catalogue only)")
    parser.add_argument("--quiet", action="store_true", help="no per-case progress lines")
    return parser


def select_cases(suite: str | None, globs: Sequence[str] | None):
    """The selected cases; UsageError for an unknown suite or a glob matching nothing."""
    from cases import registry

    try:
        selected = registry.default_registry().select(suite=suite or (None if globs else "default"), names=globs)
    except (KeyError, ValueError) as exc:
        raise UsageError(str(exc)) from exc
    if not selected:
        raise UsageError("no case matches the selection")
    return list(selected)


def print_catalogue(catalogue: Sequence[Fault]) -> None:
    for fault in catalogue:
        scope = "/".join(fault.implementations) + (" (sharded only)" if fault.sharded_only else "")
        print(f"{fault.name}\n    seam: {fault.seam.name}\n    paths: {scope}\n    models: {fault.description}")


def _run_faults_in_process(faults: Sequence[Fault], cases, policy, *, quiet=False):
    """Clean pass, then one pass per fault, in this process: (clean rows, [FaultResult])."""
    shared, memo = _SharedInputs(), {}
    _log(f"faults: clean pass over {len(cases)} case(s)", quiet=False)
    clean_rows = run_clean_pass(cases, policy, shared, memo, quiet=quiet)
    results = []
    for fault in faults:
        targets = [c for c in cases if fault.affects_case(c)]
        start = time.perf_counter()
        _log(f"faults: {fault.name} on {len(targets)} case(s) ...", quiet=False)
        rows = run_fault_pass(fault, targets, policy, shared, memo) if targets else []
        result = judge_fault(fault, rows, clean_rows, [c.name for c in targets], time.perf_counter() - start)
        results.append(result)
        _log(f"faults: {fault.name}: {result.status} ({len(result.cases_killed)}/{len(targets)} cases, "
             f"margin {result.margin_text}, {result.seconds:.0f}s)", quiet=False)
    return clean_rows, results


def _worker(fault_names: Sequence[str], case_names: Sequence[str], policy_path, quiet: bool,
            use_compilation_cache: bool):
    """One `--jobs` worker process: built-in faults by name, cases by name."""
    from harness.env import ensure_host_devices

    ensure_host_devices()
    if use_compilation_cache:
        from harness.env import enable_compilation_cache

        enable_compilation_cache()
    from cases import registry
    from harness.faults import FAULTS
    from harness.policy import load_policy

    cases = [registry.default_registry().get(name) for name in case_names]
    return _run_faults_in_process([FAULTS[n] for n in fault_names], cases, load_policy(policy_path), quiet=quiet)


def _split_faults(faults: Sequence[Fault], jobs: int) -> list[list[Fault]]:
    """Faults dealt round-robin into `jobs` groups (kernel faults cost more; dealing mixes them)."""
    ordered = sorted(faults, key=lambda f: (f.implementations == ("reference",), f.sharded_only))
    groups: list[list[Fault]] = [[] for _ in range(min(jobs, len(ordered)))]
    for index, fault in enumerate(ordered):
        groups[index % len(groups)].append(fault)
    return groups


def _run_faults_in_workers(faults, cases, policy_path, jobs: int, *, quiet=False, use_compilation_cache=True):
    """`_run_faults_in_process` split over `jobs` spawned processes (each does its own clean pass)."""
    import concurrent.futures
    import multiprocessing

    groups = _split_faults(faults, jobs)
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=len(groups), mp_context=context) as pool:
        futures = [
            pool.submit(_worker, [f.name for f in group], [c.name for c in cases], policy_path, quiet,
                        use_compilation_cache)
            for group in groups
        ]
        outcomes = [future.result() for future in futures]
    clean_rows = outcomes[0][0]
    by_name = {result.name: result for _, results in outcomes for result in results}
    return clean_rows, [by_name[f.name] for f in faults]


def run_kill_matrix(faults: Sequence[Fault], cases, policy, out: pathlib.Path, *, quiet=False, jobs: int = 1,
                    policy_path=None, use_compilation_cache=True) -> int:
    """Clean pass, one pass per fault (in `jobs` processes), reports; returns the exit code."""
    from harness.env import run_metadata

    started = datetime.datetime.now(datetime.timezone.utc)
    wall = time.perf_counter()
    if jobs > 1 and len(faults) > 1:
        clean_rows, results = _run_faults_in_workers(
            faults, cases, policy_path, jobs, quiet=quiet, use_compilation_cache=use_compilation_cache)
    else:
        clean_rows, results = _run_faults_in_process(faults, cases, policy, quiet=quiet)
    clean_failures = sum(r["verdict"] in CATCHING_VERDICTS for r in clean_rows)
    if clean_failures:
        _log(f"faults: WARNING: {clean_failures} row(s) fail on the unmodified code; they are not "
             "counted as evidence against any fault", quiet=False)
    metadata = run_metadata()
    metadata.update(
        command_line=" ".join(sys.argv), start_time=started.isoformat(timespec="seconds"),
        wall_seconds=round(time.perf_counter() - wall, 1), policy_file=str(policy.source),
        policy_hash=policy.digest, cases=[c.name for c in cases], clean_failing_rows=clean_failures, jobs=jobs,
    )
    paths = write_kill_matrix(results, clean_rows, out, metadata)
    print()
    print_kill_matrix(results)
    survivors = [r for r in results if not r.killed]
    print()
    print(f"faults: {len(results) - len(survivors)}/{len(results)} killed in "
          f"{time.perf_counter() - wall:.0f}s; clean failing rows: {clean_failures}")
    if survivors:
        print("surviving faults: " + ", ".join(f"{r.name} ({r.status})" for r in survivors))
    for fmt, path in paths.items():
        print(f"{fmt:>10}: {path}")
    return EXIT_SURVIVOR if survivors else EXIT_OK


def main(argv: Sequence[str] | None = None, *, catalogue: Sequence[Fault] = CATALOGUE,
         use_compilation_cache: bool = True) -> int:
    """Entry point of `python -m harness faults`.

    catalogue: the faults to choose from (tests pass their own). use_compilation_cache:
    turn on JAX's persistent compilation cache in the project cache folder, as
    `python -m harness run` does (tests leave the process's configuration alone).
    """
    from harness.env import ensure_host_devices

    ensure_host_devices()
    try:
        args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    except SystemExit as exc:  # argparse: 2 on usage errors, 0 on --help
        return int(exc.code or 0)
    try:
        if args.list:
            print_catalogue(list(catalogue))
            return EXIT_OK
        if args.seeds is not None:
            if args.seeds < 1:
                raise UsageError(f"--seeds must be at least 1, got {args.seeds}")
            if args.faults:
                raise UsageError("--seeds runs the unmodified code; it cannot be combined with --faults")
        if args.jobs < 1:
            raise UsageError(f"--jobs must be at least 1, got {args.jobs}")
        if args.jobs > 1 and tuple(catalogue) != CATALOGUE:
            raise UsageError("--jobs > 1 runs the built-in catalogue only")
        faults = select_faults(args.faults, catalogue) if args.seeds is None else []
        for fault in faults:
            fault.seam.resolve()
        from harness.policy import PolicyError, load_policy

        try:
            policy = load_policy(args.policy)
        except (PolicyError, OSError) as exc:
            raise UsageError(str(exc)) from exc
        cases = select_cases(args.suite, args.cases)
    except (UsageError, UnknownFaultError, SeamError) as exc:
        print(f"mhc-parity faults: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if use_compilation_cache:
        from harness.env import enable_compilation_cache

        enable_compilation_cache()
    if args.seeds is not None:
        return run_sweep(cases, args.seeds, policy, args.out or DEFAULT_SWEEP_OUT, quiet=args.quiet)
    return run_kill_matrix(faults, cases, policy, args.out or DEFAULT_FAULTS_OUT, quiet=args.quiet,
                           jobs=args.jobs, policy_path=args.policy, use_compilation_cache=use_compilation_cache)
