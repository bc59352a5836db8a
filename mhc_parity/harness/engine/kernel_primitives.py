"""Whether a Pallas kernel compiled by Mosaic computes each elementwise float32 primitive as XLA does
(`compare_primitives`: bit-identical or how far apart, and each one's error against float64). Where
they agree bit for bit, a Mosaic-vs-XLA comparison shares that primitive's error, so `narrowed_terms`
widens it only by the primitives that differ or were not measured, and by the sigmoid's term always
(a kernel may route its sigmoid otherwise). Without a Mosaic table (off a TPU, or an interpret-mode
one) nothing is narrowed. Importing this module starts no backend."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
from collections.abc import Mapping

import jax
import jax.numpy as jnp
import numpy as np

from mhc_parity.harness.engine.backend_arithmetic import (
    PRIMITIVES,
    SAMPLES,
    SUMMED,
    Primitive,
    _backend_function,
    _operands,
    device_probe_key,
    primitive_error,
)
from mhc_parity.records.artifact_store import ArtifactStore, CorruptEntry
from mhc_parity.records.cache_root import cache_root

# The elementwise primitives: a reduction's or a dot's result depends on how a kernel blocks it,
# which is the kernel's own choice, not the compiler's arithmetic.
KERNEL_PRIMITIVES: tuple[Primitive, ...] = tuple(p for p in PRIMITIVES if p.error != SUMMED)
LANES = 128  # a TPU vector register's lanes: the block's last dimension
BLOCK_ROWS = 512  # 8 sublanes x 64: 256 KiB of float32 a block, well inside VMEM
MOSAIC, INTERPRET = "mosaic", "interpret"
# The model term that is a route's, not one primitive's: never narrowed (module docstring).
ROUTE_TERMS = ("logistic",)


@dataclasses.dataclass(frozen=True)
class PrimitiveAgreement:
    """One primitive computed by XLA and inside a Pallas kernel on the same float32 inputs: `identical`
    (every output bit-identical, NaN where NaN; None where the kernel could not compute it, `error` says
    why), the `differing` outputs, `max_ulps_between` (float32 ulps of the larger), and each one's error
    against float64 on the host (`backend_arithmetic.PrimitiveError`) over `samples` inputs."""

    name: str
    identical: bool | None
    differing: int
    max_ulps_between: float
    xla_max_ulps: float
    kernel_max_ulps: float
    xla_max_relative: float
    kernel_max_relative: float
    samples: int
    error: str = ""


@dataclasses.dataclass(frozen=True)
class KernelPrimitiveTable:
    """The comparison on one backend: key (`kernel_probe_key`), compiler (`MOSAIC`, or `INTERPRET`
    on a host that has no Mosaic) and each primitive's `PrimitiveAgreement`, in `KERNEL_PRIMITIVES` order."""

    key: tuple[tuple[str, str], ...]
    compiler: str
    primitives: tuple[PrimitiveAgreement, ...]

    def differing(self) -> frozenset[str]:
        """The primitives whose kernel outputs are not XLA's bit for bit, or were not measured."""
        measured = {p.name: p for p in self.primitives}
        return frozenset(p.name for p in KERNEL_PRIMITIVES if not (p.name in measured and measured[p.name].identical))

    def to_json(self) -> dict:
        return {
            "key": dict(self.key),
            "compiler": self.compiler,
            "primitives": [dataclasses.asdict(p) for p in self.primitives],
        }

    @classmethod
    def from_json(cls, data: dict) -> KernelPrimitiveTable:
        """The inverse of `to_json`; ValueError naming what is missing or mistyped."""
        try:
            rows = tuple(PrimitiveAgreement(**p) for p in data["primitives"])
            if data["compiler"] not in (MOSAIC, INTERPRET):
                raise ValueError(f"compiler {data['compiler']!r}")
            return cls(tuple(sorted((str(k), str(v)) for k, v in data["key"].items())), data["compiler"], rows)
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"not a kernel primitive table: {exc!r}") from None

    def record(self) -> str:
        """One line for the run's environment record."""
        key = dict(self.key)
        parts = []
        for p in self.primitives:
            if p.identical is None:
                parts.append(f"{p.name} not measured ({p.error[:80]})")
            else:
                same = "identical" if p.identical else f"differs ({p.max_ulps_between:.3g} ulp apart)"
                parts.append(f"{p.name} {same}")
        where = f"{key.get('backend')} ({key.get('device_kind')})"
        return f"float32 primitives in a Pallas kernel ({self.compiler}) against XLA on {where}: " + "; ".join(parts)


def _pallas_program(name: str, arity: int, rows: int, interpret: bool):
    """Primitive `name` of `arity` (rows, 128) float32 operands, inside a Pallas kernel over row blocks."""
    from jax.experimental import pallas as pl  # only a probe needs Pallas: importing it costs

    function = _backend_function(name)

    def kernel(*refs):
        *inputs, out = refs
        out[...] = function(*(ref[...] for ref in inputs))

    spec = pl.BlockSpec((BLOCK_ROWS, LANES), lambda i: (i, 0))
    return jax.jit(
        pl.pallas_call(
            kernel,
            out_shape=jax.ShapeDtypeStruct((rows, LANES), jnp.float32),
            grid=(rows // BLOCK_ROWS,),
            in_specs=[spec] * arity,
            out_specs=spec,
            interpret=interpret,
        )
    )


def _ulps_apart(a: np.ndarray, b: np.ndarray) -> float:
    """The largest |a - b| in float32 ulps of the larger magnitude (NaN against a number: inf)."""
    both_nan = np.isnan(a) & np.isnan(b)
    larger = np.maximum(np.abs(a), np.abs(b)).astype(np.float32)
    spacing = np.spacing(np.maximum(larger, np.finfo(np.float32).tiny)).astype(np.float64)
    apart = np.abs(a.astype(np.float64) - b.astype(np.float64)) / spacing
    apart = np.where(both_nan, 0.0, np.where(np.isnan(apart), np.inf, apart))
    return float(np.max(apart)) if apart.size else 0.0


def compare_primitive(primitive: Primitive, device, samples: int, interpret: bool) -> PrimitiveAgreement:
    """`primitive` on `samples` inputs (a multiple of `BLOCK_ROWS` x 128) by XLA and in a Pallas
    kernel on `device`; a kernel that fails to lower, compile or run is recorded, not raised."""
    rows = samples // LANES
    if rows % BLOCK_ROWS or rows == 0:
        raise ValueError(f"samples must be a positive multiple of {BLOCK_ROWS * LANES}, got {samples}")
    operands = _operands(primitive, samples)
    on_device = [jax.device_put(o.reshape(rows, LANES), device) for o in operands]
    by_xla = np.asarray(jax.jit(_backend_function(primitive.name))(*on_device), np.float32)
    xla = primitive_error(primitive, operands, by_xla)
    try:
        program = _pallas_program(primitive.name, len(operands), rows, interpret)
        by_kernel = np.asarray(program(*on_device), np.float32)
    except Exception as exc:  # noqa: BLE001 - a primitive Mosaic cannot compute is a finding, widened by
        return PrimitiveAgreement(
            primitive.name, None, samples, np.inf, xla.max_ulps, np.nan, xla.max_relative, np.nan, samples,
            error=f"{type(exc).__name__}: {exc}"[:2000],
        )  # fmt: skip
    kernel = primitive_error(primitive, operands, by_kernel)
    same = (by_xla.view(np.uint32) == by_kernel.view(np.uint32)) | (np.isnan(by_xla) & np.isnan(by_kernel))
    return PrimitiveAgreement(
        name=primitive.name,
        identical=bool(same.all()),
        differing=int((~same).sum()),
        max_ulps_between=_ulps_apart(by_xla, by_kernel),
        xla_max_ulps=xla.max_ulps,
        kernel_max_ulps=kernel.max_ulps,
        xla_max_relative=xla.max_relative,
        kernel_max_relative=kernel.max_relative,
        samples=samples,
    )


def _spec_digest(samples: int) -> str:
    """What the comparison measures, digested: a change of a range, the grid or the block is a new table."""
    spec = repr([(p.name, p.ranges) for p in KERNEL_PRIMITIVES] + [samples, BLOCK_ROWS, LANES])
    return hashlib.sha256(spec.encode()).hexdigest()[:16]


def kernel_probe_key(device, samples: int = SAMPLES) -> tuple[tuple[str, str], ...]:
    """What the table depends on: backend, device kind, JAX, jaxlib and libtpu versions, the
    comparison's definition (`backend_arithmetic.device_probe_key`)."""
    return device_probe_key(device, _spec_digest(samples))


def compare_primitives(device=None, samples: int = SAMPLES, interpret: bool | None = None) -> KernelPrimitiveTable:
    """Every `KERNEL_PRIMITIVES` by XLA and in a Pallas kernel on `device` (default: the default
    backend's first). interpret: Pallas interpret mode (default: on any backend but a TPU, which
    alone has Mosaic); an interpret table says nothing of Mosaic."""
    device = jax.devices()[0] if device is None else device
    interpret = device.platform != "tpu" if interpret is None else interpret
    found = tuple(compare_primitive(p, device, samples, interpret) for p in KERNEL_PRIMITIVES)
    return KernelPrimitiveTable(kernel_probe_key(device, samples), INTERPRET if interpret else MOSAIC, found)


STORE_FOLDER = "kernel-primitives"


@functools.cache
def measured_kernel_primitives() -> KernelPrimitiveTable | None:
    """The default backend's Mosaic table, once per process: None off a TPU, or where the comparison fails
    (then nothing is narrowed); else read from the cache folder's checksummed store, or compared now
    (seconds) and stored."""
    device = jax.devices()[0]
    if device.platform != "tpu":
        return None
    key = kernel_probe_key(device)
    store = ArtifactStore(cache_root() / STORE_FOLDER, STORE_FOLDER)
    material = {"key": dict(key), "compiler": MOSAIC}
    stored = store.load(material)
    if stored is not None:
        try:
            table = KernelPrimitiveTable.from_json(json.loads(stored))
            if table.key == key and table.compiler == MOSAIC:
                return table
            raise CorruptEntry("written for another key")
        except (ValueError, CorruptEntry) as error:
            store.reject(material, str(error))
    try:
        table = compare_primitives(device, interpret=False)
    except Exception:  # noqa: BLE001 - no table: every term widens, as before the comparison existed
        return None
    store.save(material, json.dumps(table.to_json(), sort_keys=True).encode())
    return table


def narrowed_terms(terms: Mapping[str, float], table: KernelPrimitiveTable | None) -> dict[str, float]:
    """The backend's model terms (primitive -> relative error) for a comparison of a Mosaic kernel
    path with an XLA path on the same backend: a primitive's term where `table` (a `MOSAIC` one)
    shows the two compilers' outputs differ or did not measure it, and the sigmoid's
    (`ROUTE_TERMS`) always; 0 where they are bit-identical. Without a Mosaic table, `terms` as they are."""
    if table is None or table.compiler != MOSAIC:
        return dict(terms)
    differing = table.differing()
    measured = {p.name for p in KERNEL_PRIMITIVES}
    return {
        name: term if name in ROUTE_TERMS or name not in measured or name in differing else 0.0
        for name, term in terms.items()
    }


def narrowing_note(terms: Mapping[str, float], table: KernelPrimitiveTable | None) -> str:
    """One line for the run's record: how the backend's terms judge Mosaic-vs-XLA comparisons."""
    widened = {name for name, term in terms.items() if term}
    if not widened:
        return ""
    if table is None or table.compiler != MOSAIC:
        return (
            "not measured on this backend whether Mosaic's primitives differ from XLA's: "
            f"Mosaic-vs-XLA comparisons widened by every backend term ({', '.join(sorted(widened))})"
        )
    kept = {name for name, term in narrowed_terms(terms, table).items() if term}
    dropped = sorted(widened - kept)
    return (
        f"Mosaic-vs-XLA comparisons widened by {', '.join(sorted(kept)) or 'no term'} (differing, unmeasured "
        f"or the sigmoid's routes), not by {', '.join(dropped) or '-'} (bit-identical in a Mosaic kernel)"
    )
