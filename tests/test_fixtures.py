"""mhc_parity.cases.fixtures: bit-identical fixtures across processes, workers and the cache; cache safety."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import ml_dtypes
import numpy as np
import pytest

from mhc_parity.cases import fixtures
from mhc_parity.cases.fixtures import (
    cache_path,
    default_cache_dir,
    generate_fixture,
    make_fixture,
)
from mhc_parity.cases.init_families import generate_masters
from mhc_parity.cases.spec import Case
from mhc_parity.mhc.types import WEIGHT_FIELDS, MhcWeights
from mhc_parity.records.cache_root import CACHE_ENV_VAR
from mhc_parity.records.project_code import PROJECT_ROOT

CASE = Case(name="fx", batch=2, sequence=64, streams=4, embedding=128, dtype="bfloat16", branch="mlp")
SINKHORN = Case(
    name="fx-sk",
    batch=1,
    sequence=64,
    streams=3,
    embedding=128,
    variant="sinkhorn",
    weight_dtype="bfloat16",
    init="peaky_permutation",
)


def _subprocess_digests(cases: list[Case], env_extra: dict | None = None) -> list[str]:
    """Digests computed in a fresh interpreter (no cache)."""
    code = textwrap.dedent(
        """
        import json, sys
        from mhc_parity.cases.fixtures import generate_fixture
        from mhc_parity.cases.spec import Case
        specs = json.loads(sys.argv[1])
        print(json.dumps([generate_fixture(Case(**s)).digest() for s in specs]))
        """
    )
    specs = json.dumps([{**c.__dict__, "mesh": c.mesh, "tags": list(c.tags)} for c in cases])
    env = {**os.environ, **(env_extra or {})}
    result = subprocess.run(
        [sys.executable, "-c", code, specs], cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_layout_dtypes_and_shapes_follow_the_case():
    fixture = generate_fixture(CASE)
    assert fixture.x.dtype == np.dtype(ml_dtypes.bfloat16) and fixture.x.shape == CASE.shape
    assert fixture.cotangent.dtype == fixture.x.dtype and fixture.cotangent.shape == CASE.shape
    assert tuple(fixture.weights) == WEIGHT_FIELDS
    for name, shape in CASE.dims.weight_shapes().items():
        assert fixture.weights[name].shape == shape and fixture.weights[name].dtype == np.float32
    assert set(fixture.branch_params) == {"w_in", "b_in", "w_out", "b_out"}
    assert all(p.dtype == np.float32 for p in fixture.branch_params.values())
    assert not fixture.x.flags.writeable  # shared fixtures cannot be mutated
    weights = fixture.mhc_weights()
    assert isinstance(weights, MhcWeights) and weights.res_bias.shape == (24,)
    sinkhorn = generate_fixture(SINKHORN)
    assert sinkhorn.weights["res_bias"].shape == (3, 3)
    assert all(v.dtype == np.dtype(ml_dtypes.bfloat16) for v in sinkhorn.weights.values())
    assert sinkhorn.branch_params == {}
    assert sinkhorn.as_float64().x.dtype == np.float64


def test_arrays_are_the_masters_rounded_to_the_case_dtypes():
    """bf16 and f32 variants of one case round the same float64 masters."""
    masters = generate_masters(CASE)
    f32 = generate_fixture(CASE.replace(dtype="float32"))
    bf16 = generate_fixture(CASE)
    np.testing.assert_array_equal(f32.x, masters.x.astype(np.float32))
    np.testing.assert_array_equal(bf16.x, f32.x.astype(ml_dtypes.bfloat16))
    wbf16 = generate_fixture(CASE.replace(weight_dtype="bfloat16"))
    np.testing.assert_array_equal(wbf16.weights["pre_alpha"], bf16.weights["pre_alpha"].astype(ml_dtypes.bfloat16))


def test_fixture_is_independent_of_name_mesh_blocks_and_tags():
    twin = CASE.replace(name="other", mesh=(2, 4), block_tokens=32, tags=("z",))
    assert generate_fixture(twin).digest() == generate_fixture(CASE).digest()
    assert fixtures.cache_key(twin) == fixtures.cache_key(CASE)


@pytest.mark.parametrize(
    "change",
    [
        dict(seed=1),
        dict(seed=2),
        dict(init="mixed_signs"),
        dict(branch="identity"),
        dict(dtype="float32"),
        dict(sequence=32),
        dict(streams=3),
    ],
)
def test_distinct_data_fields_give_distinct_data(change):
    base, other = generate_fixture(CASE), generate_fixture(CASE.replace(**change))
    assert base.digest() != other.digest()
    assert fixtures.cache_key(base.case) != fixtures.cache_key(other.case)
    if "seed" in change:  # every array changes, not just one
        for role, array in base.arrays().items():
            assert not np.array_equal(array, other.arrays()[role]), role


@pytest.mark.slow
def test_bit_identical_across_processes_and_with_or_without_cache(tmp_path):
    cases = [CASE, SINKHORN, CASE.replace(init="large_magnitude", dtype="float32")]
    here = [generate_fixture(c).digest() for c in cases]
    assert _subprocess_digests(cases) == here
    cold = [make_fixture(c, cache_dir=tmp_path).digest() for c in cases]  # written to the cache
    assert all(cache_path(c, tmp_path).exists() for c in cases)
    warm = [fixtures.load_cached_fixture(c, tmp_path).digest() for c in cases]  # read back
    uncached = [make_fixture(c, use_cache=False).digest() for c in cases]
    assert cold == warm == uncached == here
    loaded = fixtures.load_cached_fixture(CASE, tmp_path)
    for role, array in generate_fixture(CASE).arrays().items():
        assert loaded.arrays()[role].dtype == array.dtype
        np.testing.assert_array_equal(loaded.arrays()[role].view(np.uint8), array.view(np.uint8))


@pytest.mark.slow
def test_bit_identical_across_xdist_workers_sharing_one_cache(tmp_path):
    """Two pytest-xdist workers make the same fixtures concurrently through one cache."""
    pytest.importorskip("xdist")
    cache, out = tmp_path / "cache", tmp_path / "out"
    out.mkdir()
    env = {**os.environ, "FIXTURE_PROBE_CACHE": str(cache), "FIXTURE_PROBE_OUT": str(out)}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-n",
            "2",
            "--dist",
            "each",
            "tests/fixture_digest_probe.py",
        ],
        cwd=PROJECT_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    records = {p.name: p.read_text() for p in out.iterdir()}
    sys.path.insert(0, str(PROJECT_ROOT / "tests"))
    try:
        from fixture_digest_probe import PROBE_CASES
    finally:
        sys.path.pop(0)
    for case in PROBE_CASES:
        seen = {
            worker: d
            for worker, d in ((k.split("--")[0], v) for k, v in records.items() if k.endswith("--" + case.name))
        }
        assert set(seen) == {"gw0", "gw1"}, records
        assert set(seen.values()) == {generate_fixture(case).digest()}
        assert fixtures.load_cached_fixture(case, cache).digest() == seen["gw0"]
    assert not list(cache.glob("*.tmp"))  # no temporary files left behind


def _corrupt_truncate(path):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _corrupt_flip_array_byte(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 3] ^= 0xFF  # inside an array payload (zip CRC or sha256 catches it)
    path.write_bytes(bytes(data))


def _corrupt_replace_array(path):
    """A well-formed archive whose x was swapped for other data of the right shape."""
    with np.load(path) as archive:
        payload = {k: archive[k] for k in archive.files}
    payload["x"] = payload["x"][::-1].copy()
    np.savez(path, **payload)


def _corrupt_stale_header(path):
    with np.load(path) as archive:
        payload = {k: archive[k] for k in archive.files}
    header = json.loads(bytes(payload["__header__"]).decode())
    header["key"]["generator"] = "0" * 64
    payload["__header__"] = np.frombuffer(json.dumps(header).encode(), np.uint8)
    np.savez(path, **payload)


def _corrupt_wrong_shape(path):
    with np.load(path) as archive:
        payload = {k: archive[k] for k in archive.files}
    payload["weights.pre_bias"] = payload["weights.pre_bias"][:-1]
    np.savez(path, **payload)


@pytest.mark.parametrize(
    "corrupt",
    [
        _corrupt_truncate,
        _corrupt_flip_array_byte,
        _corrupt_replace_array,
        _corrupt_stale_header,
        _corrupt_wrong_shape,
        lambda p: p.write_bytes(b""),
        lambda p: p.write_bytes(b"not a zip file"),
    ],
    ids=["truncated", "flipped-byte", "swapped-array", "stale-header", "wrong-shape", "empty", "garbage"],
)
def test_corrupt_cache_entries_are_detected_and_regenerated(tmp_path, corrupt, caplog):
    expected = generate_fixture(CASE).digest()
    make_fixture(CASE, cache_dir=tmp_path)
    path = cache_path(CASE, tmp_path)
    corrupt(path)
    with pytest.raises(fixtures.CorruptFixtureError):
        fixtures.load_cached_fixture(CASE, tmp_path)
    with caplog.at_level("WARNING", logger="mhc_parity.cases.fixtures"):
        assert make_fixture(CASE, cache_dir=tmp_path).digest() == expected
    assert "regenerating" in caplog.text
    assert fixtures.load_cached_fixture(CASE, tmp_path).digest() == expected  # rewritten, valid again


def test_default_cache_folder_and_environment_override(tmp_path, monkeypatch):
    monkeypatch.delenv(CACHE_ENV_VAR, raising=False)
    assert default_cache_dir() == PROJECT_ROOT / ".cache" / "fixtures"
    monkeypatch.setenv(CACHE_ENV_VAR, str(tmp_path))
    assert default_cache_dir() == tmp_path / "fixtures"
    make_fixture(SINKHORN)
    assert cache_path(SINKHORN).parent == tmp_path / "fixtures" and cache_path(SINKHORN).exists()


def test_an_installed_copy_caches_in_the_user_s_cache_folder_not_in_site_packages(tmp_path, monkeypatch):
    # A checkout's root holds pyproject.toml; the folder an installed copy lives in does not.
    from mhc_parity.records import cache_root as where

    monkeypatch.delenv(CACHE_ENV_VAR, raising=False)
    site = tmp_path / "site-packages"
    site.mkdir()
    monkeypatch.setattr(where, "PROJECT_ROOT", site)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert where.cache_root() == tmp_path / "xdg" / "mhc-parity"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_cache_dir() == tmp_path / "home" / ".cache" / "mhc-parity" / "fixtures"


def test_unwritable_cache_still_returns_the_fixture(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    assert make_fixture(SINKHORN, cache_dir=blocker / "sub").digest() == generate_fixture(SINKHORN).digest()


def test_expected_unsupported_shapes_still_get_fixtures():
    from mhc_parity.cases import registry

    for case in registry.default_registry():
        if case.expects_unsupported:
            fixture = generate_fixture(case)
            assert fixture.x.shape == case.shape
            assert fixture.weights["res_alpha"].shape == case.dims.weight_shapes()["res_alpha"]


def test_unconstructible_shapes_raise_unsupported():
    from mhc_parity.mhc.common import UnsupportedInputError

    with pytest.raises(UnsupportedInputError, match="elements"):
        generate_fixture(Case(name="huge", batch=1, sequence=8, streams=9, embedding=1024))
