"""Process set-up of an entry point: a supported JAX (`mhc_parity.jax_support`), XLA flags
before the JAX backend starts, the cache folder, the garbage collector's pace.

XLA reads `XLA_FLAGS` once, when JAX creates its first backend (the first
`jax.devices()`, array or compilation), not when `jax` is imported (checked on the
pinned jaxlib, docs/jax-notes.md: flags set after `import jax` but before any computation
take effect; flags set after the backend started are ignored). So modules import JAX at the
top, and each entry point calls `ensure_host_devices()` before it computes anything:
`mhc_parity.harness.cli.main`, `mhc_parity.harness.commands.faults.main` and its worker processes, the root
conftest.py and the pytest plugin, and the scripts in bench/.
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
# XLA may otherwise keep a bfloat16 intermediate in float32 when it fuses the producer
# with its consumer ("excess precision"). Whether it does depends on fusion decisions —
# e.g. on whether a one-step kernel grid loop was inlined — so the same program would
# round differently from one compilation to the next. Off, every path rounds where its
# program says it does, which is what a parity comparison must see.
_EXCESS_PRECISION_FLAG = "--xla_allow_excess_precision"
# On x86-64 XLA's CPU code generator fuses a multiply and an add into one FMA in some loops
# and not in others: in a fused loop over a kernel block's rows the vector body rounded
# twice and the scalar tail for the last rows once (jaxlib 0.12.0.1, docs/jax-notes.md), so
# a token's result depended on its row in the block and a sharded run (the same block, the
# token at another row) no longer matched the unsharded one bit for bit. Capped at AVX,
# which has no FMA, every multiply-add rounds twice wherever it runs.
_MAX_ISA_FLAG = "--xla_cpu_max_isa"
ISA_CAP = "AVX"
_X86_64 = ("x86_64", "amd64")
# Tracing allocates millions of short-lived objects: at its default thresholds Python's cycle
# collector runs thousands of times a run, holding the GIL; at these it runs a few times,
# for the same peak memory (bench/parity_bench.py's columns show both).
GC_THRESHOLDS = (50_000, 20, 10)


def required_xla_flags(count: int = HOST_DEVICE_COUNT) -> dict[str, str]:
    """The XLA flags every parity process needs, by name."""
    flags = {_DEVICE_FLAG: str(count), _EXCESS_PRECISION_FLAG: "false"}
    if platform.machine().lower() in _X86_64:
        flags[_MAX_ISA_FLAG] = ISA_CAP
    return flags


def device_count_advice(needed: int, have: int) -> str:
    """What a process with `have` simulated CPU devices, short of a mesh's `needed`, should change."""
    return (
        f"this process has {have} CPU devices ({_DEVICE_FLAG} in XLA_FLAGS); set it to at least {needed}, "
        f"or leave it out (mhc-parity sets {HOST_DEVICE_COUNT})"
    )


def backend_started() -> bool:
    """True once this process's JAX backend exists (and has read XLA_FLAGS).

    This module does not import JAX (commands that never compute stay quick to start): a
    process that has not imported it has no backend.
    """
    jax = sys.modules.get("jax")
    # jax._src.xla_bridge.backends_are_initialized: no public equivalent in the pinned JAX.
    return jax is not None and jax._src.xla_bridge.backends_are_initialized()


# libtpu (installed with the project on x86-64 Linux, for its compiler: compile rows) reads
# these when JAX initialises its TPU plugin: on a host without TPU chips it cannot find
# out its accelerator type and worker names and prints several lines of warnings (also when
# JAX merely tries the plugin for `jax.devices()`), and a second process that loads it fails
# on its lockfile (/tmp/libtpu_lockfile) unless told that several may load it. Set to
# these values only on a host without TPU chips (`tpu_host`): a TPU VM's own are left alone.
# The accelerator type named does not limit the compile targets: a topology named to
# `jax.experimental.topologies.get_topology_desc` is compiled for as named (checked:
# v5e, v6e and v5p topologies under this setting).
COMPILE_ONLY_LIBTPU_ENV = {
    "TPU_ACCELERATOR_TYPE": "v5litepod-8",
    "TPU_WORKER_HOSTNAMES": "localhost",
    "ALLOW_MULTIPLE_LIBTPU_LOAD": "1",
}


def tpu_host(dev: pathlib.Path = pathlib.Path("/dev"), environ=os.environ) -> bool:
    """True on a machine with TPU chips (a TPU VM: /dev/accel*, or /dev/vfio/<n> on v5e and
    later) or one where the user asked JAX for TPUs (`JAX_PLATFORMS` naming tpu)."""
    if "tpu" in environ.get("JAX_PLATFORMS", "").lower():
        return True
    vfio = dev / "vfio"
    groups = vfio.is_dir() and any(entry.name.isdigit() for entry in vfio.iterdir())
    return groups or any(dev.glob("accel*"))


def quiet_compile_only_libtpu(dev: pathlib.Path = pathlib.Path("/dev"), environ=os.environ) -> None:
    """On a host without TPU chips, give libtpu `COMPILE_ONLY_LIBTPU_ENV` (values the user set
    are kept): no warnings on the terminal, JAX's default backend stays the CPU (the TPU plugin
    finds no chip and is passed over), and every worker process can compile for TPUs. A TPU
    host's environment is left as it is."""
    if tpu_host(dev, environ):
        return
    for name, value in COMPILE_ONLY_LIBTPU_ENV.items():
        environ.setdefault(name, value)


@functools.cache
def _jax_supported() -> None:
    check_jax_versions()  # once a process: the metadata does not change under it


def ensure_host_devices(count: int = HOST_DEVICE_COUNT) -> None:
    """Check the installed JAX, and set the XLA flags parity runs need before its backend starts
    (`required_xla_flags`).

    Raises `mhc_parity.jax_support.UnsupportedJaxError` (one line) when jax or jaxlib is
    missing or outside the supported releases: the entry points refuse to start on them.

    `count` simulated CPU devices let token-sharded paths run on a CPU, excess precision
    is turned off so bfloat16 rounding is a property of the program, and on x86-64 the CPU
    code has no FMA, so a value's rounding does not depend on its place in a loop. On a host
    without TPU chips libtpu is set up to compile quietly (`quiet_compile_only_libtpu`). Flags the
    user already set (with any value) are left as they are. Raises RuntimeError if the
    backend already started without them: XLA has read its flags, and results would
    silently depend on it.
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
    """Let Python's cycle collector run less often (`GC_THRESHOLDS`): for a process that
    traces and compiles programs. Memory is still freed by reference counting at once;
    only garbage held in reference cycles waits longer."""
    gc.set_threshold(*GC_THRESHOLDS)


@contextlib.contextmanager
def collector_paused_for_imports(*, freeze: bool):
    """Import modules inside with the cycle collector off: what an import builds (modules,
    classes, functions) lives as long as the process, so a collection during it frees
    nothing and only walks it. With `freeze`, everything alive afterwards moves to the
    collector's permanent generation (`gc.freeze`), which no later collection walks: for a
    process the command owns (`mhc_parity.harness.cli.entry`), since garbage cycles alive at
    that moment are never freed. The collector is on again after, as it was before."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if freeze:
            gc.freeze()
        if enabled:
            gc.enable()


# XLA:CPU's instruction-set levels, oldest first, by the names `--xla_cpu_max_isa` takes, each
# with the /proc/cpuinfo flag that introduces it. XLA (xla/backends/cpu/codegen/cpu_features.cc
# in the pinned jaxlib's XLA) turns off every host feature of the levels above the cap and keeps
# the host's others, so the code it generates targets the lower of the cap and the host's level;
# an unknown name is ignored with a warning (no cap). The names are upper-cased there too.
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


def compiler_material() -> dict:
    """What XLA compiles this process's CPU programs for: `XLA_FLAGS` and the host CPU (cache keys)."""
    return {"xla_flags": os.environ.get("XLA_FLAGS", ""), "host_cpu": host_cpu()}


@functools.lru_cache(maxsize=1)
def host_cpu() -> str:
    """The host CPU's model and a digest of its instruction-set flags, e.g. ``AMD EPYC 7B13 (isa 3f2a9c1d04be)``.

    XLA compiles CPU code for the host's instruction set, so a compiled program (and a
    float32 sum's blocking) may differ between machines that report the same versions.
    Read from /proc/cpuinfo on Linux; elsewhere the platform's processor name.
    """
    fields = _cpuinfo_fields()
    if not fields:
        return platform.processor() or platform.machine()
    model = fields.get("model name") or fields.get("Processor") or platform.machine()
    flags = fields.get("flags") or fields.get("Features") or ""
    return f"{model} (isa {hashlib.sha256(flags.encode()).hexdigest()[:12]})"


def _cpuinfo_fields() -> dict[str, str]:
    """The fields of /proc/cpuinfo, the last processor's where they repeat ({} where there is
    none: not Linux)."""
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
    """The newest of `levels` whose flag `cpu_flags` (space-separated, /proc/cpuinfo's) has; "" if none.

    x86 and AArch64 CPUs keep every older level's instructions, so the newest flag present names the level.
    """
    present = set(cpu_flags.split())
    found = [name for name, flag in levels if flag in present]
    return found[-1] if found else ""


def isa_cap(xla_flags: str) -> str:
    """The `--xla_cpu_max_isa` value in `xla_flags`, upper-cased as XLA reads it ("" if not
    given; the last one counts)."""
    values = [token.split("=", 1)[1] for token in xla_flags.split() if token.startswith(f"{_MAX_ISA_FLAG}=")]
    return values[-1].strip().upper() if values else ""


def effective_isa(cap: str, host: str, levels: tuple[tuple[str, str], ...]) -> str:
    """The level XLA:CPU generates code for: the lower of `cap` and the `host`'s level.

    An unknown cap is ignored, as XLA ignores it; an unknown host level leaves the cap; "" when neither is known.
    """
    order = [name for name, _ in levels]
    if cap not in order:
        return host
    if host not in order:
        return cap
    return order[min(order.index(cap), order.index(host))]


@functools.lru_cache(maxsize=1)
def host_isa() -> str:
    """This host's newest instruction-set level in XLA's names (`highest_isa` of /proc/cpuinfo's flags);
    "" where it cannot be read (not Linux) or XLA names no level (not x86-64 or AArch64)."""
    fields = _cpuinfo_fields()
    return highest_isa(fields.get("flags") or fields.get("Features") or "", isa_levels())


def isa_record() -> dict[str, str]:
    """What the run's float32 arithmetic was compiled for, for the run's record and a baseline's header:

    xla_cpu_isa   the level XLA:CPU generates code for (`effective_isa` of `XLA_FLAGS`'s
                  `--xla_cpu_max_isa`, which `ensure_host_devices` sets or leaves as the user set it,
                  and of `host_isa`);
    host_cpu_isa  the host's own level (`host_isa`): the libraries XLA calls (its oneDNN matmuls)
                  choose their code by it, whatever the cap.

    Two runs whose records differ may round float32 sums differently (FMA or not, vector width,
    blocking), by a few ulps (docs/gate.md). Empty values where unknown.
    """
    host = host_isa()
    return {
        "xla_cpu_isa": effective_isa(isa_cap(os.environ.get("XLA_FLAGS", "")), host, isa_levels()),
        "host_cpu_isa": host,
    }
