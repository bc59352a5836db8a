"""What every command shares: the conventions of the command line (`mhc_parity.command_line`:
exit codes, parser, error line), the default run folder, argument parsing."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from mhc_parity.command_line import (  # noqa: F401 - the commands' one place to import them from
    ERROR_PREFIX,
    EXIT_CODES,
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    Parser,
    error,
    warning,
)

# Where `mhc-parity run` writes a run unless told otherwise (and where `baseline` looks).
DEFAULT_RUN_FOLDER = Path("out/parity")


def parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None):
    """The parsed arguments, or the exit code argparse chose (0 for --help, 2 for a usage error)."""
    try:
        return parser.parse_args(None if argv is None else list(argv))
    except SystemExit as exc:
        return int(exc.code or 0)
