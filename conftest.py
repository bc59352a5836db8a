"""Root pytest configuration.

The 8-device host flag must be in the environment before JAX is first imported, so
the token-sharded paths run on a CPU; this module is imported by pytest before any
test module, which makes it the one place to set it for the test suite.
"""

import os

_DEVICE_FLAG = "--xla_force_host_platform_device_count=8"
if _DEVICE_FLAG.split("=")[0] not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _DEVICE_FLAG).strip()

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
