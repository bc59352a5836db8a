"""Faults and legitimate variants, the kill matrix that injects them, and the false-positive sweep.

`model` (perturbations and their injection), `fault_catalogue` and `coherent_faults` (the faults),
`variants`, `passes` (a case's clean and perturbed passes), `matrix` (the kill matrix), `seed_sweep`,
`rounding_audit`, `compile_faults`; `mhc_parity.harness.commands.faults` runs them and `mhc_parity.reports`
writes their results.
"""

from mhc_parity.harness.faults.fault_catalogue import CATALOGUE, FAULTS
from mhc_parity.harness.faults.model import DTYPE_SLICES, Patch, Perturbation, Seam, SeamError, UnknownPerturbationError
from mhc_parity.harness.faults.variants import VARIANTS, VARIANTS_BY_NAME

# Every catalogued perturbation by name (the `--jobs` workers look them up here).
BY_NAME = {**FAULTS, **VARIANTS_BY_NAME}

__all__ = [
    "BY_NAME",
    "CATALOGUE",
    "DTYPE_SLICES",
    "FAULTS",
    "Patch",
    "Perturbation",
    "Seam",
    "SeamError",
    "UnknownPerturbationError",
    "VARIANTS",
    "VARIANTS_BY_NAME",
]
