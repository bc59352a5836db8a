"""MaxText's mHC (`maxtext==0.2.5` from PyPI) as implementations the harness runs.

Everything MaxText-specific lives in this package; the engine (`harness`) knows only the
implementation interface (`mhc_parity.harness.engine.implementations`). `mhc-parity run --suite maxtext
--impl mhc_parity.maxtext_parity:implementations` (what `make parity-maxtext` runs) adds seven:

  maxtext-layer-reference              the layer, use_mhc_pallas_kernel=False, as released
  maxtext-layer-kernel                 the layer, use_mhc_pallas_kernel=True, as released
  maxtext-kernel-api                   the public kernel API `maxtext.kernels.mhc.pre/post`, as released
  maxtext-layer-reference-upstream-pr  the reference with only the upstream PR's change (pre and post
                                       gates in float32, the residual gate as released)
  ...-fixed (each of the three)        with the upstream fixes applied at run time (`mhc_parity.maxtext_parity.fixes`)

`mhc_parity.maxtext_parity:released` and `mhc_parity.maxtext_parity:fixed` give those three paths each;
`mhc_parity.maxtext_parity:layer_reference` and `:layer_reference_fixed` the layer's reference path alone.

Each layer runs through its own `__call__` with the case's branch as `branch_fn` and the
fixture's weights in its parameters (`mhc_parity.maxtext_parity.layer`). A kernel path is also compared
with its own layer's reference path of the same release state (its `partner`). Nothing
outside this package imports it, so the rest of the project never needs MaxText.
"""

from __future__ import annotations

from mhc_parity.maxtext_parity import type_aliases
from mhc_parity.maxtext_parity.import_noise import import_quietly

# Before any MaxText import: on a Python older than 3.12, MaxText's PEP 695 aliases are read as
# assignments (a stated accommodation, `mhc_parity.maxtext_parity.type_aliases`).
type_aliases.install()
# Before any other MaxText import: the one that prints a known line of noise at import, with
# that line dropped (a run-time accommodation, `mhc_parity.maxtext_parity.import_noise`).
import_quietly()

from mhc_parity.maxtext_parity.kernel_api import KernelApi  # noqa: E402 - after the quiet import above
from mhc_parity.maxtext_parity.layer import LayerPath  # noqa: E402


def implementations() -> list:
    """Every MaxText implementation, as released, with the upstream PR alone, and fixed (the `--impl` factory)."""
    return released() + [LayerPath(kernel=False, fixed=False, upstream_pr=True)] + fixed()


def released() -> list:
    """MaxText's layer (both paths) and kernel API as released."""
    return [LayerPath(kernel=False, fixed=False), LayerPath(kernel=True, fixed=False), KernelApi(fixed=False)]


def fixed() -> list:
    """The same three with the upstream fixes applied at run time."""
    return [LayerPath(kernel=False, fixed=True), LayerPath(kernel=True, fixed=True), KernelApi(fixed=True)]


def layer_reference() -> LayerPath:
    """The layer's reference path alone, as released: the quickest of them to run on a CPU
    (no kernel in Pallas's interpret mode), and one implementation, so it can have a baseline."""
    return LayerPath(kernel=False, fixed=False)


def layer_reference_fixed() -> LayerPath:
    """The layer's reference path alone, with the upstream fixes applied at run time."""
    return LayerPath(kernel=False, fixed=True)
