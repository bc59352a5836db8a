"""`mhc-parity policy`: the tolerance policy, checked, and every bound it resolves to.

    mhc-parity policy [--policy FILE]             check the file (one line; exit 2 if bad)
    mhc-parity policy --table [--policy FILE]     every resolved bound, a plain-text table
    mhc-parity policy --markdown [--policy FILE]  the same as docs/tolerances.md (`make tolerances`)

One line per judgement the case matrix makes (`planned_judgements`: every registered case through the
built-ins and an external implementation); partitionings with one bound share a line.
"""

from __future__ import annotations

import dataclasses
import pathlib
from collections.abc import Sequence

from mhc_parity.cases import registry
from mhc_parity.harness.commands.common import EXIT_OK, Parser, error
from mhc_parity.harness.engine.implementations import BUILTIN, Implementation
from mhc_parity.harness.engine.plan import JudgementKey, PathPlan, planned_judgements
from mhc_parity.harness.judging.bounds import notation
from mhc_parity.harness.judging.metrics import eps
from mhc_parity.harness.judging.policy import POLICY_COMPARISONS, POLICY_LEAF_KINDS, Policy, PolicyError, Resolved
from mhc_parity.harness.judging.policy_file import load_policy
from mhc_parity.records.text import format_number, format_text_table
from mhc_parity.reports.tables import md_table

PROG = "mhc-parity policy"
# Any external implementation: every variant, partitioned by XLA ("auto").
EXTERNAL = Implementation("external")
TABLE_HEADERS = ("comparison", "partitioning", "act dtype", "leaf dtype", "leaf kind", "bound", "ulps of", "rule")
DOC_PATH = pathlib.Path("docs") / "tolerances.md"


@dataclasses.dataclass(frozen=True)
class TableLine:
    """One resolved bound and the judgements (partitionings) that meet it."""

    key: JudgementKey
    partitionings: tuple[str, ...]
    resolved: Resolved

    def cells(self) -> list[str]:
        k = self.key
        return [
            k.comparison,
            ", ".join(self.partitionings),
            k.act_dtype,
            k.dtype,
            k.leaf_kind,
            self.resolved.bound.describe(),
            self.resolved.unit_dtype,
            self.resolved.rule.pattern,
        ]


def matrix_judgements() -> list[JudgementKey]:
    """Every kind of judgement the registered cases make."""
    plan = PathPlan(implementations=(*BUILTIN.values(), EXTERNAL), lowering=False)
    return planned_judgements(list(registry.default_registry()), plan)


def table_lines(policy: Policy, judgements: Sequence[JudgementKey]) -> list[TableLine]:
    """The resolved bound of every judgement, in comparison / activation dtype / leaf dtype / leaf kind
    order, partitionings with one bound on one line; PolicyError for one the policy cannot resolve."""
    groups: dict[tuple, list[tuple[str, Resolved]]] = {}
    for key in judgements:
        group = (key.comparison, key.act_dtype, key.dtype, key.leaf_kind)
        groups.setdefault(group, []).append((key.partitioning, key.resolve(policy)))
    order = lambda group: (
        POLICY_COMPARISONS.index(group[0]),
        group[1],
        group[2],  # noqa: E731
        POLICY_LEAF_KINDS.index(group[3]),
    )
    lines = []
    for group in sorted(groups, key=order):
        by_bound: dict[Resolved, list[str]] = {}
        for partitioning, resolved in sorted(groups[group]):
            by_bound.setdefault(resolved, []).append(partitioning)
        for resolved, partitionings in by_bound.items():
            key = JudgementKey(group[0], partitionings[0], *group[1:])
            lines.append(TableLine(key, tuple(partitionings), resolved))
    return lines


def table_text(lines: Sequence[TableLine]) -> str:
    return format_text_table(TABLE_HEADERS, [line.cells() for line in lines], limit=None)


def _rule_heading(rule) -> str:
    return f"{rule.comparison}: {rule.pattern}"


def _numbers(bound) -> str:
    fields = [f.name for f in dataclasses.fields(bound) if f.name in type(bound).numbers]
    return ", ".join(f"{name} = {getattr(bound, name):g}" for name in fields) or "no numbers"


def markdown(
    policy: Policy, lines: Sequence[TableLine], *, source: str = "mhc_parity/harness/judging/tolerances.toml"
) -> str:
    """docs/tolerances.md: how to read it, the resolved bounds per comparison, every rule's rationale."""
    used = {line.resolved.rule.index for line in lines}
    units = ", ".join(f"{d} {format_number(eps(d), 3)}" for d in ("float32", "bfloat16"))
    out = [
        "# Tolerances",
        "",
        f"Generated from `{source}` by `mhc-parity policy --markdown` (`make tolerances`);",
        "`tests/test_policy_table.py` fails when this file is not what the policy resolves to, so a",
        "change of a number shows here as the lines it moves. Semantics:",
        "`mhc_parity/harness/judging/policy.py` (matching, non-finite values) and",
        "`mhc_parity/harness/judging/bounds.py` (the rule kinds).",
        "",
        "One line per kind of judgement the case matrix makes (every registered case through the",
        "built-in implementations and an external one). A bound is in ulps of the dtype in `ulps of`",
        f"(eps: {units}), relative to the largest compared value:",
        "",
        *(f"- {line}" for line in notation()),
        "",
    ]
    for comparison in POLICY_COMPARISONS:
        rows = [line.cells() for line in lines if line.key.comparison == comparison]
        if rows:
            out += [f"## {comparison}", "", md_table(TABLE_HEADERS, rows, limit=None, escape_html=False), ""]
    out += ["## Rules", ""]
    for rule in policy.rules:
        unit = rule.eps_dtype or "the leaf's dtype"
        note = "" if rule.index in used else " (resolves no judgement of the matrix)"
        out += [
            f"### {_rule_heading(rule)}{note}",
            "",
            f"`{rule.kind}`: {_numbers(rule.bound)} (ulps of {unit})",
            "",
            *(f"> {text}" for text in rule.rationale.splitlines()),
            "",
        ]
    if policy.systematic is not None:
        s = policy.systematic
        out += [
            "## Systematic criterion",
            "",
            f"On {', '.join(s.leaf_kinds)} leaves of oracle_ratio rules: t_floor = {s.t_floor:g}, ratio = {s.ratio:g}.",
            "",
            *(f"> {text}" for text in s.rationale.splitlines()),
            "",
        ]
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    """`policy [--policy FILE] [--table | --markdown]`; exit 0, or 2 for a malformed policy or one that
    cannot resolve a judgement the matrix makes."""
    parser = Parser(prog=PROG, description="Check the tolerance policy; print every resolved bound.")
    parser.add_argument("--policy", type=pathlib.Path, default=None, help="tolerance policy TOML (default: packaged)")
    shown = parser.add_mutually_exclusive_group()
    shown.add_argument("--table", action="store_true", help="print every resolved bound as a plain-text table")
    shown.add_argument("--markdown", action="store_true", help=f"print every resolved bound as {DOC_PATH}")
    try:
        args = parser.parse_args(None if argv is None else list(argv))
    except SystemExit as exc:
        return int(exc.code or 0)
    try:
        policy = load_policy(args.policy)
        judgements = matrix_judgements()
        lines = table_lines(policy, judgements)
    except PolicyError as exc:
        return error(str(exc))
    if args.table:
        print(table_text(lines))
    elif args.markdown:
        print(markdown(policy, lines, source=_shown_source(args.policy)), end="")
    else:
        print(
            f"policy {policy.source}: {len(policy.rules)} rules resolve all {len(judgements)} kinds of judgement "
            f"the case matrix makes ({len(lines)} distinct bounds; sha256 {policy.digest[:12]})"
        )
    return EXIT_OK


def _shown_source(path) -> str:
    return "mhc_parity/harness/judging/tolerances.toml" if path is None else str(path)
