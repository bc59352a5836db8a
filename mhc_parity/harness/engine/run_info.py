"""This process's environment record (versions, backend, devices, matmul precision) and
JAX's persistent compilation cache."""

from __future__ import annotations

import hashlib
import json
import pathlib
import platform
import subprocess
from collections.abc import Sequence

import flax
import jax
import jaxlib
import numpy

from mhc_parity.harness.engine.backend_arithmetic import measured_arithmetic, model_terms
from mhc_parity.harness.engine.kernel_primitives import measured_kernel_primitives, narrowing_note
from mhc_parity.harness.env import host_cpu, isa_record
from mhc_parity.harness.errors import ConfigurationError
from mhc_parity.jax_support import libtpu_version
from mhc_parity.mhc.precision import (
    DEFAULT_MATMUL_PRECISION,
    device_compute_capability,
    effective_matmul_precision,
    operand_rounding,
)
from mhc_parity.records.cache_root import CACHE_ENV_VAR, cache_root
from mhc_parity.records.environment import (
    BACKEND_DIGEST_KEY,
    BACKEND_SOURCE_KEY,
    BACKEND_TERMS_KEY,
    LIBTPU_KEY,
    NO_BACKEND_TERMS,
    format_precision_record,
)
from mhc_parity.records.identity import DEVICE_ENVIRONMENT_KEYS, ENVIRONMENT_KEYS, settings_record
from mhc_parity.records.outputs import OutputPathError, writable_folder
from mhc_parity.records.project_code import PROJECT_ROOT

# JAX's events for a program looked up in the persistent cache: found (loaded, not
# compiled) or not (compiled by XLA, then stored).
_COMPILE_EVENTS = {
    "/jax/compilation_cache/cache_misses": "programs_compiled",
    "/jax/compilation_cache/cache_hits": "programs_loaded",
}
_compile_counts = dict.fromkeys(_COMPILE_EVENTS.values(), 0)
_counting = []  # non-empty once the listener is registered (once per process)


def _count_compile_event(event: str, **kwargs) -> None:
    name = _COMPILE_EVENTS.get(event)
    if name is not None:
        _compile_counts[name] += 1


def compile_counts() -> dict[str, int]:
    """Programs this process compiled with XLA and loaded from the persistent cache so far
    (counted once `enable_compilation_cache` has run)."""
    return dict(_compile_counts)


def enable_compilation_cache() -> pathlib.Path:
    """Turn on JAX's persistent compilation cache in the project cache folder (and count
    what it compiles and loads: `compile_counts`). ConfigurationError if the cache folder
    cannot be written."""
    if not _counting:
        jax.monitoring.register_event_listener(_count_compile_event)
        _counting.append(True)
    try:  # the fixture, oracle and program stores live beside it
        path = writable_folder(writable_folder(cache_root()) / "jax-compilation")
    except OutputPathError as exc:
        raise ConfigurationError(f"the cache folder ({CACHE_ENV_VAR} names another): {exc}") from None
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
            cwd=PROJECT_ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""
    return commit + ("+dirty" if dirty else "")


def precision_metadata(settings, device) -> dict:
    """The run's matmul precision record for `settings` (the cases' settings) on `device`: each setting's
    operand rounding there, and `matmul_precision_note` where a setting ran as another (e.g. "default"
    as "highest" on a CPU)."""
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


def arithmetic_metadata() -> dict:
    """The backend's float32 primitives as probed, the model terms they give here ("none" on a CPU), the
    table's source and a digest of the exact terms (the shown ones are rounded), which `merge` compares."""
    table = measured_arithmetic()
    exact = model_terms(table)
    terms = {name: term for name, term in exact.items() if term}
    widened = ", ".join(f"{name} {term:.3g}" for name, term in terms.items()) or NO_BACKEND_TERMS
    digest = hashlib.sha256(json.dumps(exact, sort_keys=True).encode()).hexdigest()[:16]
    return {
        "backend_arithmetic": table.record(),
        BACKEND_TERMS_KEY: widened,
        BACKEND_SOURCE_KEY: table.source,
        BACKEND_DIGEST_KEY: digest,
    }


def kernel_primitive_metadata() -> dict:
    """How the backend's terms judge a Mosaic kernel against XLA here (`kernel_primitives`: the
    measured table, and what the comparison is widened by), where any term widens; {} on a CPU."""
    table = measured_kernel_primitives()
    note = narrowing_note(model_terms(measured_arithmetic()), table)
    if not note:
        return {}
    return {"kernel_primitives": note + ("" if table is None else f". {table.record()}")}


def run_metadata(cases=None) -> dict:
    """This process's versions, backend, devices, CPU instruction set and matmul precision, for the
    report's environment block; `cases` give the precision settings (None: the default)."""
    devices = jax.devices()
    settings = {c.matmul_precision for c in cases} if cases else {DEFAULT_MATMUL_PRECISION}
    capability = device_compute_capability(devices[0])
    return {
        **identity_environment(),
        "python_version": platform.python_version(),
        "platform": platform.platform(),
        "host_cpu": host_cpu(),
        **({"compute_capability": capability} if capability else {}),
        **precision_metadata(settings, devices[0]),
        **arithmetic_metadata(),
        **kernel_primitive_metadata(),
        "git_commit": git_commit(),
    }


def identity_environment(keys: Sequence[str] = ENVIRONMENT_KEYS) -> dict:
    """`run_metadata`'s `ENVIRONMENT_KEYS` (or those of `keys`, in their order), recorded when a run starts, so
    that `--resume` in another environment is refused as `merge` refuses such shards; the device's fields
    (`DEVICE_ENVIRONMENT_KEYS`: the backend, its devices and its measured arithmetic) are read only where asked."""
    fields = {
        "jax_version": jax.__version__,
        "jaxlib_version": jaxlib.__version__,
        LIBTPU_KEY: libtpu_version(),
        "flax_version": flax.__version__,
        "numpy_version": numpy.__version__,
        **isa_record(),
        **settings_record(),
        "host_cpu_devices": len(jax.devices("cpu")),
    }
    if not set(keys).isdisjoint(DEVICE_ENVIRONMENT_KEYS):
        devices = jax.devices()
        fields.update(
            backend=jax.default_backend(),
            device_kind=devices[0].device_kind,
            device_count=len(devices),
            **arithmetic_metadata(),
        )
    return {key: fields.get(key) for key in keys}
