"""How a failure while running a case is told: a code error as a row's reason that says where it was
raised; the machine out of memory as a ResourceError that stops the run."""

from __future__ import annotations

import errno
import traceback

import jax

from mhc_parity.cases.fixtures import fixture_elements
from mhc_parity.harness.errors import ResourceError


def error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}".strip()


# Besides RESOURCE_EXHAUSTED: XLA:CPU's "Out of memory allocating N bytes." (seen from a cold float64
# oracle too large for the host), and LLVM's failure to make a mapping.
_XLA_OUT_OF_MEMORY = ("out of memory", "cannot allocate memory")


def out_of_memory(exc: BaseException) -> bool:
    """Whether `exc` says the machine (host or device) ran out of memory, not that the code failed."""
    if isinstance(exc, MemoryError) or (isinstance(exc, OSError) and exc.errno == errno.ENOMEM):
        return True
    text = str(exc)
    if "RESOURCE_EXHAUSTED" in text:
        return True
    return isinstance(exc, jax.errors.JaxRuntimeError) and any(mark in text.lower() for mark in _XLA_OUT_OF_MEMORY)


def out_of_memory_error(case, where: str, exc: BaseException) -> ResourceError:
    """A one-line ResourceError naming the case, its size and where memory ran out."""
    first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
    return ResourceError(
        f"case {case.name} ({case.shape_name}, {fixture_elements(case):,} fixture elements) ran out of memory "
        f"in {where}: {first_line}; run it on a machine with more memory, or select smaller cases"
    )


def last_frame(exc: BaseException, code_root: str = "") -> str:
    """' (at file:line)' of the innermost frame; with `code_root`, of the innermost frame under that
    folder (an implementation's own code), named from there, if the traceback has one."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return ""
    if code_root:
        root = code_root.rstrip("/") + "/"
        inside = [f for f in frames if f.filename.startswith(root)]
        if inside:
            last = inside[-1]
            base = root.rstrip("/").rsplit("/", 1)[-1]
            return f" (at {base}/{last.filename[len(root) :]}:{last.lineno} in {last.name})"
    last = frames[-1]
    return f" (at {last.filename.rsplit('/', 1)[-1]}:{last.lineno})"
