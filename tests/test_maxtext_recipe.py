"""docs/maxtext.md's recipe "From MaxText's own pytest", run: a MaxText working tree whose own
pytest gates its mHC with this project's plugin.

The tree is made from the installed MaxText 0.2.5 package (`src/maxtext`, a minimal
pyproject). The recipe's two commands install a copy of this checkout and the tree, both
editable, into a scratch venv (`tests.scratch_venv`: this venv's packages but MaxText and
mhc-parity). Its
`pytest.ini` has MaxText's own lines that matter here (`--import-mode=importlib`,
`--strict-markers`, `*_test.py` under `tests/`), its `tests/conftest.py` starts JAX's backend
at import as MaxText's does, and the recipe's lines are added word for word from the doc.
The recipe's configuration collects its tests; one case, through the layer's reference path
with the upstream fixes (the quickest path the doc names), passes; then, with the tree's own
`res_mapping` computing in bfloat16 again (MaxText 0.2.5's residual-gate cast, made
independent of the dtype the fix gives it), the same run fails naming the leaf and its
cause: the code checked is the tree's.
"""

from __future__ import annotations

import importlib.util
import pathlib
import re
import shutil

import pytest

pytest.importorskip("maxtext")  # the `maxtext` extra, where it installs (docs/accelerators.md)

from tests import scratch_venv  # noqa: E402 - after the skip

pytestmark = pytest.mark.slow

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "maxtext.md"
SECTION = "## From MaxText's own pytest"
CASE = "lite-n4-c128-b2s128-bf16-w32-identity-bf16_inexact_gates-bt64-btb32"
QUICK = ("--parity-impl", "mhc_parity.maxtext_parity:layer_reference_fixed", "-k", CASE)
# The lines of MaxText's pytest.ini (its repository's root) that change how pytest loads a
# test module and its marks; the recipe's lines go below them.
MAXTEXT_PYTEST_INI = """[pytest]
testpaths =
    tests
python_files = *_test.py *_tests.py
addopts =
    -rf --import-mode=importlib --strict-markers
"""
# What MaxText's tests/conftest.py does at import that matters to the plugin: it asks JAX for
# its devices (to skip tpu_only and gpu_only tests), which starts JAX's backend.
MAXTEXT_CONFTEST = """import jax

_HAS_TPU = any(d.platform == "tpu" for d in jax.devices())
"""
PYPROJECT = """[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "maxtext"
version = "0.2.5"
requires-python = ">=3.12"

[tool.setuptools.packages.find]
where = ["src"]
"""


def recipe() -> tuple[list[str], list[str], str, str]:
    """The recipe's install commands, its ini lines, and its test module's path and text (its
    block's first line names the path), from the doc's SECTION."""
    text = DOC.read_text(encoding="utf-8").partition(SECTION + "\n")[2]
    assert text, f"docs/maxtext.md has no section {SECTION!r}"
    install = re.search(r"^```sh\n(.*?)^```", text, flags=re.M | re.S)
    ini = re.search(r"^```ini\n(.*?)^```", text, flags=re.M | re.S)
    module = re.search(r"^```python\n# (\S+)\n(.*?)^```", text, flags=re.M | re.S)
    assert install and ini and module, "the recipe's sh, ini and python blocks"
    return install.group(1).splitlines(), ini.group(1).splitlines(), module.group(1), module.group(2)


def maxtext_tree(folder: pathlib.Path) -> pathlib.Path:
    """A MaxText working tree in `folder`: the installed package's files as its src/maxtext,
    MaxText's pytest configuration with the recipe's lines, and the recipe's test module."""
    installed = pathlib.Path(importlib.util.find_spec("maxtext").origin).parent
    shutil.copytree(installed, folder / "src" / "maxtext", ignore=shutil.ignore_patterns("__pycache__"))
    (folder / "pyproject.toml").write_text(PYPROJECT)
    _, ini_lines, module_path, module_text = recipe()
    (folder / "pytest.ini").write_text(MAXTEXT_PYTEST_INI + "\n".join(ini_lines) + "\n")
    (folder / "tests").mkdir()
    (folder / "tests" / "conftest.py").write_text(MAXTEXT_CONFTEST)
    (folder / module_path).parent.mkdir(parents=True, exist_ok=True)
    (folder / module_path).write_text(module_text)
    return folder


def plant_residual_gate_cast(tree: pathlib.Path) -> None:
    """The tree's `res_mapping` with bfloat16 in place of the dtype it is given: its gate's
    scale, bias and weights rounded to bfloat16 whatever the layer's dtype (as released, it
    casts them to the compute dtype, which the fixed path makes float32)."""
    source = tree / "src" / "maxtext" / "layers" / "mhc.py"
    head, start, rest = source.read_text().partition("  def res_mapping(")
    body, end, tail = rest.partition("  def mapping(")
    assert start and end and body.count("self.dtype") == 4, "maxtext/layers/mhc.py's res_mapping as in 0.2.5"
    source.write_text(head + start + body.replace("self.dtype", "jnp.bfloat16") + end + tail)


def _output(proc) -> str:
    return proc.stdout[-6000:] + proc.stderr[-3000:]


def test_maxtext_s_own_pytest_gates_its_working_tree_with_the_recipe_s_lines(tmp_path):
    install, ini_lines, module_path, _ = recipe()
    assert ini_lines and all("=" in line for line in ini_lines) and module_path.endswith("_test.py")
    tree = maxtext_tree(tmp_path / "maxtext")
    venv = scratch_venv.create(tmp_path / "venv", replacing=("mhc-parity", "maxtext"))
    source = scratch_venv.source_copy(ROOT, tmp_path / "mhc-parity")
    for command in install:  # in the tree, MHC_PARITY the copy of this checkout
        installed = venv.run(command, tree, MHC_PARITY=str(source))
        assert installed.returncode == 0, command + installed.stdout[-3000:] + installed.stderr[-3000:]
    pytest_run = f"pytest -p no:cacheprovider {module_path} " + " ".join(QUICK)

    # The recipe's own implementation loads (the tree's code as it is; on 0.2.5 it fails).
    collected = venv.run(f"pytest -p no:cacheprovider --collect-only -q {module_path}", tree)
    assert collected.returncode == 0, _output(collected)
    assert f"{module_path}::test_mhc_parity[{CASE}::vs_oracle]" in collected.stdout, _output(collected)

    passed = venv.run(pytest_run, tree)
    assert passed.returncode == 0, _output(passed)
    # The case's vs_oracle and vs_reference tests, the suite's other cases deselected.
    assert re.search(r"=+ 2 passed, \d+ deselected in ", passed.stdout), _output(passed)

    plant_residual_gate_cast(tree)
    failed = venv.run(pytest_run, tree)
    assert failed.returncode == pytest.ExitCode.TESTS_FAILED, _output(failed)
    # One regression, seen by both comparisons: vs_oracle fails, vs_reference is skipped naming it.
    assert re.search(r"=+ 1 failed, 1 skipped, \d+ deselected in ", failed.stdout), _output(failed)
    assert f"{CASE}::vs_oracle: 1 leaf failed, seen by vs_oracle and vs_reference" in failed.stdout
    assert re.search(r"d_res_bias +maxtext-layer-reference-fixed/unsharded +vs_oracle +oracle +fail", failed.stdout)
    assert "the residual gate's scale and bias rounded to bfloat16" in failed.stdout
