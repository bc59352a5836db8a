"""`Case`: the frozen, hashable specification of one parity run (everything that determines
its numbers, and whether the kernels should accept it). Names key baselines, so a name is never
reused for a different spec.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from mhc_parity.mhc.common import MhcDims
from mhc_parity.mhc.types import MhcConfig
from mhc_parity.records import dtypes

ACTIVATION_DTYPES = ("float32", "bfloat16")
WEIGHT_DTYPES = ("float32", "bfloat16")
VARIANTS = ("lite", "sinkhorn")  # mirrors mhc_parity.mhc.common.VARIANTS (checked by the tests)
BRANCH_NAMES = ("identity", "tanh", "mlp")  # mirrors mhc_parity.cases.branches.BRANCHES
INIT_FAMILY_NAMES = (  # mirrors mhc_parity.cases.init_families.INIT_FAMILIES
    "default",
    "saturated_gates",
    "peaky_permutation",
    "near_zero_rms",
    "large_magnitude",
    "bf16_inexact_gates",
    "mixed_signs",
)
EXPECTATIONS = ("supported", "unsupported")
MESH_AXES = ("data", "fsdp")
# mirrors mhc_parity.mhc.precision.MATMUL_PRECISIONS (checked by the tests); the first is the default
MATMUL_PRECISIONS = ("highest", "default")

# Activation dtype spellings a user may type (CLI, TOML, select()) -> canonical name.
DTYPE_ALIASES = {
    spelling: name
    for spelling, name in ({n: n for n in dtypes.FLOAT_DTYPES} | dtypes.ALIASES).items()
    if name in ACTIVATION_DTYPES
}
_DTYPE_SHORT = {"float32": "f32", "bfloat16": "bf16"}
_WEIGHT_SHORT = {"float32": "w32", "bfloat16": "wbf16"}

# Explicit tags with a meaning the harness relies on.
REFERENCE_ONLY_TAG = "reference_only"  # run on the reference and oracle paths only
MULTI_BLOCK_TAG = "multi_block"  # block sizes set so the kernels run several grid steps
TPU_TAG = "tpu"  # only worth running with compiled (Mosaic) kernels

# What each `Case` field decides (its metadata's `ROLES`): the fixture's and a compiled
# program's keys derive from these marks, so a new field must be marked (tests/test_cases.py).
DATA = "data"  # the fixture's arrays, bit for bit
PROGRAM = "program"  # the traced program (shapes, dtypes, kernel block sizes): `mhc_parity.harness.engine.paths`
PLACEMENT = "placement"  # where and how precisely a path runs: its mesh (in the path's name), its matmul precision
LABEL = "label"  # names and expectations: neither data nor program
ROLES = "roles"


def _marked(*roles: str, **field_options):
    return dataclasses.field(metadata={ROLES: frozenset(roles)}, **field_options)


# Matched whole (`fullmatch`: `$` would also match before a trailing newline).
_NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+=-]*")
_TAG_PATTERN = re.compile(r"[A-Za-z0-9_.:-]+")
# Names key baselines, rows and file names; the catalogue's longest is under 80 characters.
MAX_NAME_LENGTH = 200
_MAX_SEED = 2**63 - 1


def mesh_label(mesh: tuple[int, ...] | None) -> str:
    """ "" for no mesh, else e.g. ``data=2,fsdp=4`` (row schema and path names)."""
    return "" if mesh is None else ",".join(f"{axis}={size}" for axis, size in zip(MESH_AXES, mesh))


class CaseSpecError(ValueError):
    """A case field has an invalid value; the message names the case and the field."""


def normalize_dtype(value: str, *, field: str = "dtype", case: str | None = None) -> str:
    """Canonical dtype name ("float32" | "bfloat16") for a name or alias like "bf16";
    CaseSpecError naming `field` (and `case`) for anything else."""
    if isinstance(value, str) and value.strip().lower() in DTYPE_ALIASES:
        return DTYPE_ALIASES[value.strip().lower()]
    where = f"case {case!r}: field {field!r}" if case is not None else f"{field}"
    aliases = sorted(k for k in DTYPE_ALIASES if k not in ACTIVATION_DTYPES)
    raise CaseSpecError(f"{where} must be one of {ACTIVATION_DTYPES} (or an alias {aliases}), got {value!r}")


def standard_name(
    *,
    variant: str,
    streams: int,
    embedding: int,
    batch: int,
    sequence: int,
    dtype: str,
    weight_dtype: str,
    branch: str,
    init: str,
    mesh: tuple[int, int] | None = None,
    block_tokens: int | None = None,
    block_tokens_bwd: int | None = None,
    block_features: int | None = None,
    seed: int = 0,
    matmul_precision: str = MATMUL_PRECISIONS[0],
    suffix: str = "",
) -> str:
    """The catalogue's descriptive name, e.g. ``lite-n4-c256-b2s64-bf16-w32-mlp-default``, plus
    ``-m2x4``, ``-bt32``, ``-btb32``, ``-bf128``, ``-s7``, ``-matmul_default``, suffix where set."""
    parts = [
        variant,
        f"n{streams}",
        f"c{embedding}",
        f"b{batch}s{sequence}",
        _DTYPE_SHORT.get(dtype, dtype),
        _WEIGHT_SHORT.get(weight_dtype, weight_dtype),
        branch,
        init,
    ]
    if mesh is not None:
        parts.append(f"m{mesh[0]}x{mesh[1]}")
    if block_tokens is not None:
        parts.append(f"bt{block_tokens}")
    if block_tokens_bwd is not None:
        parts.append(f"btb{block_tokens_bwd}")
    if block_features is not None:
        parts.append(f"bf{block_features}")
    if seed:
        parts.append(f"s{seed}")
    if matmul_precision != MATMUL_PRECISIONS[0]:
        parts.append(f"matmul_{matmul_precision}")
    if suffix:
        parts.append(suffix)
    return "-".join(parts)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclasses.dataclass(frozen=True)
class Case:
    """One parity case; frozen and hashable (a dict key or a `jit` static argument).

    batch, sequence, streams, embedding: x is (B, S, n, C). dtype: activation dtype (x,
    cotangent, output); weight_dtype: every weight and branch parameter. mesh: None or (data,
    fsdp) device counts for the token-sharded paths. block_*: kernel block sizes, None = default.
    matmul_precision: "highest" or "default" (`mhc_parity.mhc.precision`). expect_reason: for
    expect="unsupported", a substring of the expected UnsupportedInputError; "" otherwise.
    """

    name: str = _marked(LABEL)
    batch: int = _marked(DATA, PROGRAM)
    sequence: int = _marked(DATA, PROGRAM)
    streams: int = _marked(DATA, PROGRAM)
    embedding: int = _marked(DATA, PROGRAM)
    dtype: str = _marked(DATA, PROGRAM, default="float32")
    weight_dtype: str = _marked(DATA, PROGRAM, default="float32")
    variant: str = _marked(DATA, PROGRAM, default="lite")
    branch: str = _marked(DATA, PROGRAM, default="identity")
    init: str = _marked(DATA, default="default")
    seed: int = _marked(DATA, default=0)
    mesh: tuple[int, int] | None = _marked(PLACEMENT, default=None)
    block_tokens: int | None = _marked(PROGRAM, default=None)
    block_tokens_bwd: int | None = _marked(PROGRAM, default=None)
    block_features: int | None = _marked(PROGRAM, default=None)
    matmul_precision: str = _marked(PLACEMENT, default=MATMUL_PRECISIONS[0])
    tags: tuple[str, ...] = _marked(LABEL, default=())
    expect: str = _marked(LABEL, default="supported")
    expect_reason: str = _marked(LABEL, default="")

    def __post_init__(self):
        if isinstance(self.mesh, list):
            object.__setattr__(self, "mesh", tuple(self.mesh))
        if isinstance(self.tags, list):
            object.__setattr__(self, "tags", tuple(self.tags))
        for problem in self._problems():
            raise CaseSpecError(problem)

    # -- validation ---------------------------------------------------------------

    def _problems(self):
        label = self.name if isinstance(self.name, str) else repr(self.name)

        def bad(field: str, requirement: str) -> str:
            return f"case {label!r}: field {field!r} {requirement}, got {getattr(self, field)!r}"

        if not isinstance(self.name, str) or not _NAME_PATTERN.fullmatch(self.name):
            yield bad(
                "name", "must be a non-empty string of letters, digits and _ . + = - (starting with a letter or digit)"
            )
        elif len(self.name) > MAX_NAME_LENGTH:
            label = f"{self.name[:40]}...({len(self.name)} characters)"
            yield f"case {label!r}: field 'name' must be at most {MAX_NAME_LENGTH} characters"
        for field in ("batch", "sequence", "streams", "embedding"):
            value = getattr(self, field)
            if not _is_int(value) or value < 1:
                yield bad(field, "must be a positive integer")
        if self.dtype not in ACTIVATION_DTYPES:
            yield bad("dtype", f"must be one of {ACTIVATION_DTYPES}")
        if self.weight_dtype not in WEIGHT_DTYPES:
            yield bad("weight_dtype", f"must be one of {WEIGHT_DTYPES}")
        if self.variant not in VARIANTS:
            yield bad("variant", f"must be one of {VARIANTS}")
        if self.branch not in BRANCH_NAMES:
            yield bad("branch", f"must be one of {BRANCH_NAMES}")
        if self.init not in INIT_FAMILY_NAMES:
            yield bad("init", f"must be one of {INIT_FAMILY_NAMES}")
        if not _is_int(self.seed) or not 0 <= self.seed <= _MAX_SEED:
            yield bad("seed", f"must be an integer in [0, {_MAX_SEED}]")
        if self.mesh is not None and not (
            isinstance(self.mesh, tuple)
            and len(self.mesh) == len(MESH_AXES)
            and all(_is_int(v) and v >= 1 for v in self.mesh)
        ):
            yield bad("mesh", "must be None or a (data, fsdp) pair of positive integers")
        for field in ("block_tokens", "block_tokens_bwd", "block_features"):
            value = getattr(self, field)
            if value is not None and (not _is_int(value) or value < 1):
                yield bad(field, "must be None (kernel default) or a positive integer")
        if self.matmul_precision not in MATMUL_PRECISIONS:
            yield bad("matmul_precision", f"must be one of {MATMUL_PRECISIONS}")
        if not isinstance(self.tags, tuple) or not all(
            isinstance(t, str) and _TAG_PATTERN.fullmatch(t) for t in self.tags
        ):
            yield bad("tags", "must be a tuple of non-empty strings without spaces or commas")
        elif len(set(self.tags)) != len(self.tags):
            yield bad("tags", "must not repeat a tag")
        if self.expect not in EXPECTATIONS:
            yield bad("expect", f"must be one of {EXPECTATIONS}")
        if not isinstance(self.expect_reason, str):
            yield bad("expect_reason", "must be a string")
        elif self.expect == "unsupported" and not self.expect_reason.strip():
            yield bad("expect_reason", "must name (a substring of) the expected error for an expect='unsupported' case")
        elif self.expect == "supported" and self.expect_reason:
            yield bad("expect_reason", "must be empty for an expect='supported' case")

    # -- derived properties -------------------------------------------------------

    @property
    def tokens(self) -> int:
        """batch · sequence, the token count the kernels tile."""
        return self.batch * self.sequence

    @property
    def shape(self) -> tuple[int, int, int, int]:
        """(B, S, n, C): the shape of x, the layer output and the cotangent."""
        return (self.batch, self.sequence, self.streams, self.embedding)

    @property
    def shape_name(self) -> str:
        """The shape as the row schema writes it, e.g. ``2x64x4x128``."""
        return "x".join(str(d) for d in self.shape)

    @property
    def is_sharded(self) -> bool:
        return self.mesh is not None

    @property
    def mesh_name(self) -> str:
        """ "" when unsharded, else e.g. ``data=2,fsdp=4``."""
        return mesh_label(self.mesh)

    @property
    def mesh_devices(self) -> int:
        """Devices the sharded paths need (1 when unsharded)."""
        if self.mesh is None:
            return 1
        return self.mesh[0] * self.mesh[1]

    @property
    def expects_unsupported(self) -> bool:
        return self.expect == "unsupported"

    @property
    def block_sizes(self) -> dict[str, int]:
        """The explicitly set kernel block sizes, by field name (unset ones omitted)."""
        fields = ("block_tokens", "block_tokens_bwd", "block_features")
        return {f: getattr(self, f) for f in fields if getattr(self, f) is not None}

    @property
    def all_tags(self) -> tuple[str, ...]:
        """Explicit tags, then those derived from the fields (what `select(tags=...)` matches)."""
        derived = [
            _DTYPE_SHORT[self.dtype],
            _WEIGHT_SHORT[self.weight_dtype],
            self.variant,
            self.branch,
            self.init,
            "sharded" if self.is_sharded else "unsharded",
        ]
        if self.matmul_precision != MATMUL_PRECISIONS[0]:
            derived.append(f"matmul_{self.matmul_precision}")
        if self.expects_unsupported:
            derived.append("unsupported")
        return tuple(dict.fromkeys(self.tags + tuple(derived)))

    def data_fields(self) -> dict[str, Any]:
        """The fields that determine the fixture's arrays (`DATA_FIELDS`), by name."""
        return {f: getattr(self, f) for f in DATA_FIELDS}

    def program_fields(self) -> tuple:
        """The values of the fields that shape the traced program (`PROGRAM_FIELDS`), in order."""
        return tuple(getattr(self, f) for f in PROGRAM_FIELDS)

    @property
    def dims(self):
        """`MhcDims`, not validated: also built for expected-unsupported shapes."""
        return MhcDims(self.streams, self.embedding, self.variant)

    def mhc_config(self):
        """`MhcConfig` for the case; raises UnsupportedInputError for invalid dims."""
        return MhcConfig(
            streams=self.streams,
            embedding=self.embedding,
            variant=self.variant,
            matmul_precision=self.matmul_precision,
        )

    def replace(self, **changes) -> Case:
        """A copy with `changes` applied (validated again)."""
        return dataclasses.replace(self, **changes)

    def describe(self) -> dict[str, str]:
        """One display row of `mhc-parity cases list`."""
        blocks = ",".join(f"{k.removeprefix('block_')}={v}" for k, v in self.block_sizes.items())
        expect = self.expect if not self.expects_unsupported else f"unsupported: {self.expect_reason}"
        return {
            "name": self.name,
            "shape": self.shape_name,
            "tokens": str(self.tokens),
            "dtype": self.dtype,
            "weights": self.weight_dtype,
            "variant": self.variant,
            "branch": self.branch,
            "init": self.init,
            "seed": str(self.seed),
            "mesh": self.mesh_name or "-",
            "blocks": blocks or "-",
            "precision": self.matmul_precision,
            "tags": " ".join(self.tags) or "-",
            "expect": expect,
        }


def case_field_names() -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(Case))


def fields_with(role: str) -> tuple[str, ...]:
    """The `Case` fields marked with `role`, in declaration order."""
    return tuple(f.name for f in dataclasses.fields(Case) if role in f.metadata.get(ROLES, ()))


# The fields that determine the fixture's arrays: a sharded case and its unsharded twin see
# the same data, and so do the precisions of one case.
DATA_FIELDS = fields_with(DATA)
# The fields that shape a compiled program; the effective matmul precision is added where
# a path is placed (`mhc_parity.harness.engine.paths`).
PROGRAM_FIELDS = fields_with(PROGRAM)
