"""A run-time accommodation: MaxText's one known line of import noise, kept off stdout.

MaxText 0.2.5's `maxtext.utils.gcs_utils`, without `google-cloud-storage`, prints "[NO-OP] gcs_storage
dependency missing; using stubs." at import. `import_quietly` imports it first with stdout captured and
prints the rest: only the known line is dropped, so a new message still shows.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import sys
from types import ModuleType

# The MaxText module that prints at import, and the lines it prints that are known noise.
NOISY_MODULE = "maxtext.utils.gcs_utils"
KNOWN_NOISE = ("[NO-OP] gcs_storage dependency missing; using stubs.",)


def without_known_noise(text: str, known: tuple[str, ...] = KNOWN_NOISE) -> str:
    return "".join(line for line in text.splitlines(keepends=True) if line.rstrip("\r\n") not in known)


def import_quietly(module: str = NOISY_MODULE, known: tuple[str, ...] = KNOWN_NOISE) -> ModuleType:
    """`importlib.import_module(module)` with stdout captured; what it printed less the `known` lines goes
    to stdout afterwards, also when the import raises."""
    captured = io.StringIO()
    try:
        with contextlib.redirect_stdout(captured):
            return importlib.import_module(module)
    finally:
        sys.stdout.write(without_known_noise(captured.getvalue(), known))
