"""Conventions of every mhc-parity entry point: exit codes, one error prefix, `--help` with
defaults and exit codes, colour only where wanted. Imports no subpackage, so each may use it."""

from __future__ import annotations

import argparse
import os
import re
import sys

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
# The exit codes of every command, in short: `--help`'s epilog. README.md and docs/running.md
# explain each (tests/test_cli_conventions.py checks that their tables list these codes).
EXIT_CODES = (
    ("0", "passed: every row passed or is an explained skip, and the gate passed (--baseline)"),
    ("1", "a parity failure: a fail or error row, a failing gate, a surviving fault"),
    ("2", "a usage or configuration error, named on one line, or what the machine lacked"),
    ("130 / 143", "stopped by Ctrl-C / SIGTERM (the message gives the --resume command)"),
    ("141", "stdout's reader went away (`| head`)"),
)
# The one prefix of every error line (argparse's own form, for one program).
ERROR_PREFIX = "mhc-parity: error: "


def exit_codes_text() -> str:
    """The exit codes as `--help` shows them."""
    width = max(len(code) for code, _ in EXIT_CODES)
    return "exit codes:\n" + "\n".join(f"  {code:<{width}}  {meaning}" for code, meaning in EXIT_CODES)


def error(message: str) -> int:
    """Print `message` as the command's one error line on stderr; EXIT_USAGE."""
    print(f"{ERROR_PREFIX}{message}", file=sys.stderr)
    return EXIT_USAGE


def warning(message: str) -> None:
    """Print `message` as a warning line on stderr."""
    print(f"mhc-parity: warning: {message}", file=sys.stderr)


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Appends "(default: X)" to an option's help unless the default is None/False/empty or the
    help already says it; the epilog as written."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if (
            "default" in text
            or default in (None, False, [], ())
            or default is argparse.SUPPRESS
            or not action.option_strings
        ):
            return text
        shown = " ".join(map(str, default)) if isinstance(default, (list, tuple)) else str(default)
        return f"{text} (default: {shown.replace('%', '%%')})"


class Parser(argparse.ArgumentParser):
    """ArgumentParser whose usage errors carry `ERROR_PREFIX`; help shows defaults and exit codes."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", HelpFormatter)
        kwargs.setdefault("epilog", exit_codes_text())
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{ERROR_PREFIX}{message}\n")


# Verdict words and their ANSI colours (green, red, yellow).
VERDICT_COLOURS = {"PASS": "32", "FAIL": "31", "NOTHING COMPARED": "33"}
_VERDICT_WORDS = re.compile(r"\b(" + "|".join(map(re.escape, VERDICT_COLOURS)) + r")\b")


def colour_wanted(stream=None) -> bool:
    """Whether to colour `stream` (default stdout): never with a non-empty NO_COLOR, always with
    FORCE_COLOR, else only on a terminal that is not TERM=dumb."""
    if os.environ.get("NO_COLOR"):
        return False
    if os.environ.get("FORCE_COLOR"):
        return True
    stream = sys.stdout if stream is None else stream
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty()) and os.environ.get("TERM") != "dumb"


def paint_verdicts(text: str) -> str:
    """`text` with each verdict word (PASS, FAIL, NOTHING COMPARED) in its colour."""
    return _VERDICT_WORDS.sub(lambda m: f"\033[{VERDICT_COLOURS[m.group(1)]}m{m.group(1)}\033[0m", text)
