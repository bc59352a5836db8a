"""The command line's conventions (issue 68, items 4, 5 and 8): a progress line that fits the
terminal and names the stage, an ETA only once it means something, `mhc-parity cases`,
did-you-mean, `help`, defaults and exit codes in `--help`, one error prefix, colour that
respects NO_COLOR, and an `--impl` import failure that names its file and line."""

from __future__ import annotations

import fcntl
import io
import os
import pathlib
import pty
import queue
import re
import struct
import sys
import termios
import time

import pytest

from mhc_parity.command_line import ERROR_PREFIX, EXIT_CODES, colour_wanted, paint_verdicts
from mhc_parity.harness import cli
from mhc_parity.harness.commands import progress as progress_module
from mhc_parity.harness.commands.progress import Progress
from mhc_parity.harness.engine.implementations import ImplementationError, load_implementations
from mhc_parity.harness.processes import parallel
from mhc_parity.harness.processes.step_relay import StepRelay, poster

ROOT = pathlib.Path(__file__).resolve().parent.parent
LONG_NAME = "lite-n4-c256-b8s64-bf16-w32-mlp-peaky_permutation-m8x1-bt64-btb32-" + "x" * 120


class Case:
    def __init__(self, name: str, variant: str = "lite"):
        self.name = name


def _drive(progress: Progress, cases: int) -> None:
    """A run's events: each case starts, moves through stages, finishes; the clock redraws once."""
    for index in range(cases):
        case = Case(f"{LONG_NAME}-{index}")
        progress.start(case)
        progress.step(case, "compiling programs")
        if index == 0:
            time.sleep(progress_module.TTY_REFRESH_S * 1.5)  # the heartbeat thread redraws
        progress.step(case, "interpret/unsharded")
        progress.finish(case, [{"verdict": "pass"}] * 40 + [{"verdict": "skip"}] * 7)
    progress.close()


def _redraws(master: int) -> list[str]:
    chunks = []
    while True:
        try:
            chunk = os.read(master, 65536)
        except (BlockingIOError, OSError):
            break
        if not chunk:
            break
        chunks.append(chunk)
    text = b"".join(chunks).decode()
    return [part.replace("\033[K", "") for part in re.split(r"[\r\n]", text) if part.strip()]


@pytest.mark.parametrize("columns_from", ["COLUMNS", "the terminal"])
def test_no_progress_redraw_is_wider_than_the_terminal(monkeypatch, columns_from):
    master, slave = pty.openpty()
    os.set_blocking(master, False)
    width = 80 if columns_from == "COLUMNS" else 60
    if columns_from == "COLUMNS":
        monkeypatch.setenv("COLUMNS", "80")
    else:
        monkeypatch.delenv("COLUMNS", raising=False)
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, width, 0, 0))
    stream = os.fdopen(slave, "w", buffering=1)
    try:
        progress = Progress(4, stream=stream)
        assert progress.tty
        _drive(progress, 4)
        redraws = _redraws(master)
    finally:
        stream.close()
        os.close(master)
    assert len(redraws) >= 8, redraws  # a redraw per start and finish, and the clock's
    assert max(map(len, redraws)) <= width - 1, [r for r in redraws if len(r) >= width]
    assert any("compiling programs" in r for r in redraws)


def test_the_eta_waits_for_a_few_cases_and_weighs_them_by_cost():
    stream = io.StringIO()
    costs = {"a": 1.0, "b": 1.0, "c": 1.0, "d": 97.0}
    progress = Progress(4, stream=stream, remaining_cost=100.0, cost=lambda case: costs[case.name])
    lines = []
    for name in "abc":
        progress.start(Case(name))
        progress.finish(Case(name), [{"verdict": "pass"}])
        lines.append(stream.getvalue().splitlines()[-1])
    progress.close()
    assert progress_module.ETA_AFTER_CASES == 3
    assert "eta" not in lines[0] and "eta" not in lines[1] and "eta" in lines[2]
    elapsed = time.perf_counter() - progress.start_time
    assert progress.eta_seconds() == pytest.approx(97 / 3 * elapsed, rel=0.5)


def test_progress_shows_every_running_case_of_the_workers():
    stream = io.StringIO()
    progress = Progress(2, stream=stream)
    first, second = Case("first"), Case("second")
    progress.start(first)
    progress.step(first, "oracle")
    progress.step(second, "compiling programs")
    running = progress._running()
    assert re.fullmatch(r"oracle \d+s; compiling programs \d+s: cases first, second", running), running
    progress.finish(second, [])
    progress.step(second, "late message")  # relayed after the case finished: not shown again
    assert "second" not in progress._running()
    progress.close()


def test_worker_stages_reach_the_parent(monkeypatch):
    """A worker's runner posts its stages on the queue (`_run_case`); the parent's relay calls on_step."""
    steps: queue.Queue = queue.Queue()

    class FakeRunner:
        timings: dict = {}

        def work_counts(self):
            return {}

        def run_case(self, case, plan, on_step):
            on_step(case, "compiling programs")
            on_step(case, "oracle")
            return iter([{"verdict": "pass"}])

    monkeypatch.setitem(parallel._WORKER, "runner", FakeRunner())
    monkeypatch.setitem(parallel._WORKER, "plan", None)
    monkeypatch.setitem(parallel._WORKER, "on_step", poster(steps))
    case = Case("c1")
    rows, *_ = parallel._run_case(case)
    assert rows == [{"verdict": "pass"}]
    seen = []
    with StepRelay(steps, [case], lambda c, s: seen.append((c, s))):
        deadline = time.monotonic() + 10
        while len(seen) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
    assert seen == [(case, "compiling programs"), (case, "oracle")]


# ----------------------------------------------------------------------------- the command line


def test_a_mistyped_command_gets_did_you_mean(capsys):
    assert cli.main(["runn"]) == 2
    assert capsys.readouterr().err.strip() == f"{ERROR_PREFIX}unknown command 'runn'; did you mean 'run'?"
    assert cli.main(["zzzz"]) == 2
    assert "did you mean" not in capsys.readouterr().err


def test_help_subcommand_shows_a_commands_help_with_defaults_and_exit_codes(capsys):
    assert cli.main(["help"]) == 0
    top = capsys.readouterr().out
    assert "cases" in top and "help" in top and "exit codes:" in top
    assert cli.main(["help", "run"]) == 0
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps its lines
    assert text.startswith("usage: mhc-parity run")
    assert "output folder (default: out/parity)" in text and "(default: 1)" in text
    assert "exit codes:" in text and all(f" {code} " in text for code, _ in EXIT_CODES)
    assert cli.main(["help", "runn"]) == 2
    assert "did you mean 'run'?" in capsys.readouterr().err


def test_the_exit_codes_are_those_the_docs_list():
    codes = [code for code, _ in EXIT_CODES]
    tables = 0
    for doc in ("README.md", "docs/running.md"):
        text = (ROOT / doc).read_text(encoding="utf-8")
        if "| exit | meaning |" not in text:
            continue
        table = text[text.index("| exit | meaning |") :].split("\n\n")[0]
        listed = [line.split("|")[1].strip() for line in table.splitlines()[2:]]
        assert listed == codes, doc
        tables += 1
    assert tables, "no exit table in README.md or docs/running.md"


@pytest.mark.parametrize("command", sorted(cli.COMMANDS))
def test_every_command_prints_errors_with_one_prefix(command, capsys):
    assert cli.main([command, "--no-such-option"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert (
        lines[-1].startswith(ERROR_PREFIX)
        and "--no-such-option" not in lines[-1]
        or lines[-1].startswith(f"{ERROR_PREFIX}unrecognized arguments: --no-such-option")
    ), lines


@pytest.mark.parametrize(
    "argv",
    [
        ["gate", "--baseline", "{missing}", "--current", "{missing}"],
        ["render", "--rows", "{missing}", "--out", "{tmp}/out"],
        ["policy", "--policy", "{missing}"],
        ["merge", "{tmp}/merged", "{missing}"],
        ["cases", "--suite", "nope"],
        ["baseline", "--from", "{missing}", "--to", "{tmp}/b.csv"],
    ],
    ids=lambda argv: argv[0],
)
def test_every_commands_own_errors_have_the_same_prefix(argv, tmp_path, capsys):
    argv = [a.format(missing=tmp_path / "missing", tmp=tmp_path) for a in argv]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(ERROR_PREFIX), err


CASE_FILE = """
[[case]]
name = "my-file-case"
batch = 1
sequence = 8
streams = 2
embedding = 128
"""


def test_cases_lists_the_catalogue_or_a_case_files_cases(tmp_path, capsys):
    assert cli.main(["cases"]) == 0
    out = capsys.readouterr().out
    assert out.rstrip().endswith("case(s) from the catalogue") and "lite-n4-c128" in out
    path = tmp_path / "mine.toml"
    path.write_text(CASE_FILE)
    assert cli.main(["cases", "--case-file", str(path)]) == 0
    out = capsys.readouterr().out
    assert "my-file-case" in out and "lite-n4-c128" not in out and "1 case(s) from the case file(s)" in out
    assert cli.main(["cases", "--case-file", str(path), "--suite", "user"]) == 0
    listed = capsys.readouterr().out
    assert re.search(r"my-file-case .* " + re.escape(str(path)), listed)
    assert cli.main(["cases", "suites"]) == 0 and "smoke" in capsys.readouterr().out


def test_python_m_cases_list_is_the_same_listing(capsys):
    from mhc_parity.cases.__main__ import main as cases_main

    assert cases_main(["list", "--suite", "smoke"]) == 0
    via_module = capsys.readouterr().out
    assert cli.main(["cases", "--suite", "smoke"]) == 0
    assert capsys.readouterr().out == via_module


# ----------------------------------------------------------------------------- colour


class Tty(io.StringIO):
    def isatty(self):
        return True


@pytest.mark.parametrize(
    "env, tty, wanted",
    [
        ({}, True, True),
        ({}, False, False),
        ({"NO_COLOR": "1"}, True, False),
        ({"NO_COLOR": ""}, True, True),  # no-color.org: set and not empty
        ({"FORCE_COLOR": "1"}, False, True),
        ({"NO_COLOR": "1", "FORCE_COLOR": "1"}, True, False),
        ({"TERM": "dumb"}, True, False),
    ],
)
def test_colour_respects_no_color_and_a_non_terminal(monkeypatch, env, tty, wanted):
    for name in ("NO_COLOR", "FORCE_COLOR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TERM", "xterm")
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert colour_wanted(Tty() if tty else io.StringIO()) is wanted


def test_the_summary_colours_its_verdicts_only_when_wanted(monkeypatch, capsys):
    from mhc_parity.reports import terminal

    monkeypatch.setattr(terminal, "format_summary", lambda *a, **k: "parity: FAIL (3 rows)\nGate against b: PASS")
    monkeypatch.setenv("FORCE_COLOR", "1")
    monkeypatch.delenv("NO_COLOR", raising=False)
    terminal.print_summary([])
    assert capsys.readouterr().out == "parity: \033[31mFAIL\033[0m (3 rows)\nGate against b: \033[32mPASS\033[0m\n"
    monkeypatch.setenv("NO_COLOR", "1")
    terminal.print_summary([])
    assert "\033[" not in capsys.readouterr().out
    assert paint_verdicts("PASSING FAILED") == "PASSING FAILED"


# ----------------------------------------------------------------------------- --impl import failures


@pytest.mark.parametrize(
    "source, where, what",
    [
        ("import math\n\nx = 1\nraise RuntimeError('not configured')\n", 4, "RuntimeError: not configured"),
        ("import math\nimport no_such_package_xyz\n", 2, "No module named 'no_such_package_xyz'"),
        ("def factory(:\n", 1, "SyntaxError"),
        ("import json\njson.loads('{')\n", 2, "JSONDecodeError"),  # raised in the stdlib: the user's line
    ],
    ids=["raises", "imports-missing", "syntax", "raises-in-a-library"],
)
def test_an_impl_that_fails_to_import_names_its_file_and_line(tmp_path, monkeypatch, source, where, what):
    name = f"broken_impl_{abs(hash(source))}"
    (tmp_path / f"{name}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ImplementationError) as info:
        load_implementations(f"{name}:factory")
    message = str(info.value)
    assert f" at {tmp_path / name}.py:{where}: " in message and what in message and "\n" not in message
    sys.modules.pop(name, None)


def test_an_impl_that_does_not_exist_names_no_place(capsys):
    with pytest.raises(ImplementationError) as info:
        load_implementations("no_such_module_xyz:factory")
    assert str(info.value) == "--impl 'no_such_module_xyz:factory': cannot import 'no_such_module_xyz': " + (
        "No module named 'no_such_module_xyz'"
    )


def test_a_case_reports_compiling_its_programs_before_it_waits_for_them():
    """The first cases of a cold run wait minutes in `cache.prepare`: the progress line must name that stage."""
    from mhc_parity.harness.engine.collaborators import Collaborators, OracleFunction, RunOnlyPrograms
    from mhc_parity.harness.engine.runner import Runner

    steps = []

    class WaitingCache(RunOnlyPrograms):
        def prepare(self, paths, case, fixture):
            steps.append("prepare")

    collaborators = Collaborators(programs=WaitingCache(), oracle=OracleFunction(lambda case, fixture: None))
    runner = Runner(policy=None, collaborators=collaborators)
    assert runner._run_paths(Case("c"), [], fixture=None, on_step=lambda case, step: steps.append(step)) == {}
    assert steps == ["compiling programs", "prepare"]
