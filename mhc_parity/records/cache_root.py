"""Where the stores live (fixtures, oracle answers, compiled programs, lowerings).

`$MHC_PARITY_CACHE` when set; else a checkout's own `.cache` (the folder holding `mhc_parity`
has the project's pyproject.toml: a clone, installed editable or not); else, for a copy
installed into site-packages, the user's cache folder (`$XDG_CACHE_HOME`, else `~/.cache`,
then `mhc-parity`): an installed package's folder is no place to write, and may be read-only.

Plain Python (the standard library only): `cases` and `harness` both ask it.
"""

from __future__ import annotations

import os
import pathlib

from mhc_parity.records.project_code import PROJECT_ROOT
from mhc_parity.records.settings import setting

CACHE_ENV_VAR = "MHC_PARITY_CACHE"
CACHE_NAME = "mhc-parity"


def cache_root() -> pathlib.Path:
    """The cache folder (module docstring); not created here."""
    chosen = setting(CACHE_ENV_VAR)
    if chosen:
        return pathlib.Path(chosen)
    if (PROJECT_ROOT / "pyproject.toml").is_file():
        return PROJECT_ROOT / ".cache"
    user = os.environ.get("XDG_CACHE_HOME", "").strip()
    return (pathlib.Path(user) if user else pathlib.Path.home() / ".cache") / CACHE_NAME
