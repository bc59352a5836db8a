"""Process set-up that must happen before JAX loads, and the run's environment record."""

from __future__ import annotations

import os
import pathlib
import platform
import subprocess
import sys

HOST_DEVICE_COUNT = 8
_DEVICE_FLAG = "--xla_force_host_platform_device_count"
PROJECT_ROOT = pathlib.Path(__file__).resolve().parent.parent


def ensure_host_devices(count: int = HOST_DEVICE_COUNT) -> None:
    """Ask XLA for `count` simulated CPU devices, so token-sharded paths run on a CPU.

    Must run before JAX is imported: XLA reads the flag once when its CPU client
    starts. Raises RuntimeError if JAX is already loaded without the flag, rather than
    letting sharded paths silently skip.
    """
    flags = os.environ.get("XLA_FLAGS", "")
    if _DEVICE_FLAG in flags:
        return
    if "jax" in sys.modules:
        import jax

        if jax.device_count() >= count or jax.default_backend() != "cpu":
            return
        raise RuntimeError(
            f"JAX was imported before {_DEVICE_FLAG}={count} was set; set XLA_FLAGS in the "
            f"environment or import harness before jax"
        )
    os.environ["XLA_FLAGS"] = f"{flags} {_DEVICE_FLAG}={count}".strip()


def cache_root() -> pathlib.Path:
    """The project cache folder (`MHC_PARITY_CACHE` overrides `<project>/.cache`)."""
    return pathlib.Path(os.environ.get("MHC_PARITY_CACHE", PROJECT_ROOT / ".cache"))


def enable_compilation_cache() -> pathlib.Path:
    """Turn on JAX's persistent compilation cache in the project cache folder."""
    import jax

    path = cache_root() / "jax-compilation"
    path.mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", str(path))
    # Cache every program: interpret-mode kernels compile in well under a second each,
    # but there are many of them.
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return path


def git_commit() -> str:
    """The checked-out commit (with `+dirty` if the tree has changes), or "" outside git."""
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=PROJECT_ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=PROJECT_ROOT, capture_output=True, text=True, check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""
    return commit + ("+dirty" if dirty else "")


def run_metadata() -> dict:
    """Versions, backend and devices of this process, for the report's environment block."""
    import flax
    import jax
    import jaxlib
    import numpy

    devices = jax.devices()
    return {
        "jax_version": jax.__version__,
        "jaxlib_version": jaxlib.__version__,
        "flax_version": flax.__version__,
        "numpy_version": numpy.__version__,
        "python_version": platform.python_version(),
        "platform": platform.platform(),
        "backend": jax.default_backend(),
        "device_kind": devices[0].device_kind if devices else "",
        "device_count": len(devices),
        "git_commit": git_commit(),
    }
