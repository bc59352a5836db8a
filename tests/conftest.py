"""Fixtures the CLI tests share (tests/cli_support.py has their helpers)."""

from __future__ import annotations

import pytest

from mhc_parity.records import foreign_code
from tests.cli_support import CASE_FILE


@pytest.fixture(autouse=True)
def no_foreign_code_record(monkeypatch):
    """Each test starts with no external implementation on record (`mhc_parity.records.foreign_code`):
    the tests' own implementations patch nothing, and one test loading them must not turn off
    the stores' writes for the next tests of its worker; a test of the guard loads one itself."""
    monkeypatch.setattr(foreign_code, "_LOADED", [])
    monkeypatch.setattr(foreign_code, "_RECORDS", {})  # a test's scratch module may be edited and read again
    monkeypatch.setattr(foreign_code, "_INSTALLED", [])


@pytest.fixture(scope="module")
def case_file(tmp_path_factory):
    """`CASE_FILE` written to a file: the cheapest cases, for `--case-file`."""
    path = tmp_path_factory.mktemp("cases") / "cases.toml"
    path.write_text(CASE_FILE)
    return path


@pytest.fixture(autouse=True)
def no_forced_colour(monkeypatch):
    """The tests read plain output: a FORCE_COLOR in the developer's or CI's environment
    (`mhc_parity.command_line.colour_wanted`) must not colour it."""
    monkeypatch.delenv("FORCE_COLOR", raising=False)
