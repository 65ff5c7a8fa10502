"""Symbolic shapes of a program's values (``("BLOCK",)``), as far as they can be read: used to leave out an
``unbroadcast`` whose operand provably has the result's shape, and by the analyses that need a tile's rank."""

from __future__ import annotations

import ast

from ..core.errors import NotDifferentiableError
from ..core.ir import (
    Program,
    arguments,
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

    def of(atom: ast.expr) -> Shape:
        if isinstance(atom, ast.Name):
            return shapes.get(atom.id)
        if isinstance(atom, ast.Constant) or (isinstance(atom, ast.Call) and isinstance(atom.func, ast.Name)
                                              and atom.func.id == "float"):  # -float("inf")
            return ()
        if isinstance(atom, ast.UnaryOp):
            return of(atom.operand)
        return None

    # Triton keeps a loop-carried variable's type, and a runtime if's outputs have one type: their first
    # known shape holds. A constexpr if's branches may differ: their definitions must agree.
    fixed: set[str] = set()
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
        if t not in shapes or (t in fixed and shapes[t] is None):
            shapes[t] = shape
        elif t not in fixed and shapes[t] != shape:
            shapes[t] = None
    return shapes


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
    kind = op.kind
    b = arguments(stmt)
    if kind in ("program_id", "num_programs", "cdiv"):
        return ()
    if kind == "arange":
        start, end = op.args[0], op.args[1]
        if isinstance(start, ast.Constant) and start.value == 0:
            return (ast.unparse(end),)
        return (f"{ast.unparse(end)} - {ast.unparse(start)}",)
    if kind in ("zeros", "full"):
        return _dims(op.args[0] if op.args else op.kwargs.get("shape"))
    if kind in LOADS:
        return of(b["pointer"])
    if kind == "make_tensor_descriptor":
        return _dims(b["block_shape"])
    if kind == "subscript":
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
    if kind == "expand_dims":
        x, axis = of(b["input"]), ast.literal_eval(b["axis"])
        axes = axis if isinstance(axis, (tuple, list)) else (axis,)
        out = list(x)
        for a in axes:
            out.insert(a if a >= 0 else len(out) + 1 + a, "1")
        return tuple(out)
    if kind in ("reshape", "view", "broadcast_to"):
        return _dims(b["shape"])
    if kind in ("trans", "permute"):
        x = of(b["input"])
        dims = b["dims"].elts if isinstance(b["dims"], ast.Tuple) else []
        if len(dims) == 1 and isinstance(dims[0], (ast.Tuple, ast.List)):
            dims = dims[0].elts
        order = [ast.literal_eval(d) for d in dims] or list(reversed(range(len(x))))
        return tuple(x[i] for i in order)
    if kind in ("sum", "max", "min", "argmax", "argmin"):
        x, axis = of(op.args[0]), ast.literal_eval(b.get("axis", ast.Constant(None)))
        keep = ast.literal_eval(b.get("keep_dims", ast.Constant(False)))
        if axis is None:  # tl.reduce flattens first; tl.sum and friends keep the rank
            flattened = triton_language_name(op.func, None) == "reduce"
            return (("1",) if flattened else tuple("1" for _ in x)) if keep else ()
        axis = axis % len(x)
        return tuple("1" if i == axis else d for i, d in enumerate(x)) if keep else x[:axis] + x[axis + 1:]
    if kind == "dot":
        x, y = of(b["input"]), of(b["other"])
        return x[:-1] + y[-1:]
    if kind in ("to", "cast", "cumsum", "cumprod"):
        return of(b["input"])
    if kind == "softmax":
        return of(b["x"])
    if kind in ("copy", "neg", "pos", "not_", "invert") or (
            kind in OPERATIONS and OPERATIONS[kind].elementwise):  # not a custom rule's: its helper may reduce
        return broadcast(*[of(a) for a in op.args if not isinstance(a, (ast.Tuple, ast.List))])
    return None
