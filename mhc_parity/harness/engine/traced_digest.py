"""What a traced program computes, as a sha256 of its jaxpr written out by value: the program store's
key of a program foreign code may have shaped, without lowering it (lowering costs about three times
tracing: docs/speed.md). None where the jaxpr holds code or an object known by its address, or while
a lowering-time rule from outside JAX is registered (a JAX closure around foreign code, such as
`mlir.lower_fun(f)`, counts as foreign: docs/jax-notes.md); the store then keys the program by its
lowered module. JAX's printer is not used: it masks a function's address, so two functions of one
name read alike there."""

from __future__ import annotations

import dataclasses
import enum
import functools
import hashlib
import types
from collections.abc import Mapping

import jax
import numpy as np
from jax._src.core import AbstractValue  # no public name for the base of every abstract value
from jax._src.interpreters import mlir
from jax._src.interpreters import partial_eval as pe
from jax._src.pallas import hlo_interpreter  # Pallas' interpret-mode rules (imported with the kernels anyway)
from jax._src.state import discharge
from jax.extend import core

# Packages whose rules are JAX's own: their code is what the JAX and jaxlib versions say it is.
_JAX_PACKAGES = ("jax", "jaxlib")
# Objects that can be called yet are values, written by their repr: a mesh (a context manager
# that names its axes and devices). Any other callable in a jaxpr is code: no digest.
_CALLABLE_VALUES = (jax.sharding.Mesh, jax.sharding.AbstractMesh)


class NotAValue(Exception):
    """A program holds something that is not written out by value (a function, an identity)."""


def traced_digest(traced) -> str | None:
    """sha256 of what `traced` (a `jax.stages.Traced`) computes, or None where its jaxpr holds a
    parameter that is not a value or a rule not JAX's own is registered (module docstring)."""
    if foreign_rules():
        return None
    writer = _Writer()
    try:
        # `_params` and `_consts` are the Traced's private record of the jit call it lowers
        # (its jaxpr, donation, shardings, name) and the constants it closes over.
        writer.value(traced._params)
        writer.value(list(traced._consts))
    except NotAValue:
        return None
    writer.text(f"in {traced.in_tree}\nout {traced.out_tree}")
    writer.text(_configuration())
    return writer.hexdigest()


def _configuration() -> str:
    """Every JAX option's value, in a fixed order (what a lowering rule may read)."""
    return "\n".join(f"{name}={value!r}" for name, value in sorted(jax.config.values.items()))


def _rule_tables() -> tuple[dict, ...]:
    """The tables of rules JAX consults while it lowers a jaxpr, interpret-mode Pallas included."""
    return (
        mlir._lowerings,
        *mlir._platform_specific_lowerings.values(),
        discharge._discharge_rules,
        pe.dce_rules,
        pe.forwarding_rules,
        pe.const_fold_rules,
        hlo_interpreter._eval_jaxpr_hop_rules,
    )


def foreign_rules() -> tuple[str, ...]:
    """The primitives whose lowering-time rule comes from outside JAX ("" where none)."""
    return tuple(sorted({str(p) for table in _rule_tables() for p, rule in list(table.items()) if not _jax_code(rule)}))


def _jax_code(rule) -> bool:
    """Whether `rule` (a function, a partial of one, a rule entry holding one) is JAX's code, and
    so is every function it closes over or binds (`mlir.lower_fun(f)` is a closure of JAX's
    module around `f`: it traces `f` while it lowers)."""
    pending, seen = [rule], set()
    while pending:
        code = pending.pop()
        if id(code) in seen or len(seen) > 256:  # a closure of closures: 256 is far past JAX's
            continue
        seen.add(id(code))
        if isinstance(code, mlir.LoweringRuleEntry):
            pending.append(code.rule)
        elif isinstance(code, functools.partial):
            pending.extend(part for part in (code.func, *code.args, *code.keywords.values()) if callable(part))
        elif isinstance(code, types.MethodType):
            pending.append(code.__func__)
        elif isinstance(code, types.FunctionType):
            if not _in_jax(code.__module__):
                return False
            cells = [cell.cell_contents for cell in code.__closure__ or () if _filled(cell)]
            bound = [*cells, *(code.__defaults__ or ()), *(code.__kwdefaults__ or {}).values()]
            pending.extend(part for part in bound if callable(part) and not isinstance(part, _NOT_CODE))
        elif not _in_jax(getattr(code, "__module__", None) or type(code).__module__):
            return False
    return True


# What a rule may close over and call that is no code of a module: classes (a primitive's type,
# a dtype), builtins and NumPy's ufuncs. Any other callable (a function, a partial, an object
# with `__call__`) is followed.
_NOT_CODE = (type, types.BuiltinFunctionType, np.ufunc)


def _in_jax(module: str | None) -> bool:
    return (module or "").split(".")[0] in _JAX_PACKAGES


def _filled(cell) -> bool:
    try:
        cell.cell_contents  # noqa: B018 - an empty cell (a name not yet bound) raises
    except ValueError:
        return False
    return True


class _Writer:
    """Writes a value into a sha256, by value (`value`); raises `NotAValue` for code or identity."""

    def __init__(self):
        self._parts: list[str] = []  # the tokens, hashed at the end (NUL-separated: no repr holds one)
        self._vars: dict[int, int] = {}
        self._avals: dict[int, str] = {}  # an abstract value's token, by the object's id
        self._keep: list = []  # the objects numbered or remembered by id: alive while their ids are

    def text(self, text: str) -> None:
        self._parts.append(text)

    def hexdigest(self) -> str:
        return hashlib.sha256("\x00".join(self._parts).encode()).hexdigest()

    def var(self, var) -> None:
        if isinstance(var, core.Literal):
            self.text("literal")
            self.value(var.val)
            self.aval(var.aval)
            return
        if isinstance(var, core.DropVar):
            self.text("drop")
            self.aval(var.aval)
            return
        number = self._vars.setdefault(id(var), len(self._vars))
        if number == len(self._vars) - 1:
            self._keep.append(var)
        self.text(f"v{number}")
        self.aval(var.aval)

    def aval(self, aval) -> None:
        # An abstract value is immutable and one object types many variables: written once.
        token = self._avals.get(id(aval))
        if token is None:
            # repr carries shape, dtype and weak type; the sharding, memory space and varying
            # axes are added where held (a set in sorted order: its own order is the hash seed's).
            extra = [
                f"{k}={sorted(map(repr, v)) if isinstance(v, (set, frozenset)) else repr(v)}"
                for k in ("sharding", "memory_space", "vma")
                if (v := getattr(aval, k, None)) is not None
            ]
            token = f"{type(aval).__qualname__}:{aval!r} {' '.join(extra)}"
            if " at 0x" in token:
                raise NotAValue(f"an abstract value known by identity: {token[:200]}")
            self._avals[id(aval)] = token
            self._keep.append(aval)
        self.text(token)

    def effects(self, effects) -> None:
        """An equation's or a jaxpr's effects, in a fixed order. A state effect names the reference it
        reads or writes by input position or by variable (its repr shows the variable's id): the
        variable is written by its number here, "?" and type where it was not numbered yet."""
        written = []
        for effect in effects:
            where = getattr(effect, "input", getattr(effect, "input_index", None))  # JAX 0.12 / 0.10
            if isinstance(where, (core.Var, core.Literal)):
                number = self._vars.get(id(where))
                where = f"v{number}" if number is not None else f"?{where.aval!r}"
                written.append(f"{type(effect).__module__}.{type(effect).__qualname__}({where})")
                continue
            text = repr(effect)
            if " at 0x" in text or "id=" in text:
                raise NotAValue(f"an effect known by identity: {text[:200]}")
            written.append(f"{type(effect).__module__}.{type(effect).__qualname__}:{text}")
        self.text(f"effects {len(written)}")
        for text in sorted(written):
            self.text(text)

    def jaxpr(self, jaxpr) -> None:
        self.text(f"jaxpr {len(jaxpr.constvars)} {len(jaxpr.invars)} {len(jaxpr.eqns)}")
        for var in (*jaxpr.constvars, *jaxpr.invars):
            self.var(var)
        for eqn in jaxpr.eqns:
            self.text(f"eqn {eqn.primitive.name} {type(eqn.primitive).__module__}")
            for name in sorted(eqn.params):
                self.text(name)
                self.value(eqn.params[name])
            self.text(f"in {len(eqn.invars)}")
            for var in eqn.invars:
                self.var(var)
            self.text(f"out {len(eqn.outvars)}")
            for var in eqn.outvars:
                self.var(var)
            self.effects(eqn.effects)
        self.text(f"outs {len(jaxpr.outvars)}")
        for var in jaxpr.outvars:
            self.var(var)
        self.effects(jaxpr.effects)

    def value(self, value) -> None:
        kind = type(value)
        if value is None or kind in (bool, int, float, complex, str, bytes):
            self.text(f"{kind.__name__}:{value!r}")
        elif isinstance(value, core.ClosedJaxpr):
            self.jaxpr(value.jaxpr)
            self.value(list(value.consts))
        elif isinstance(value, core.Jaxpr):
            self.jaxpr(value)
        elif isinstance(value, (core.Var, core.Literal)):
            self.var(value)
        elif isinstance(value, jax.core.Tracer):
            # A closed jaxpr's constant may be a tracer of the trace around it (`run_scoped` in a
            # Pallas kernel closes over the kernel's references): it stands for that variable.
            atom = getattr(value, "val", None)
            if not isinstance(atom, (core.Var, core.Literal)):
                raise NotAValue(f"a tracer: {value!r}")
            self.text("tracer")
            self.var(atom)
        elif isinstance(value, AbstractValue):
            self.aval(value)
        elif isinstance(value, jax.Array) and jax.dtypes.issubdtype(value.dtype, jax.dtypes.prng_key):
            # A typed key (`jax.random.key`) has no NumPy form: its impl, then its bits.
            self.text(f"key {value.dtype} {jax.random.key_impl(value)}")
            self.value(jax.random.key_data(value))
        elif isinstance(value, (np.ndarray, np.generic, jax.Array)):
            array = np.asarray(value)
            self.text(f"array {array.dtype} {array.shape} {hashlib.sha256(array.tobytes()).hexdigest()}")
            if isinstance(value, jax.Array):
                self.text(f"placed {value.sharding!r}")
        elif isinstance(value, (type, np.dtype)):
            self.text(f"type {value!r}")
        elif callable(value) and not isinstance(value, _CALLABLE_VALUES):
            # A function, a partial, an object with `__call__` (a dataclass's fields are not its
            # code): code, whatever its repr says.
            raise NotAValue(f"code: {kind.__module__}.{kind.__qualname__}")
        elif isinstance(value, enum.Enum):
            self.text(f"enum {kind.__module__}.{kind.__qualname__}.{value.name}")
        elif dataclasses.is_dataclass(value) and not isinstance(value, type):
            self.text(f"dataclass {kind.__module__}.{kind.__qualname__}")
            for field in dataclasses.fields(value):
                self.text(field.name)
                self.value(getattr(value, field.name))
        elif isinstance(value, (tuple, list)):
            self.text(f"{kind.__qualname__} {len(value)}")
            for item in value:
                self.value(item)
        elif isinstance(value, Mapping):
            self.text(f"mapping {kind.__qualname__} {len(value)}")
            for key in sorted(value, key=repr):
                self.value(key)
                self.value(value[key])
        elif isinstance(value, (set, frozenset)):
            self.text(f"set {len(value)}")
            for item in sorted(value, key=repr):
                self.value(item)
        else:
            text = repr(value)
            if " at 0x" in text:
                raise NotAValue(f"{kind.__qualname__}: {text[:200]}")
            self.text(f"{kind.__module__}.{kind.__qualname__}:{text}")
