"""Install mhc-parity into a Python that already has its JAX: `make setup SYSTEM_JAX=1`, `make test-compat`.

A TPU VM image comes with its own jax, jaxlib and libtpu (and numpy, scipy), and often with
no registry but a package index of its own that pip is configured to use. Run with the
Python of the venv to install into (one made with `--system-site-packages` sees the
machine's packages), this installs the project without touching what is there:

1. jax and jaxlib must be installed at a supported release (`mhc_parity.jax_support`);
2. every distribution this Python already has is written, at its installed version, to a
   constraints file in the venv (`kept-packages.txt`): nothing pip installs next may upgrade,
   downgrade or replace one (a package that needs another version fails, naming both). But
   the build backend: pyproject.toml's [build-system] requires (setuptools >= 68) is installed
   into the venv as written, since the tests build the project with it (`--no-build-isolation`)
   and Python 3.11.7's own setuptools 65.5.0, without `wheel`, cannot;
3. the project itself, without its pinned dependencies (`pip install --no-deps -e .`); pip
   builds it in an isolated environment with that build backend, from the same sources;
4. its dependencies and the `dev` extra by name, unpinned, and the build backend, from
   whatever index pip is configured with, under those constraints (and each `--constraint
   FILE` given);
5. the `maxtext` extra as pyproject.toml pins it (`mhc_parity.maxtext_parity` patches that
   release). On a Python older than MaxText's 3.12 (a TPU image's 3.11): that extra without
   MaxText's Python gate and without the dependencies its packages declare, plus what its mHC
   layer and kernels import (`tools/maxtext-imports.txt`, measured), each from the configured
   index or `PIP_FIND_LINKS`; its two PEP 695 aliases are read by
   `mhc_parity/maxtext_parity/type_aliases.py`. Where it cannot install (an index without it)
   the install goes on without it and says why: the MaxText tests skip and
   `make parity-maxtext` refuses, each naming the missing module.

Steps 4 and 5 install under `tools/system-jax-constraints.txt` too (less what is kept): the
versions of what tools/tpu-wheels carries to the TPU image, measured to import there, so a set-up
resolves the same set later (unpinned, the newest anyio needed a newer typing_extensions than
the kept one). Last, the project, its test tools and (where installed) MaxText's mHC are
imported (tools/import_check.py): a set that does not import fails the set-up.

Exit 2, with one line, when jax is missing or unsupported, a required install fails, or the
installed set does not import (naming the package at fault).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import pathlib
import re
import subprocess
import sys
import tomllib

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from mhc_parity.jax_support import installed_versions, unsupported_reason  # noqa: E402 - the checkout, not installed yet

DISTRIBUTION = "mhc-parity"
# The extra installed with the dependencies, and the one installed only where it can be.
REQUIRED_EXTRAS = ("dev",)
OPTIONAL_EXTRA = "maxtext"
# What the optional extra's code imports, installed with it where Python is older than it asks.
OPTIONAL_IMPORTS = ROOT / "tools" / "maxtext-imports.txt"
# MaxText's own Requires-Python (>=3.12): its PEP 695 aliases are the only 3.12 syntax its mHC uses.
OPTIONAL_PYTHON = (3, 12)
_NAME = re.compile(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?")
# The versions of the 3.11 stack's own installs (tools/tpu-wheels resolves and carries them).
PINS = ROOT / "tools" / "system-jax-constraints.txt"
# What must import once set up: the project and its test tools; then MaxText's mHC through
# the project's adapter (first: it installs the accommodation), where the extra installed.
REQUIRED_MODULES = ("mhc_parity", "mhc_parity.harness", "pytest", "xdist")
OPTIONAL_MODULES = ("mhc_parity.maxtext_parity", "maxtext.kernels.mhc.api", "maxtext.layers.mhc")


def normalized(name: str) -> str:
    """A distribution name as pip compares them (PEP 503): lower case, runs of -_. as one -."""
    return re.sub(r"[-_.]+", "-", name).lower()


def unpinned(requirement: str) -> str:
    """A requirement without its version: "jax[tpu]==0.12.0.1" -> "jax[tpu]" (an environment marker stays)."""
    spec, semicolon, marker = requirement.partition(";")
    match = _NAME.match(spec)
    if match is None:
        raise ValueError(f"not a requirement: {requirement!r}")
    return match.group(1) + (match.group(2) or "") + (f"; {marker.strip()}" if semicolon else "")


def build_requirements(pyproject: dict) -> list[str]:
    """[build-system] requires, as written (the build backend: "setuptools>=68")."""
    return list(pyproject.get("build-system", {}).get("requires", ()))


def project_requirements(pyproject: dict) -> tuple[list[str], list[str]]:
    """(the dependencies and required extras, unpinned, and the build backend as written; the
    optional extra's requirements as pinned)."""
    project = pyproject["project"]
    extras = project.get("optional-dependencies", {})
    required = [*project["dependencies"], *(r for extra in REQUIRED_EXTRAS for r in extras[extra])]
    return [*(unpinned(r) for r in required), *build_requirements(pyproject)], list(extras.get(OPTIONAL_EXTRA, ()))


def kept_packages(distributions, replaceable: frozenset[str] = frozenset()) -> list[str]:
    """`name==version` for each installed distribution but this project and the `replaceable`
    names (normalized), first on the path first (the one Python imports), sorted by name."""
    kept: dict[str, str] = {}
    for dist in distributions:
        name = dist.metadata["Name"]
        if not name or normalized(name) in {DISTRIBUTION, *replaceable}:
            continue
        kept.setdefault(normalized(name), f"{name}=={dist.version}")
    return sorted(kept.values(), key=str.lower)


def listed_names(text: str) -> list[str]:
    """The requirement lines of a list file: blank lines and `#` comments dropped."""
    return [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def optional_install_args(optional: list[str], python: tuple[int, ...] = tuple(sys.version_info[:2])) -> list[str]:
    """pip's arguments for the optional extra on this Python: as pinned, or, on a Python older
    than MaxText's, without its Python gate or declared dependencies, with what it imports."""
    if tuple(python) >= OPTIONAL_PYTHON:
        return optional
    imports = listed_names(OPTIONAL_IMPORTS.read_text(encoding="utf-8"))
    return ["--no-deps", "--ignore-requires-python", *optional, *imports]


def pins_not_kept(pins: list[str], kept: list[str]) -> list[str]:
    """The `pins` (name==version lines) of packages not in `kept`: a kept one stays at its
    version (pinning it again to another would fail every install)."""
    kept_names = {normalized(unpinned(line)) for line in kept}
    return [line for line in pins if normalized(unpinned(line)) not in kept_names]


def import_problem(modules: tuple[str, ...]) -> str:
    """tools/import_check.py's line for the first of `modules` this Python cannot import, or ""."""
    check = ROOT / "tools" / "import_check.py"
    proc = subprocess.run([sys.executable, str(check), *modules], capture_output=True, text=True, cwd=ROOT)
    if proc.returncode == 0:
        return ""
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    return (lines or [f"import check exited {proc.returncode}"])[-1]


def _pip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", *args], capture_output=True, text=True)


def _last_error(proc: subprocess.CompletedProcess) -> str:
    lines = [line.strip() for line in (proc.stderr + proc.stdout).splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("ERROR")]
    return (errors or lines or [f"pip exited {proc.returncode}"])[-1]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--constraint", action="append", default=[], help="a further pip constraints file")
    args = parser.parse_args(argv)
    reason = unsupported_reason(installed_versions())
    if reason:
        print(f"install_on_own_jax: {sys.executable}: {reason}", file=sys.stderr)
        return 2
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    required, optional = project_requirements(pyproject)
    build_tools = frozenset(normalized(unpinned(r)) for r in build_requirements(pyproject))
    kept = pathlib.Path(sys.prefix) / "kept-packages.txt"
    kept_lines = kept_packages(importlib.metadata.distributions(), build_tools)
    kept.write_text("".join(f"{line}\n" for line in kept_lines))
    pinned = pathlib.Path(sys.prefix) / "pinned-packages.txt"
    pins = pins_not_kept(listed_names(PINS.read_text(encoding="utf-8")), kept_lines)
    pinned.write_text("".join(f"{line}\n" for line in pins))
    constraints = [arg for path in [kept, pinned, *args.constraint] for arg in ("--constraint", str(path))]
    for what, pip_args in (
        ("the project", ["--no-deps", "--editable", str(ROOT)]),
        ("its dependencies", [*constraints, *required]),
    ):
        print(f"install_on_own_jax: installing {what} (pip, quiet)", flush=True)
        proc = _pip(*pip_args)
        if proc.returncode != 0:
            print(proc.stderr, file=sys.stderr, end="")
            print(f"install_on_own_jax: installing {what} failed: {_last_error(proc)}", file=sys.stderr)
            return 2
    print(f"install_on_own_jax: installing the optional {OPTIONAL_EXTRA!r} extra (pip, quiet)", flush=True)
    proc = _pip(*constraints, *optional_install_args(optional))
    if proc.returncode != 0:
        print(
            f"install_on_own_jax: the {OPTIONAL_EXTRA!r} extra is not installed ({_last_error(proc)}): "
            "its tests skip and `make parity-maxtext` cannot run"
        )
    problem = import_problem(REQUIRED_MODULES + (OPTIONAL_MODULES if proc.returncode == 0 else ()))
    if problem:
        print(f"install_on_own_jax: the installed set does not import: {problem}", file=sys.stderr)
        return 2
    versions = installed_versions()
    print(f"install_on_own_jax: mhc-parity on jax {versions['jax']}, jaxlib {versions['jaxlib']} ({sys.executable})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
