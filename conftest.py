"""Root pytest configuration.

The XLA flags of `harness.env` (8 simulated host devices, so token-sharded paths run
on a CPU; no excess precision) must be in the environment before JAX is first
imported; pytest imports this module before any test module.
"""

from harness.env import ensure_host_devices

# 8 simulated devices and no excess precision, before any test module imports JAX.
ensure_host_devices()

MARKERS = {
    "tpu_only": "needs a real TPU backend; skipped elsewhere",
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

        on_tpu = jax.default_backend() == "tpu"
    except Exception:  # pragma: no cover - jax missing is reported by the tests themselves
        on_tpu = False
    if on_tpu:
        return
    skip_tpu = pytest.mark.skip(reason="needs a TPU backend (jax.default_backend() != 'tpu')")
    for item in items:
        if "tpu_only" in item.keywords:
            item.add_marker(skip_tpu)

# The parity matrix as tests (see harness/pytest_plugin.py).
pytest_plugins = ["harness.pytest_plugin"]
