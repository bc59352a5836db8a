"""tools/install_on_own_jax.py (`make setup SYSTEM_JAX=1`, `make test-compat`): the project on a JAX
the machine already has, every package already there kept at its version."""

from __future__ import annotations

import pathlib
import re
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


# ------------------------------------------------------------------ a set that imports (issue 68)

PINS = tool.listed_names(tool.PINS.read_text(encoding="utf-8"))


def test_the_pins_are_versions_of_what_the_set_up_installs_and_agree_with_pyproject():
    """tools/system-jax-constraints.txt: one `name==version` a line; MaxText's and the dev tools'
    as pyproject.toml pins them (another would make every set-up fail); anyio among them (unpinned,
    the newest does not import with the image's typing_extensions 4.15.0); no package the image
    keeps (tools/tpu-v5e-image-packages.txt); and tools/tpu-wheels resolves under it."""
    assert all(re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*==[0-9][0-9A-Za-z.+]*", line) for line in PINS), PINS
    pinned = {tool.normalized(line.split("==")[0]): line.split("==")[1] for line in PINS}
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    extras = pyproject["project"]["optional-dependencies"]
    for requirement in extras["maxtext"] + [r for r in extras["dev"] if "==" in r]:
        name, version = requirement.split("==")
        if tool.normalized(name) in pinned:
            assert pinned[tool.normalized(name)] == version, requirement
    image = tool.listed_names((ROOT / "tools" / "tpu-v5e-image-packages.txt").read_text())
    kept = {tool.normalized(line.split("==")[0]) for line in image} - {"setuptools"}  # the build backend is upgraded
    assert not kept & set(pinned)
    assert "anyio" in pinned and "-c tools/system-jax-constraints.txt" in (ROOT / "tools" / "tpu-wheels").read_text()


def test_a_pin_of_a_kept_package_is_dropped():
    assert tool.pins_not_kept(["anyio==4.14.2", "ruff==0.17.6"], ["Anyio==4.0.0", "jax==0.10.2"]) == ["ruff==0.17.6"]


def test_a_set_that_does_not_import_is_named_in_one_line(tmp_path, monkeypatch):
    """Reproduction (issue 68): with typing_extensions 4.15.0 kept, the newest anyio installed
    beside it and `import maxtext...` failed after a set-up that said nothing. The check names
    the package whose code raised and the one it could not import from, in one line."""
    for name, version, code in (("oldpkg", "4.15.0", "x = 1\n"), ("newpkg", "4.15.1", "from oldpkg import sentinel\n")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(code)
        info = tmp_path / f"{name}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        (info / "top_level.txt").write_text(f"{name}\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    assert tool.import_problem(("json", "oldpkg")) == ""
    problem = tool.import_problem(("json", "newpkg", "oldpkg"))
    assert problem == (
        "import newpkg fails in newpkg 4.15.1 (from oldpkg 4.15.0): ImportError: cannot import name "
        f"'sentinel' from 'oldpkg' ({tmp_path / 'oldpkg' / '__init__.py'})"
    )
