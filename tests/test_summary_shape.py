"""summary.md, the PR comment, leads with the verdict and the failures; timings fold away.

On a CPU about 50 of its 86 lines were Speed rows each saying it was not a speed
measurement, above nothing a reviewer acts on. Now the first screen is the verdict, the gate's
line, the failures and the command that reruns them; the Speed and Host memory sections sit in
closed `<details>` blocks.
"""

from __future__ import annotations

import re

from mhc_parity.records.schema import empty_row
from mhc_parity.reports import to_frame
from mhc_parity.reports.markdown import render_markdown

CPU = {"backend": "cpu", "device_kind": "cpu"}


def _row(case, candidate, partner, comparison, verdict="pass", leaf="out", execute_s=0.5):
    return empty_row(
        case=case,
        candidate=candidate,
        partner=partner,
        comparison=comparison,
        leaf=leaf,
        leaf_kind="output",
        verdict=verdict,
        bound_usage=2.0 if verdict == "fail" else 0.1,
        execute_s=execute_s,
        execute_first_s=execute_s,
        execute_runs=1.0,
        bytes_moved=1e6,
        devices="cpu:0",
    )


def cpu_run(cases: int = 30) -> list[dict]:
    """`cases` cases timed on a CPU, the reference and the kernel path each, one failing leaf."""
    rows = []
    for index in range(cases):
        case = f"case-{index:02d}"
        rows.append(_row(case, "reference/unsharded", "oracle", "vs_oracle"))
        rows.append(_row(case, "interpret/unsharded", "reference/unsharded", "vs_reference"))
    rows.append(_row("case-07", "interpret/unsharded", "oracle", "vs_oracle", verdict="fail", leaf="d_x"))
    return rows


def unfolded(markdown: str) -> str:
    """What a reader sees without opening a `<details>` block."""
    return re.sub(r"<details>.*?</details>", "", markdown, flags=re.S)


def test_the_summary_leads_with_the_verdict_and_failures_and_folds_the_cpu_timings():
    markdown = render_markdown(to_frame(cpu_run()), metadata=CPU, rerun="mhc-parity run --cases case-07 --out x")
    lines = markdown.splitlines()
    assert lines[0] == "## mHC parity: ❌ FAIL"
    failures = markdown.index("### Failures (1)")
    assert failures < markdown.index("Rerun only the failing cases") < markdown.index("| pass |")
    assert failures < markdown.index("<details>")
    seen = unfolded(markdown)
    assert "not a speed measurement" not in seen.lower() and "device ms" not in seen and "case-29" not in seen
    assert len([line for line in seen.splitlines() if line.strip()]) < 25, seen
    speed = re.search(
        r"<details><summary>Speed: (\d+) programs timed on a CPU[^<]*</summary>(.*?)</details>", markdown, re.S
    )
    assert speed and int(speed.group(1)) == 60 and "case-05" in speed.group(2)
