"""The command that reruns only a run's failing cases (pytest's `--lf`): in the terminal,
summary.md and report.html, rebuilt from the run's manifest (`mhc_parity.reports.rerun`).

It names exactly the failing cases, keeps what chose how they ran (paths, implementations,
case files, seed, lowering, policy) and the baseline, and writes beside the run (`OUT-rerun`);
run as printed, it reruns those cases and fails again.
"""

from __future__ import annotations

import dataclasses
import html
import json
import shlex

from mhc_parity.harness.cli import main as cli_main
from mhc_parity.harness.commands.run import run_parser
from mhc_parity.reports import to_frame
from mhc_parity.reports.rerun import failing_cases, rerun_command, rerun_folder
from mhc_parity.reports.samples import run_request, sample_manifest, sample_rows, write_sample_run
from mhc_parity.reports.summary import FAILING_VERDICTS
from tests.cli_support import BROKEN_IMPL_RUN
from tests.test_run_exit_codes import COMMAND, mhc_parity

RERUN_LINE = "Rerun only the failing cases: "


def _failing_of(rows) -> set[str]:
    return {r["case"] for r in rows if r["verdict"] in FAILING_VERDICTS}


def test_the_command_names_the_failing_cases_and_keeps_how_they_ran():
    rows = sample_rows()
    manifest = dataclasses.replace(
        sample_manifest(rows),
        request=run_request(
            suite="default",
            tags=("quick",),
            paths=("reference/*", "my/*"),
            # One factory giving two implementations is one --impl.
            implementations=(("my", "pkg.kernels:factory"), ("my-fixed", "pkg.kernels:factory")),
            case_files=("cases.toml",),
            seed=3,
            lowering=False,
        ),
        command_line="mhc-parity run --suite default --policy my.toml --allow-legacy-baseline --out out/x",
    )
    cases = failing_cases(to_frame(rows), None, manifest.cases)
    assert set(cases) == _failing_of(rows) and cases
    command = rerun_command(manifest, cases, "out/x", "baselines/default.csv")
    words = shlex.split(command)
    assert words[:2] == ["mhc-parity", "run"]
    args = run_parser().parse_args(words[2:])
    assert [c for glob in args.cases for c in glob.split(",")] == list(cases)
    assert args.suite == "default" and args.tags is None  # the cases are named: no further filter
    assert args.paths == ["reference/*", "my/*"] and args.impl == ["pkg.kernels:factory"]
    assert [str(f) for f in args.case_file] == ["cases.toml"] and args.seed == 3 and args.no_lowering
    assert str(args.policy) == "my.toml" and args.allow_legacy_baseline
    assert str(args.out) == "out/x-rerun" and str(args.baseline) == "baselines/default.csv"
    assert rerun_folder("out/x-rerun") == "out/x-rerun"  # a rerun's rerun replaces it
    assert rerun_command(manifest, (), "out/x") == ""


def test_summary_md_and_report_html_give_it_and_a_passing_run_does_not(tmp_path):
    rows = sample_rows()
    paths = write_sample_run(rows, tmp_path / "run")
    markdown = paths["markdown"].read_text()
    assert "Rerun only the failing cases:" in markdown
    command = html.unescape(markdown.split("<pre><code>", 1)[1].split("</code></pre>", 1)[0])
    assert command.startswith("mhc-parity run --cases ") and f"--out {tmp_path / 'run'}-rerun" in command
    # before the verdict counts and the folded timings: what a PR comment's reader acts on
    assert markdown.index("Rerun only") < markdown.index("| pass |")
    page = paths["html"].read_text()
    assert 'id="rerun"' in page and "mhc-parity run --cases" in page
    passing = [r for r in rows if r["verdict"] not in FAILING_VERDICTS]
    clean = write_sample_run(passing, tmp_path / "clean")
    assert "Rerun" not in clean["markdown"].read_text() and 'id="rerun"' not in clean["html"].read_text()


def test_the_terminal_gives_it_and_it_reruns_only_the_failing_cases(tmp_path, case_file, capsys):
    out = tmp_path / "broken"
    # Without the causes' search (most of a failing run's time): the verdicts, so the failing
    # cases and the hint, are the same; the rerun repeats the option as it repeats the others.
    # The failing run in this process (the command's own entry, its stdout captured): the hint's
    # words are read; the console script is what runs them, as printed.
    code = cli_main([str(a) for a in ("run", "--case-file", case_file, *BROKEN_IMPL_RUN, "--no-causes", "--out", out)])
    first = capsys.readouterr()
    assert code == 1, first.out[-3000:] + first.err[-3000:]
    (line,) = [line for line in first.out.splitlines() if line.startswith(RERUN_LINE)]
    words = shlex.split(line.removeprefix(RERUN_LINE))
    assert words[:2] == ["mhc-parity", "run"] and words[words.index("--out") + 1] == f"{out}-rerun"
    again = mhc_parity(*words[1:])
    assert again.returncode == 1, again.stdout[-3000:] + again.stderr[-3000:]
    manifest = json.loads((tmp_path / "broken-rerun" / "manifest.json").read_text())
    assert manifest["cases"] == ["cli-a-f32"] and COMMAND.is_file()
