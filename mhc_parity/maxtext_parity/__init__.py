"""MaxText's mHC (`maxtext==0.2.5`) as implementations the harness runs (docs/maxtext.md).

`--impl mhc_parity.maxtext_parity:implementations` adds seven: the layer's reference and kernel paths and
the kernel API, as released and with the upstream fixes applied at run time (`fixes`), and the reference
with only the upstream PR's change. `:released`, `:fixed`, `:layer_reference` and `:layer_reference_fixed`
give subsets. Nothing outside this package imports it.
"""

from __future__ import annotations

from mhc_parity.maxtext_parity import type_aliases
from mhc_parity.maxtext_parity.import_noise import import_quietly

# Before any MaxText import: below Python 3.12, its PEP 695 aliases read as assignments.
type_aliases.install()
# Before any other MaxText import: the one that prints a known line of noise, that line dropped.
import_quietly()

from mhc_parity.maxtext_parity.kernel_api import KernelApi  # noqa: E402 - after the quiet import above
from mhc_parity.maxtext_parity.layer import LayerPath  # noqa: E402


def implementations() -> list:
    """Every MaxText implementation, as released, with the upstream PR alone, and fixed (the `--impl` factory)."""
    return released() + [LayerPath(kernel=False, fixed=False, upstream_pr=True)] + fixed()


def released() -> list:
    return [LayerPath(kernel=False, fixed=False), LayerPath(kernel=True, fixed=False), KernelApi(fixed=False)]


def fixed() -> list:
    return [LayerPath(kernel=False, fixed=True), LayerPath(kernel=True, fixed=True), KernelApi(fixed=True)]


def layer_reference() -> LayerPath:
    """The layer's reference path alone, as released: the quickest on a CPU (no interpret-mode kernel), and
    one implementation, so it can have a baseline."""
    return LayerPath(kernel=False, fixed=False)


def layer_reference_fixed() -> LayerPath:
    return LayerPath(kernel=False, fixed=True)
