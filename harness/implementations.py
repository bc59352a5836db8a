"""Implementations of the mHC layer the harness can run, built-in and external.

Every implementation runs through the same `ManifoldConstrainedHyperConnections`
layer, so the weights a path sees (`layer.weights()`) and the way the branch is wired
are identical across paths; only the pre/post functions differ:

  reference  the layer with `use_pallas_kernel=False` (plain JAX)
  interpret  the layer with `use_pallas_kernel=True`, Pallas interpret mode
  mosaic     the layer with `use_pallas_kernel=True`, Mosaic-compiled (TPU only)
  external   the layer with `implementation=<object with pre/post>`, loaded by
             import path (`--impl my_pkg.module:factory`)

The external interface: `factory()` returns an object with
  pre(x, weights: MhcWeights, *, config: MhcConfig) -> (layer_input, context)
  post(layer_output, context, *, config: MhcConfig) -> out
with x (B, S, n, C), layer_input (B, S, C), out like x, and `context` any pytree; if it
has attributes h_pre, h_post, h_res they are compared as intermediates. Optional
attributes: `name` (defaults to the factory's module:function), `variants` (tuple of
supported variants, default ("lite", "sinkhorn")), `expects_case_limits` (True if the
case's expect/expect_reason applies to it, as to the kernels; default False).
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any, Callable

from harness.errors import ConfigurationError
from mhc.common import VARIANTS


class ImplementationError(ConfigurationError):
    """An implementation could not be loaded or is malformed (a configuration error)."""


@dataclasses.dataclass(frozen=True)
class Implementation:
    """One way of computing the layer, and what the harness may expect of it.

    name: stable path prefix (keys baselines). kernel: True for the Pallas kernels.
    interpret: Pallas interpret mode (kernels only). variants: variants it implements;
    other cases get a `skip` row. needs_backend: JAX backend required ("tpu"), else
    `skip`. case_limits: the case's expect/expect_reason applies (kernel-like paths).
    external: the object with pre/post passed to the layer as `implementation`.
    spec, source_file: an external one's `module:factory` and its module's file (the
    run manifest records both: the file is code under test).
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

    def case_skip_reason(self, case) -> str:
        """Why this implementation does not run `case` at all ("" if it does)."""
        if case.variant not in self.variants:
            return f"{self.name} implements {'/'.join(self.variants)}, not the {case.variant} variant"
        if self.kernel and "reference_only" in case.all_tags:
            return "case is tagged reference_only"
        return ""

    @property
    def runs_on_host(self) -> bool:
        """True if it can run on the host CPU (everything but backend-specific code such as Mosaic)."""
        return self.needs_backend is None

    def partitioning(self, elementwise_branch: bool) -> str:
        """How a token-sharded run of this implementation is split, for the policy.

        "manual": every per-token computation runs per shard in code whose blocking does
        not depend on the shard's token count (the kernels inside shard_map, around an
        elementwise branch), so each token is bit-identical to the unsharded run.
        "auto": some per-token work (the reference, an external implementation, or a
        branch with matmuls) is partitioned by XLA, which may re-block a matmul for the
        smaller per-shard row count and so reorder its sums.
        """
        return "manual" if self.kernel and elementwise_branch else "auto"

    def layer_options(self) -> dict[str, Any]:
        """Keyword arguments for `ManifoldConstrainedHyperConnections` (besides shapes)."""
        if self.external is not None:
            return {"implementation": self.external}
        return {"use_pallas_kernel": self.kernel}


REFERENCE = Implementation("reference")
INTERPRET = Implementation("interpret", kernel=True, interpret=True, variants=("lite",), case_limits=True)
MOSAIC = Implementation(
    "mosaic", kernel=True, interpret=False, variants=("lite",), needs_backend="tpu", case_limits=True
)
BUILTIN = {impl.name: impl for impl in (REFERENCE, INTERPRET, MOSAIC)}
# `lowering` and `oracle` are paths too but not layer implementations: see harness.paths.
RESERVED_NAMES = set(BUILTIN) | {"lowering", "oracle"}


def load_external(spec: str) -> Implementation:
    """Load `module.path:factory` and wrap what the factory returns.

    Raises ImplementationError naming the spec for a bad format, a missing module or
    attribute, a factory that fails, or an object without callable pre/post.
    """
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ImplementationError(f"--impl {spec!r}: expected 'module.path:factory'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ImplementationError(f"--impl {spec!r}: cannot import {module_name!r}: {exc}") from exc
    except Exception as exc:  # a syntax error or an exception raised while the module loads
        raise ImplementationError(
            f"--impl {spec!r}: importing {module_name!r} failed: {type(exc).__name__}: {exc}"
        ) from exc
    factory: Callable[[], Any] | None = getattr(module, attr, None)
    if not callable(factory):
        raise ImplementationError(f"--impl {spec!r}: {module_name} has no callable {attr!r}")
    try:
        obj = factory()
    except Exception as exc:  # the user's code: report, do not crash the CLI
        raise ImplementationError(f"--impl {spec!r}: the factory raised {type(exc).__name__}: {exc}") from exc
    return wrap_external(obj, spec=spec, default_name=f"{module_name}:{attr}",
                         source_file=getattr(module, "__file__", None) or "")


def wrap_external(obj: Any, *, spec: str = "", default_name: str = "", source_file: str = "") -> Implementation:
    """An `Implementation` around an object with `pre`/`post` (what a factory returns).

    Its name is `obj.name`, else `default_name`; ImplementationError for an object without
    callable pre/post, without a name, with a reserved name or unknown variants.
    """
    label = f"--impl {spec!r}" if spec else f"implementation {type(obj).__name__}"
    for method in ("pre", "post"):
        if not callable(getattr(obj, method, None)):
            raise ImplementationError(f"{label}: the factory's object has no callable {method}()")
    name = getattr(obj, "name", None) or default_name
    if not name:
        raise ImplementationError(f"{label}: give the object a `name` attribute (it keys rows and baselines)")
    if name in RESERVED_NAMES or "/" in name:
        raise ImplementationError(f"{label}: name {name!r} is reserved or contains '/'")
    variants = tuple(getattr(obj, "variants", VARIANTS))
    unknown = set(variants) - set(VARIANTS)
    if unknown:
        raise ImplementationError(f"{label}: unknown variants {sorted(unknown)}")
    if not source_file:
        module = importlib.import_module(type(obj).__module__) if type(obj).__module__ else None
        source_file = getattr(module, "__file__", None) or ""
    return Implementation(
        name=name,
        variants=variants,
        case_limits=bool(getattr(obj, "expects_case_limits", False)),
        external=obj,
        spec=spec,
        source_file=source_file,
    )


def as_implementation(item: "str | Implementation | Any") -> Implementation:
    """A `module:factory` spec loaded, an `Implementation` as it is, an object with pre/post wrapped."""
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
    loaded = tuple(as_implementation(item) for item in specs)
    names: dict[str, str] = {}
    for impl in loaded:
        if impl.name in names:
            raise ImplementationError(
                f"--impl {names[impl.name] or impl.name!r} and --impl {impl.spec or impl.name!r} are both named {impl.name!r}; "
                f"give one a different `name` attribute"
            )
        names[impl.name] = impl.spec
    return loaded
