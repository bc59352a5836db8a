"""The backend's float32 arithmetic, measured: each primitive the layer and its branches use, on the
device that runs the paths, against float64 on the host (a TPU's transcendentals err far more than
XLA:CPU's, on which the rounding model was calibrated). `model_terms` gives the model a term for each
primitive past `ALLOWED_ULPS` (docs/backend-arithmetic.md). Importing it starts no backend; it needs
only JAX, NumPy and the standard library (`bench/probes/tpu_backend_probe.py` runs it on a bare TPU image)."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import pathlib

import jax
import jax.numpy as jnp
import jaxlib
import numpy as np

from mhc_parity.jax_support import libtpu_version
from mhc_parity.records.artifact_store import header_checksum
from mhc_parity.records.cache_root import cache_root
from mhc_parity.records.foreign_code import foreign_material

log = logging.getLogger(__name__)

# Inputs per primitive: a float32 grid spread evenly over its range (the TPU figures of
# docs/judging.md were measured over 2^20).
SAMPLES = 2**20
# Within this many ulps a primitive is within what the model assumes (XLA:CPU, on which the sweep
# calibrated the bounds, errs at most 6.1 ulps: docs/backend-arithmetic.md); past it, its whole error enters.
ALLOWED_ULPS = 8.0
RELATIVE, ABSOLUTE, SUMMED = "relative", "absolute", "summed"
FLOAT32_ULP = float(np.finfo(np.float32).eps)


@dataclasses.dataclass(frozen=True)
class Primitive:
    """One primitive the probe measures.

    name: the model's name for it (`mhc_parity.mhc.rounding_model.BACKEND_PRIMITIVES` where the model uses
    it); ranges: each operand's (low, high); error: how its error enters a value downstream —
    `RELATIVE` (to its result), `ABSOLUTE` (log: an absolute error of log s is a relative
    error of s, the quantity the log-space Sinkhorn divides by) or `SUMMED` (a reduction or dot:
    relative to the sum of its terms' magnitudes); why: where the layer feeds it these inputs.
    """

    name: str
    ranges: tuple[tuple[float, float], ...]
    error: str
    why: str


PRIMITIVES: tuple[Primitive, ...] = (
    Primitive(
        "exp",
        ((-30.0, 0.0),),
        RELATIVE,
        "softmax and log-space Sinkhorn terms exp(z - max z); below -30 a term is lost in its sum",
    ),
    Primitive(
        "log", ((1.0, 16.0),), ABSOLUTE, "log of a Sinkhorn row or column sum of exp(z - max z): between 1 and n"
    ),
    Primitive("log1p", ((-0.5, 1.0),), RELATIVE, "not used by the layer; measured for a branch that would"),
    Primitive("tanh", ((-10.0, 10.0),), RELATIVE, "the tanh branch on the collapsed branch input"),
    Primitive(
        "logistic",
        ((-16.0, 16.0),),
        RELATIVE,
        "the sigmoid gates and the MLP branch's silu; past 16 a gate is within 1.1e-7 of 0 or 1 and its "
        "relative error moves no leaf (XLA:CPU's is 5110 ulps of outputs near 1e-13 at -30)",
    ),
    Primitive(
        "softplus",
        ((-20.0, 20.0),),
        ABSOLUTE,
        "a sigmoid computed as exp(-softplus(-z)) (`SIGMOID_ROUTES`) errs relatively by softplus's absolute error",
    ),
    Primitive("rsqrt", ((1e-3, 1e3),), RELATIVE, "the RMS statistic rsqrt(mean(x^2) + eps)"),
    Primitive("sqrt", ((1e-3, 1e3),), RELATIVE, "not used by the layer's paths (the oracle's route to rsqrt)"),
    Primitive("divide", ((0.0, 1.0), (1.0, 128.0)), RELATIVE, "the softmax's normalisation e / sum(e)"),
    Primitive("reciprocal", ((1.0, 128.0),), RELATIVE, "1 / x, as a path may normalise"),
    Primitive("reduction", ((-1.0, 1.0),), SUMMED, "float32 sums of 4096 terms (the RMS statistic's mean)"),
    Primitive("dot_highest", ((-1.0, 1.0), (-1.0, 1.0)), SUMMED, "a float32 dot at Precision.HIGHEST"),
    Primitive("dot_default", ((-1.0, 1.0), (-1.0, 1.0)), SUMMED, "a float32 dot at Precision.DEFAULT"),
)
_SUM_TERMS = 4096  # the length of a reduction's and a dot's sums


def _backend_function(name: str):
    """The float32 program of primitive `name` (its operands as arguments: XLA folds constants in
    its own evaluator, not the backend's kernels)."""
    highest, default = jax.lax.Precision.HIGHEST, jax.lax.Precision.DEFAULT
    return {
        "exp": jnp.exp,
        "log": jnp.log,
        "log1p": jnp.log1p,
        "tanh": jnp.tanh,
        "logistic": jax.nn.sigmoid,
        "softplus": jax.nn.softplus,
        "rsqrt": jax.lax.rsqrt,
        "sqrt": jnp.sqrt,
        "divide": jnp.divide,
        "reciprocal": jnp.reciprocal,
        "reduction": lambda x: jnp.sum(x.reshape(-1, _SUM_TERMS), axis=-1),
        "dot_highest": lambda a, b: jnp.matmul(a.reshape(-1, _SUM_TERMS), b.reshape(_SUM_TERMS, -1), precision=highest),
        "dot_default": lambda a, b: jnp.matmul(a.reshape(-1, _SUM_TERMS), b.reshape(_SUM_TERMS, -1), precision=default),
    }[name]


def _float64_reference(name: str, operands: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(exact result, the magnitude its error is measured against) in float64 on the host."""
    x = operands[0]
    if name == "reduction":
        terms = x.reshape(-1, _SUM_TERMS)
        return terms.sum(axis=-1), np.abs(terms).sum(axis=-1)
    if name.startswith("dot_"):
        a, b = x.reshape(-1, _SUM_TERMS), operands[1].reshape(_SUM_TERMS, -1)
        return a @ b, np.abs(a) @ np.abs(b)
    exact = {
        "exp": np.exp,
        "log": np.log,
        "log1p": np.log1p,
        "tanh": np.tanh,
        "logistic": lambda v: 0.5 * (1.0 + np.tanh(0.5 * v)),
        "softplus": lambda v: np.logaddexp(0.0, v),
        "rsqrt": lambda v: 1.0 / np.sqrt(v),
        "sqrt": np.sqrt,
        "divide": lambda v: v / operands[1],
        "reciprocal": lambda v: 1.0 / v,
    }[name](x)
    return exact, np.abs(exact)


def _operands(primitive: Primitive, samples: int) -> list[np.ndarray]:
    """Each operand's float32 inputs: an even grid over its range; a second operand's grid is
    permuted so the pairs cover the plane."""
    found = []
    for index, (low, high) in enumerate(primitive.ranges):
        grid = np.linspace(low, high, samples, dtype=np.float64).astype(np.float32)
        if index:
            grid = grid[np.random.default_rng(index).permutation(samples)]
        found.append(grid)
    return found


@dataclasses.dataclass(frozen=True)
class PrimitiveError:
    """What one primitive errs on the backend in float32 over its range, against float64.

    name, ranges, error: as its `Primitive`; max_ulps: the largest error in ulps of the float32
    result (of the sum of magnitudes for `SUMMED`); max_relative: the largest |error| / |exact|
    (/ sum of magnitudes for `SUMMED`); max_absolute: the largest |error|; rms_relative: the
    root-mean-square relative error; samples: inputs measured.
    """

    name: str
    ranges: tuple[tuple[float, float], ...]
    error: str
    max_ulps: float
    max_relative: float
    max_absolute: float
    rms_relative: float
    samples: int

    @property
    def figure(self) -> float:
        """The relative error a value downstream of it carries at most: `max_absolute` for a log
        (`ABSOLUTE`), `max_relative` otherwise. The maximum, not the RMS: a bound must cover the
        worst input a case feeds it (a max-error bound sees the tail)."""
        return self.max_absolute if self.error == ABSOLUTE else self.max_relative

    def describe(self) -> str:
        span = " x ".join(f"[{low:g}, {high:g}]" for low, high in self.ranges)
        return f"{self.name} on {span}: {self.max_ulps:.3g} ulp, figure {self.figure:.3g} ({self.error})"


def measure_primitive(primitive: Primitive, device, samples: int = SAMPLES) -> PrimitiveError:
    """`primitive` evaluated in float32 on `device` (a JAX device) against float64 on the host."""
    operands = _operands(primitive, samples)
    on_device = [jax.device_put(o, device) for o in operands]
    return primitive_error(primitive, operands, jax.jit(_backend_function(primitive.name))(*on_device))


def primitive_error(primitive: Primitive, operands: list[np.ndarray], result) -> PrimitiveError:
    """What `result` (float32, however computed: `primitive` of `operands`, `_operands`'s grids)
    errs against float64 on the host."""
    samples = operands[0].size
    exact, magnitude = _float64_reference(primitive.name, [o.astype(np.float64) for o in operands])
    result = np.asarray(result, np.float64).reshape(exact.shape)
    error = np.abs(result - exact)
    nonzero = magnitude > 0
    relative = error[nonzero] / magnitude[nonzero]
    spacing = np.spacing(np.maximum(magnitude, np.finfo(np.float32).tiny).astype(np.float32)).astype(np.float64)
    return PrimitiveError(
        name=primitive.name,
        ranges=primitive.ranges,
        error=primitive.error,
        max_ulps=float(np.max(error / spacing)),
        max_relative=float(np.max(relative)),
        max_absolute=float(np.max(error)),
        rms_relative=float(np.sqrt(np.mean(relative**2))),
        samples=samples,
    )


@dataclasses.dataclass(frozen=True)
class BackendArithmetic:
    """The probe's table for one backend: key (backend, device kind, versions; `backend_key`) and
    each primitive's `PrimitiveError`, in `PRIMITIVES` order; source: where this process got it
    (`measured_arithmetic`: the stored table's path, or measured here), not part of the table."""

    key: tuple[tuple[str, str], ...]
    primitives: tuple[PrimitiveError, ...]
    source: str = dataclasses.field(default="", compare=False)

    def get(self, name: str) -> PrimitiveError:
        return next(p for p in self.primitives if p.name == name)

    def to_json(self) -> dict:
        return {"key": dict(self.key), "primitives": [dataclasses.asdict(p) for p in self.primitives]}

    @classmethod
    def from_json(cls, data: dict) -> BackendArithmetic:
        """The inverse of `to_json`; ValueError naming what is missing or mistyped."""
        try:
            rows = [
                PrimitiveError(**{**p, "ranges": tuple(tuple(float(v) for v in r) for r in p["ranges"])})
                for p in data["primitives"]
            ]
            return cls(tuple(sorted((str(k), str(v)) for k, v in data["key"].items())), tuple(rows))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"not a backend arithmetic table: {exc!r}") from None

    def record(self) -> str:
        """The table as one line of the run's environment record."""
        key = dict(self.key)
        where = f"{key.get('backend')} ({key.get('device_kind')})"
        return f"float32 primitives on {where} against float64: " + "; ".join(p.describe() for p in self.primitives)


# The ways a correct path computes a sigmoid: the backend's logistic, (1 + tanh(z/2)) / 2 and
# exp(-softplus(-z)). The model's sigmoid outputs are held to the least accurate route on the backend
# (docs/backend-arithmetic.md: on a v5e the logistic's term alone failed correct implementations).
SIGMOID_ROUTES = ("logistic", "tanh", "softplus")


def model_terms(table: BackendArithmetic) -> dict[str, float]:
    """primitive -> the relative error the rounding model gives its outputs on this backend:
    its `figure` where it errs past `ALLOWED_ULPS`, 0 where it is within what the model assumes;
    the logistic's is the largest of `SIGMOID_ROUTES`'."""
    terms = {p.name: (p.figure if p.max_ulps > ALLOWED_ULPS else 0.0) for p in table.primitives}
    terms["logistic"] = max(terms.get(route, 0.0) for route in SIGMOID_ROUTES)
    return terms


def _spec_digest(samples: int) -> str:
    """What the probe measures, digested: a change of a range or the sample count is a new table."""
    spec = repr([(p.name, p.ranges, p.error) for p in PRIMITIVES] + [samples, _SUM_TERMS, ALLOWED_ULPS])
    return hashlib.sha256(spec.encode()).hexdigest()[:16]


def device_probe_key(device, probe_digest: str) -> tuple[tuple[str, str], ...]:
    """What a probe's table of `device` depends on: the backend kind, device kind, JAX, jaxlib
    and libtpu versions, and the probe's own definition (`probe_digest`)."""
    key = {
        "backend": device.platform,
        "device_kind": device.device_kind,
        "jax": jax.__version__,
        "jaxlib": jaxlib.__version__,
        "libtpu": libtpu_version(),
        "probe": probe_digest,
    }
    return tuple(sorted(key.items()))


def backend_key(device, samples: int = SAMPLES) -> tuple[tuple[str, str], ...]:
    """This probe's `device_probe_key`."""
    return device_probe_key(device, _spec_digest(samples))


def probe_arithmetic(device=None, samples: int = SAMPLES) -> BackendArithmetic:
    """Measure every primitive of `PRIMITIVES` on `device` (default: the default backend's first)."""
    device = jax.devices()[0] if device is None else device
    found = tuple(measure_primitive(p, device, samples) for p in PRIMITIVES)
    return BackendArithmetic(backend_key(device, samples), found)


STORE_FOLDER = "backend-arithmetic"
# The stored table's own checksum (`header_checksum`): a table whose numbers were edited is measured
# again, never trusted (issue 56, docs/backend-arithmetic.md).
CHECKSUM_FIELD = "checksum"


def _store_path(key, foreign: dict) -> pathlib.Path:
    material = {**dict(key), **foreign}
    digest = hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()[:24]
    return cache_root() / STORE_FOLDER / f"{digest}.json"


def stored_document(table: BackendArithmetic, foreign: dict) -> dict:
    """The JSON document a table is stored as: `to_json`, the foreign-code record it is keyed
    by, and `CHECKSUM_FIELD` over all of them."""
    document = {**table.to_json(), **foreign}
    return {**document, CHECKSUM_FIELD: header_checksum(document)}


def read_stored_table(path: pathlib.Path, key) -> tuple[BackendArithmetic | None, str]:
    """(the table stored at `path`, "") if it is whole and of `key`, else (None, why not)."""
    try:
        document = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        return None, f"unreadable ({error})"
    if not isinstance(document, dict) or CHECKSUM_FIELD not in document:
        return None, "no checksum (written before tables were checksummed, or not a table)"
    if document[CHECKSUM_FIELD] != header_checksum(document):
        return None, "checksum mismatch: its contents were changed after it was measured"
    try:
        table = BackendArithmetic.from_json(document)
    except ValueError as error:
        return None, str(error)
    if table.key != key:
        return None, "stale: measured for another backend, version or probe"
    if [p.name for p in table.primitives] != [p.name for p in PRIMITIVES]:
        return None, "stale: another probe's primitives"
    return table, ""


def probe_document_table(path: pathlib.Path) -> BackendArithmetic:
    """The device's table of a probe document (`bench/probes/tpu_backend_probe.py OUT.json`, written on
    an accelerator: its "device" table beside the host's), to judge here as that device judges."""
    return BackendArithmetic.from_json(json.loads(pathlib.Path(path).read_text())["device"])


@functools.cache
def measured_arithmetic() -> BackendArithmetic:
    """The default backend's table, once per process: read from the cache folder where this backend,
    device kind and versions were probed before and the stored table verifies (`read_stored_table`),
    else measured and stored there; `source` says which. A process that loaded foreign code uses only
    tables keyed by that code, and none where its code cannot be recorded."""
    device = jax.devices()[0]
    key = backend_key(device)
    foreign = foreign_material()
    if foreign is None:
        return dataclasses.replace(probe_arithmetic(device), source="measured in this process (not stored)")
    path = _store_path(key, foreign)
    if path.is_file():
        table, problem = read_stored_table(path, key)
        if table is not None:
            return dataclasses.replace(table, source=f"probe table {path}")
        log.warning("backend arithmetic table %s is invalid (%s); measuring again", path, problem)
    table = probe_arithmetic(device)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{id(table)}.tmp")
        tmp.write_text(json.dumps(stored_document(table, foreign), indent=1))
        tmp.replace(path)
    except OSError:
        return dataclasses.replace(table, source="measured in this process (the cache is not writable)")
    return dataclasses.replace(table, source=f"measured in this process, stored as probe table {path}")
