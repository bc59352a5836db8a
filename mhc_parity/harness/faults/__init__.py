"""Faults and legitimate variants, the kill matrix that injects them, and the false-positive sweep.

Modules, in the order data flows through them:

* `model` — `Seam`, `Patch`, `Perturbation` (a fault or a legitimate variant) and its
  reversible injection;
* `fault_catalogue` — the faults (`CATALOGUE`, `FAULTS`);
* `coherent_faults` — its faults that scale a whole leaf a little (what only the gain sees);
* `variants` — the legitimate variants (`VARIANTS`);
* `passes` — a case's clean pass and its perturbation passes, sharing what no
  perturbation changes (fixtures, oracle answers, the causes' hypotheses, the outputs of
  the paths it does not affect, the clean programs);
* `matrix` — the kill matrix: the cases' passes in one process or dealt to workers,
  judged per dtype slice;
* `seed_sweep` — the unmodified code over many seeds;
* `mhc_parity.harness.commands.faults` — `mhc-parity faults`.

Their results are plain records written to files by `mhc_parity.reports.kill_matrix` and
`mhc_parity.reports.sweep` (CSV, Markdown, JSON and the terminal tables).
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
