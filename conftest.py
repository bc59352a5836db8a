"""Root pytest configuration.

The XLA flags of `mhc_parity.harness.env` (8 simulated host devices, so token-sharded paths run
on a CPU; no excess precision) must be in the environment before the JAX backend
starts; pytest imports this module before any test module.
"""

import jax
import pytest

from mhc_parity.harness.env import ensure_host_devices

# 8 simulated devices and no excess precision, before any test computes (XLA reads its
# flags when the backend starts, not when jax is imported: mhc_parity.harness.env).
ensure_host_devices()

# One marker per kind of hardware: such a test is skipped, with the reason, unless JAX's
# default backend is that platform.
HARDWARE_MARKERS = {
    "tpu": "needs a TPU backend (Mosaic-compiled kernels); skipped elsewhere",
    "gpu": "needs a GPU backend; skipped elsewhere",
}
MARKERS = {
    **HARDWARE_MARKERS,
    "slow": "takes more than a few seconds",
    "sharded": "runs token-sharded on the 8 simulated host devices",
    "browser": "renders a page in headless Chromium",
}


def pytest_configure(config):
    for name, description in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {description}")


def pytest_collection_modifyitems(config, items):
    backend = jax.default_backend()
    for marker in HARDWARE_MARKERS:
        if marker == backend:
            continue
        skip = pytest.mark.skip(reason=f"needs a {marker} backend; jax.default_backend() is {backend!r}")
        for item in items:
            if item.get_closest_marker(marker) is not None:
                item.add_marker(skip)


# The parity matrix as tests (see mhc_parity/harness/pytest_plugin.py). The installed `pytest11` entry
# point has the module's name, so this line is a no-op when it is active and loads the
# plugin when it is not (PYTEST_DISABLE_PLUGIN_AUTOLOAD=1).
pytest_plugins = ["mhc_parity.harness.pytest_plugin"]
