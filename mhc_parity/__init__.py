"""mhc-parity: whether any forward output or gradient leaf of the mHC layer drifted beyond
what the arithmetic explains.

Subpackages, in the order data flows through them (docs/ARCHITECTURE.md):

    cases           named cases, suites, seeded fixtures (a case spec -> its NumPy inputs)
    mhc             the system under test: the reference, the Pallas kernels, the float64 oracle
    harness         the engine (paths run the case, leaves are compared and judged), the
                    public API (`mhc_parity.harness.api`), the `mhc-parity` command line and
                    the pytest plugin
    records         the row schema, manifests and row streams the engine writes
    reports         what a run's records become: CSV / JSON / HTML / Markdown, the baseline, the gate
    maxtext_parity  MaxText's mHC as implementations (`--impl mhc_parity.maxtext_parity:implementations`)

`__version__` is the installed distribution's version (`mhc_parity.version`).
"""

from mhc_parity.version import version as _version


def __getattr__(name: str):
    # Looked up on first use: reading the distribution's metadata scans sys.path, which an
    # import of any subpackage (every command, every worker) should not pay for.
    if name == "__version__":
        return _version()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
