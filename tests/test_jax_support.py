"""mhc_parity.jax_support: the JAX releases the project runs on, stated once, and refused outside them."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys
import tomllib

import pytest

from mhc_parity import jax_support
from mhc_parity.harness import env

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _pins(lines) -> dict[str, str]:
    return dict(re.match(r"\s*([A-Za-z0-9._-]+)==(\S+)", line).groups() for line in lines if "==" in line)


def test_the_pinned_and_the_oldest_tested_jax_are_the_ends_of_the_range():
    pinned = _pins(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"])
    oldest = _pins((ROOT / "tools" / "oldest-supported.txt").read_text().splitlines())
    assert oldest["jax"] == oldest["jaxlib"] == jax_support.OLDEST_JAX
    assert all(jax_support.is_supported(pinned[name]) for name in ("jax", "jaxlib"))
    # The pinned series is the newest supported: the next minor release is outside.
    assert jax_support.release(jax_support.FIRST_UNSUPPORTED_JAX)[:2] == (0, jax_support.release(pinned["jax"])[1] + 1)


@pytest.mark.parametrize(
    ("version", "supported"),
    [
        ("0.10.2", True),
        ("0.10.1", False),
        ("0.11.0", True),
        ("0.12.0.1", True),
        ("0.12.9", True),
        ("0.13.0", False),
        ("0.13.0.dev20260101", False),
        ("0.4.38", False),
    ],
)
def test_a_version_is_supported_inside_the_range_only(version, supported):
    assert jax_support.is_supported(version) is supported


def test_the_reason_names_what_is_missing_or_outside_and_how_to_install():
    assert jax_support.unsupported_reason({"jax": "0.12.0.1", "jaxlib": "0.12.0.1"}) == ""
    reason = jax_support.unsupported_reason({"jax": "0.9.2", "jaxlib": None})
    assert "\n" not in reason
    assert (
        reason.startswith("unsupported JAX: ")
        and "runs on 0.10.2 <= jax < 0.13" in reason
        and "found jax 0.9.2" in reason
        and "jaxlib is not installed" in reason
    )
    assert "make setup SYSTEM_JAX=1" in reason


def test_an_entry_point_refuses_an_unsupported_jax(monkeypatch):
    monkeypatch.setattr(jax_support, "installed_versions", lambda: {"jax": "0.9.2", "jaxlib": "0.9.2"})
    env._jax_supported.cache_clear()
    try:
        with pytest.raises(jax_support.UnsupportedJaxError, match="found jax 0.9.2; found jaxlib 0.9.2"):
            env.ensure_host_devices()
    finally:
        env._jax_supported.cache_clear()


def test_the_command_line_exits_2_with_one_line_on_an_unsupported_jax(tmp_path):
    # A jaxlib distribution's metadata, older than the range, first on the path.
    dist = tmp_path / "jaxlib-0.9.2.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: jaxlib\nVersion: 0.9.2\n")
    proc = subprocess.run(
        [sys.executable, "-c", "import sys; from mhc_parity.harness.cli import main; sys.exit(main(['gate']))"],
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": f"{tmp_path}"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith(
        "mhc-parity: error: unsupported JAX: found jaxlib 0.9.2; "
    )


@pytest.mark.parametrize(("jax", "jaxlib"), [("0.10.2", "0.12.0.1"), ("0.12.0.1", "0.11.2"), ("0.12.0", "0.12.0.1")])
def test_jax_and_jaxlib_of_two_releases_are_refused(jax, jaxlib):
    # Issue 56, item 3: each was checked against the range alone, though the message says "of one release".
    reason = jax_support.unsupported_reason({"jax": jax, "jaxlib": jaxlib})
    assert f"jax {jax} and jaxlib {jaxlib} are not one release" in reason and "\n" not in reason


def _not_installed(name):
    raise jax_support.importlib.metadata.PackageNotFoundError(name)


def test_a_libtpu_given_through_tpu_library_path_has_an_identity_of_its_own(tmp_path, monkeypatch):
    # Issue 56, item 3: a libtpu given through TPU_LIBRARY_PATH read as "" (or as the package's
    # version, which is not what JAX loads), so the stored probe table outlived an upgrade.
    stamped, bare = tmp_path / "stamped.so", tmp_path / "bare.so"
    stamped.write_bytes(b"\x7fELF" + b"\x00" * 1000 + b"Built on Jan  2 2026 03:04:05 (1767323045)\x00tail")
    bare.write_bytes(b"\x7fELF" + b"\x01" * 1000)
    monkeypatch.setattr(jax_support.importlib.metadata, "version", _not_installed)  # no libtpu package
    monkeypatch.delenv("TPU_LIBRARY_PATH", raising=False)
    assert jax_support.libtpu_version() == ""
    monkeypatch.setenv("TPU_LIBRARY_PATH", str(stamped))
    found = jax_support.libtpu_version()
    assert found.startswith("built Jan  2 2026 03:04:05 (1767323045), sha256:"), found
    monkeypatch.setenv("TPU_LIBRARY_PATH", str(bare))
    assert re.fullmatch(r"sha256:[0-9a-f]{24}", jax_support.libtpu_version())
    before = jax_support.libtpu_version()
    bare.write_bytes(b"\x7fELF" + b"\x02" * 1001)  # an upgrade in place
    assert jax_support.libtpu_version() not in (before, "")


@pytest.mark.skipif(jax_support.importlib.util.find_spec("libtpu") is None, reason="libtpu is not installed here")
def test_the_package_s_own_library_reads_as_the_package_s_version(tmp_path, monkeypatch):
    # libtpu's import points TPU_LIBRARY_PATH at its own library: that is the package's version.
    package = pathlib.Path(jax_support.importlib.util.find_spec("libtpu").submodule_search_locations[0])
    version = jax_support.importlib.metadata.version("libtpu")
    monkeypatch.setenv("TPU_LIBRARY_PATH", str(package / "libtpu.so"))
    assert jax_support.libtpu_version() == version
    other = tmp_path / "libtpu.so"
    other.write_bytes(b"another build")
    monkeypatch.setenv("TPU_LIBRARY_PATH", str(other))
    assert jax_support.libtpu_version() not in (version, "")


def test_the_probe_and_compile_keys_and_the_environment_record_hold_a_given_libtpu(tmp_path, monkeypatch):
    import jax

    from mhc_parity.harness.engine import backend_arithmetic, run_info, store_keys

    library = tmp_path / "libtpu.so"
    library.write_bytes(b"a libtpu build")
    monkeypatch.setenv("TPU_LIBRARY_PATH", str(library))
    given = jax_support.libtpu_version()
    assert given.startswith("sha256:")
    assert dict(backend_arithmetic.backend_key(jax.devices()[0]))["libtpu"] == given
    # every store's key (the TPU compile store's among them) holds the environment's identity record
    assert store_keys.environment_material()["identity"]["libtpu_version"] == given
    assert store_keys.environment_material(devices=False)["identity"]["libtpu_version"] == given
    assert run_info.run_metadata()["libtpu_version"] == given
