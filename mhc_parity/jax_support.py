"""The JAX releases mhc-parity runs on (`OLDEST_JAX` up to the pinned series; docs/accelerators.md),
and the check each entry point makes before it computes: outside that range a run refuses to
start. Standard library only: versions come from distribution metadata, so checking imports no JAX.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import importlib.util
import os
import pathlib
import re

# The oldest release tested (`make test-compat`): a TPU v5e VM image's own (issue 50).
OLDEST_JAX = "0.10.2"
# The first release past the pinned 0.12 series: not tested, so not supported.
FIRST_UNSUPPORTED_JAX = "0.13"
# Both must be one release: a TPU image's upgrade can leave an older jaxlib beside a newer jax,
# which jax itself accepts (0.12 takes any jaxlib from 0.11.2).
CHECKED_DISTRIBUTIONS = ("jax", "jaxlib")
# The environment variable JAX loads libtpu from before the libtpu package's own library
# (`jax._src.cloud_tpu_init.get_tpu_library_path`: where it names a file).
TPU_LIBRARY_VARIABLE = "TPU_LIBRARY_PATH"
# What a libtpu build says of itself in its library, e.g. "Built on Oct 22 2026 00:45:19 (1792655119)"
# (libtpu 0.0.50.1; the package version is not in the file).
_BUILD_STAMP = re.compile(rb"Built on [ -~]{1,80}?(?=\x00)")


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


def _package_libtpu_version() -> str:
    """The libtpu (or libtpu-nightly) package's version; "" where none is installed."""
    for name in ("libtpu", "libtpu-nightly"):
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return ""


def _package_library() -> pathlib.Path | None:
    """The libtpu package's own library file (found without importing the package: its import
    sets `TPU_LIBRARY_VARIABLE`), or None where no package is installed."""
    try:
        spec = importlib.util.find_spec("libtpu")
    except (ImportError, ValueError):
        return None
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    return pathlib.Path(locations[0]) / "libtpu.so" if locations else None


def given_libtpu_library(environ=os.environ) -> pathlib.Path | None:
    """The libtpu library `TPU_LIBRARY_VARIABLE` gives JAX in place of the package's own, or None
    (unset, naming no file — JAX then falls back to the package — or naming the package's own)."""
    value = environ.get(TPU_LIBRARY_VARIABLE)
    if not value or not os.path.isfile(value):
        return None
    given = pathlib.Path(value).resolve()
    package = _package_library()
    return None if package is not None and package.resolve() == given else given


@functools.cache
def _library_identity(path: str, size: int, modified_ns: int) -> str:
    """Build stamp (where found) and sha256 of a library file; cached per file state (libtpu
    is 600 MiB, about a second to hash)."""
    digest, stamp, tail = hashlib.sha256(), b"", b""
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 24):
            digest.update(chunk)
            if not stamp:
                # The stamp may straddle two chunks: search the previous chunk's tail with this one.
                found = _BUILD_STAMP.search(tail + chunk)
                stamp = found.group() if found else b""
                tail = chunk[-128:]
    built = stamp.decode("ascii", "replace").replace("Built on", "built") + ", " if stamp else ""
    return f"{built}sha256:{digest.hexdigest()[:24]}"


def libtpu_version(environ=os.environ) -> str:
    """The libtpu JAX loads, as key material and for the environment record: the package's
    version, or for a library given through `TPU_LIBRARY_VARIABLE` its build stamp and sha256;
    "" where there is neither."""
    given = given_libtpu_library(environ)
    if given is None:
        return _package_libtpu_version()
    try:
        state = given.stat()
        return _library_identity(str(given), state.st_size, state.st_mtime_ns)
    except OSError as error:  # unreadable: not "", which would read as no libtpu at all
        return f"{given} (unreadable: {error.strerror or error})"


def unsupported_reason(versions: dict[str, str | None]) -> str:
    """ "" when every checked distribution is installed at one supported release, else one line
    saying which is not (or that they are of two releases)."""
    missing = [name for name, version in versions.items() if version is None]
    outside = [f"{name} {version}" for name, version in versions.items() if version and not is_supported(version)]
    present = [f"{name} {version}" for name, version in versions.items() if version]
    apart = len(present) > 1 and len({release(version) for version in versions.values() if version}) > 1
    if not missing and not outside and not apart:
        return ""
    found = "; ".join(
        [
            *(f"{name} is not installed" for name in missing),
            *(f"found {v}" for v in outside),
            *([f"{' and '.join(present)} are not one release"] if apart else []),
        ]
    )
    return (
        f"unsupported JAX: {found}; mhc-parity runs on {supported_range()} (jax and jaxlib of one release): "
        "`make setup` installs the pinned release, `make setup SYSTEM_JAX=1` uses a supported one "
        "the machine already has (docs/accelerators.md)"
    )


def check_jax_versions() -> None:
    """Raise UnsupportedJaxError (one line) unless jax and jaxlib are installed at one supported release."""
    reason = unsupported_reason(installed_versions())
    if reason:
        raise UnsupportedJaxError(reason)
