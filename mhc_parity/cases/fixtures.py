"""Fixtures: every array one case's run needs (x, weights, branch parameters, cotangent),
bit-identical on every machine: float64 masters from the case's `DATA_FIELDS`, rounded
float64 → float32 → bfloat16 (RNE) as its dtypes require.

Cached as ``fixture-<key>.npz`` in the cache folder, keyed on the data fields, the generator's
code digest and the NumPy/ml_dtypes versions; every load is verified (shapes, dtypes, sha256)
and a bad entry is regenerated, never used. Writes are atomic (concurrent xdist workers).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import io
import json
import logging
import math
import os
from pathlib import Path

import jax.numpy as jnp
import ml_dtypes
import numpy as np

from mhc_parity.cases.branches import get_branch
from mhc_parity.cases.init_families import Masters, generate_masters
from mhc_parity.cases.spec import Case
from mhc_parity.mhc.common import UnsupportedInputError
from mhc_parity.mhc.types import WEIGHT_FIELDS, MhcWeights
from mhc_parity.records.cache_root import cache_root
from mhc_parity.records.code import closure_digest
from mhc_parity.records.files import array_sha256, atomic_write, digest_arrays
from mhc_parity.records.foreign_code import read_keys, write_key

# Its import closure is part of the cache key, so an edited generator misses the cache.
GENERATOR_ENTRY = ("mhc_parity.cases.fixtures",)
# Fixture arrays beyond this many elements are refused (e.g. mHC-lite with n = 9 has
# 9! = 362880 residual columns): the case is not constructible on an ordinary machine.
MAX_FIXTURE_ELEMENTS = 1 << 29

_NUMPY_DTYPES = {"float32": np.dtype(np.float32), "bfloat16": np.dtype(ml_dtypes.bfloat16)}
_BIT_VIEWS = {"float32": np.dtype("<u4"), "bfloat16": np.dtype("<u2")}
_HEADER_KEY = "__header__"

log = logging.getLogger(__name__)


class CorruptFixtureError(ValueError):
    """A cache entry failed verification; the message says why."""


def numpy_dtype(name: str) -> np.dtype:
    """NumPy dtype for a case dtype name ("float32" -> float32, "bfloat16" -> ml_dtypes.bfloat16)."""
    return _NUMPY_DTYPES[name]


def round_master(master: np.ndarray, dtype_name: str) -> np.ndarray:
    """Round a float64 master to `dtype_name`: float64 → float32 → (bfloat16), RNE each step."""
    as_f32 = np.asarray(master, np.float64).astype(np.float32)
    if dtype_name == "float32":
        return as_f32
    return as_f32.astype(ml_dtypes.bfloat16)


@dataclasses.dataclass(frozen=True, eq=False)
class Fixture:
    """The inputs of one case, rounded to its dtypes; arrays read-only.

    x, cotangent (the VJP's output cotangent): (B, S, n, C) in the activation dtype.
    weights: `WEIGHT_FIELDS` name -> `MhcDims.weight_shapes()` shape; branch_params: name ->
    array ({} when parameter-free); both in the weight dtype. Equality is identity: use `digest()`.
    """

    case: Case
    x: np.ndarray
    weights: dict[str, np.ndarray]
    branch_params: dict[str, np.ndarray]
    cotangent: np.ndarray

    def arrays(self) -> dict[str, np.ndarray]:
        """Every array by a flat role name: x, weights.<field>, branch.<param>, cotangent."""
        out = {"x": self.x}
        out.update({f"weights.{k}": self.weights[k] for k in WEIGHT_FIELDS})
        out.update({f"branch.{k}": self.branch_params[k] for k in sorted(self.branch_params)})
        out["cotangent"] = self.cotangent
        return out

    @functools.cached_property
    def _digest(self) -> str:
        return digest_arrays(self.arrays())

    def digest(self) -> str:
        """sha256 (hex) of every array's role, dtype, shape and bytes: equal iff bit-identical."""
        return self._digest

    def mhc_weights(self):
        """`MhcWeights` of jax arrays (weight dtype, as stored)."""
        return MhcWeights(**{k: jnp.asarray(v) for k, v in self.weights.items()})

    def branch_params_jax(self) -> dict:
        return {k: jnp.asarray(v) for k, v in self.branch_params.items()}

    def as_float64(self) -> Fixture:
        """The same rounded values upcast to float64 (exact), e.g. for the oracle."""
        up = lambda a: a.astype(np.float64)  # noqa: E731
        return Fixture(
            case=self.case,
            x=_readonly(up(self.x)),
            weights={k: _readonly(up(v)) for k, v in self.weights.items()},
            branch_params={k: _readonly(up(v)) for k, v in self.branch_params.items()},
            cotangent=_readonly(up(self.cotangent)),
        )


def _readonly(array: np.ndarray) -> np.ndarray:
    array = np.ascontiguousarray(array)
    array.setflags(write=False)
    return array


# -- generation ---------------------------------------------------------------------


def expected_layout(case: Case) -> dict[str, tuple[str, tuple[int, ...]]]:
    """role -> (dtype name, shape) of every array the case's fixture holds."""
    shapes = case.dims.weight_shapes()
    layout = {"x": (case.dtype, case.shape)}
    layout.update({f"weights.{k}": (case.weight_dtype, shapes[k]) for k in WEIGHT_FIELDS})
    branch_shapes = get_branch(case.branch).param_shapes(case.embedding)
    layout.update({f"branch.{k}": (case.weight_dtype, branch_shapes[k]) for k in sorted(branch_shapes)})
    layout["cotangent"] = (case.dtype, case.shape)
    return layout


def fixture_elements(case: Case) -> int:
    """Total elements of the case's fixture arrays (from shapes only)."""
    return sum(math.prod(shape) for _, shape in expected_layout(case).values())


def fixture_from_masters(case: Case, masters: Masters) -> Fixture:
    """Round float64 masters to the case's dtypes."""
    return Fixture(
        case=case,
        x=_readonly(round_master(masters.x, case.dtype)),
        weights={k: _readonly(round_master(v, case.weight_dtype)) for k, v in masters.weights.items()},
        branch_params={k: _readonly(round_master(v, case.weight_dtype)) for k, v in masters.branch_params.items()},
        cotangent=_readonly(round_master(masters.cotangent, case.dtype)),
    )


def generate_fixture(case: Case) -> Fixture:
    """The case's fixture, uncached; UnsupportedInputError past `MAX_FIXTURE_ELEMENTS`."""
    elements = fixture_elements(case)
    if elements > MAX_FIXTURE_ELEMENTS:
        raise UnsupportedInputError(
            f"case {case.name!r}: its fixture would hold {elements} elements "
            f"(limit {MAX_FIXTURE_ELEMENTS}); streams={case.streams} variant={case.variant} "
            f"embedding={case.embedding}"
        )
    return fixture_from_masters(case, generate_masters(case))


# -- cache --------------------------------------------------------------------------


def default_cache_dir() -> Path:
    return cache_root() / "fixtures"


@functools.cache
def generator_digest() -> str:
    """`closure_digest` of the fixture generator's code (once per process)."""
    return closure_digest(GENERATOR_ENTRY)


def cache_key_material(case: Case) -> dict:
    """Everything the cached arrays depend on."""
    return {
        "generator": generator_digest(),
        "numpy": np.__version__,
        "ml_dtypes": ml_dtypes.__version__,
        "data": case.data_fields(),
    }


def cache_key(case: Case) -> str:
    """Content hash naming the case's cache entry (cases with equal data share it)."""
    return _key_name(cache_key_material(case))


def _key_name(material: dict) -> str:
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()[:32]


def cache_path(case: Case, cache_dir: str | os.PathLike | None = None, material: dict | None = None) -> Path:
    """Where the case's fixture is (or would be) cached under key `material` (default
    `cache_key_material`)."""
    folder = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    return folder / f"fixture-{_key_name(cache_key_material(case) if material is None else material)}.npz"


def _serialize(fixture: Fixture, material: dict) -> bytes:
    arrays = fixture.arrays()
    header = {
        "key": material,
        "digest": fixture.digest(),
        "arrays": {
            role: {"dtype": a.dtype.name, "shape": list(a.shape), "sha256": array_sha256(a)}
            for role, a in arrays.items()
        },
    }
    payload = {role: np.ascontiguousarray(a).view(_BIT_VIEWS[a.dtype.name]) for role, a in arrays.items()}
    payload[_HEADER_KEY] = np.frombuffer(json.dumps(header, sort_keys=True).encode(), np.uint8)
    buffer = io.BytesIO()
    np.savez(buffer, **payload)
    return buffer.getvalue()


def _deserialize(case: Case, path: Path, material: dict) -> Fixture:
    """Load and verify a cache entry written under key `material`; raise CorruptFixtureError on any problem."""
    try:
        with np.load(path, allow_pickle=False) as archive:
            header = json.loads(bytes(archive[_HEADER_KEY]).decode())
            raw = {name: archive[name] for name in archive.files if name != _HEADER_KEY}
    except CorruptFixtureError:
        raise
    except Exception as error:  # truncated zip, bad CRC, bad JSON, ...
        raise CorruptFixtureError(f"unreadable ({type(error).__name__}: {error})") from error
    if header.get("key") != json.loads(json.dumps(material, sort_keys=True)):
        raise CorruptFixtureError("stale: written for different data fields or generator code")
    layout = expected_layout(case)
    if set(raw) != set(layout) or set(header.get("arrays", {})) != set(layout):
        raise CorruptFixtureError(f"holds arrays {sorted(raw)}, expected {sorted(layout)}")
    arrays = {}
    for role, (dtype_name, shape) in layout.items():
        meta = header["arrays"][role]
        bits = raw[role]
        if meta.get("dtype") != dtype_name or tuple(meta.get("shape", ())) != tuple(shape):
            raise CorruptFixtureError(f"{role}: header says {meta}, expected {dtype_name} {shape}")
        if bits.dtype != _BIT_VIEWS[dtype_name] or bits.shape != tuple(shape):
            raise CorruptFixtureError(f"{role}: stored {bits.dtype} {bits.shape}, expected {dtype_name} {shape}")
        array = bits.view(_NUMPY_DTYPES[dtype_name])
        if array_sha256(array) != meta.get("sha256"):
            raise CorruptFixtureError(f"{role}: checksum mismatch")
        arrays[role] = _readonly(array)
    fixture = Fixture(
        case=case,
        x=arrays["x"],
        weights={r.removeprefix("weights."): a for r, a in arrays.items() if r.startswith("weights.")},
        branch_params={r.removeprefix("branch."): a for r, a in arrays.items() if r.startswith("branch.")},
        cotangent=arrays["cotangent"],
    )
    if fixture.digest() != header.get("digest"):
        raise CorruptFixtureError("fixture digest mismatch")
    return fixture


def load_cached_fixture(case: Case, cache_dir: str | os.PathLike | None = None) -> Fixture | None:
    """The verified cached fixture under any key this process reads (`read_keys`), None if
    there is no entry; CorruptFixtureError if bad."""
    error = None
    for material in read_keys(cache_key_material(case)):
        path = cache_path(case, cache_dir, material)
        if not path.exists():
            continue
        try:
            return _deserialize(case, path, material)
        except CorruptFixtureError as invalid:
            error = error or invalid
    if error is not None:
        raise error
    return None


def make_fixture(case: Case, cache_dir: str | os.PathLike | None = None, *, use_cache: bool = True) -> Fixture:
    """The case's fixture: from the disk cache when a verified entry exists, else generated and
    stored (a bad entry is logged and replaced; an unwritable cache only logs a warning).
    use_cache=False neither reads nor writes the cache."""
    if not use_cache:
        return generate_fixture(case)
    try:
        cached = load_cached_fixture(case, cache_dir)
        if cached is not None:
            return cached
    except CorruptFixtureError as error:
        log.warning("fixture cache entry for case %r is invalid (%s); regenerating", case.name, error)
    fixture = generate_fixture(case)
    material = write_key(cache_key_material(case))
    if material is None:  # foreign code this process cannot record: nothing is stored
        return fixture
    path = cache_path(case, cache_dir, material)
    try:
        atomic_write(path, _serialize(fixture, material))
    except OSError as error:
        log.warning("could not write fixture cache entry %s: %s", path, error)
    return fixture
