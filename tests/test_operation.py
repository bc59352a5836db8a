"""The seam between the engine and the operation under test (mhc_parity.harness.engine.operation).

The mHC layer serves the interface from `mhc_parity.mhc.operation`; the engine, the judging, the
stores, the processes, the records and the reports name none of its leaves or weights
(outside docstrings and comments), so what is mHC-specific has one home.
"""

from __future__ import annotations

import ast
import pathlib
import types

import numpy as np
import pytest

from mhc_parity.cases.catalogue import make_case
from mhc_parity.cases.fixtures import make_fixture
from mhc_parity.harness.engine.leaves import FORWARD_LEAVES, INTERMEDIATE_LEAVES, leaf_kind
from mhc_parity.harness.engine.operation import OPERATION, Operation
from mhc_parity.harness.engine.oracle_path import run_oracle_path
from mhc_parity.mhc.types import WEIGHT_FIELDS

ROOT = pathlib.Path(__file__).resolve().parent.parent
# The code that must not know the operation: every module of these folders.
OPERATION_FREE = (
    "mhc_parity/harness/engine",
    "mhc_parity/harness/judging",
    "mhc_parity/harness/processes",
    "mhc_parity/records",
    "mhc_parity/reports",
)
# A hand-made row set for tests, made to look like a real run's rows.
SAMPLE_DATA = {"mhc_parity/reports/samples.py"}
MHC_NAMES = (
    {"h_pre", "h_post", "h_res", "layer_input", "MhcWeights", "MhcConfig", "MhcContext"}
    | {"ManifoldConstrainedHyperConnections"}
    | set(WEIGHT_FIELDS)
)


def test_the_mhc_layer_serves_the_operation_interface():
    assert isinstance(OPERATION, Operation)
    missing = types.SimpleNamespace(**{name: getattr(OPERATION, name) for name in ("NAME", "FORWARD_LEAVES")})
    assert not isinstance(missing, Operation), "control: an object without the interface is refused"


def test_leaf_names_and_kinds_come_from_the_operation():
    assert FORWARD_LEAVES == OPERATION.FORWARD_LEAVES and FORWARD_LEAVES[0] == "out"
    assert [leaf_kind(leaf) for leaf in FORWARD_LEAVES] == ["output"] + ["intermediate"] * len(INTERMEDIATE_LEAVES)
    kinds = {name: leaf_kind(f"d_{name}") for name in OPERATION.WEIGHT_NAMES}
    assert {kinds[n] for n in ("pre_scale", "post_scale", "res_scale")} == {"scale_grad"}
    assert kinds["norm_scale"] == "weight_grad", "the norm scale multiplies each channel: a weight"
    with pytest.raises(KeyError, match="unknown leaf"):
        leaf_kind("d_not_a_weight")
    dtypes = OPERATION.forward_leaf_dtypes("bfloat16")
    assert dtypes["out"] == dtypes["layer_input"] == "bfloat16" and dtypes["h_res"] == "float32"


def test_the_oracle_path_names_every_leaf_a_path_produces():
    case = make_case(batch=1, sequence=4, streams=2, embedding=32, branch="mlp", seed=3)
    outputs = run_oracle_path(case, make_fixture(case))
    assert set(FORWARD_LEAVES) | {"d_x"} <= set(outputs.leaves)
    assert {f"d_{name}" for name in OPERATION.WEIGHT_NAMES} <= set(outputs.leaves)
    assert any(leaf.startswith("d_branch.") for leaf in outputs.leaves)
    assert all(value.dtype == np.float64 for value in outputs.leaves.values())


def _named_in_code(path: pathlib.Path, root: pathlib.Path = ROOT) -> list[str]:
    """The mHC names `path` uses in code or string literals (its docstrings left out)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and ast.get_docstring(node, clean=False) is not None
    }
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            found += [f"{path.relative_to(root)}:{node.lineno} {name!r}" for name in MHC_NAMES if name in node.value]
        elif isinstance(node, ast.Name) and node.id in MHC_NAMES:
            found.append(f"{path.relative_to(root)}:{node.lineno} {node.id}")
        elif isinstance(node, ast.Attribute) and node.attr in MHC_NAMES:
            found.append(f"{path.relative_to(root)}:{node.lineno} .{node.attr}")
    return found


def test_the_engine_judging_stores_records_and_reports_name_no_mhc_leaf_or_weight():
    files = [p for folder in OPERATION_FREE for p in sorted((ROOT / folder).rglob("*.py"))]
    assert len(files) > 40, "control: the folders were read"
    found = [hit for p in files if p.relative_to(ROOT).as_posix() not in SAMPLE_DATA for hit in _named_in_code(p)]
    assert not found, f"mHC names outside the operation (mhc_parity.harness.engine.operation is the seam): {found}"


def test_the_name_finder_sees_a_name_in_code(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text('"""h_pre in a docstring is fine."""\nLEAF = "h_pre"\nweights.pre_scale\n', encoding="utf-8")
    assert _named_in_code(probe, tmp_path) == ["probe.py:2 'h_pre'", "probe.py:3 .pre_scale"]
