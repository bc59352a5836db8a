"""The parity harness: the engine (`engine/`: plan, paths, runner, the operation seam;
`judging/`: metrics, tolerance policy; `stores/`; `processes/`; `faults/`), the public API
(`mhc_parity.harness.api`), the command line (`mhc_parity.harness.cli`, `commands/`) and the pytest plugin.

    from mhc_parity.harness import run_parity, gate
    run = run_parity("my_pkg.kernels:factory", suite="smoke")
    assert run.passed, run.failure_table()

The names below are the stable ones; each is defined in `mhc_parity.harness.api` and loaded on
first use, so `mhc-parity gate | baseline | render` (which import this package)
still never load JAX.
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
    """The public API's names, from `mhc_parity.harness.api` (imported here, on first use: it loads JAX)."""
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import mhc_parity.harness.api

    return getattr(mhc_parity.harness.api, name)
