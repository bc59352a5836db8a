"""The memory a case needs, known from its shapes: a case that cannot fit is refused before
the run starts, with its size, instead of exhausting memory hours in (`mhc-parity run`, exit 2).

The float64 oracle dominates a cold case: it runs the exact answer and the rounding draws
(`mhc_parity.harness.engine.oracle_path.NOISE_SAMPLES`) as one vmapped program, every draw holding the
inputs, intermediates and gradients in float64, with its banks of random numbers. Its peak
grows with the fixture (`mhc_parity.cases.fixtures.fixture_elements`): cold runs of the reference paths
peaked at 8.4 GiB resident for 4.3 M fixture elements and 16.2 GiB for 8.5 M, about 1.9 KiB
per element. `BYTES_PER_FIXTURE_ELEMENT` is about half that, a floor: a case refused would
not have fitted, and one admitted may still run out (then the runner says so, exit 2 too).

A case larger than `mhc_parity.cases.fixtures.MAX_FIXTURE_ELEMENTS` is refused whatever the machine, as
fixture generation would refuse it; a case whose dimensions the math rejects
(`mhc_parity.mhc.common.validate_dims`) is left to the run, whose rows say it is unsupported.
"""

from __future__ import annotations

import pathlib
from collections.abc import Iterable

from mhc_parity.cases.fixtures import MAX_FIXTURE_ELEMENTS, fixture_elements
from mhc_parity.harness.processes.parallel import available_memory_bytes
from mhc_parity.mhc.common import UnsupportedInputError, validate_dims

try:
    import resource
except ImportError:  # Windows
    resource = None

# A floor on the bytes a cold case needs per fixture element (see the module docstring).
BYTES_PER_FIXTURE_ELEMENT = 1024


def case_memory_bytes(case) -> int:
    """The least memory (bytes) a cold run of `case` needs: `BYTES_PER_FIXTURE_ELEMENT` per
    element of its fixture."""
    return fixture_elements(case) * BYTES_PER_FIXTURE_ELEMENT


def _address_space_left() -> int | None:
    """Bytes this process may still map under its address-space limit (`ulimit -v`), or None
    without a limit (or where it cannot be read)."""
    if resource is None:
        return None
    limit, _ = resource.getrlimit(resource.RLIMIT_AS)
    if limit == resource.RLIM_INFINITY:
        return None
    try:
        for line in pathlib.Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmSize:"):
                return max(0, limit - int(line.split()[1]) * 1024)
    except (OSError, ValueError, IndexError):
        pass
    return limit


def memory_for_a_case() -> int | None:
    """The memory (bytes) a case run by this process can get: the system's available memory,
    less where the address-space limit leaves less; None if neither is known."""
    known = [n for n in (available_memory_bytes(), _address_space_left()) if n is not None]
    return min(known) if known else None


def _gib(n: int) -> str:
    return f"{n / 2**30:,.1f} GiB"


def too_large(case, memory: int | None) -> str:
    """Why `case` cannot run here with `memory` bytes to spare (None: unknown), in one phrase
    naming its size; "" if it may."""
    try:
        validate_dims(case.dims)
    except UnsupportedInputError:
        return ""  # not a size: the run reports it unsupported
    elements = fixture_elements(case)
    size = f"case {case.name} ({case.shape_name}, {elements:,} fixture elements)"
    if elements > MAX_FIXTURE_ELEMENTS:
        return f"{size} is beyond the {MAX_FIXTURE_ELEMENTS:,} elements a fixture may hold; select smaller cases"
    needed = case_memory_bytes(case)
    if memory is not None and needed > memory:
        return (
            f"{size} needs at least {_gib(needed)} of memory for its float64 oracle, more than the "
            f"{_gib(memory)} this process can get; run it on a machine with more memory, or select smaller cases"
        )
    return ""


def first_too_large(cases: Iterable) -> str:
    """`too_large` of the first of `cases` that cannot run in this process ("" if all may)."""
    memory = memory_for_a_case()
    for case in cases:
        reason = too_large(case, memory)
        if reason:
            return reason
    return ""
