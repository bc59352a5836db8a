"""The README as a newcomer meets it, and the word lists it sends them to, pinned to the code.

The README opens with what the tool does and its two commands (first 25 lines), then the one
command after a kernel edit with its measured time, then how to reach the command line in a
new shell, and stays under 15 KB. docs/glossary.md's Terms name every verdict; docs/rows.md's
"Reading rows.csv" lists every comparison and every leaf name a row can hold (from the
operation's leaves, the branches' parameters and the lowered programs), and its "Cases and
their names" reads a case name as `mhc_parity.cases.spec.standard_name` builds it: every
built-in case's name is decoded by that grammar back to its spec, and the examples' words
match their specs.
"""

from __future__ import annotations

import ast
import re

from mhc_parity.cases import registry
from mhc_parity.cases.branches import BRANCHES
from mhc_parity.cases.spec import BRANCH_NAMES, INIT_FAMILY_NAMES, mesh_label
from mhc_parity.harness.engine.leaves import branch_leaf, weight_leaf
from mhc_parity.harness.engine.operation import OPERATION
from mhc_parity.mhc.kernels.lowering import PROGRAMS
from mhc_parity.records.schema import COMPARISONS, VERDICTS
from tests.cli_support import ROOT

README = (ROOT / "README.md").read_text(encoding="utf-8")
# The terms and the row and case-name reference, moved out of the README (issue 68).
GLOSSARY = (ROOT / "docs" / "glossary.md").read_text(encoding="utf-8")
ROWS = (ROOT / "docs" / "rows.md").read_text(encoding="utf-8")
# What a row about a whole path, not one of its leaves, has as its leaf (mhc_parity.harness.engine.compare.status_row).
WHOLE_PATH_LEAF = "*"
# The program names of an implementation that lowers its own kernels (mhc_parity.maxtext_parity.lowering: ENTRY).
MAXTEXT_ENTRY = "mhc_kernels_fwd"


def section(title: str, text: str = README) -> str:
    """The `## title` section of `text` (default the README), up to the next `## ` heading."""
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, flags=re.M | re.S)
    assert match, f"no '## {title}' section"
    return match.group(1)


def quoted(text: str) -> set[str]:
    """Everything `text` puts in backticks."""
    return set(re.findall(r"`([^`\n]+)`", text))


def emitted_leaves() -> set[str]:
    """Every leaf name a row can hold: the operation's forward leaves, the gradients of the
    input, of each weight and of each branch's parameters, the kernel programs of a lowering
    row (this project's and MaxText's), and a whole path's `*`."""
    branch_params = {param for branch in BRANCHES.values() for param in branch.param_shapes(128)}
    return {
        *OPERATION.FORWARD_LEAVES,
        "d_x",
        *(weight_leaf(name) for name in OPERATION.WEIGHT_NAMES),
        *(branch_leaf(param) for param in branch_params),
        *PROGRAMS,
        *(f"{program} ({MAXTEXT_ENTRY})" for program in PROGRAMS),
        WHOLE_PATH_LEAF,
    }


def test_the_readme_opens_with_what_it_does_and_both_commands_then_the_edit_loop_then_a_new_shell():
    """Reproduction (issue 68): 35 lines of terms came before the first command; no edit loop;
    nothing said how to reach the command line in a new shell; 14.3 KB and growing."""
    first = "\n".join(README.splitlines()[:25])
    assert "mhc-parity tells you whether" in first and "float64 oracle" in first
    assert re.search(r"^make parity\b", first, re.M) and re.search(r"^make test\b", first, re.M)
    assert len(README.encode("utf-8")) < 15_000
    titles = re.findall(r"^## (.+)$", README, flags=re.M)
    assert titles[:3] == ["The two commands", "After a kernel edit", "In a new shell"], titles
    loop = section("After a kernel edit")
    (command,) = code_lines(loop)
    assert command.startswith("make smoke ") and re.search(r"\b\d+ s after an\s+edit", loop)
    assert "--only-current-cases" in loop  # what gates it on the matching baseline rows
    shell = " ".join(code_lines(section("In a new shell")))
    assert ". .venv/bin/activate" in shell and ".venv/bin/mhc-parity" in shell
    assert "## Terms" not in README and "## Reading rows.csv" not in README


def code_lines(text: str) -> list[str]:
    """The lines of `text`'s fenced code blocks."""
    return [
        line for block in re.findall(r"^```[^\n]*\n(.*?)^```", text, flags=re.M | re.S) for line in block.splitlines()
    ]


def test_maxtext_s_program_names_are_those_the_readme_lists():
    """mhc_parity.maxtext_parity.lowering's ENTRY, read from its source (importing it imports MaxText)."""
    tree = ast.parse((ROOT / "mhc_parity" / "maxtext_parity" / "lowering.py").read_text(encoding="utf-8"))
    entries = [
        node.value.value
        for node in tree.body
        if isinstance(node, ast.Assign) and [ast.unparse(t) for t in node.targets] == ["ENTRY"]
    ]
    assert entries == [MAXTEXT_ENTRY]


def test_the_readme_lists_every_leaf_a_row_can_hold():
    missing = emitted_leaves() - quoted(section("Reading rows.csv", ROWS))
    assert not missing, f"leaves the README's 'Reading rows.csv' does not list: {sorted(missing)}"


def test_the_readme_describes_every_comparison():
    text = section("Reading rows.csv", ROWS)
    described = set(re.findall(r"^- `([a-z_]+)`:", text, flags=re.M)) & set(COMPARISONS)
    assert described == set(COMPARISONS)
    assert f"one of {['', 'one', 'two', 'three', 'four', 'five'][len(COMPARISONS)]}" in text
    assert {"allowed_error", "bound_metric", "bound_usage"} <= quoted(text)


def test_the_readme_s_terms_name_every_verdict_and_term():
    text = section("Terms", GLOSSARY)
    assert set(VERDICTS) <= quoted(text)
    terms = ("Leaf", "partner", "Envelope", "Mosaic", "explained skip", "Noise floor", "bound usage", "Sensitivity")
    for term in terms:
        assert f"**{term}**" in text, term


# ---------------------------------------------------------------------------- case names

# The README's grammar of a case name ("Cases and their names"), part by part.
_NAME = re.compile(
    r"(?P<variant>lite|sinkhorn)-n(?P<streams>\d+)-c(?P<embedding>\d+)-b(?P<batch>\d+)s(?P<sequence>\d+)"
    r"-(?P<dtype>f32|bf16)-(?P<weight_dtype>w32|wbf16)-(?P<branch>[a-z]+)-(?P<init>[a-z0-9_]+)"
    r"(?:-m(?P<mesh_data>\d+)x(?P<mesh_fsdp>\d+))?(?:-bt(?P<block_tokens>\d+))?(?:-btb(?P<block_tokens_bwd>\d+))?"
    r"(?:-bf(?P<block_features>\d+))?(?:-s(?P<seed>\d+))?(?:-matmul_(?P<matmul_precision>[a-z]+))?"
)
_DTYPES = {"f32": "float32", "bf16": "bfloat16", "w32": "float32", "wbf16": "bfloat16"}
# The README's spelling of each optional part.
_OPTIONAL_PARTS = ("m<data>x<fsdp>", "bt<n>", "btb<n>", "bf<n>", "s<seed>", "matmul_default")


def decode(name: str) -> dict:
    """A built-in case's fields read from its name by the README's grammar."""
    match = _NAME.fullmatch(name)
    assert match, f"{name!r} does not read by the README's grammar"
    part = match.groupdict()

    def number(key):
        return None if part[key] is None else int(part[key])

    return {
        "variant": part["variant"],
        "streams": int(part["streams"]),
        "embedding": int(part["embedding"]),
        "batch": int(part["batch"]),
        "sequence": int(part["sequence"]),
        "dtype": _DTYPES[part["dtype"]],
        "weight_dtype": _DTYPES[part["weight_dtype"]],
        "branch": part["branch"],
        "init": part["init"],
        "mesh": None if part["mesh_data"] is None else (int(part["mesh_data"]), int(part["mesh_fsdp"])),
        "block_tokens": number("block_tokens"),
        "block_tokens_bwd": number("block_tokens_bwd"),
        "block_features": number("block_features"),
        "seed": number("seed") or 0,
        "matmul_precision": part["matmul_precision"] or "highest",
    }


def _built_in_cases():
    cases = registry.default_registry()
    return {case.name: case for suite in cases.suites() for case in cases.suite(suite)}


def test_every_built_in_case_name_reads_back_to_its_spec():
    cases = _built_in_cases()
    assert len(cases) > 50
    for name, case in cases.items():
        decoded = decode(name)
        assert decoded == {key: getattr(case, key) for key in decoded}, name


def test_the_readme_spells_every_part_of_a_case_name():
    text = quoted(section("Cases and their names", ROWS))
    assert {"lite", "sinkhorn", "n<streams>", "c<embedding>", "b<batch>s<sequence>"} <= text
    assert set(_DTYPES) | set(BRANCH_NAMES) | set(INIT_FAMILY_NAMES) | set(_OPTIONAL_PARTS) <= text


def _described(case) -> list[str]:
    """Words the README's reading of `case` must contain (its example list)."""
    words = [f"batch {case.batch} × sequence {case.sequence}"]
    if case.mesh is not None:
        words += [f"{case.mesh[0]} × {case.mesh[1]} mesh", f"`{mesh_label(case.mesh)}`"]
    if case.block_tokens is not None:
        words.append(f"token blocks of {case.block_tokens}")
    return words


def test_the_readme_s_example_names_read_as_their_specs():
    examples = re.findall(
        r"^- `([^`]+)`: (.*?)(?=^- |^\n|\Z)", section("Cases and their names", ROWS), flags=re.M | re.S
    )
    assert len(examples) >= 2
    first = registry.get(examples[0][0])
    text = " ".join(examples[0][1].split())
    assert f"{first.streams} streams of {first.embedding} features" in text
    assert f"{first.dtype} activations and weights" in text and f"the {first.branch} branch" in text
    for name, reading in examples:
        case = registry.get(name)
        assert decode(name) == {key: getattr(case, key) for key in decode(name)}
        for words in _described(case):
            assert words in " ".join(reading.split()), (name, words)
