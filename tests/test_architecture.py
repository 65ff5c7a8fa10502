"""The package's shape: its modules import each other without cycles, and the IR and the table of
operations have one home each (docs/architecture.md)."""

import ast
import importlib
from pathlib import Path

import tritongrad

PACKAGE = Path(tritongrad.__file__).parent


def _imports(path: Path) -> set[str]:
    """The package's modules a module imports, at module level or inside functions."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            if node.module:
                found.add(node.module.split(".")[0])
            else:
                found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tritongrad."):
            found.add(node.module.split(".")[1])
    return found


def _graph() -> dict[str, set[str]]:
    modules = {p.stem: p for p in PACKAGE.glob("*.py") if p.stem != "__init__"}
    return {name: _imports(path) & set(modules) for name, path in modules.items()}


def test_the_module_imports_are_acyclic():
    graph = _graph()
    state: dict[str, str] = {}

    def visit(module: str, path: list[str]) -> None:
        if state.get(module) == "done":
            return
        assert state.get(module) != "open", f"import cycle: {' -> '.join([*path, module])}"
        state[module] = "open"
        for imported in sorted(graph[module]):
            visit(imported, [*path, module])
        state[module] = "done"

    for module in sorted(graph):
        visit(module, [])


def test_the_ir_and_the_operation_facts_have_one_home():
    defined: dict[str, list[str]] = {}
    for path in PACKAGE.glob("*.py"):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
                defined.setdefault(node.name, []).append(path.stem)
    for name in ("Op", "Origin", "Program", "Carried", "Tag", "op_of", "target_of", "arguments", "statements"):
        assert defined.get(name) == ["ir"], (name, defined.get(name))
    for name in ("Operation", "Signature", "operation_of"):
        assert defined.get(name) == ["operations"], (name, defined.get(name))


def test_the_readme_lists_the_operation_table_as_it_is():
    from tritongrad.operations import markdown_table

    readme = (PACKAGE.parent / "README.md").read_text()
    begin, end = "<!-- operations:begin -->\n", "<!-- operations:end -->"
    assert readme[readme.index(begin) + len(begin):readme.index(end)] == markdown_table(), (
        "README.md's operation table is stale: paste `python -m tritongrad.operations` between its markers")


def test_no_module_shares_a_name_with_an_export():
    """Importing a submodule sets it as an attribute of the package: a module named like an export
    (``tritongrad.op``) would replace the exported function once something imports the module directly."""
    modules = {p.stem for p in PACKAGE.glob("*.py")} | {p.name for p in PACKAGE.iterdir() if p.is_dir()}
    assert not modules & set(tritongrad.__all__)
    importlib.import_module("tritongrad.examples.linear")  # imports the op's module directly
    assert callable(tritongrad.op) and callable(tritongrad.override)
