"""Small, self-contained inputs for the mhc_parity/mhc/ unit tests (the harness uses mhc_parity/cases/)."""

from __future__ import annotations

import contextlib
import csv
import io
import pathlib
import re
import shutil
import sys
import threading
from collections.abc import Callable, Iterable, Iterator

import jax
import jax.numpy as jnp
import numpy as np

from mhc_parity.harness.engine.backend_arithmetic import model_terms, probe_document_table
from mhc_parity.harness.judging.policy_file import load_policy
from mhc_parity.mhc.precision import dot_precision
from mhc_parity.mhc.types import MhcConfig, MhcWeights
from mhc_parity.reports.gate.baseline_file import DIGEST_KEY, ENVELOPE_KEY, IMPLEMENTATIONS_KEY, LOWERING_KEY, sealed
from mhc_parity.reports.gate.drift import GAIN_COLUMNS

# The probe's table as it ran on the lent TPU v5e (JAX 0.10.2, libtpu 0.0.42.1):
# `python bench/probes/tpu_backend_probe.py docs/results/backend-probe-tpu-v5e.json` there.
TPU_V5E_PROBE = pathlib.Path(__file__).resolve().parent.parent / "docs" / "results" / "backend-probe-tpu-v5e.json"


def tpu_v5e_terms() -> dict[str, float]:
    """The rounding model's terms for the TPU v5e's measured primitives (exp, log, tanh, ...): a
    CPU run judged with the chip's widened sensitivities (`oracle_path.backend_terms`)."""
    return model_terms(probe_document_table(TPU_V5E_PROBE))


def random_weights(config: MhcConfig, seed: int = 0, dtype=jnp.float32) -> MhcWeights:
    """Weights with every gate away from saturation and every leaf non-trivial."""
    rng = np.random.default_rng(seed)
    leaves = {}
    for name, shape in config.dims.weight_shapes().items():
        if name == "norm_scale":
            value = 1.0 + 0.1 * rng.normal(size=shape)
        elif name.endswith("_alpha"):
            value = rng.normal(size=shape) / np.sqrt(shape[0])
        elif name.endswith("_scale"):
            value = 0.5 + rng.uniform(size=shape)
        else:
            value = 0.5 * rng.normal(size=shape)
        leaves[name] = jnp.asarray(value, dtype)
    return MhcWeights(**leaves)


def random_activations(shape, seed: int = 1, dtype=jnp.float32) -> jax.Array:
    return jnp.asarray(np.random.default_rng(seed).normal(size=shape), dtype)


def tanh_mlp_branch(params, h):
    """A branch with parameters: tanh(h @ w) + b, matmul in h's dtype, f32 accumulate."""
    w = params["w"].astype(h.dtype)
    acc = jax.lax.dot_general(
        h, w, (((h.ndim - 1,), (0,)), ((), ())), precision=dot_precision(h.dtype), preferred_element_type=jnp.float32
    )
    return (jnp.tanh(acc) + params["b"].astype(jnp.float32)).astype(h.dtype)


def mlp_params(embedding: int, seed: int = 2, dtype=jnp.float32) -> dict:
    rng = np.random.default_rng(seed)
    return {
        "w": jnp.asarray(rng.normal(size=(embedding, embedding)) / np.sqrt(embedding), dtype),
        "b": jnp.asarray(0.1 * rng.normal(size=(embedding,)), dtype),
    }


def max_rel_err(actual, expected) -> float:
    """max|a - e| / max|e|, in float64."""
    a = np.asarray(actual, np.float64)
    e = np.asarray(expected, np.float64)
    return float(np.max(np.abs(a - e)) / np.max(np.abs(e)))


def project_files_run(function: Callable[[], object]) -> set[str]:
    """The project files (relative paths) whose Python code ran while `function()` ran.

    For the tests that check a cache key's declared sources cover the code a computation
    runs (the program store's, the oracle cache's). A function is seen when it is called.
    """
    from mhc_parity.records.project_code import PROJECT_ROOT

    seen = set()

    def profile(frame, event, arg):
        if event == "call":
            seen.add(frame.f_code.co_filename)

    sys.setprofile(profile)
    try:
        function()
    finally:
        sys.setprofile(None)
    root = str(PROJECT_ROOT) + "/"
    return {f[len(root) :] for f in seen if f.startswith(root) and "/.venv/" not in f and "/site-packages/" not in f}


def copy_project(destination: pathlib.Path, subpackages: Iterable[str]) -> pathlib.Path:
    """A copy of the project's sources in `destination` (made if needed): the `mhc_parity`
    namespace's own modules and its named `subpackages` (e.g. "mhc"), without bytecode
    caches; returns `destination`. Run from there, Python imports the copy."""
    from mhc_parity.records.project_code import NAMESPACE, PROJECT_ROOT

    package = pathlib.Path(destination) / NAMESPACE
    package.mkdir(parents=True, exist_ok=True)
    for module in (PROJECT_ROOT / NAMESPACE).glob("*.py"):
        shutil.copy(module, package / module.name)
    for name in subpackages:
        shutil.copytree(PROJECT_ROOT / NAMESPACE / name, package / name, ignore=shutil.ignore_patterns("__pycache__"))
    return pathlib.Path(destination)


def policy_rate() -> float:
    """The false-positive rate the packaged policy states (`[confidence]` of tolerances.toml)."""
    return load_policy().confidence.false_positive_rate


@contextlib.contextmanager
def background_under_way(lock) -> Iterator[threading.Event]:
    """A task holding `lock.background()` (a `mhc_parity.harness.engine.quiet.QuietLock`) from
    before the block until the yielded event is set (at the latest when the block ends)."""
    started, release = threading.Event(), threading.Event()

    def task():
        with lock.background():
            started.set()
            release.wait(60)

    thread = threading.Thread(target=task)
    thread.start()
    started.wait(10)
    try:
        yield release
    finally:
        release.set()
        thread.join(10)


def older_format_copy(source: pathlib.Path, target: pathlib.Path, version: int) -> pathlib.Path:
    """`source` (a format-5 baseline) written as format `version` (3 or 4) wrote it, sealed alike:
    format 4 has no selection fields in its header, format 3 no gain columns either."""
    lines = source.read_text(encoding="utf-8").splitlines(keepends=True)
    header = re.sub(r"format=\d+ ", f"format={version} ", lines[0].split(f" {DIGEST_KEY}=")[0], count=1)
    for key in (IMPLEMENTATIONS_KEY, LOWERING_KEY, ENVELOPE_KEY):
        header = re.sub(rf" {key}=\S+", "", header)
    rows = list(csv.reader(lines[1:]))
    dropped = GAIN_COLUMNS if version < 4 else ()
    keep = [i for i, name in enumerate(rows[0]) if name not in dropped]
    body = io.StringIO()
    csv.writer(body, lineterminator="\n").writerows([[row[i] for i in keep] for row in rows])
    target.write_text(sealed(header, body.getvalue()), encoding="utf-8")
    return target
