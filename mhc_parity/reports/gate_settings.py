"""The gate's user settings `--growth-factor` and `--noise-floor-ulps`: which values can judge (checked here only, for
the command's argparse types, `gate_run` and `gate` itself), and the sentence every gate summary opens with when they
are not the defaults (an infinite one would switch the growth check off, so it is refused).
"""

from __future__ import annotations

import math

from mhc_parity.records.text import format_number
from mhc_parity.reports.drift import DEFAULT_GROWTH_FACTOR, DEFAULT_NOISE_FLOOR_ULPS


def growth_factor_problem(value: float) -> str:
    """Why `value` cannot be the gate's growth factor ("" if it can): finite and above 1."""
    return "" if math.isfinite(value) and value > 1.0 else f"must be a finite number above 1, got {value:g}"


def noise_floor_problem(value: float) -> str:
    """Why `value` cannot be the gate's noise floor in ulps ("" if it can): finite, 0 or more."""
    return "" if math.isfinite(value) and value >= 0.0 else f"must be a finite number, 0 or more, got {value:g}"


# The gate's parameters as `mhc-parity gate` names them (the API passes its keyword names).
PARAMETER_NAMES = ("--growth-factor", "--noise-floor-ulps")


def parameter_problem(growth_factor: float, noise_floor_ulps: float, names: tuple[str, str] = PARAMETER_NAMES) -> str:
    """Why the gate cannot judge with these parameters (one line, naming them as `names`), or ""."""
    for name, problem in zip(names, (growth_factor_problem(growth_factor), noise_floor_problem(noise_floor_ulps))):
        if problem:
            return f"{name} {problem}"
    return ""


def settings_note(growth_factor: float, noise_floor_ulps: float) -> str:
    """One sentence naming the settings that are not the defaults ("" when both are)."""
    changed = [
        f"{label} {shown(value)} (default {shown(default)})"
        for label, value, default, shown in (
            ("growth factor", growth_factor, DEFAULT_GROWTH_FACTOR, lambda v: f"×{format_number(v)}"),
            ("noise floor", noise_floor_ulps, DEFAULT_NOISE_FLOOR_ULPS, lambda v: f"{format_number(v)} ulps"),
        )
        if value != default
    ]
    return f"The gate judged drift with {' and '.join(changed)}, not its defaults." if changed else ""
