"""Process set-up that must happen before JAX loads, and the run's environment record."""

from __future__ import annotations

import os
import pathlib
import platform
import subprocess
import sys

HOST_DEVICE_COUNT = 8
_DEVICE_FLAG = "--xla_force_host_platform_device_count"
# XLA may otherwise keep a bfloat16 intermediate in float32 when it fuses the producer
# with its consumer ("excess precision"). Whether it does depends on fusion decisions —
# e.g. on whether a one-step kernel grid loop was inlined — so the same program would
# round differently from one compilation to the next. Off, every path rounds where its
# program says it does, which is what a parity comparison must see.
_EXCESS_PRECISION_FLAG = "--xla_allow_excess_precision"
PROJECT_ROOT = pathlib.Path(__file__).resolve().parent.parent


def required_xla_flags(count: int = HOST_DEVICE_COUNT) -> dict[str, str]:
    """The XLA flags every parity process needs, by name."""
    return {_DEVICE_FLAG: str(count), _EXCESS_PRECISION_FLAG: "false"}


def ensure_host_devices(count: int = HOST_DEVICE_COUNT) -> None:
    """Set the XLA flags parity runs need before JAX loads (see `required_xla_flags`).

    `count` simulated CPU devices let token-sharded paths run on a CPU, and excess
    precision is turned off so bfloat16 rounding is a property of the program. XLA reads
    the flags once when its client starts: raises RuntimeError if JAX is already loaded
    and the environment lacks them, rather than letting results silently depend on it.
    Flags the user already set (with any value) are left as they are.
    """
    flags = os.environ.get("XLA_FLAGS", "")
    missing = {k: v for k, v in required_xla_flags(count).items() if k not in flags}
    if not missing:
        return
    if "jax" in sys.modules:
        raise RuntimeError(
            f"JAX was imported before XLA_FLAGS had {sorted(missing)}; set them in the "
            f"environment or import harness.env and call ensure_host_devices() before jax"
        )
    extra = " ".join(f"{k}={v}" for k, v in missing.items())
    os.environ["XLA_FLAGS"] = f"{flags} {extra}".strip()


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


def precision_metadata(settings, device) -> dict:
    """The run's matmul precision record, and a note when a setting ran as another.

    settings: the matmul-precision settings the run's cases request; device: a device
    of the default backend. `matmul_precision` maps each setting to the operand rounding
    it means there (`reports.environment`); `matmul_precision_note` (only when needed)
    says which settings ran as another, e.g. "default" as "highest" on a CPU.
    """
    from mhc.precision import device_compute_capability, effective_matmul_precision, operand_rounding
    from reports.environment import format_precision_record

    capability = device_compute_capability(device)
    roundings = {s: operand_rounding(s, device.platform, capability).name for s in settings}
    record = {"matmul_precision": format_precision_record(roundings)}
    ran_as = {s: effective_matmul_precision(s, device.platform, capability) for s in sorted(settings)}
    changed = [f"{s} ran as {e}" for s, e in ran_as.items() if e != s]
    if changed:
        record["matmul_precision_note"] = (
            f"{'; '.join(changed)}: on {device.platform} ({device.device_kind}) the default precision is full float32"
        )
    return record


def run_metadata(cases=None) -> dict:
    """Versions, backend, devices and matmul precision of this process, for the report's environment block.

    cases: the run's cases (their matmul-precision settings are recorded); None records
    the default setting.
    """
    import flax
    import jax
    import jaxlib
    import numpy

    from mhc.precision import DEFAULT_MATMUL_PRECISION, device_compute_capability

    devices = jax.devices()
    settings = {c.matmul_precision for c in cases} if cases else {DEFAULT_MATMUL_PRECISION}
    capability = device_compute_capability(devices[0])
    return {
        "jax_version": jax.__version__,
        "jaxlib_version": jaxlib.__version__,
        "flax_version": flax.__version__,
        "numpy_version": numpy.__version__,
        "python_version": platform.python_version(),
        "platform": platform.platform(),
        "backend": jax.default_backend(),
        "device_kind": devices[0].device_kind,
        "device_count": len(devices),
        **({"compute_capability": capability} if capability else {}),
        "host_cpu_devices": len(jax.devices("cpu")),
        **precision_metadata(settings, devices[0]),
        "git_commit": git_commit(),
    }
