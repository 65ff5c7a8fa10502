"""A kernel's integer scalars as expressions a launch evaluates: ``scalar_expr`` (integer math on the parameters and the
grid), ``program_expr`` (also on the program ids: a value each program computes, a swizzle's), ``divisor_text`` (an
index split's divisor); and ``starts_at_zero``, whether an integer tile counts from zero (what makes a split's digits
stand for the index)."""

from __future__ import annotations

import ast

from ..core.ir import axis_of, canonical_atom, op_of, range_bounds
from ..core.operations import operation_of
from .launch_values import Expr


def program_expr(name: str, defs: dict[str, list[ast.stmt]], params: frozenset[str]) -> Expr | None:
    """A scalar as an expression over the program ids, the grid and the kernel's parameters (None: it reads
    something else, a loaded value, a loop's index)."""
    ids = {n: axis_of(op_of(d)) for n, ds in defs.items() for d in ds
           if not isinstance(d, ast.For) and op_of(d).kind == "program_id" and len(ds) == 1}

    def expand(n: str) -> Expr | None:
        if n in ids:
            return Expr("program_id", (ids[n],)) if ids[n] is not None else None
        found = scalar_expr(ast.Name(n), defs)
        return None if n in params or found == Expr.name(n) else found

    value = scalar_expr(ast.Name(name), defs)
    for _ in range(16):
        more = value.substitute(expand)
        if more == value:
            break
        value = more
    return value if value.names() <= params and _readable(value) else None


def _readable(e: Expr) -> bool:
    return e.op != "unknown" and all(_readable(a) for a in e.args if isinstance(a, Expr))


def scalar_expr(atom: ast.expr, defs: dict[str, list[ast.stmt]], depth: int = 0) -> Expr:
    """A scalar as an expression over the kernel's parameters and the grid where it is integer math on
    them (``tl.cdiv(K, BLOCK)``, ``R - 1``, ``tl.num_programs(1)``), for launch checks; else its name."""
    if isinstance(atom, ast.Constant) and isinstance(atom.value, int):
        return Expr.const(atom.value)
    if not isinstance(atom, ast.Name):
        return Expr.of_text(ast.unparse(atom))
    found = [d for d in defs.get(atom.id, []) if not isinstance(d, ast.For)]
    if depth < 8 and len(found) == 1:
        op = op_of(found[0])
        if operation_of(op).on_host is not None or op.kind == "minimum":
            kind = "min" if op.kind == "minimum" else op.kind
            return Expr(kind, tuple(scalar_expr(a, defs, depth + 1) for a in op.args))
        if op.kind == "num_programs" and axis_of(op) is not None:
            return Expr("grid", (axis_of(op),))
    return Expr.name(atom.id)


def starts_at_zero(atom: ast.expr, defs: dict) -> bool:
    """Whether a coordinate sum has no constant part: built from ``tl.arange(0, ...)`` and program ids (a
    carried ``cols += BLOCK`` too: its steps are the loop's coordinate)."""
    if isinstance(atom, ast.Constant):
        return atom.value == 0
    if not isinstance(atom, ast.Name):
        return False
    headers = [d for d in defs.get(atom.id, []) if isinstance(d, ast.For)]
    if headers:  # a loop's index: from a range starting at 0
        start = range_bounds(headers[0])[0]
        return len(headers) == 1 and isinstance(start, ast.Constant) and start.value == 0
    own = [d for d in defs.get(atom.id, []) if not (op_of(d).kind == "add" and any(
        isinstance(a, ast.Name) and a.id == atom.id for a in op_of(d).args[:2]))]  # not `cols = cols + BLOCK`
    if len(own) != 1:
        return False
    op = op_of(own[0])
    if op.kind == "arange":
        return isinstance(op.args[0], ast.Constant) and op.args[0].value == 0
    if op.kind == "program_id":
        return True
    if op.kind == "add":
        return all(starts_at_zero(a, defs) for a in op.args[:2])
    if op.kind == "mul":
        return any(starts_at_zero(a, defs) for a in op.args[:2])
    if op.kind in ("floordiv", "mod"):  # a digit of a split (`pid // n`, `pid % n`): from 0 where its index is
        return starts_at_zero(op.args[0], defs)
    if operation_of(op).lanes == "same" or op.kind in ("subscript", "expand_dims", "broadcast_to"):
        return starts_at_zero(op.args[0], defs)
    return False


def divisor_text(atom: ast.expr, defs: dict) -> str:
    """A digit's divisor, written out through its definitions where that reads as integer math on the launch's
    values (``H * W``: two temporaries computing it give one divisor, so ``offs // HW`` and ``offs % HW`` are
    partners), else as spelled."""
    text = canonical_atom(atom, defs) if isinstance(atom, ast.Name) else ast.unparse(atom)
    return text if Expr.of_text(text).op != "unknown" else ast.unparse(atom)
