"""What every command shares: its exit codes, the default run folder, argument parsing."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
# Where `mhc-parity run` writes a run unless told otherwise (and where `baseline` looks).
DEFAULT_RUN_FOLDER = Path("out/parity")


def parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None):
    """The parsed arguments, or the exit code argparse chose (0 for --help, 2 for a usage error)."""
    try:
        return parser.parse_args(None if argv is None else list(argv))
    except SystemExit as exc:
        return int(exc.code or 0)
