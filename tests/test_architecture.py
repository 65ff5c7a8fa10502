"""The package's shape: its subpackages are the pipeline's stages, each importing only stages below it; its
modules import each other without cycles; none is over 500 lines; the IR and the table of operations have one
home each (docs/architecture.md)."""

import ast
import importlib
from pathlib import Path

import tritongrad

PACKAGE = Path(tritongrad.__file__).parent
# the stages, lowest first: a module may import its own stage and those before it
STAGES = ("core", "frontend", "analysis", "writes", "reverse", "tangent", "codegen", "runtime", "host", "ops", "tools",
          "examples")
MAX_LINES = 500


def _module(path: Path) -> str:
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """The package's modules a module imports, at module level or inside functions (dotted, from the package)."""
    here = _module(path).split(".") if path.name == "__init__.py" else _module(path).split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = here[:len(here) - (node.level - 1)] if node.level > 1 else here
            target = [*base, *node.module.split(".")] if node.module else base
            if node.module:
                found.add(".".join(target))
            else:
                found |= {".".join([*target, a.name]) for a in node.names}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tritongrad."):
            found.add(node.module.removeprefix("tritongrad."))
    return found


def _graph() -> dict[str, set[str]]:
    modules = {_module(p): p for p in PACKAGE.rglob("*.py") if p.name != "__init__.py" and "examples" not in p.parts}
    return {name: {m for m in _imports(path) if m in modules} for name, path in modules.items()}


def _stage(module: str) -> int:
    return len(STAGES) if module == "__main__" else STAGES.index(module.split(".")[0])


def test_the_stages_import_only_the_stages_below_them():
    for module, imported in _graph().items():
        for other in imported:
            assert _stage(other) <= _stage(module), f"{module} ({module.split('.')[0]}) imports {other}, a later stage"


def test_every_module_belongs_to_a_stage():
    loose = [p.name for p in PACKAGE.glob("*.py") if p.stem not in ("__init__", "__main__")]
    assert not loose, f"modules outside the stages' subpackages: {loose}"
    assert {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()} == set(STAGES)


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


def test_no_module_is_over_500_lines():
    long = {_module(p): n for p in PACKAGE.rglob("*.py") if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines: {long}"


def test_the_ir_and_the_operation_facts_have_one_home():
    defined: dict[str, list[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
                defined.setdefault(node.name, []).append(_module(path))
    for name in ("Op", "Origin", "Program", "Carried", "Tag", "op_of", "target_of", "arguments", "statements"):
        assert defined.get(name) == ["core.ir"], (name, defined.get(name))
    for name in ("Operation", "Signature", "operation_of"):
        assert defined.get(name) == ["core.operations"], (name, defined.get(name))


def test_the_docs_list_the_operation_table_as_it_is():
    from tritongrad.core.operations_doc import markdown_table

    page = (PACKAGE.parent / "docs" / "operations.md").read_text()
    begin, end = "<!-- operations:begin -->\n", "<!-- operations:end -->"
    assert page[page.index(begin) + len(begin):page.index(end)] == markdown_table(), (
        "docs/operations.md's operation table is stale: paste `python -m tritongrad.core.operations_doc` between its "
        "markers")


def test_no_module_shares_a_name_with_an_export():
    """Importing a submodule sets it as an attribute of the package: a module named like an export
    (``tritongrad.op``) would replace the exported function once something imports the module directly."""
    modules = {p.stem for p in PACKAGE.rglob("*.py")} | {p.name for p in PACKAGE.rglob("*") if p.is_dir()}
    assert not modules & set(tritongrad.__all__)
    importlib.import_module("tritongrad.examples.linear")  # imports the op's module directly
    assert callable(tritongrad.op) and callable(tritongrad.override)


def test_every_operation_has_a_shape_rule_or_is_unknown_on_purpose():
    from tritongrad.analysis.shapes import SHAPES, UNKNOWN
    from tritongrad.core.operations import OPERATIONS

    unplaced = {kind for kind, operation in OPERATIONS.items()
                if kind not in SHAPES and kind not in UNKNOWN and not operation.elementwise}
    assert not unplaced, f"add these kinds to analysis/shapes.py's SHAPES (or UNKNOWN): {sorted(unplaced)}"
    assert not (set(SHAPES) | UNKNOWN) - set(OPERATIONS) - {"subscript"}, "shape rules for kinds that do not exist"


def test_every_tg_helper_has_its_facts_in_the_table():
    """The passes over a derived kernel know a ``tg`` helper only by its HELPERS entry (core/language.py)."""
    from tritongrad.core import language

    tree = ast.parse(Path(language.__file__).read_text())
    defined = {n.name[1:] for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("_")
               and not n.name.startswith("__")}
    variants = {"interpreting", "tape_get_as_kept", *language._COMBINES}  # not helpers: used by the ones listed
    assert defined - variants == set(language.HELPERS)
    for name, helper in language.HELPERS.items():
        assert set(helper.calls) <= set(language.HELPERS), name


def test_every_operation_with_adjoints_has_a_tangent_or_says_why_not():
    """One table, both modes: forward mode reads an elementwise operation's adjoints as its tangent (a diagonal
    Jacobian), any other operation's ``tangents``; one without says what forward mode does not yet handle."""
    from tritongrad.core.operations import OPERATIONS

    missing = {kind for kind, operation in OPERATIONS.items() if operation.has_rule and not operation.elementwise
               and operation.tangents is None and not operation.no_tangent}
    assert not missing, f"give these kinds `tangents` (or `no_tangent`) in core/operations.py: {sorted(missing)}"
    assert not {kind for kind, o in OPERATIONS.items() if (o.tangents or o.no_tangent) and not o.has_rule}


KIND_COMPARISONS_AT_MOST = 38  # analyses ask the table's facts and registries, not kind strings


def _kind_comparisons() -> dict[str, int]:
    """Per module, the comparisons of an operation's kind with string literals (``op.kind == "add"``,
    ``kind in ("to", "cast")``) outside the table of operations."""
    def is_kind(e: ast.expr) -> bool:
        return (isinstance(e, ast.Attribute) and e.attr == "kind") or (isinstance(e, ast.Name) and e.id == "kind")

    def is_literal(e: ast.expr) -> bool:
        elts = e.elts if isinstance(e, (ast.Tuple, ast.List, ast.Set)) else [e]
        return bool(elts) and all(isinstance(x, ast.Constant) and isinstance(x.value, str) for x in elts)

    found: dict[str, int] = {}
    for path in PACKAGE.rglob("*.py"):
        if _module(path) == "core.operations":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare) and any(is_kind(e) for e in [node.left, *node.comparators]) and any(
                    is_literal(e) for e in [node.left, *node.comparators]):
                found[_module(path)] = found.get(_module(path), 0) + 1
    return found


def test_the_passes_ask_the_operation_table_rather_than_compare_kinds():
    """What a pass needs of an operation is a fact of its entry in core/operations.py, or its function in a
    registry keyed by kind (core/per_kind.py); a comparison with a kind's name is left only where the kind is
    the point (``item``, ``custom``)."""
    found = _kind_comparisons()
    assert sum(found.values()) <= KIND_COMPARISONS_AT_MOST, sorted(found.items(), key=lambda kv: -kv[1])


def test_every_operation_kind_has_a_function_in_each_registry_or_is_unknown_to_it():
    """A registry keyed by kind (core/per_kind.py) names the kinds it knows nothing of: a new operation in the
    table is then placed, or declared unknown, in each analysis that registers functions per kind."""
    from tritongrad.core.operations import OPERATIONS
    from tritongrad.core.per_kind import PerKind
    from tritongrad.runtime import derive  # noqa: F401 (the pipeline: every analysis's registry)

    assert PerKind.every
    for registry in PerKind.every:
        unplaced = set(OPERATIONS) - set(registry.rules) - registry.unknown
        assert not unplaced, f"register these kinds for {registry.job}, or declare them unknown: {sorted(unplaced)}"
        assert not registry.unknown - set(OPERATIONS), (registry.job, sorted(registry.unknown - set(OPERATIONS)))


def test_every_test_file_has_its_home_in_the_tests_readme():
    """tests/README.md says where each kind of test goes: a new file is listed there (by name or a pattern)."""
    import fnmatch
    import re

    tests = Path(__file__).parent
    readme = (tests / "README.md").read_text()
    listed = set(re.findall(r"`(test_[\w*]*\.py)`", readme))
    files = sorted(p.name for p in tests.glob("test_*.py"))
    unlisted = [f for f in files if not any(fnmatch.fnmatch(f, pattern) for pattern in listed)]
    assert not unlisted, f"not in tests/README.md: {unlisted}"


MODE_TESTS_AT_MOST = 0


def _mode_tests() -> dict[str, int]:
    """Per module outside writes/strategies.py, the uses of a write strategy's ``Mode`` (``c.mode == Mode.STORE``,
    ``Choice(Mode.ATOMIC)``)."""
    found: dict[str, int] = {}
    for path in PACKAGE.rglob("*.py"):
        if _module(path) == "writes.strategies":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "Mode":
                found[_module(path)] = found.get(_module(path), 0) + 1
    return found


def test_the_stages_ask_a_write_strategy_rather_than_test_its_mode():
    """A write strategy's choice, code, buffers and work after the kernel are its object's (writes/strategies.py:
    ``choice.strategy``'s fields and methods, ``Choice.atomic()``); the other stages ask it, so a new strategy is
    one class there, not a ``Mode`` test in each stage."""
    found = _mode_tests()
    assert sum(found.values()) <= MODE_TESTS_AT_MOST, sorted(found.items(), key=lambda kv: -kv[1])
