"""The JAX releases mhc-parity runs on, and the check each entry point makes before it computes.

The default install pins one JAX (pyproject.toml). A machine's own JAX (a TPU VM image:
`make setup SYSTEM_JAX=1`, docs/accelerators.md) may be any release from `OLDEST_JAX` up to the
pinned series: `make test-compat` runs the not-slow tests on the oldest
(tools/oldest-supported.txt pins it), `make test` on the pinned one. Outside that range the
code's JAX API assumptions (docs/jax-notes.md) are untested, so a run refuses to start rather
than produce rows nobody checked.

Plain Python (the standard library only): the versions are read from the installed
distributions' metadata, so checking imports no JAX.
"""

from __future__ import annotations

import importlib.metadata
import re

# The oldest release tested (`make test-compat`): a TPU v5e VM image's own (issue 50).
OLDEST_JAX = "0.10.2"
# The first release past the pinned 0.12 series: not tested, so not supported.
FIRST_UNSUPPORTED_JAX = "0.13"
# jax and jaxlib are released together with one version; both are checked (a jaxlib the
# machine keeps beside a newer jax is what a TPU image's own upgrade can leave behind).
CHECKED_DISTRIBUTIONS = ("jax", "jaxlib")


class UnsupportedJaxError(RuntimeError):
    """The installed jax or jaxlib is missing or outside the supported range (one-line message)."""


def release(version: str) -> tuple[int, ...]:
    """The numeric release of a version string: "0.12.0.1" -> (0, 12, 0, 1); "0.13.0.dev1" -> (0, 13, 0)."""
    match = re.match(r"\d+(?:\.\d+)*", version.strip())
    if match is None:
        raise ValueError(f"not a version: {version!r}")
    return tuple(int(part) for part in match.group().split("."))


def supported_range() -> str:
    """The supported range as one phrase, e.g. "0.10.2 <= jax < 0.13"."""
    return f"{OLDEST_JAX} <= jax < {FIRST_UNSUPPORTED_JAX}"


def is_supported(version: str) -> bool:
    """Whether a jax / jaxlib version string lies in the supported range."""
    return release(OLDEST_JAX) <= release(version) < release(FIRST_UNSUPPORTED_JAX)


def installed_versions() -> dict[str, str | None]:
    """Distribution name -> its installed version (None when not installed), for `CHECKED_DISTRIBUTIONS`."""
    found: dict[str, str | None] = {}
    for name in CHECKED_DISTRIBUTIONS:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    return found


def libtpu_version() -> str:
    """The installed libtpu's version (its nightly's where that is what is installed); "" where none is."""
    for name in ("libtpu", "libtpu-nightly"):
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return ""


def unsupported_reason(versions: dict[str, str | None]) -> str:
    """ "" when every checked distribution is installed at a supported version, else one line saying which is not."""
    missing = [name for name, version in versions.items() if version is None]
    outside = [f"{name} {version}" for name, version in versions.items() if version and not is_supported(version)]
    if not missing and not outside:
        return ""
    found = "; ".join([*(f"{name} is not installed" for name in missing), *(f"found {v}" for v in outside)])
    return (
        f"unsupported JAX: {found}; mhc-parity runs on {supported_range()} (jax and jaxlib of one release): "
        "`make setup` installs the pinned release, `make setup SYSTEM_JAX=1` uses a supported one "
        "the machine already has (docs/accelerators.md)"
    )


def check_jax_versions() -> None:
    """Raise UnsupportedJaxError (one line) unless jax and jaxlib are installed at supported versions."""
    reason = unsupported_reason(installed_versions())
    if reason:
        raise UnsupportedJaxError(reason)
