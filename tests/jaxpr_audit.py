"""Walk a jaxpr and every jaxpr nested in it, listing its dot_general equations.

Nested jaxprs sit in equation params: `pjit`/`jit` ("jaxpr"), `shard_map` ("jaxpr"),
`pallas_call` ("jaxpr", the kernel body), `custom_vjp_call` ("call_jaxpr"),
`custom_jvp_call`, `while`/`cond`/`scan` bodies and branches (tuples of jaxprs); a
param value is followed when it is a `Jaxpr` or `ClosedJaxpr`, or a tuple/list of them.

A dot_general's `precision` param is None when the call stated none (and
`jax_default_matmul_precision` is unset): that dot runs at the backend's default.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import jax
from jax.extend.core import ClosedJaxpr, Jaxpr
from jax.extend.source_info_util import summarize

DOT_PRIMITIVES = ("dot_general",)


@dataclasses.dataclass(frozen=True)
class DotSite:
    """One dot equation: where it sits (enclosing primitives/params), its precision and operands."""

    where: str
    precision: object
    operand_dtypes: tuple[str, ...]
    source: str

    def describe(self) -> str:
        operands = " x ".join(self.operand_dtypes)
        return f"{self.where}: dot_general({operands}) precision={self.precision} at {self.source}"


def _nested(value) -> Iterator[Jaxpr]:
    for item in value if isinstance(value, (tuple, list)) else (value,):
        if isinstance(item, ClosedJaxpr):
            yield item.jaxpr
        elif isinstance(item, Jaxpr):
            yield item


def dot_sites(jaxpr, where: str = "") -> Iterator[DotSite]:
    """Every dot_general in `jaxpr` (a Jaxpr or ClosedJaxpr) and in every jaxpr nested in it."""
    if isinstance(jaxpr, ClosedJaxpr):
        jaxpr = jaxpr.jaxpr
    for index, eqn in enumerate(jaxpr.eqns):
        name = eqn.primitive.name
        if name in DOT_PRIMITIVES:
            yield DotSite(
                where=f"{where}/{name}#{index}",
                precision=eqn.params.get("precision"),
                operand_dtypes=tuple(str(v.aval.dtype) for v in eqn.invars),
                source=summarize(eqn.source_info),
            )
        for param, value in eqn.params.items():
            for inner in _nested(value):
                yield from dot_sites(inner, f"{where}/{name}#{index}[{param}]")


def implicit_precision_dots(jaxpr) -> list[DotSite]:
    """The dots of `jaxpr` (nested included) that state no precision."""
    return [site for site in dot_sites(jaxpr) if site.precision is None]


def trace(fn, *args) -> ClosedJaxpr:
    """The jaxpr of `jax.jit(fn)(*args)` (so the walk also crosses a jit boundary).

    Refuses to trace under a global default matmul precision, which would fill in the
    precision of every implicit dot and hide it.
    """
    if jax.config.jax_default_matmul_precision is not None:
        raise RuntimeError("jax_default_matmul_precision is set: implicit dots would look explicit")
    return jax.make_jaxpr(jax.jit(fn))(*args)
