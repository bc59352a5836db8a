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
_X86_64 = ("x86_64", "amd64")
# Tracing allocates millions of short-lived objects: at its default thresholds Python's cycle
# collector runs thousands of times a run, holding the GIL; at these it runs a few times,
# for the same peak memory (bench/parity_bench.py's columns show both).
GC_THRESHOLDS = (50_000, 20, 10)


def required_xla_flags(count: int = HOST_DEVICE_COUNT) -> dict[str, str]:
    """The XLA flags every parity process needs, by name."""
    flags = {_DEVICE_FLAG: str(count), _EXCESS_PRECISION_FLAG: "false"}
    if platform.machine().lower() in _X86_64:
        flags[_MAX_ISA_FLAG] = "AVX"
    return flags


def backend_started() -> bool:
    """True once this process's JAX backend exists (and has read XLA_FLAGS).

    This module does not import JAX (commands that never compute stay quick to start): a
    process that has not imported it has no backend.
    """
    jax = sys.modules.get("jax")
    # jax._src.xla_bridge.backends_are_initialized: no public equivalent in the pinned JAX.
    return jax is not None and jax._src.xla_bridge.backends_are_initialized()


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
    code has no FMA, so a value's rounding does not depend on its place in a loop. Flags the
    user already set (with any value) are left as they are. Raises RuntimeError if the
    backend already started without them: XLA has read its flags, and results would
    silently depend on it.
    """
    _jax_supported()
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
    try:
        info = pathlib.Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or platform.machine()
    fields = dict(line.split(":", 1) for line in info.splitlines() if ":" in line)
    fields = {k.strip(): v.strip() for k, v in fields.items()}
    model = fields.get("model name") or fields.get("Processor") or platform.machine()
    flags = fields.get("flags") or fields.get("Features") or ""
    return f"{model} (isa {hashlib.sha256(flags.encode()).hexdigest()[:12]})"
