"""Parity engine: paths, metrics, tolerance policy, runner, CLI; and the public API.

    from harness import run_parity, gate
    run = run_parity("my_pkg.kernels:factory", suite="smoke")
    assert run.passed, run.failure_table()

See `harness.api` for every name below (they are the stable ones).
"""

from harness.api import (
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
