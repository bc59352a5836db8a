"""Print the distributions MaxText's mHC layer and kernels import (tools/maxtext-imports.txt).

Run with the Python to measure, where maxtext and everything it may need is installed (e.g. a
`pip install --target DIR --no-deps --ignore-requires-python` of the resolved wheels, DIR given
here): it imports `maxtext.layers.mhc` and `maxtext.kernels.mhc.api` through this project's
adapter (so, on Python 3.11, through the PEP 695 accommodation) and prints, one a line, each
distribution that provides a module loaded by that import and not already by jax, numpy and flax.

    python tools/maxtext_imports.py [EXTRA_SITE_DIR]
"""

from __future__ import annotations

import importlib
import importlib.metadata
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
# Provided by the machine's own stack or by mhc-parity's own dependencies: never in the list.
NOT_LISTED = {
    "jax",
    "jaxlib",
    "numpy",
    "scipy",
    "ml-dtypes",
    "libtpu",
    "flax",
    "mhc-parity",
    "maxtext",
    "qwix",
    "aqtp",
    "pathwaysutils",
    "omegaconf",
    "jinja2",
}


def main(argv: list[str]) -> int:
    sys.path.insert(0, str(ROOT))
    sys.path.extend(argv)
    import flax  # noqa: F401 - loaded before, so its own imports are not counted
    import jax  # noqa: F401
    import numpy  # noqa: F401

    before = set(sys.modules)
    # The adapter first: it installs the accommodation before any MaxText import.
    for module in ("mhc_parity.maxtext_parity", "maxtext.kernels.mhc.api", "maxtext.layers.mhc"):
        importlib.import_module(module)

    providers = importlib.metadata.packages_distributions()
    names = {dist for module in set(sys.modules) - before for dist in providers.get(module.partition(".")[0], ())}
    for name in sorted(names, key=str.lower):
        if name.lower().replace("_", "-") not in NOT_LISTED:
            print(name)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
