"""Root pytest configuration.

The XLA flags of `harness.env` (8 simulated host devices, so token-sharded paths run
on a CPU; no excess precision) must be in the environment before JAX is first
imported; pytest imports this module before any test module.
"""

from harness.env import ensure_host_devices

# 8 simulated devices and no excess precision, before any test module imports JAX.
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
    import pytest

    try:
        import jax

        backend = jax.default_backend()
    except Exception:  # pragma: no cover - jax missing is reported by the tests themselves
        backend = "unavailable"
    for marker in HARDWARE_MARKERS:
        if marker == backend:
            continue
        skip = pytest.mark.skip(reason=f"needs a {marker} backend; jax.default_backend() is {backend!r}")
        for item in items:
            if item.get_closest_marker(marker) is not None:
                item.add_marker(skip)

# The parity matrix as tests (see harness/pytest_plugin.py).
pytest_plugins = ["harness.pytest_plugin"]
