"""Symbolic shapes of a program's values (``("BLOCK",)``), as far as they can be read: used to leave out an
``unbroadcast`` whose operand provably has the result's shape, and by the analyses that need a tile's rank."""

from __future__ import annotations

import ast

from ..core.errors import NotDifferentiableError
from ..core.ir import (
    SCALAR_BUILTINS,
    Program,
    arguments,
    definitions,
    expanded,
    op_of,
    statements,
    structured,
    target_of,
)
from ..core.operations import LOADS, OPERATIONS
from ..core.source import triton_language_name

Shape = tuple[str, ...] | None  # None: unknown



def infer_shapes(program: Program, tile: bool = False) -> dict[str, Shape]:
    # a kernel's parameters are scalars and pointers; a tile function's are tiles of unknown shape
    shapes: dict[str, Shape] = {p: None if tile else () for p in program.param_names()}
    defined = set(definitions(program.body))

    def of(atom: ast.expr) -> Shape:
        if isinstance(atom, ast.Name):
            if atom.id not in shapes and atom.id not in defined:
                return ()  # a global the kernel reads: a compile-time value (`SQRT_2_OVER_PI = tl.constexpr(...)`)
            return shapes.get(atom.id)
        if isinstance(atom, ast.Constant) or (isinstance(atom, ast.Call) and isinstance(atom.func, ast.Name)
                                              and atom.func.id == "float"):  # -float("inf")
            return ()
        if isinstance(atom, ast.UnaryOp):
            return of(atom.operand)
        if isinstance(atom, ast.Call) and isinstance(atom.func, ast.Name) and atom.func.id in SCALAR_BUILTINS:
            shapes_of = [of(a) for a in atom.args]  # `min(a, b)` of scalars
            return () if all(s == () for s in shapes_of) else None
        return None

    # Triton keeps a loop-carried variable's type, and a runtime if's outputs have one type: their first
    # known shape holds. A constexpr if's branches may differ: their definitions must agree.
    fixed: set[str] = set()
    canonical = _canonical_extents(program)
    for node in structured(program.body):
        if isinstance(node, ast.For):
            shapes[node.target.id] = ()
            fixed |= {c.name for c in node.tg.carried}
        elif not node.tg.static:
            fixed |= set(node.tg.merges)
    for s in statements(program.body):
        t = target_of(s)
        if t is None:
            continue
        try:
            shape = _shape_of(s, of)
        except (ValueError, TypeError, IndexError, KeyError, ZeroDivisionError, NotDifferentiableError):
            shape = None  # shapes only let codegen leave out an unbroadcast: unknown is always safe
        if shape is not None:
            shape = tuple(canonical(d) for d in shape)
        if t not in shapes or (t in fixed and shapes[t] is None):
            shapes[t] = shape
        elif t not in fixed and shapes[t] != shape:
            shapes[t] = None
    return shapes


def _canonical_extents(program: Program):
    """An extent named by a temporary (``pad_rd // 2``, which the frontend names once per use) as the expression
    of the parameters it is computed from, so that two tiles of one extent have one shape; extents computed from
    anything else (a loop's values) stay as written."""
    defs = definitions(program.body)
    params = set(program.param_names())

    def canonical(dim: str) -> str:
        if not dim.isidentifier() or dim in params or len(defs.get(dim, [])) != 1:
            return dim
        tree = expanded(ast.Name(dim, ast.Load()), defs)
        names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
        return ast.unparse(tree) if names <= params else dim

    return canonical


def _dims(atom: ast.expr) -> Shape:
    if isinstance(atom, (ast.Tuple, ast.List)):
        if len(atom.elts) == 1 and isinstance(atom.elts[0], (ast.Tuple, ast.List)):
            return _dims(atom.elts[0])
        return tuple(ast.unparse(e) for e in atom.elts)
    return None


def broadcast(*shapes: Shape) -> Shape:
    if any(s is None for s in shapes):
        return None
    rank = max(len(s) for s in shapes)
    out = []
    for i in range(rank):
        dims = {s[i - rank + len(s)] for s in shapes if i - rank + len(s) >= 0} - {"1"}
        out.append(sorted(dims)[0] if dims else "1")
    return tuple(out)


def _shape_of(stmt: ast.stmt, of) -> Shape:
    op = op_of(stmt)
    rule = SHAPES.get(op.kind)
    if rule is None:
        elementwise = op.kind in OPERATIONS and OPERATIONS[op.kind].elementwise  # (not a custom rule's: its helper
        return _broadcast_operands(op, arguments(stmt), of) if elementwise else None  # may reduce)
    return rule(op, arguments(stmt), of)


# -- the table: per operation kind, its result's shape from its arguments' (``op``: the Op, ``b``: its arguments by
# parameter name, ``of``: an argument's shape). A kind without an entry: its operands broadcast together if it is
# elementwise, else unknown (``UNKNOWN`` lists those on purpose; tests/test_architecture.py checks every kind is
# in one or the other).

def _scalar(op, b, of) -> Shape:
    return ()


def _arange(op, b, of) -> Shape:
    start, end = op.args[0], op.args[1]
    if isinstance(start, ast.Constant) and start.value == 0:
        return (ast.unparse(end),)
    return (f"{ast.unparse(end)} - {ast.unparse(start)}",)


def _filled(op, b, of) -> Shape:
    return _dims(op.args[0] if op.args else op.kwargs.get("shape"))


def _subscript(op, b, of) -> Shape:
    x = of(b["input"])
    index = op.kwargs["index"]
    parts = index.elts if isinstance(index, ast.Tuple) else [index]
    if x is None:
        return None
    out, i = [], 0
    for p in parts:
        if isinstance(p, ast.Constant):
            out.append("1")
        else:
            out.append(x[i])
            i += 1
    return tuple(out) + x[i:]


def _expand_dims(op, b, of) -> Shape:
    x, axis = of(b["input"]), ast.literal_eval(b["axis"])
    axes = axis if isinstance(axis, (tuple, list)) else (axis,)
    out = list(x)
    for a in axes:
        out.insert(a if a >= 0 else len(out) + 1 + a, "1")
    return tuple(out)


def _permuted(op, b, of) -> Shape:
    x = of(b["input"])
    dims = b["dims"].elts if isinstance(b["dims"], ast.Tuple) else []
    if len(dims) == 1 and isinstance(dims[0], (ast.Tuple, ast.List)):
        dims = dims[0].elts
    order = [ast.literal_eval(d) for d in dims] or list(reversed(range(len(x))))
    return tuple(x[i] for i in order)


def _reduced(op, b, of) -> Shape:
    x, axis = of(op.args[0]), ast.literal_eval(b.get("axis", ast.Constant(None)))
    keep = ast.literal_eval(b.get("keep_dims", ast.Constant(False)))
    if axis is None:  # tl.reduce flattens first; tl.sum and friends keep the rank
        flattened = triton_language_name(op.func, None) == "reduce"
        return (("1",) if flattened else tuple("1" for _ in x)) if keep else ()
    axis = axis % len(x)
    return tuple("1" if i == axis else d for i, d in enumerate(x)) if keep else x[:axis] + x[axis + 1:]


def _broadcast_operands(op, b, of) -> Shape:
    return broadcast(*[of(a) for a in op.args if not isinstance(a, (ast.Tuple, ast.List))])


SHAPES: dict = {
    **dict.fromkeys(("program_id", "num_programs", "cdiv"), _scalar),
    "arange": _arange,
    **dict.fromkeys(("zeros", "full"), _filled),
    **dict.fromkeys(LOADS, lambda op, b, of: of(b["pointer"])),
    "make_tensor_descriptor": lambda op, b, of: _dims(b["block_shape"]),
    "subscript": _subscript,
    "expand_dims": _expand_dims,
    **dict.fromkeys(("reshape", "view", "broadcast_to"), lambda op, b, of: _dims(b["shape"])),
    **dict.fromkeys(("trans", "permute"), _permuted),
    **dict.fromkeys(("sum", "max", "min", "argmax", "argmin"), _reduced),
    "dot": lambda op, b, of: of(b["input"])[:-1] + of(b["other"])[-1:],
    **dict.fromkeys(("to", "cast", "cumsum", "cumprod"), lambda op, b, of: of(b["input"])),
    "softmax": lambda op, b, of: of(b["x"]),
    **dict.fromkeys(("copy", "neg", "pos", "not_", "invert"), _broadcast_operands),
}
# kinds whose result's shape is not read (several results, memory effects, constants of no tile, refused
# operations): their shape is unknown, which is always safe
UNKNOWN = frozenset({
    "item", "linear_scan", "split", "join", "zeros_like", "rand", "randn", "randint", "rand4x", "randn4x",
    "randint4x", "umulhi", "multiple_of", "max_contiguous", "max_constancy", "floor", "ceil", "static_assert",
    "device_assert", "static_print", "device_print", "debug_barrier", "print", "store", "atomic_add", "atomic_max",
    "atomic_min", "atomic_and", "atomic_or", "atomic_xor", "atomic_xchg", "atomic_cas", "desc_store",
    "desc_atomic_add", "is_", "is_not", "in_", "not_in", "boolop", "ifexp", "xor_sum", "reduce",
})
