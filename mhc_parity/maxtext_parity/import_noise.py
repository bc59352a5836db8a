"""A run-time accommodation: MaxText's one known line of import noise, kept off stdout.

MaxText 0.2.5 imports `maxtext.utils.gcs_utils` on the way to its mHC layer, and that
module, finding no `google-cloud-storage` (a dependency of MaxText's training on GCS, not of
the layer), prints "[NO-OP] gcs_storage dependency missing; using stubs." with `print` at
import (`maxtext.common.gcloud_stub.gcs_storage`). It says nothing about the layer this
project checks, yet it would open every `make parity-maxtext` run and every pytest session
that loads the adapter. So the adapter imports that module first with stdout captured
(`import_quietly`, from `mhc_parity/maxtext_parity/__init__.py`) and prints through whatever else it
wrote: only the known line is dropped, so a new message of a new MaxText still shows.
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
    """`text` less its lines that are exactly a `known` line (line endings kept)."""
    return "".join(line for line in text.splitlines(keepends=True) if line.rstrip("\r\n") not in known)


def import_quietly(module: str = NOISY_MODULE, known: tuple[str, ...] = KNOWN_NOISE) -> ModuleType:
    """`importlib.import_module(module)` with its stdout captured; what it printed, less the
    `known` lines, goes to stdout afterwards (also when the import raises)."""
    captured = io.StringIO()
    try:
        with contextlib.redirect_stdout(captured):
            return importlib.import_module(module)
    finally:
        sys.stdout.write(without_known_noise(captured.getvalue(), known))
