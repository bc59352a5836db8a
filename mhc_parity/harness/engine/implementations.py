"""Implementations of the operation under test, built-in and external. All but a whole-layer one run
through the operation's layer, so weights and branch wiring are identical across paths: `reference`
(plain JAX), `interpret` (the Pallas kernels in interpret mode), `mosaic` (Mosaic-compiled, TPU only)
and an external `--impl my_pkg.module:factory`, whose factory returns an object (or a list of them) with
  pre(x, weights: MhcWeights, *, config: MhcConfig) -> (layer_input, context)
  post(layer_output, context, *, config: MhcConfig) -> out
x (B, S, n, C), layer_input (B, S, C), out like x; `context` any pytree, its h_pre, h_post, h_res (if
any) compared as intermediates. A whole-layer implementation has instead
  build(case, *, matmul_precision, mesh) -> forward
  forward(x, weights: dict[field, array], branch_fn) -> (out, intermediates: dict)
(weights by `MhcWeights` field in stored dtypes; gradients are taken through `forward`). Optional
attributes: docs/external-implementations.md, and `kernel_programs(case, mesh) -> {name: (fn, structs)}`,
its kernel programs in Mosaic mode on a mesh of compile-only TPU devices, for the compile rows."""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import pathlib
import sys
import traceback
from collections.abc import Callable
from typing import Any

from mhc_parity.harness.engine.envelope import Envelope
from mhc_parity.harness.engine.operation import OPERATION
from mhc_parity.harness.engine.precision_choices import PrecisionChoice, declared_choices
from mhc_parity.harness.errors import ConfigurationError
from mhc_parity.mhc.common import VARIANTS
from mhc_parity.records.foreign_code import note_foreign_code

# The frames of an import's traceback that are not the user's: this module and importlib.
_MACHINERY = (pathlib.Path(__file__).resolve(), pathlib.Path(importlib.__file__).resolve().parent)


def _is_machinery(path: pathlib.Path) -> bool:
    return path == _MACHINERY[0] or path.is_relative_to(_MACHINERY[1])


class ImplementationError(ConfigurationError):
    """An implementation could not be loaded or is malformed (a configuration error)."""


@dataclasses.dataclass(frozen=True)
class Implementation:
    """One way of computing the layer, and what the harness may expect of it.

    name: stable path prefix (keys baselines). kernel / interpret: the Pallas kernels, in interpret
    mode. needs_backend: the JAX backend required ("tpu"), else `skip`. case_limits: the case's
    expect/expect_reason applies. external: the pre/post object; layer: a whole-layer one's object.
    spec, source_file, module: an external one's `module:factory`, its module's file and name (the
    manifest records them). The other fields are the external object's attributes of the same name.
    """

    name: str
    kernel: bool = False
    interpret: bool = True
    variants: tuple[str, ...] = VARIANTS
    needs_backend: str | None = None
    case_limits: bool = False
    external: Any = None
    spec: str = ""
    source_file: str = ""
    module: str = ""
    layer: Any = None
    envelope: Envelope | None = None
    partner: str = ""
    lower: Callable | None = dataclasses.field(default=None, compare=False)
    kernel_programs: Callable | None = dataclasses.field(default=None, compare=False)
    code_root: str = ""
    precision_choices: tuple[PrecisionChoice, ...] = ()
    source_accommodations: tuple[str, ...] = ()

    def case_skip_reason(self, case) -> str:
        """Why this implementation does not run `case` at all ("" if it does)."""
        if case.variant not in self.variants:
            return f"{self.name} implements {'/'.join(self.variants)}, not the {case.variant} variant"
        if self.kernel and "reference_only" in case.all_tags:
            return "case is tagged reference_only"
        return ""

    def envelope_reason(self, case, mesh: tuple[int, int] | None = None) -> str:
        """Why `case` on `mesh` is outside this implementation's envelope ("" if inside or it has none)."""
        return self.envelope.reason(case, mesh) if self.envelope is not None else ""

    @property
    def runs_on_host(self) -> bool:
        """True if it can run on the host CPU (everything but backend-specific code such as Mosaic)."""
        return self.needs_backend is None

    def partitioning(self, elementwise_branch: bool) -> str:
        """How a token-sharded run is split, for the policy: "manual" where every per-token computation runs
        per shard in code whose blocking does not depend on the shard's token count (the kernels in
        shard_map around an elementwise branch: each token bit-identical to the unsharded run); "auto" where
        XLA partitions some per-token work and may re-block a matmul for fewer rows, reordering its sums."""
        return "manual" if self.kernel and elementwise_branch else "auto"

    def layer_builder(self):
        """What builds its paths' forward (`mhc_parity.harness.engine.operation.LayerBuilder`): a
        whole-layer implementation's own object, else the operation's layer on this
        implementation (the reference, the kernels, or around the external pre/post)."""
        if self.layer is not None:
            return self.layer
        return OPERATION.layer_builder(kernel=self.kernel, interpret=self.interpret, external=self.external)


REFERENCE = Implementation("reference")
INTERPRET = Implementation("interpret", kernel=True, interpret=True, variants=("lite",), case_limits=True)
MOSAIC = Implementation(
    "mosaic", kernel=True, interpret=False, variants=("lite",), needs_backend="tpu", case_limits=True
)
BUILTIN = {impl.name: impl for impl in (REFERENCE, INTERPRET, MOSAIC)}
# `lowering`, `compile` and `oracle` are paths too but not layer implementations: see
# mhc_parity.harness.engine.paths and mhc_parity.harness.engine.compile_rows.
RESERVED_NAMES = set(BUILTIN) | {"lowering", "compile", "oracle"}


def declared_accommodations(obj: Any, label: str) -> tuple[str, ...]:
    """An implementation object's `source_accommodations`: each a line saying how its code was
    read other than as written (absent: none); ImplementationError for anything but strings."""
    raw = getattr(obj, "source_accommodations", ()) or ()
    lines = (raw,) if isinstance(raw, str) else tuple(raw)
    if not all(isinstance(line, str) and line for line in lines):
        raise ImplementationError(f"{label}: `source_accommodations` must be non-empty strings")
    return lines


def accommodation_record(implementations) -> dict:
    """The run's environment record of source accommodations (`source_accommodations`: each
    distinct line, "; "-joined); empty where no implementation declares one."""
    lines = sorted({line for impl in implementations for line in impl.source_accommodations})
    return {"source_accommodations": "; ".join(lines)} if lines else {}


def is_builtin(impl: Implementation) -> bool:
    """True for this project's own `reference`, `interpret`, `mosaic` (not an external one under such a name)."""
    return BUILTIN.get(impl.name) == impl


def load_external(spec: str) -> Implementation:
    """Load `module.path:factory`, whose factory returns one object, and wrap it
    (ImplementationError if it returns several: see `load_implementations`)."""
    loaded = load_implementations(spec)
    if len(loaded) != 1:
        raise ImplementationError(f"--impl {spec!r} gives {len(loaded)} implementations; expected one")
    return loaded[0]


def failure_location(exc: BaseException, module_name: str) -> str:
    """ " at FILE:LINE" where importing `module_name` failed: a syntax error's own place, else the
    last frame of the traceback in the module's file (in the user's code, not the import
    machinery's), else the last frame outside it; "" where no frame is the user's (no such module)."""
    if isinstance(exc, SyntaxError) and exc.filename:
        return f" at {exc.filename}:{exc.lineno}"
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not f.filename.startswith("<")]
    frames = [f for f in frames if not _is_machinery(pathlib.Path(f.filename).resolve())]
    try:
        spec = importlib.util.find_spec(module_name)
    except (ImportError, ValueError):  # its package failed to import too
        spec = None
    origin = spec.origin if spec is not None and spec.origin else None
    own = [f for f in frames if origin and pathlib.Path(f.filename).resolve() == pathlib.Path(origin).resolve()]
    chosen = (own or frames or [None])[-1]
    return "" if chosen is None else f" at {chosen.filename}:{chosen.lineno}"


def load_implementations(spec: str) -> tuple[Implementation, ...]:
    """Load `module.path:factory` and wrap what the factory returns (one object, or a list or tuple of
    them); ImplementationError naming the spec for a bad format, a missing module or attribute, a
    factory that fails or returns nothing, or a malformed object (`wrap_external`)."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ImplementationError(f"--impl {spec!r}: expected 'module.path:factory'")
    note_foreign_code(spec, module_name)  # before the import: it may patch anything
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        where = failure_location(exc, module_name)
        raise ImplementationError(f"--impl {spec!r}: cannot import {module_name!r}{where}: {exc}") from exc
    except Exception as exc:  # a syntax error or an exception raised while the module loads
        raise ImplementationError(
            f"--impl {spec!r}: importing {module_name!r} failed{failure_location(exc, module_name)}: "
            f"{type(exc).__name__}: {exc}"
        ) from exc
    note_foreign_code(spec, module_name, getattr(module, "__file__", None))  # a project name, a file elsewhere?
    factory: Callable[[], Any] | None = getattr(module, attr, None)
    if not callable(factory):
        raise ImplementationError(f"--impl {spec!r}: {module_name} has no callable {attr!r}")
    try:
        obj = factory()
    except Exception as exc:  # the user's code: report, do not crash the CLI
        raise ImplementationError(f"--impl {spec!r}: the factory raised {type(exc).__name__}: {exc}") from exc
    objects = obj if isinstance(obj, (list, tuple)) else (obj,)
    if not objects:
        raise ImplementationError(f"--impl {spec!r}: the factory returned no implementation")
    return tuple(
        wrap_external(
            item,
            spec=spec,
            default_name=f"{module_name}:{attr}" if len(objects) == 1 else "",
            source_file=getattr(module, "__file__", None) or "",
        )
        for item in objects
    )


def wrap_external(obj: Any, *, spec: str = "", default_name: str = "", source_file: str = "") -> Implementation:
    """An `Implementation` around a factory's object, named `obj.name`, else `default_name`;
    ImplementationError for no callable pre/post (nor build), an envelope that is not an `Envelope`, no
    name, a reserved name or unknown variants."""
    label = f"--impl {spec!r}" if spec else f"implementation {type(obj).__name__}"
    kind = type(obj)
    note_foreign_code(spec or f"{kind.__module__}.{kind.__qualname__}", kind.__module__, _module_file(kind.__module__))
    whole_layer = callable(getattr(obj, "build", None))
    for method in () if whole_layer else OPERATION.EXTERNAL_HOOKS:
        if not callable(getattr(obj, method, None)):
            raise ImplementationError(f"{label}: the factory's object has no callable {method}() (nor build())")
    envelope = getattr(obj, "envelope", None)
    if envelope is not None and not isinstance(envelope, Envelope):
        raise ImplementationError(
            f"{label}: `envelope` must be a mhc_parity.harness.engine.envelope.Envelope, got {type(envelope).__name__}"
        )
    lower, programs = getattr(obj, "lower", None), getattr(obj, "kernel_programs", None)
    for attribute, value in (("lower", lower), ("kernel_programs", programs)):
        if value is not None and not callable(value):
            raise ImplementationError(f"{label}: `{attribute}` must be callable")
    name = getattr(obj, "name", None) or default_name
    if not name:
        raise ImplementationError(f"{label}: give the object a `name` attribute (it keys rows and baselines)")
    if name in RESERVED_NAMES or "/" in name:
        raise ImplementationError(f"{label}: name {name!r} is reserved or contains '/'")
    variants = tuple(getattr(obj, "variants", VARIANTS))
    unknown = set(variants) - set(VARIANTS)
    if unknown:
        raise ImplementationError(f"{label}: unknown variants {sorted(unknown)}")
    module_name = spec.partition(":")[0] or type(obj).__module__ or ""
    if not source_file:
        module = importlib.import_module(module_name) if module_name else None
        source_file = getattr(module, "__file__", None) or ""
    return Implementation(
        name=name,
        variants=variants,
        case_limits=bool(getattr(obj, "expects_case_limits", False)),
        external=None if whole_layer else obj,
        spec=spec,
        source_file=source_file,
        module=module_name,
        layer=obj if whole_layer else None,
        envelope=envelope,
        partner=str(getattr(obj, "partner", "") or ""),
        lower=lower,
        kernel_programs=programs,
        code_root=str(getattr(obj, "code_root", "") or ""),
        precision_choices=declared_choices(obj, label),
        source_accommodations=declared_accommodations(obj, label),
    )


def _module_file(name: str) -> str | None:
    module = sys.modules.get(name)
    return getattr(module, "__file__", None)


def as_implementation(item: str | Implementation | Any) -> Implementation:
    """A `module:factory` spec loaded, an `Implementation` as it is, an object with pre/post wrapped.
    ImplementationError for a spec whose factory returns several (`load_externals` takes those)."""
    if isinstance(item, Implementation):
        return item
    if isinstance(item, str):
        return load_external(item)
    return wrap_external(item)


def load_externals(specs) -> tuple[Implementation, ...]:
    """`as_implementation` of each item (a spec, an Implementation, an object with pre/post);
    ImplementationError for a spec given twice or two implementations with one name (their
    rows would share keys)."""
    specs = list(specs)
    repeated = sorted({s for s in specs if isinstance(s, str) and specs.count(s) > 1})
    if repeated:
        raise ImplementationError(f"--impl {repeated[0]!r} is given more than once")
    loaded = tuple(
        impl
        for item in specs
        for impl in (load_implementations(item) if isinstance(item, str) else (as_implementation(item),))
    )
    names: dict[str, str] = {}
    for impl in loaded:
        if impl.name in names:
            raise ImplementationError(
                f"--impl {names[impl.name] or impl.name!r} and --impl {impl.spec or impl.name!r} are both "
                f"named {impl.name!r}; give one a different `name` attribute"
            )
        names[impl.name] = impl.spec
    for impl in loaded:
        if impl.partner and impl.partner not in names:
            raise ImplementationError(
                f"implementation {impl.name!r} names partner {impl.partner!r}, which the run does not include "
                f"(it includes: {', '.join(names)})"
            )
    return loaded
