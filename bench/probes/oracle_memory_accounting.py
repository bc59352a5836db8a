"""How the TPU VM counts the memory of a float64 oracle (issue 55): the machine's memory in use
(MemTotal - MemAvailable) against the oracle process's resident memory, second by second, while
one case's chunked oracle runs, under each way of running it.

On the lent TPU VM (gVisor) a run's oracle in a process of its own saw the memory in use climb
0.4-1.3 GB/s to the 40 GiB limit while that process stayed resident at 4-9 GB; the same oracle
in the run's own process (which had loaded the TPU runtime) had not. This prints, per variant,
the figures every second and where in use stood 10 s after the oracle ended:

    python bench/probes/oracle_memory_accounting.py [--seconds 45] [--tokens 2048] [VARIANT ...]

Variants: `child` (JAX_PLATFORMS=cpu, as the oracle's own process before it kept what glibc
frees), `child-malloc` (glibc keeping what it frees, one arena: `KEEP_FREED_MEMORY`, as the
oracle's own process now), `child-one` and `child-one-malloc` (the same, one chunk at a time),
`child-one-huge` (one at a time, glibc asking for transparent huge pages: fewer faults, each
zeroing 2 MiB), `tpu` (a process whose default backend is the chip, the oracle on its CPU
device, as in the run's process). An oracle that ends within the limit prints its time, the
cores it kept busy, its minor page faults (memory mapped afresh: each chunk's gigabytes, where
glibc hands them back) and its peak resident memory.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from mhc_parity.harness.engine.oracle_process import KEEP_FREED_MEMORY  # noqa: E402
from mhc_parity.harness.processes.worker_processes import memory_in_use_bytes  # noqa: E402

# A mid-size case of the tpu suite's shapes: 2048 tokens of 4 x 1024, 16 chunks of 128.
ORACLE = """
import sys, time
from mhc_parity.harness.env import ensure_host_devices
ensure_host_devices()
from mhc_parity.cases.spec import Case
from mhc_parity.cases.fixtures import make_fixture
from mhc_parity.harness.engine.oracle_path import run_oracle_path
import resource
case = Case(name="accounting", batch=1, sequence=int(sys.argv[2]), streams=4, embedding=1024, dtype="bfloat16")
fixture = make_fixture(case)
before, start = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
run_oracle_path(case, fixture, chunk_tokens=128, in_flight=int(sys.argv[1]))
after, wall = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter() - start
cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
print(f"oracle {wall:.1f} s ({case.sequence // 128} chunks), {cpu / wall:.1f} cores busy on average,"
      f" {after.ru_minflt - before.ru_minflt} minor page faults, peak resident {after.ru_maxrss // 1024} MiB",
      flush=True)
"""
VARIANTS = {
    "child": ({"JAX_PLATFORMS": "cpu"}, 2),
    "child-malloc": ({"JAX_PLATFORMS": "cpu", **KEEP_FREED_MEMORY}, 2),
    "child-one": ({"JAX_PLATFORMS": "cpu"}, 1),
    "child-one-malloc": ({"JAX_PLATFORMS": "cpu", **KEEP_FREED_MEMORY}, 1),
    "child-one-huge": ({"JAX_PLATFORMS": "cpu", "GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}, 1),
    "tpu": ({}, 2),
}


def in_use_mib() -> int:
    return memory_in_use_bytes() // 2**20


def resident_mib(pid: int) -> int:
    try:
        for line in open(f"/proc/{pid}/status"):
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) // 1024
    except OSError:
        pass
    return 0


def run(name: str, limit_s: float, tokens: int) -> None:
    extra, in_flight = VARIANTS[name]
    path = os.environ.get("PYTHONPATH")  # a TPU image's own JAX may be found only through it
    env = {**os.environ, **extra, "PYTHONPATH": ROOT + (os.pathsep + path if path else "")}
    before = in_use_mib()
    process = subprocess.Popen([sys.executable, "-c", ORACLE, str(in_flight), str(tokens)], env=env, cwd=ROOT)
    start = time.monotonic()
    while process.poll() is None and time.monotonic() - start < limit_s:
        print(
            f"{name} {time.monotonic() - start:5.1f} s: in use {in_use_mib() - before:+6d} MiB,"
            f" resident {resident_mib(process.pid):6d} MiB",
            flush=True,
        )
        time.sleep(1)
    if process.poll() is None:
        process.kill()
        print(f"{name}: stopped after {limit_s} s", flush=True)
    process.wait()
    time.sleep(10)
    print(f"{name}: 10 s after, in use {in_use_mib() - before:+d} MiB", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("variants", nargs="*", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--seconds", type=float, default=45.0, help="each variant's limit")
    parser.add_argument("--tokens", type=int, default=2048, help="the case's tokens (chunks of 128)")
    args = parser.parse_args()
    for name in args.variants:
        run(name, args.seconds, args.tokens)


if __name__ == "__main__":
    main()
