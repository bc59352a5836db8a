"""tools/install_on_own_jax.py (`make setup SYSTEM_JAX=1`, `make test-compat`): the project on a JAX
the machine already has, every package already there kept at its version."""

from __future__ import annotations

import pathlib
import sys
import tomllib
import types

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))

import install_on_own_jax as tool  # noqa: E402


def test_the_dependencies_go_by_name_and_maxtext_as_pinned():
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    required, optional = tool.project_requirements(pyproject)
    assert {"jax", "jaxlib", "flax", "numpy", "scipy", "pandas", "pytest", "pytest-xdist"} <= set(required)
    # No version, whatever an environment marker says of the platform (libtpu's: x86-64 Linux).
    names = [r.partition(";")[0] for r in required if r != "setuptools>=68"]
    assert not any(mark in name for name in names for mark in "=<>~! ")
    assert "setuptools>=68" in required  # the build backend, as [build-system] requires it
    assert optional == pyproject["project"]["optional-dependencies"]["maxtext"]
    assert "maxtext==0.2.5" in optional


def test_a_requirement_keeps_its_name_and_extras_not_its_version():
    assert tool.unpinned("jax[tpu]==0.12.0.1") == "jax[tpu]"
    assert tool.unpinned("ml_dtypes==0.6.0") == "ml_dtypes"
    assert tool.unpinned("scipy>=1.14 ; python_version >= '3.11'") == "scipy; python_version >= '3.11'"


def _dist(name, version):
    return types.SimpleNamespace(metadata={"Name": name}, version=version)


def test_what_is_installed_is_kept_at_the_version_python_imports():
    dists = [
        _dist("jax", "0.10.2"),
        _dist("ml_dtypes", "0.6.0"),
        _dist("mhc_parity", "0.1.0"),  # the project itself is installed again, editable
        _dist("ml-dtypes", "0.5.4"),  # further down the path (the system's, under the venv's): not imported
        _dist("libtpu", "0.0.42.1"),
        _dist("setuptools", "65.5.0"),  # Python 3.11.7's own: cannot build the project
    ]
    kept = ["jax==0.10.2", "libtpu==0.0.42.1", "ml_dtypes==0.6.0"]
    assert tool.kept_packages(dists, frozenset({"setuptools"})) == kept
    assert tool.kept_packages(dists) == [*kept, "setuptools==65.5.0"]


def test_on_an_older_python_maxtext_goes_without_its_gate_and_with_what_it_imports():
    """On Python 3.11 the `maxtext` extra installs as pinned, without MaxText's Python gate or the
    dependencies its packages declare, plus the measured list of what its mHC code imports;
    never jax, jaxlib, numpy or libtpu (the machine's own)."""
    optional = ["maxtext==0.2.5", "qwix==0.1.8"]
    assert tool.optional_install_args(optional, (3, 12)) == optional
    older = tool.optional_install_args(optional, (3, 11))
    assert older[:2] == ["--no-deps", "--ignore-requires-python"] and older[2:4] == optional
    imports = older[4:]
    assert {"fastapi", "pydantic", "uvicorn"} <= set(imports)  # pathwaysutils imports them at import
    assert not {"jax", "jaxlib", "numpy", "libtpu", "scipy"} & {tool.normalized(n) for n in imports}
    assert tool.listed_names("# a comment\n\nfastapi\n  # indented comment\nuvloop\n") == ["fastapi", "uvloop"]
