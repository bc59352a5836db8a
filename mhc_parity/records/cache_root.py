"""Where the stores live: `$MHC_PARITY_CACHE`; else a checkout's own `.cache`; else (a copy installed in site-packages,
which may be read-only) `$XDG_CACHE_HOME` or `~/.cache`, then `mhc-parity`.
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
