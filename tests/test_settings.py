"""Every `MHC_PARITY_*` setting is checked before any work (issue 66, 6): a refused value is one
line naming the variable and what it accepts (exit 2, a usage error), never a run of `error`
rows or a traceback; an unknown name (a typo) is a warning naming the closest setting."""

from __future__ import annotations

import pathlib
import re

import pytest

from mhc_parity.harness.api import prepare
from mhc_parity.harness.errors import ConfigurationError
from tests.cli_support import ROOT, run_cli

pytest_plugins = ["pytester"]  # the inner pytest run of the plugin

CASE = "lite-n4-c128-b2s64-f32-w32-identity-default"
REFUSED = {
    "MHC_PARITY_ORACLE_PROCESS": "yes",
    "MHC_PARITY_ORACLE_CHUNKS_IN_FLIGHT": "two",
    "MHC_PARITY_MEMORY_LIMIT": "inf",
    "MHC_PARITY_ORACLE_CHUNK_TOKENS": "0",
}


@pytest.mark.parametrize("name", list(REFUSED))
def test_a_refused_setting_stops_the_run_before_any_work(name, tmp_path):
    """One line on stderr naming the variable and what it accepts, exit 2, no run folder."""
    out = tmp_path / "run"
    args = ("run", "--cases", CASE, "--paths", "reference/unsharded", "--no-lowering", "--jobs", "1", "--quiet")
    proc = run_cli(*args, "--out", out, env_extra={name: REFUSED[name], "MHC_PARITY_CACHE": str(tmp_path / "c")})
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    lines = [line for line in proc.stderr.splitlines() if line.startswith("mhc-parity:")]
    assert len(lines) == 1 and lines[0].startswith(f"mhc-parity: error: ${name} must be "), proc.stderr[-2000:]
    assert lines[0].endswith(f", got {REFUSED[name]!r}")
    assert not out.exists()


def test_the_api_refuses_a_mistyped_setting(monkeypatch):
    monkeypatch.setenv("MHC_PARITY_ORACLE_PROCESS", "yes")
    with pytest.raises(ConfigurationError, match=r"^\$MHC_PARITY_ORACLE_PROCESS must be 'always' or 'never'"):
        prepare(cases=CASE)


def test_the_pytest_plugin_refuses_a_mistyped_setting(pytester, monkeypatch):
    pytester.makeini("[pytest]\nparity_impl = tests.external_impls:good\nparity_dtype = f32\n")
    pytester.makepyfile(test_parity="def test_parity(parity_check):\n    parity_check.check()\n")
    monkeypatch.setenv("MHC_PARITY_ORACLE_CHUNKS_IN_FLIGHT", "two")
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-p", "no:xdist", "--collect-only")
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str()[-2000:]
    assert "$MHC_PARITY_ORACLE_CHUNKS_IN_FLIGHT must be a positive integer, got 'two'" in result.stderr.str()


def test_every_refused_value_is_named_on_one_line():
    from mhc_parity.records.settings import SettingError, check_settings  # new in issue 66

    environ = {"MHC_PARITY_ORACLE_PROCESS": "yes", "MHC_PARITY_MEMORY_LIMIT": "1e400"}
    with pytest.raises(SettingError) as caught:
        check_settings(environ)
    assert "\n" not in str(caught.value)
    assert "$MHC_PARITY_ORACLE_PROCESS" in str(caught.value) and "$MHC_PARITY_MEMORY_LIMIT" in str(caught.value)


def test_an_unknown_setting_is_named_with_the_closest_known_one():
    from mhc_parity.records.settings import SETTINGS, check_settings

    assert check_settings({"MHC_PARITY_ORACLE_PROCES": "always", "OTHER": "x"}) == (
        "$MHC_PARITY_ORACLE_PROCES is no mhc-parity setting and is ignored (did you mean $MHC_PARITY_ORACLE_PROCESS?)",
    )
    assert check_settings({name: "" for name in SETTINGS}) == ()


def test_every_setting_the_package_names_is_in_the_table():
    """A new `MHC_PARITY_*` variable read anywhere in the package is checked with the rest."""
    from mhc_parity.records.settings import SETTINGS

    named = set()
    for source in (ROOT / "mhc_parity").rglob("*.py"):
        named.update(re.findall(r"MHC_PARITY_[A-Z0-9_]*[A-Z0-9]", pathlib.Path(source).read_text()))
    assert named <= set(SETTINGS), sorted(named - set(SETTINGS))


def test_an_unknown_setting_is_said_once_per_process(monkeypatch):
    """A pytest session checks the settings when it starts and again in `prepare`: one warning."""
    from mhc_parity.harness.errors import checked_settings

    monkeypatch.setenv("MHC_PARITY_ONCE_ONLY_TYPO", "1")
    (first,) = checked_settings()
    assert "$MHC_PARITY_ONCE_ONLY_TYPO" in first and checked_settings() == ()
    monkeypatch.setenv("MHC_PARITY_ORACLE_PROCESS", "yes")
    with pytest.raises(ConfigurationError):  # a refused value is refused every time
        checked_settings()
