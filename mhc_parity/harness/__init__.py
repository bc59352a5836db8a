"""The parity harness: the engine (`engine/`, `judging/`, `stores/`, `processes/`, `faults/`), the public
API, the command line and the pytest plugin.

    from mhc_parity.harness import run_parity, gate
    run = run_parity("my_pkg.kernels:factory", suite="smoke")
    assert run.passed, run.failure_table()

The names below are loaded from `mhc_parity.harness.api` on first use, so commands that import this package
without computing never load JAX.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mhc_parity.harness.api import (
        BaselineError,
        ConfigurationError,
        GateResult,
        ParityError,
        ParityRun,
        PreparedRun,
        ReportError,
        gate,
        prepare,
        run_parity,
    )

__all__ = [
    "BaselineError",
    "ConfigurationError",
    "GateResult",
    "ParityError",
    "ParityRun",
    "PreparedRun",
    "ReportError",
    "gate",
    "prepare",
    "run_parity",
]


def __getattr__(name: str):
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import mhc_parity.harness.api

    return getattr(mhc_parity.harness.api, name)
