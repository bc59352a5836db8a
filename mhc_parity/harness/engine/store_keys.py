"""The key material the stores share: the environment part of every key (`environment_material`, from
the run's identity record), the digest of the project sources a result is made from
(`traced_sources_digest`), what an implementation adds to its programs' keys
(`implementation_material`), arrays by their bits (`arrays_digest`) and JSON's reading of a value
(`jsonable`)."""

from __future__ import annotations

import functools
import json
import logging
import os
import platform
from collections.abc import Mapping

import jax
import ml_dtypes
import numpy as np

from mhc_parity.cases.spec import LABEL, case_field_names, fields_with
from mhc_parity.harness.engine.implementations import is_builtin
from mhc_parity.harness.engine.run_info import identity_environment
from mhc_parity.harness.env import host_cpu
from mhc_parity.jax_support import TPU_LIBRARY_VARIABLE
from mhc_parity.records.code import closure_digest
from mhc_parity.records.files import digest_arrays
from mhc_parity.records.foreign_code import code_record
from mhc_parity.records.identity import ENVIRONMENT_KEYS, HOST_ENVIRONMENT_KEYS, settings_record

log = logging.getLogger(__name__)

# JAX settings that change what a traced program is (the identity record holds none of them).
JAX_SETTINGS = (
    "jax_enable_x64",
    "jax_default_matmul_precision",
    "jax_numpy_dtype_promotion",
    "jax_threefry_partitionable",
)


def environment_material(*, devices: bool = True) -> dict:
    """The environment part of every store's key. identity: this process's identity record
    (`run_info.identity_environment`: what a manifest records, so an entry is not reused where a
    `--resume` would be refused) — with `devices` False only its host's part
    (`HOST_ENVIRONMENT_KEYS`), for what is computed on the host CPU alone (the oracle's answers,
    whose own process runs without the accelerator). Besides it, what else shapes a stored result
    that the record leaves out: the interpreter, ml_dtypes, the host CPU's model and instruction-set
    flags (`mhc_parity.harness.env.host_cpu`) and `JAX_SETTINGS`."""
    keys = ENVIRONMENT_KEYS if devices else HOST_ENVIRONMENT_KEYS
    settings = tuple(settings_record().items())
    return {
        "identity": dict(_identity(keys, settings, os.environ.get(TPU_LIBRARY_VARIABLE, ""))),
        "python": platform.python_version(),
        "ml_dtypes": ml_dtypes.__version__,
        "host_cpu": host_cpu(),
        "jax_settings": {name: str(getattr(jax.config, name)) for name in JAX_SETTINGS},
    }


@functools.lru_cache(maxsize=8)
def _identity(keys: tuple[str, ...], settings: tuple, libtpu_library: str) -> dict:
    """`identity_environment(keys)`, once per process and the compiler settings and libtpu library it
    is read under (it reads libtpu's package metadata: a millisecond a key otherwise)."""
    return identity_environment(keys)


@functools.cache
def traced_sources_digest(entries: tuple[str, ...], exclude: tuple[str, ...]) -> str | None:
    """`mhc_parity.records.code.closure_digest` of `entries` less `exclude`, or None — with one warning
    — when the sources are not on disk (e.g. a zipped install): then nothing is stored.
    Cached per process: the run's code does not change under it (and the manifest records
    what it was)."""
    try:
        return closure_digest(entries, exclude)
    except FileNotFoundError as error:
        log.warning("compiled programs and TPU lowerings are not stored: %s", error)
        return None


def jsonable(value):
    """`value` as it reads back from JSON, a key's material: NumPy scalars as numbers, NaN kept,
    anything else JSON cannot hold as its str."""
    return json.loads(json.dumps(value, default=_plain))


def _plain(value):
    if isinstance(value, np.generic):
        return value.item()
    return str(value)


def arrays_digest(arrays: Mapping[str, np.ndarray]) -> str:
    """`digest_arrays` of a mapping of arrays (a path's leaves, a fit's errors) in the order of their names."""
    return digest_arrays({name: np.asarray(arrays[name]) for name in sorted(arrays)})


def implementation_material(impl) -> dict | None:
    """What a path's implementation adds to its program's key: for a built-in one its kernel
    switches (its code is the sources'); for an external one also its name, spec, object type
    and the `mhc_parity.records.foreign_code.CodeRecord` digest of its module (the files it can
    run: an `--impl` of a project module is not foreign code, yet its file is no program
    source). None where that module's code cannot be read."""
    described = {"kernel": impl.kernel, "interpret": impl.interpret}
    if is_builtin(impl):
        return described
    record = code_record(impl.module, impl.source_file or None) if impl.module else None
    if record is None:
        return None
    obj = impl.layer if impl.layer is not None else impl.external
    kind = type(obj)
    return {
        **described,
        "name": impl.name,
        "spec": impl.spec,
        "type": f"{kind.__module__}.{kind.__qualname__}",
        "code": record.digest(),
    }


def implementation_case_material(impl, case) -> dict | None:
    """What an implementation's own kernel programs of `case` are built from: what it is
    (`implementation_material`) and every field of the case but its labels; None where its
    code cannot be read (then nothing is stored)."""
    implementation = implementation_material(impl)
    if implementation is None:
        return None
    labels = fields_with(LABEL)
    return {
        "implementation": implementation,
        "case": {n: getattr(case, n) for n in case_field_names() if n not in labels},
    }
