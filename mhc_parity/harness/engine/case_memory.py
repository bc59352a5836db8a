"""The memory a case needs, known from its shapes, so that a case that cannot fit is refused before the
run (exit 2) instead of exhausting memory hours in. `oracle_memory_bytes` is the chunked float64
oracle's budget: the process, the fixture, the exact leaves and each chunk in flight's working set
(or, where larger, what making the fixture holds), each term measured by `bench/oracle_memory.py`
(docs/judging.md). The refusal's floor, `case_memory_bytes`, is `FLOOR_FRACTION` of it; the paths'
own memory comes on top, so an admitted case may still run out."""

from __future__ import annotations

import math
import pathlib
from collections.abc import Iterable

from mhc_parity.cases.branches import get_branch
from mhc_parity.cases.fixtures import MAX_FIXTURE_ELEMENTS, expected_layout, fixture_elements, numpy_dtype
from mhc_parity.harness.engine.oracle_path import NOISE_SAMPLES, oracle_chunk_tokens
from mhc_parity.harness.processes.worker_processes import available_memory_bytes
from mhc_parity.mhc.common import UnsupportedInputError, validate_dims

try:
    import resource
except ImportError:  # Windows
    resource = None

# The oracle's budget (module docstring). The process, its runtime and compiled programs: the
# measured peaks less their chunks' and leaves' shares came to 0.66-0.81 GB.
ORACLE_PROCESS_BYTES = 1 << 30
# Draws each chunk runs: the exact one, the noisy ones and the backend-shift one (on a backend
# with model terms; a CPU runs one fewer).
ORACLE_DRAWS = NOISE_SAMPLES + 2
# Float64 values a draw of a chunk holds per token: per element of x, of the branch's hidden layer (by
# branch; one not named here counts as the largest), per permutation (lite) or h_res entry per Sinkhorn
# iteration; and per weight or branch parameter element, whatever the chunk. The measured slopes
# (bench/oracle_memory.py, 2-core CPU, n = 4): 29 per element of x, 82 per MLP hidden element, 54 per
# permutation, 48 per Sinkhorn entry, 9.4 per weight element; each with about a fifth more.
ORACLE_VALUES_PER_ACTIVATION = 36
ORACLE_VALUES_PER_HIDDEN = {"identity": 0, "tanh": 24, "mlp": 100}
ORACLE_VALUES_PER_PERMUTATION = 64
ORACLE_VALUES_PER_SINKHORN_ENTRY = 60
ORACLE_VALUES_PER_WEIGHT = 12
# The oracle's own process keeps the memory it frees, so its heap has holes beside the chunks'
# buffers: counted as much again as a chunk's working set (docs/judging.md gives the measured peaks).
ORACLE_KEPT_FRACTION = 1.0
# Copies of each exact token-major leaf the oracle holds at its peak: the leaf, and the
# temporaries its statistics take at the end (`mhc_parity.harness.judging.token_statistics`).
ORACLE_LEAF_COPIES = 3
# Float64 bytes making the fixture holds per element of x and of the cotangent: the float64
# master and the temporaries of its draw (`mhc_parity.cases.random_streams.normalish`).
FIXTURE_MASTER_BYTES = 32
# Measured peaks came to 0.53-0.95 of the oracle's budget (docs/judging.md): a case refused below
# half of it would not have fitted.
FLOOR_FRACTION = 0.5


def _hidden_values(case) -> int:
    """Float64 values per token a draw holds for the branch: `ORACLE_VALUES_PER_HIDDEN` times the
    width of its hidden layer (the MLP's first parameter's columns; C for a parameter-free branch)."""
    shapes = get_branch(case.branch).param_shapes(case.embedding)
    width = max([case.embedding] + [shape[-1] for shape in shapes.values() if len(shape) == 2])
    return ORACLE_VALUES_PER_HIDDEN.get(case.branch, max(ORACLE_VALUES_PER_HIDDEN.values())) * width


def _chunk(case, chunk_tokens: int | None) -> int:
    tokens = case.shape[0] * case.shape[1]
    return min(tokens, oracle_chunk_tokens(case) if chunk_tokens is None else chunk_tokens)


def chunk_working_bytes(case, chunk_tokens: int | None = None) -> int:
    """The host memory (bytes) one chunk in flight of `case`'s oracle holds, of `chunk_tokens` tokens
    (default `oracle_chunk_tokens`), with what the heap keeps beside it (`ORACLE_KEPT_FRACTION`)."""
    streams, embedding = case.shape[2:]
    layout = expected_layout(case)
    weights = sum(math.prod(shape) for role, (_, shape) in layout.items() if role not in ("x", "cotangent"))
    values = ORACLE_VALUES_PER_ACTIVATION * streams * embedding + _hidden_values(case)
    if case.variant == "sinkhorn":
        values += ORACLE_VALUES_PER_SINKHORN_ENTRY * streams**2 * case.mhc_config().sinkhorn_iterations
    else:
        values += ORACLE_VALUES_PER_PERMUTATION * math.factorial(streams)
    working = 8 * ORACLE_DRAWS * (_chunk(case, chunk_tokens) * values + ORACLE_VALUES_PER_WEIGHT * weights)
    return int((1 + ORACLE_KEPT_FRACTION) * working)


def oracle_memory_bytes(case, chunk_tokens: int | None = None, in_flight: int = 1) -> int:
    """The host memory (bytes) the chunked float64 oracle of `case` needs, fixture included, in chunks
    of `chunk_tokens` tokens (default `oracle_chunk_tokens`), `in_flight` of them at once."""
    batch, sequence, streams, embedding = case.shape
    tokens = batch * sequence
    layout = expected_layout(case)
    fixture = sum(math.prod(shape) * numpy_dtype(dtype).itemsize for dtype, shape in layout.values())
    per_token = streams * embedding
    # out and d_x (n·C), layer_input and layer_output (C), h_pre and h_post (n), h_res (n²)
    leaves = 8 * ORACLE_LEAF_COPIES * tokens * (2 * per_token + 2 * embedding + 2 * streams + streams**2)
    working = in_flight * chunk_working_bytes(case, chunk_tokens)
    making = FIXTURE_MASTER_BYTES * 2 * tokens * per_token
    return ORACLE_PROCESS_BYTES + max(making, fixture + leaves + working)


def case_memory_bytes(case) -> int:
    """The least memory (bytes) a cold run of `case` needs: `FLOOR_FRACTION` of its oracle's
    budget (`oracle_memory_bytes`), which every case that computes numbers runs."""
    return int(FLOOR_FRACTION * oracle_memory_bytes(case))


def _address_space_left() -> int | None:
    """Bytes this process may still map under its address-space limit (`ulimit -v`), or None
    without a limit (or where it cannot be read)."""
    if resource is None:
        return None
    limit, _ = resource.getrlimit(resource.RLIMIT_AS)
    if limit == resource.RLIM_INFINITY:
        return None
    try:
        for line in pathlib.Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmSize:"):
                return max(0, limit - int(line.split()[1]) * 1024)
    except (OSError, ValueError, IndexError):
        pass
    return limit


def memory_for_a_case() -> int | None:
    """The memory (bytes) a case run by this process can get: the system's available memory,
    less where the address-space limit leaves less; None if neither is known."""
    known = [n for n in (available_memory_bytes(), _address_space_left()) if n is not None]
    return min(known) if known else None


def _gib(n: int) -> str:
    return f"{n / 2**30:,.1f} GiB"


def too_large(case, memory: int | None) -> str:
    """Why `case` cannot run here with `memory` bytes to spare (None: unknown), in one phrase
    naming its size; "" if it may."""
    try:
        validate_dims(case.dims)
    except UnsupportedInputError:
        return ""  # not a size: the run reports it unsupported
    elements = fixture_elements(case)
    size = f"case {case.name} ({case.shape_name}, {elements:,} fixture elements)"
    if elements > MAX_FIXTURE_ELEMENTS:
        return f"{size} is beyond the {MAX_FIXTURE_ELEMENTS:,} elements a fixture may hold; select smaller cases"
    needed = case_memory_bytes(case)
    if memory is not None and needed > memory:
        return (
            f"{size} needs at least {_gib(needed)} of memory for its float64 oracle, more than the "
            f"{_gib(memory)} this process can get; run it on a machine with more memory, or select smaller cases"
        )
    return ""


def first_too_large(cases: Iterable) -> str:
    """`too_large` of the first of `cases` that cannot run in this process ("" if all may)."""
    memory = memory_for_a_case()
    for case in cases:
        reason = too_large(case, memory)
        if reason:
            return reason
    return ""
