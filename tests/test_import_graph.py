"""The imports form a DAG, the packages are layered, and modules import at the top.

Layers (a package may import only the ones listed for it; docs/ARCHITECTURE.md), each a
subpackage of `mhc_parity` but `bench`:

    mhc      the system under test                      nothing of the project
    records  row schema, manifests, row stores (no JAX)  nothing of the project
    reports  the reports and the gate (no JAX)           records
    cases    cases, suites, fixtures                     mhc, records
    harness  the engine, the API, the command line       mhc, cases, records, reports
    bench    scripts                                     any

The namespace's own modules (`mhc_parity/__init__.py`, `mhc_parity/version.py`) import
nothing of the subpackages, and any package may import them.

Inside `harness`, the engine (`ENGINE`: what plans, computes, judges, stores and runs
processes) imports neither `reports` nor what sits above it (the API, the commands, the
pytest plugin); the API and the plugin import no command.

Every import counts, at a module's top or inside a function (`if TYPE_CHECKING:` blocks
do not: they never run). XLA reads its flags when the JAX backend starts, not when jax is
imported (mhc_parity.harness.env), so modules import at the top and importing them starts nothing.
"""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
NAMESPACE = "mhc_parity"
_SUBPACKAGES = {
    "mhc": set(),
    "records": set(),
    "reports": {"records"},
    "cases": {"mhc", "records"},
    "harness": {"mhc", "cases", "records", "reports"},
    "maxtext_parity": {"mhc", "cases", "records", "harness"},
}
# Package (module name) -> the packages it may import, besides the namespace's own modules.
LAYERS = {
    NAMESPACE: set(),
    **{f"{NAMESPACE}.{name}": {f"{NAMESPACE}.{below}" for below in imports} for name, imports in _SUBPACKAGES.items()},
    "bench": {f"{NAMESPACE}.{name}" for name in ("mhc", "cases", "records", "harness", "reports")},
}
ENGINE = (
    "mhc_parity.harness.engine",
    "mhc_parity.harness.judging",
    "mhc_parity.harness.processes",
    "mhc_parity.harness.faults",
    "mhc_parity.harness.env",
    "mhc_parity.harness.errors",
)
ABOVE_ENGINE = (
    "mhc_parity.reports",
    "mhc_parity.harness.api",
    "mhc_parity.harness.commands",
    "mhc_parity.harness.cli",
    "mhc_parity.harness.pytest_plugin",
    "mhc_parity.harness.plugin",
    "mhc_parity.harness",
)
COMMANDS = ("mhc_parity.harness.commands", "mhc_parity.harness.cli")
# The folders of `harness` that import each other both ways, and why: no other pair may (a
# store imports what it stores, so it sits beside it, not in a folder of its own).
FOLDER_LOOPS = {
    frozenset(("engine", "processes")): "the workers run the engine; the oracle's own process starts as a worker does",
}
# Function-level imports that stay, and why (module path, imported module).
DEFERRED_IMPORTS = {
    ("mhc_parity/mhc/layer.py", "mhc_parity.mhc.kernels"): "the reference path must not need Pallas",
    (
        "mhc_parity/harness/__init__.py",
        "mhc_parity.harness.api",
    ): "`mhc-parity gate|render` import the package, not JAX",
    (
        "mhc_parity/harness/commands/baseline.py",
        "mhc_parity.harness.commands.run",
    ): "`baseline --from` must not load JAX; `--impl` runs",
    (
        "mhc_parity/harness/commands/baseline.py",
        "mhc_parity.harness.engine.implementations",
    ): "as above: `--impl` loads the implementation",
    (
        "mhc_parity/harness/plugin/session.py",
        "mhc_parity.harness.api",
    ): "installed in every pytest run, off unless asked: no JAX",
    (
        "mhc_parity/harness/processes/watchdog.py",
        "mhc_parity.records.manifest",
    ): "a watchdog starts with each run; a stuck one needs it",
}


def project_modules() -> dict[str, pathlib.Path]:
    """Module name -> file of every module of the layered packages."""
    modules = {}
    for package in LAYERS:
        folder = ROOT.joinpath(*package.split("."))
        # The namespace's own modules are its top-level files; its folders are the subpackages.
        for path in sorted(folder.glob("*.py") if package == NAMESPACE else folder.rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            modules[name] = path
    return modules


def package_of(module: str) -> str:
    """The layer `module` belongs to: the innermost package of `LAYERS` holding it."""
    return max((p for p in LAYERS if module == p or module.startswith(p + ".")), key=len)


def _runtime_nodes(tree: ast.AST):
    """Every node of `tree` except those under an `if TYPE_CHECKING:` block."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            continue
        yield node
        yield from _runtime_nodes(node)


def imports_of(path: pathlib.Path, modules) -> list[tuple[str, bool]]:
    """(imported project module, at the top level?) for every runtime import in `path`."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    top = {id(node) for node in tree.body}
    found = []

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    for node in _runtime_nodes(tree):
        targets = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            targets = [f"{node.module}.{a.name}" for a in node.names]
        for target in targets:
            module = resolve(target)
            if module:
                found.append((module, id(node) in top))
    return found


def import_graph() -> dict[str, set[str]]:
    modules = project_modules()
    return {name: {m for m, _ in imports_of(path, modules) if m != name} for name, path in modules.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str]:
    """One import cycle as [a, b, ..., a], or [] when the graph is a DAG (depth-first search)."""
    state: dict[str, str] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str]:
        state[node], _ = "open", stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state:
                cycle = visit(nxt)
                if cycle:
                    return cycle
        state[node], _ = "done", stack.pop()
        return []

    for node in sorted(graph):
        if node not in state:
            cycle = visit(node)
            if cycle:
                return cycle
    return []


def test_the_cycle_finder_finds_cycles_and_accepts_a_dag():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) == []


def test_no_module_takes_part_in_an_import_cycle():
    cycle = find_cycle(import_graph())
    assert not cycle, "import cycle: " + " -> ".join(cycle)


def test_packages_import_only_the_layers_below_them():
    wrong = sorted(
        f"{module} imports {target}"
        for module, targets in import_graph().items()
        for target in targets
        if (package := package_of(module)) != (other := package_of(target))
        and other not in LAYERS[package] | {NAMESPACE}
    )
    assert not wrong, wrong


def _within(module: str, packages) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


def test_the_engine_imports_no_report_and_nothing_above_it():
    wrong = sorted(
        f"{module} imports {target}"
        for module, targets in import_graph().items()
        if _within(module, ENGINE)
        for target in targets
        if _within(target, ABOVE_ENGINE) and not _within(target, ENGINE)
    )
    assert not wrong, wrong


def harness_folder(module: str) -> str | None:
    """The folder of `harness` holding `module` (e.g. "engine"), None for one outside a folder."""
    parts = module.split(".")
    folder = pathlib.Path(ROOT, *parts[:3])
    return parts[2] if parts[:2] == [NAMESPACE, "harness"] and len(parts) > 2 and folder.is_dir() else None


def test_the_harness_folders_import_each_other_one_way():
    arrows = {
        (mine, theirs)
        for module, targets in import_graph().items()
        for target in targets
        if (mine := harness_folder(module)) and (theirs := harness_folder(target)) and mine != theirs
    }
    loops = {frozenset(arrow) for arrow in arrows if arrow[::-1] in arrows}
    assert loops == set(FOLDER_LOOPS), f"folders importing each other: {sorted(map(sorted, loops))}"


def test_the_api_and_the_plugin_import_no_command():
    wrong = sorted(
        f"{module} imports {target}"
        for module, targets in import_graph().items()
        if module in ("mhc_parity.harness.api", "mhc_parity.harness.pytest_plugin")
        or _within(module, ("mhc_parity.harness.plugin",))
        for target in targets
        if _within(target, COMMANDS)
    )
    assert not wrong, wrong


def test_modules_import_at_the_top():
    modules = project_modules()
    deferred = sorted(
        (path.relative_to(ROOT).as_posix(), module)
        for name, path in modules.items()
        for module, at_top in imports_of(path, modules)
        if not at_top
    )
    unexplained = [entry for entry in deferred if entry not in DEFERRED_IMPORTS]
    assert not unexplained, f"imports inside functions: {unexplained} (import at the top, see mhc_parity.harness.env)"
    assert set(deferred) == set(DEFERRED_IMPORTS), "DEFERRED_IMPORTS names an import that is gone"


@pytest.mark.slow
def test_importing_every_module_starts_no_jax_backend():
    """So any entry point may set the XLA flags after its imports (mhc_parity.harness.env)."""
    names = sorted(name for name in project_modules() if not name.endswith("__main__") and not name.startswith("bench"))
    code = (
        "import importlib, os, sys\n"
        "os.environ.pop('XLA_FLAGS', None)\n"
        f"for name in {names!r}:\n"
        "    importlib.import_module(name)\n"
        "from mhc_parity.harness.env import backend_started\n"
        "assert 'jax' in sys.modules and not backend_started(), 'a module started the JAX backend on import'\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
