"""Fixtures the CLI tests share (tests/cli_support.py has their helpers)."""

from __future__ import annotations

import pytest

from tests.cli_support import CASE_FILE


@pytest.fixture(scope="module")
def case_file(tmp_path_factory):
    """`CASE_FILE` written to a file: the cheapest cases, for `--case-file`."""
    path = tmp_path_factory.mktemp("cases") / "cases.toml"
    path.write_text(CASE_FILE)
    return path
