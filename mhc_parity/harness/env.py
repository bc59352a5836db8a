"""Process set-up of an entry point: a supported JAX, XLA flags before the JAX backend starts, the cache
folder, the garbage collector's pace. Imports no JAX.

XLA reads `XLA_FLAGS` when JAX creates its first backend, not at `import jax` (docs/jax-notes.md), so each
entry point calls `ensure_host_devices()` before it computes anything.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import hashlib
import os
import pathlib
import platform
import sys

from mhc_parity.jax_support import check_jax_versions

HOST_DEVICE_COUNT = 8
_DEVICE_FLAG = "--xla_force_host_platform_device_count"
# Off: otherwise XLA may keep a fused bfloat16 intermediate in float32, depending on fusion
# decisions, so one program would round differently from one compilation to the next.
_EXCESS_PRECISION_FLAG = "--xla_allow_excess_precision"
# AVX has no FMA: XLA:CPU otherwise fuses a multiply-add in a loop's scalar tail and not its
# vector body, so a token's result depends on its row in a block (docs/jax-notes.md).
_MAX_ISA_FLAG = "--xla_cpu_max_isa"
ISA_CAP = "AVX"
_X86_64 = ("x86_64", "amd64")
# Tracing allocates millions of short-lived objects: at the default thresholds the cycle
# collector runs thousands of times a run, holding the GIL; at these a few, same peak memory.
GC_THRESHOLDS = (50_000, 20, 10)


def required_xla_flags(count: int = HOST_DEVICE_COUNT) -> dict[str, str]:
    flags = {_DEVICE_FLAG: str(count), _EXCESS_PRECISION_FLAG: "false"}
    if platform.machine().lower() in _X86_64:
        flags[_MAX_ISA_FLAG] = ISA_CAP
    return flags


def device_count_advice(needed: int, have: int) -> str:
    return (
        f"this process has {have} CPU devices ({_DEVICE_FLAG} in XLA_FLAGS); set it to at least {needed}, "
        f"or leave it out (mhc-parity sets {HOST_DEVICE_COUNT})"
    )


def backend_started() -> bool:
    """True once this process's JAX backend exists (and has read XLA_FLAGS)."""
    jax = sys.modules.get("jax")
    # jax._src.xla_bridge.backends_are_initialized: no public equivalent in the pinned JAX.
    return jax is not None and jax._src.xla_bridge.backends_are_initialized()


# libtpu's settings on a host without TPU chips: no warnings, several processes may load it
# (docs/accelerators.md). The type named does not limit the compile targets (checked: v5e, v6e
# and v5p topologies compile as named under it).
COMPILE_ONLY_LIBTPU_ENV = {
    "TPU_ACCELERATOR_TYPE": "v5litepod-8",
    "TPU_WORKER_HOSTNAMES": "localhost",
    "ALLOW_MULTIPLE_LIBTPU_LOAD": "1",
}


def tpu_host(dev: pathlib.Path = pathlib.Path("/dev"), environ=os.environ) -> bool:
    """True on a machine with TPU chips (/dev/accel*, or /dev/vfio/<n> on v5e and later) or where
    `JAX_PLATFORMS` names tpu."""
    if "tpu" in environ.get("JAX_PLATFORMS", "").lower():
        return True
    vfio = dev / "vfio"
    groups = vfio.is_dir() and any(entry.name.isdigit() for entry in vfio.iterdir())
    return groups or any(dev.glob("accel*"))


def quiet_compile_only_libtpu(dev: pathlib.Path = pathlib.Path("/dev"), environ=os.environ) -> None:
    """On a host without TPU chips, default libtpu's `COMPILE_ONLY_LIBTPU_ENV` (docs/accelerators.md); a TPU
    host's environment is left as it is."""
    if tpu_host(dev, environ):
        return
    for name, value in COMPILE_ONLY_LIBTPU_ENV.items():
        environ.setdefault(name, value)


@functools.cache
def _jax_supported() -> None:
    check_jax_versions()  # once a process: the metadata does not change under it


def ensure_host_devices(count: int = HOST_DEVICE_COUNT) -> None:
    """Check the installed JAX and set `required_xla_flags` before its backend starts.

    `count` simulated CPU devices run token-sharded paths on a CPU; no excess precision, so bfloat16
    rounding is the program's; no FMA on x86-64; libtpu quiet on a host without TPU chips. Flags the
    user set are kept. Raises UnsupportedJaxError for a missing or unsupported jax/jaxlib, RuntimeError
    if the backend already started without the flags (results would silently depend on it).
    """
    _jax_supported()
    quiet_compile_only_libtpu()
    flags = os.environ.get("XLA_FLAGS", "")
    missing = {k: v for k, v in required_xla_flags(count).items() if k not in flags}
    if not missing:
        return
    if backend_started():
        raise RuntimeError(
            f"the JAX backend started before XLA_FLAGS had {sorted(missing)}; set them in the "
            f"environment, or call mhc_parity.harness.env.ensure_host_devices() before anything computes"
        )
    extra = " ".join(f"{k}={v}" for k, v in missing.items())
    os.environ["XLA_FLAGS"] = f"{flags} {extra}".strip()


def pace_garbage_collector() -> None:
    """`GC_THRESHOLDS` for a process that traces and compiles; reference counting still frees at once, only
    cyclic garbage waits longer."""
    gc.set_threshold(*GC_THRESHOLDS)


@contextlib.contextmanager
def collector_paused_for_imports(*, freeze: bool):
    """Import with the cycle collector off (what an import builds lives as long as the process); with
    `freeze`, everything alive afterwards moves to the permanent generation (`gc.freeze`), for a process the
    command owns, as cycles alive then are never freed."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if freeze:
            gc.freeze()
        if enabled:
            gc.enable()


# XLA:CPU's instruction-set levels, oldest first, as `--xla_cpu_max_isa` names them, each with the
# /proc/cpuinfo flag that introduces it. XLA (cpu_features.cc) targets the lower of the cap and the
# host's level, and ignores an unknown name.
X86_ISA_LEVELS = (
    ("SSE4_2", "sse4_2"),
    ("AVX", "avx"),
    ("AVX2", "avx2"),
    ("AVX512", "avx512f"),
    ("AVX512_VNNI", "avx512_vnni"),
    ("AVX512_BF16", "avx512_bf16"),
    ("AMX", "amx_bf16"),
    ("AMX_FP16", "amx_fp16"),
    ("AMX_FP8", "amx_fp8"),
)
AARCH64_ISA_LEVELS = (("NEON", "asimd"), ("SVE", "sve"), ("SVE2", "sve2"))


@functools.lru_cache(maxsize=1)
def host_cpu() -> str:
    """The host CPU's model and a digest of its instruction-set flags, e.g. ``AMD EPYC 7B13 (isa
    3f2a9c1d04be)``: compiled programs (and float32 sums' blocking) may differ between such machines."""
    fields = _cpuinfo_fields()
    if not fields:
        return platform.processor() or platform.machine()
    model = fields.get("model name") or fields.get("Processor") or platform.machine()
    flags = fields.get("flags") or fields.get("Features") or ""
    return f"{model} (isa {hashlib.sha256(flags.encode()).hexdigest()[:12]})"


def _cpuinfo_fields() -> dict[str, str]:
    """/proc/cpuinfo's fields, the last processor's where they repeat ({} off Linux)."""
    try:
        info = pathlib.Path("/proc/cpuinfo").read_text()
    except OSError:
        return {}
    pairs = (line.split(":", 1) for line in info.splitlines() if ":" in line)
    return {key.strip(): value.strip() for key, value in pairs}


def isa_levels(machine: str | None = None) -> tuple[tuple[str, str], ...]:
    """XLA's instruction-set levels for `machine` (default: this one), oldest first; () elsewhere."""
    machine = (machine or platform.machine()).lower()
    if machine in _X86_64:
        return X86_ISA_LEVELS
    if machine in ("aarch64", "arm64"):
        return AARCH64_ISA_LEVELS
    return ()


def highest_isa(cpu_flags: str, levels: tuple[tuple[str, str], ...]) -> str:
    """The newest of `levels` whose flag `cpu_flags` (/proc/cpuinfo's) has, "" if none: x86 and AArch64 keep
    every older level's instructions."""
    present = set(cpu_flags.split())
    found = [name for name, flag in levels if flag in present]
    return found[-1] if found else ""


def isa_cap(xla_flags: str) -> str:
    """The last `--xla_cpu_max_isa` value in `xla_flags`, upper-cased as XLA reads it ("" if none)."""
    values = [token.split("=", 1)[1] for token in xla_flags.split() if token.startswith(f"{_MAX_ISA_FLAG}=")]
    return values[-1].strip().upper() if values else ""


def effective_isa(cap: str, host: str, levels: tuple[tuple[str, str], ...]) -> str:
    """The lower of `cap` and the `host`'s level; an unknown cap is ignored, as XLA ignores it; "" when
    neither is known."""
    order = [name for name, _ in levels]
    if cap not in order:
        return host
    if host not in order:
        return cap
    return order[min(order.index(cap), order.index(host))]


@functools.lru_cache(maxsize=1)
def host_isa() -> str:
    """This host's newest level in XLA's names, "" where unknown (not Linux, not x86-64 or AArch64)."""
    fields = _cpuinfo_fields()
    return highest_isa(fields.get("flags") or fields.get("Features") or "", isa_levels())


def isa_record() -> dict[str, str]:
    """{"xla_cpu_isa": the level XLA:CPU generates code for, "host_cpu_isa": the host's own (oneDNN chooses
    its code by it)}: runs whose records differ may round float32 sums differently by a few ulps
    (docs/gate.md). Empty where unknown."""
    host = host_isa()
    return {
        "xla_cpu_isa": effective_isa(isa_cap(os.environ.get("XLA_FLAGS", "")), host, isa_levels()),
        "host_cpu_isa": host,
    }
