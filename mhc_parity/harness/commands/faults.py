"""`mhc-parity faults`: the kill matrix (default), the false-positive sweep (`--seeds N`) and the rounding
audit (`--audit`).

The kill matrix runs the clean pass and every selected fault and variant
(`mhc_parity.harness.faults.matrix`), writes kill_matrix.csv / .md / .json, clean_rows.csv and
perturbed_rows.csv, and exits 0 when every fault is caught or listed in every slice it runs in, every
variant passes and no clean row fails (a fault no selected case exercises survives); 1 otherwise; 2 on a
usage error. The sweep runs the unmodified code over seeds 0..N-1 and exits 1 if any row fails or errors.
"""

from __future__ import annotations

import argparse
import datetime
import pathlib
import shlex
import sys
import time
from collections.abc import Sequence

from mhc_parity.cases.fixtures import make_fixture
from mhc_parity.harness.commands.common import EXIT_FAILED, EXIT_OK, Parser, error
from mhc_parity.harness.engine.implementations import ImplementationError, load_external
from mhc_parity.harness.engine.run_info import enable_compilation_cache, run_metadata
from mhc_parity.harness.engine.selection import RunSelection, select_cases
from mhc_parity.harness.env import ensure_host_devices
from mhc_parity.harness.errors import ConfigurationError, UsageError
from mhc_parity.harness.faults import matrix as kill_matrix
from mhc_parity.harness.faults.fault_catalogue import CATALOGUE
from mhc_parity.harness.faults.model import Perturbation, SeamError, UnknownPerturbationError, select
from mhc_parity.harness.faults.rounding_audit import AUDIT_CASES, audit_case, audit_markdown
from mhc_parity.harness.faults.seed_sweep import (
    run_sweep_in_workers,
    run_sweep_rows,
    seeded_cases,
    sweep_implementations,
)
from mhc_parity.harness.faults.variants import VARIANTS
from mhc_parity.harness.judging.policy import PolicyError
from mhc_parity.harness.judging.policy_file import load_policy
from mhc_parity.records.outputs import OutputPathError, writable_file
from mhc_parity.reports.kill_matrix import headline_counts, kill_matrix_text, write_kill_matrix
from mhc_parity.reports.sweep import headroom_table, sweep_text, write_sweep
from mhc_parity.reports.writers import write_results

DEFAULT_FAULTS_OUT = pathlib.Path("out/faults")
DEFAULT_SWEEP_OUT = pathlib.Path("out/sweep")
DEFAULT_AUDIT_OUT = pathlib.Path("out/audit")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="mhc-parity faults",
        description="Kill matrix of the faults and legitimate variants; with --seeds N, the false-positive sweep.",
    )
    parser.add_argument("--suite", default=None, help="case suite (default: 'default' unless --cases is given)")
    parser.add_argument("--cases", nargs="+", default=None, metavar="GLOB", help="case-name globs")
    parser.add_argument("--dtype", default=None, help="activation dtype filter: float32|bfloat16 (f32, bf16)")
    parser.add_argument("--faults", nargs="+", default=None, metavar="GLOB", help="fault-name globs, e.g. 'kernel.*'")
    parser.add_argument(
        "--variants",
        nargs="+",
        default=None,
        metavar="GLOB",
        help="legitimate-variant-name globs (default: all, unless --faults is given)",
    )
    parser.add_argument(
        "--impl",
        action="append",
        default=[],
        metavar="MODULE:FACTORY",
        help="add an external implementation to every pass (repeatable)",
    )
    parser.add_argument(
        "--out",
        type=pathlib.Path,
        default=None,
        help=f"output folder (default: {DEFAULT_FAULTS_OUT}, or {DEFAULT_SWEEP_OUT} with --seeds)",
    )
    parser.add_argument(
        "--seeds",
        type=int,
        default=None,
        metavar="N",
        help="run the false-positive sweep instead: unmodified code, seeds 0..N-1",
    )
    parser.add_argument(
        "--audit",
        action="store_true",
        help="write the rounding audit instead: the reference's bfloat16 values and the model's site for each, "
        "and each site's share of the sensitivity "
        "(default cases: mhc_parity.harness.faults.rounding_audit.AUDIT_CASES)",
    )
    parser.add_argument("--policy", type=pathlib.Path, default=None, help="tolerance policy TOML (default: packaged)")
    parser.add_argument("--list", action="store_true", help="print the faults and variants and exit")
    parser.add_argument(
        "--jobs",
        type=int,
        default=1,
        metavar="N",
        help="deal the cases to N processes (a case's clean pass and perturbations run in one; catalogued only); "
        "with --seeds, deal the seeds to N processes",
    )
    parser.add_argument("--quiet", action="store_true", help="no per-case progress lines")
    parser.add_argument(
        "--results",
        type=pathlib.Path,
        default=None,
        metavar="FILE",
        help="also write the Markdown with its date, commit and machine (make faults / make sweep: docs/results/)",
    )
    return parser


def select_perturbations(
    fault_globs, variant_globs, faults: Sequence[Perturbation] = CATALOGUE, variants: Sequence[Perturbation] = VARIANTS
) -> list[Perturbation]:
    if fault_globs is None and variant_globs is None:
        return [*faults, *variants]
    chosen = select(fault_globs, faults, "fault") if fault_globs is not None else []
    return chosen + (select(variant_globs, variants, "variant") if variant_globs is not None else [])


def print_catalogue(perturbations: Sequence[Perturbation]) -> None:
    for p in perturbations:
        scope = "/".join(p.implementations) + (" (sharded only)" if p.sharded_only else "")
        kind = "legitimate variant (must pass)" if p.legitimate else "fault (must be caught)"
        print(f"{p.name}  [{kind}]\n    seams: {p.seam_names}\n    paths: {scope}\n    models: {p.description}")
        for dtype_slice, why in p.unkillable_in:
            print(f"    cannot be caught in {dtype_slice}: {why}")


def _command() -> str:
    return "mhc-parity faults " + shlex.join(sys.argv[2:] if sys.argv[1:2] == ["faults"] else sys.argv[1:])


def _metadata(policy, cases, started, wall, jobs, impls) -> dict:
    metadata = run_metadata()
    metadata.update(
        command_line=" ".join(sys.argv),
        start_time=started.isoformat(timespec="seconds"),
        wall_seconds=round(time.perf_counter() - wall, 1),
        policy_file=str(policy.source),
        policy_hash=policy.digest,
        cases=[c.name for c in cases],
        jobs=jobs,
        implementations=[i.name for i in impls],
    )
    return metadata


def run_kill_matrix(
    perturbations: Sequence[Perturbation],
    cases,
    policy,
    out: pathlib.Path,
    *,
    impl_specs=(),
    quiet=False,
    jobs: int = 1,
    policy_path=None,
    use_compilation_cache=True,
    results: pathlib.Path | None = None,
) -> int:
    """Each case's clean and perturbed passes (cases dealt to `jobs` processes), then the reports; the exit
    code. results: also write the Markdown there with its provenance."""
    started = datetime.datetime.now(datetime.UTC)
    wall = time.perf_counter()
    impls = kill_matrix.implementations(impl_specs)
    if jobs > 1 and len(cases) > 1:
        matrix = kill_matrix.run_in_workers(
            perturbations,
            cases,
            policy_path,
            impl_specs,
            jobs,
            quiet=quiet,
            use_compilation_cache=use_compilation_cache,
        )
    else:
        matrix = kill_matrix.run_in_process(perturbations, cases, policy, impls, quiet=quiet)
    metadata = _metadata(policy, cases, started, wall, jobs, impls)
    paths = write_kill_matrix(matrix, out, metadata)
    if results is not None:
        paths["results"] = write_results(results, paths["markdown"].read_text(encoding="utf-8"), _command(), metadata)
    print()
    print(kill_matrix_text(matrix))
    print()
    variants = [r for r in matrix.results if r.legitimate]
    print(
        f"variants: {sum(r.ok for r in variants)}/{len(variants)} pass, "
        f"{len(matrix.clean_failures)} clean row(s) fail ({time.perf_counter() - wall:.0f}s)"
    )
    for label, counts in headline_counts(matrix):
        print(f"faults: {counts.text}" if label == "all" else f"  {label}: {counts.text}")
    for r in matrix.results:
        if not r.ok:
            print(f"  NOT OK: {r.name}: {r.status}")
    for r in matrix.results:  # they pass the run, but were not seen: say which and why
        for s in r.listed_slices:
            print(f"  LISTED, not seen: {r.name} in {s.dtype_slice} ({s.listed_by})")
    for fmt, path in paths.items():
        print(f"{fmt:>14}: {path}")
    return EXIT_OK if matrix.ok else EXIT_FAILED


def run_sweep(
    cases,
    seeds: int,
    policy,
    out: pathlib.Path,
    *,
    impl_specs=(),
    quiet=False,
    results: pathlib.Path | None = None,
    jobs: int = 1,
    policy_path=None,
) -> int:
    """The false-positive sweep (seeds dealt to `jobs` processes); exit 1 if any row fails or errors.
    results: also write its Markdown there with its provenance."""
    start = time.perf_counter()
    if jobs > 1 and seeds > 1:
        rows = run_sweep_in_workers(cases, seeds, policy_path, impl_specs, jobs, quiet=quiet)
    else:
        rows = run_sweep_rows(cases, seeds, policy, sweep_implementations(impl_specs), quiet=quiet)
    table = headroom_table(rows)
    families = {seeded.name: seeded.init for seeded in seeded_cases(cases, seeds)}
    rate = None if policy.confidence is None else policy.confidence.false_positive_rate
    paths = write_sweep(
        table, rows, seeds, cases, out, time.perf_counter() - start, families=families, false_positive_rate=rate
    )
    if results is not None:
        markdown = paths["markdown"].read_text(encoding="utf-8")
        paths["results"] = write_results(
            results, markdown, _command(), {**run_metadata(cases), "policy_hash": policy.digest}
        )
    failing = int(table["failing"].sum()) if len(table) else 0
    print(sweep_text(table))
    print(
        f"sweep: {len(rows)} rows over {len(cases) * seeds} seeded cases, {failing} failing "
        f"({time.perf_counter() - start:.0f}s); reports in {out}"
    )
    for row in [r for r in rows if r["verdict"] in ("fail", "error")][:12]:
        print(
            f"  {row['verdict']}  {row['case']}  {row['candidate']} {row['comparison']}  {row['leaf']}  "
            f"{str(row['reason'])[:120]}"
        )
    for fmt, path in paths.items():
        print(f"{fmt:>14}: {path}")
    return EXIT_FAILED if failing else EXIT_OK


def run_audit(cases, out: pathlib.Path, *, results: pathlib.Path | None = None) -> int:
    """The rounding audit of `cases` into out/rounding_audit.md; exit 1 when the reference holds a bfloat16
    value no site of the model rounds."""
    audits = [audit_case(case, make_fixture(case)) for case in cases]
    markdown = audit_markdown(audits)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "rounding_audit.md"
    path.write_text(markdown, encoding="utf-8")
    if results is not None:
        write_results(results, markdown, _command(), run_metadata(cases))
    missing = {v.function for audit in audits for v in audit.unmodelled}
    print(markdown)
    print(f"audit: {len(cases)} case(s), unmodelled bfloat16 values: {', '.join(sorted(missing)) or 'none'}; {path}")
    return EXIT_FAILED if missing else EXIT_OK


def main(
    argv: Sequence[str] | None = None,
    *,
    faults: Sequence[Perturbation] = CATALOGUE,
    variants: Sequence[Perturbation] = VARIANTS,
    use_compilation_cache: bool = True,
) -> int:
    """Entry point of `mhc-parity faults`. faults, variants: the catalogues (tests pass their own);
    use_compilation_cache: JAX's persistent cache, as `run` (tests leave it off)."""
    ensure_host_devices()
    try:
        args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    except SystemExit as exc:  # argparse: 2 on usage errors, 0 on --help
        return int(exc.code or 0)
    try:
        if args.list:
            print_catalogue([*faults, *variants])
            return EXIT_OK
        if args.audit and (args.seeds is not None or args.faults or args.variants):
            raise UsageError("--audit runs the oracle alone; it cannot be combined with --seeds/--faults/--variants")
        if args.seeds is not None:
            if args.seeds < 1:
                raise UsageError(f"--seeds must be at least 1, got {args.seeds}")
            if args.faults or args.variants:
                raise UsageError("--seeds runs the unmodified code; it cannot be combined with --faults/--variants")
        if args.jobs < 1:
            raise UsageError(f"--jobs must be at least 1, got {args.jobs}")
        if args.jobs > 1 and (tuple(faults) != CATALOGUE or tuple(variants) != VARIANTS):
            raise UsageError("--jobs > 1 runs the built-in catalogues only")
        chosen = select_perturbations(args.faults, args.variants, faults, variants) if args.seeds is None else []
        for perturbation in chosen:
            perturbation.resolve()
        try:
            policy = load_policy(args.policy)
            for spec in args.impl:
                load_external(spec)
        except (PolicyError, ImplementationError, OSError) as exc:
            raise UsageError(str(exc)) from exc
        case_globs = tuple(AUDIT_CASES) if args.audit and args.cases is None and args.suite is None else args.cases
        selection = RunSelection(
            suite=args.suite, cases=None if case_globs is None else tuple(case_globs), dtype=args.dtype
        )
        cases = select_cases(selection)
        if args.results is not None:
            try:
                writable_file(args.results)
            except OutputPathError as exc:
                raise UsageError(f"--results: {exc}") from exc
    except (UsageError, UnknownPerturbationError, SeamError) as exc:
        return error(str(exc))
    if use_compilation_cache:
        try:
            enable_compilation_cache()
        except ConfigurationError as exc:
            return error(str(exc))
    if args.audit:
        return run_audit(cases, args.out or DEFAULT_AUDIT_OUT, results=args.results)
    if args.seeds is not None:
        return run_sweep(
            cases,
            args.seeds,
            policy,
            args.out or DEFAULT_SWEEP_OUT,
            impl_specs=args.impl,
            quiet=args.quiet,
            results=args.results,
            jobs=args.jobs,
            policy_path=args.policy,
        )
    return run_kill_matrix(
        chosen,
        cases,
        policy,
        args.out or DEFAULT_FAULTS_OUT,
        impl_specs=args.impl,
        quiet=args.quiet,
        jobs=args.jobs,
        policy_path=args.policy,
        use_compilation_cache=use_compilation_cache,
        results=args.results,
    )
