"""Each path's leaves on this machine's default device, saved for a look elsewhere.

    python bench/probes/leaves_dump.py --suite maxtext --cases 'lite-n4-c256-b8s64-*peaky*' \
        --impl mhc_parity.maxtext_parity:implementations --paths 'maxtext-layer-reference*' --out DIR

For every selected case and unsharded path, the program a parity run judges (the forward pass
and one VJP, `mhc_parity.harness.engine.paths`) is compiled for the default device and run once
on the case's fixture. Writes DIR/<case>/<implementation>.npz (leaf name -> array, as the run's
rows name them; `load_leaves` reads them back in their own dtypes) and
DIR/<case>/<implementation>.hlo.txt (the program as the backend compiled it: where it rounds and
what it fuses). `bench/probes/cause_replay.py` reads the .npz on any machine: a TPU's leaves
attributed on a CPU, hypothesis by hypothesis.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from mhc_parity.harness.env import ensure_host_devices  # noqa: E402

ensure_host_devices()

import jax  # noqa: E402
import numpy as np  # noqa: E402

from mhc_parity.cases import registry  # noqa: E402
from mhc_parity.cases.fixtures import make_fixture  # noqa: E402
from mhc_parity.harness.engine import paths as path_programs  # noqa: E402
from mhc_parity.harness.engine.implementations import BUILTIN, load_implementations  # noqa: E402
from mhc_parity.harness.engine.program_cache import host_leaves  # noqa: E402

# The key of the leaves' own dtypes in a dump (NumPy stores an ml_dtypes array as raw bytes).
DTYPES_KEY = "__dtypes__"


def stored_leaves(leaves: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """`leaves` as .npz holds them: a dtype NumPy does not know (bfloat16) as float32, exactly,
    with every leaf's own dtype under `DTYPES_KEY` ("leaf=dtype" strings)."""
    native = {k: v if v.dtype.isbuiltin == 1 else v.astype(np.float32) for k, v in leaves.items()}
    return {**native, DTYPES_KEY: np.array([f"{k}={v.dtype.name}" for k, v in leaves.items()])}


def load_leaves(path: pathlib.Path) -> dict[str, np.ndarray]:
    """A dump's leaves in their own dtypes (`stored_leaves` undone)."""
    with np.load(path) as stored:
        dtypes = dict(entry.split("=", 1) for entry in stored[DTYPES_KEY])
        # np.dtype knows "bfloat16" once ml_dtypes is imported (jax imports it).
        return {k: stored[k].astype(np.dtype(dtypes[k])) for k in stored.files if k != DTYPES_KEY}


def dump(impl, case, fixture, folder: pathlib.Path) -> dict:
    """Run `impl`'s program on `case` once, compiled for its devices as a parity run builds it
    (`paths.compile_placed`); save its leaves and its compiled HLO under `folder`."""
    placed = path_programs.compile_placed(path_programs.Path(impl), case, fixture)
    leaves = host_leaves(jax.block_until_ready(placed.compiled(*placed.args)))
    folder.mkdir(parents=True, exist_ok=True)
    np.savez(folder / f"{impl.name}.npz", **stored_leaves(leaves))
    (folder / f"{impl.name}.hlo.txt").write_text(placed.compiled.as_text())
    return {"case": case.name, "impl": impl.name, "leaves": sorted(leaves), "device": str(placed.placement.devices[0])}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", default="maxtext", help="the suite whose cases are selected")
    parser.add_argument("--cases", nargs="+", required=True, help="case-name globs")
    parser.add_argument("--impl", action="append", default=[], help="MODULE:FACTORY of more implementations")
    parser.add_argument("--paths", nargs="+", default=["reference"], help="implementation-name globs")
    parser.add_argument("--out", required=True, type=pathlib.Path)
    args = parser.parse_args(argv)
    impls = [*BUILTIN.values(), *(i for spec in args.impl for i in load_implementations(spec))]
    impls = [i for i in impls if any(fnmatch.fnmatch(i.name, g) for g in args.paths)]
    cases = [c for c in registry.select(suite=args.suite) if any(fnmatch.fnmatch(c.name, g) for g in args.cases)]
    if not (cases and impls):
        parser.error(f"nothing selected: {len(cases)} cases, {len(impls)} implementations")
    done = []
    for case in cases:
        fixture = make_fixture(case)
        for impl in impls:
            skip = impl.case_skip_reason(case) or impl.envelope_reason(case)
            if skip:
                done.append({"case": case.name, "impl": impl.name, "skip": skip})
                continue
            done.append(dump(impl, case, fixture, args.out / case.name))
            print(json.dumps(done[-1]), flush=True)
    environment = {"backend": jax.default_backend(), "jax": jax.__version__, "command": " ".join(sys.argv)}
    (args.out / "dumped.json").write_text(json.dumps({"environment": environment, "dumped": done}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
