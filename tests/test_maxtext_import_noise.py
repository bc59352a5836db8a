"""MaxText's known import noise stays off stdout, and nothing else it prints is lost
(`mhc_parity.maxtext_parity.import_noise`, a run-time accommodation)."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytest.importorskip("maxtext")  # the `maxtext` extra, where it installs (docs/accelerators.md)

from mhc_parity.maxtext_parity.import_noise import KNOWN_NOISE, NOISY_MODULE, import_quietly, without_known_noise  # noqa: E402 - after the skip
from tests.cli_support import ROOT  # noqa: E402 - after the skip


def _stdout_of_importing(module: str) -> str:
    """What a fresh interpreter prints on stdout importing `module` (from the checkout)."""
    proc = subprocess.run(
        [sys.executable, "-c", f"import {module}"], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


@pytest.mark.slow
def test_the_installed_maxtext_prints_the_known_line_at_import():
    """The noise the accommodation drops is real: without it, the import prints it (were a new
    MaxText to stop, the accommodation would be dead code to remove)."""
    assert KNOWN_NOISE[0] in _stdout_of_importing(NOISY_MODULE).splitlines()


@pytest.mark.slow
def test_importing_the_adapter_prints_no_no_op_line():
    printed = _stdout_of_importing("mhc_parity.maxtext_parity")
    assert "[NO-OP]" not in printed, printed


def test_only_the_known_lines_are_dropped():
    text = f"before\n{KNOWN_NOISE[0]}\n[NO-OP] something new: using stub.\n{KNOWN_NOISE[0]}\r\nafter"
    assert without_known_noise(text) == "before\n[NO-OP] something new: using stub.\nafter"


@pytest.fixture
def noisy_module(tmp_path, monkeypatch):
    """A module that prints the known line and one other at import, and its name."""
    (tmp_path / "noisy_probe_module.py").write_text(f"print({KNOWN_NOISE[0]!r})\nprint('kept')\nVALUE = 3\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "noisy_probe_module", raising=False)
    yield "noisy_probe_module"
    sys.modules.pop("noisy_probe_module", None)


def test_import_quietly_prints_through_what_is_not_known_noise(noisy_module, capsys):
    assert import_quietly(noisy_module).VALUE == 3
    assert capsys.readouterr().out == "kept\n"


def test_import_quietly_prints_through_what_a_failing_import_printed(tmp_path, monkeypatch, capsys):
    (tmp_path / "failing_probe_module.py").write_text(f"print({KNOWN_NOISE[0]!r})\nprint('why')\nraise OSError('x')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(OSError):
        import_quietly("failing_probe_module")
    assert capsys.readouterr().out == "why\n"
