"""Running the parity CLI in a subprocess, as a user does, on the cheapest cases; the hand
edits of its files a user who wants a stale file taken would make; a bench script as a module."""

from __future__ import annotations

import csv
import importlib.util
import json
import os
import pathlib
import re
import subprocess
import sys

from mhc_parity.records.schema import TIMING_COLUMNS
from mhc_parity.reports.gate.baseline_file import BASELINE_FORMAT_VERSION
from mhc_parity.reports.gate.rule import LEGACY_GATE_COLUMNS

ROOT = pathlib.Path(__file__).resolve().parent.parent


def bench_script(name: str):
    """bench/NAME.py loaded as a module named NAME (bench/ holds scripts, not a package)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


# The kernels reject embedding 96 before compiling anything (an expected-unsupported
# case), so only the reference path and the oracle run: the cheapest registry case.
REFERENCE_ONLY_CASE = "lite-n4-c96-b2s64-f32-w32-identity-default"

# Small cases (fast to compile in interpret mode): two unsharded, one on a 2x4 mesh.
CASE_FILE = """
[defaults]
batch = 1
sequence = 16
streams = 2
embedding = 128
dtype = "float32"

[[case]]
name = "cli-a-f32"

[[case]]
name = "cli-b-bf16"
dtype = "bf16"
branch = "tanh"

[[case]]
name = "cli-c-sharded"
batch = 2
sequence = 32
mesh = [2, 4]
block_tokens = 8
"""
CASE_NAMES = ("cli-a-f32", "cli-b-bf16", "cli-c-sharded")
# The two unsharded cases through the reference paths only: the cheapest complete run.
TWO_CASES_REFERENCE_ONLY = ("--cases", "cli-a-*", "cli-b-*", "--paths", "reference/*", "--no-lowering", "--quiet")
# One cheap case through an external implementation that drops a gate factor: a run that fails.
BROKEN_IMPL_RUN = (
    "--cases",
    "cli-a-*",
    "--impl",
    "tests.external_impls:broken",
    "--paths",
    "reference/*",
    "loses_post_gate_factor/*",
    "--no-lowering",
    "--quiet",
)


def cheap_run_args(case_file, out, *extra) -> list[str]:
    """`run` arguments for `TWO_CASES_REFERENCE_ONLY` of `case_file` into `out`, then `extra`
    (a later `--paths` wins)."""
    return [str(a) for a in ("run", "--case-file", case_file, *TWO_CASES_REFERENCE_ONLY, "--out", out, *extra)]


def harness_command(*args) -> list[str]:
    return [sys.executable, "-m", "mhc_parity.harness", *map(str, args)]


def run_cli(*args, timeout=600, env_extra: dict | None = None) -> subprocess.CompletedProcess:
    """`mhc-parity ARGS` from the project root; its output captured."""
    env = {**os.environ, **(env_extra or {})}
    return subprocess.run(harness_command(*args), cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def run_python(code: str, *arguments: str, xla_flags: str | None = None) -> subprocess.CompletedProcess:
    """`python -c CODE ARGUMENTS` from the project root, XLA_FLAGS as given (None: unset); output captured."""
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    if xla_flags is not None:
        env["XLA_FLAGS"] = xla_flags
    return subprocess.run(
        [sys.executable, "-c", code, *arguments], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )


def load_jsonl(path) -> list[dict]:
    return [json.loads(line) for line in pathlib.Path(path).read_text().splitlines()]


def without_timing(rows: list[dict]) -> list[dict]:
    """Rows with the timing columns dropped, sorted by identity: what two runs must agree on."""
    kept = [{k: v for k, v in r.items() if k not in TIMING_COLUMNS} for r in rows]
    return sorted(kept, key=lambda r: (r["case"], r["candidate"], r["partner"], r["leaf"]))


def assert_one_line_error(proc: subprocess.CompletedProcess, *fragments: str) -> None:
    """Exit 2 and one line on stderr naming the problem (each of `fragments`), no traceback."""
    assert_one_line(proc.returncode, proc.stderr, *fragments)


def assert_one_line(code: int, stderr: str, *fragments: str) -> None:
    """`assert_one_line_error` for a command run in this process (its exit code and stderr)."""
    assert code == 2, (code, stderr[-3000:])
    assert "Traceback" not in stderr and len(stderr.strip().splitlines()) == 1, stderr[-3000:]
    for fragment in fragments:
        assert fragment in stderr, stderr


def scale_one_metric_in_report(report: pathlib.Path, factor: float) -> None:
    """One metric of one row of `report.json` multiplied by `factor` (a flipped digit); the
    manifest it carries left as it was."""
    document = json.loads(report.read_text())
    row = next(r for r in document["rows"] if isinstance(r["cand_oracle_max_err"], float))
    row["cand_oracle_max_err"] *= factor
    report.write_text(json.dumps(document))


def as_format_1(
    baseline: pathlib.Path, target: pathlib.Path, edit=lambda row: row, policy_hash: str = ""
) -> pathlib.Path:
    """`baseline` downgraded by hand to format 1, as a user who wants a stale file read would:
    the header's format field set to 1 (its digest left as it was; `policy_hash`, if given,
    put in the header), the oracle sensitivity columns dropped, each row (a dict of its
    cells) through `edit`."""
    lines = baseline.read_text().splitlines()
    header = lines[0].replace(f"format={BASELINE_FORMAT_VERSION} ", "format=1 ")
    if policy_hash:
        header = re.sub(r"policy_hash=\S*", f"policy_hash={policy_hash}", header)
    with open(target, "w", newline="") as stream:  # the csv module: names like sharded(data=2,fsdp=4) are quoted
        stream.write(header + "\n")
        writer = csv.DictWriter(stream, LEGACY_GATE_COLUMNS, extrasaction="ignore", lineterminator="\n")
        writer.writeheader()
        writer.writerows(edit(row) for row in csv.DictReader(lines[1:]))
    return target
