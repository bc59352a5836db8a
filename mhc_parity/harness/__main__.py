"""`python -m mhc_parity.harness ...`, the same program as the `mhc-parity` command: see mhc_parity.harness.cli."""

from mhc_parity.harness.cli import entry

entry()
