"""Facts that flow through a program's values to a fixed point: what lanes a load's mask left out hold
(padding), what is computed from loaded data, what a set of values reaches (downstream), and which program ids a
value depends on."""

from __future__ import annotations

import ast
import math

from ..core.ir import (
    arguments,
    axis_of,
    is_none,
    names_in,
    op_of,
    range_bounds,
    reads,
    statements,
    structured,
    target_of,
    value_args,
)
from ..core.operations import LOADS, operation_of

MASKED, INFINITE = "masked", "infinite"  # what masked-off lanes hold (padding)



def _fixpoint(body: list[ast.stmt], step) -> dict[str, set]:
    """Facts per name: ``step(sources, stmt, facts)`` for each definition until nothing changes.

    A definition is a flat statement (its sources: the names its operation reads) or a
    loop (its target's sources: the names its range reads). Several passes, because
    loop-carried names feed their own definitions.
    """
    definitions = [(target_of(s), value_args(s), s) for s in statements(body) if target_of(s)]
    definitions += [(f.target.id, sorted(reads(f.iter)), f) for f in structured(body) if isinstance(f, ast.For)]
    facts: dict[str, set] = {}
    changed = True
    while changed:
        changed = False
        for target, sources, stmt in definitions:
            new = step(sources, stmt, facts) | facts.get(target, set())
            if new != facts.get(target, set()):
                facts[target], changed = new, True
    return facts


def padding_at_unbounded(stmt: ast.stmt, padding: dict[str, set[str]]) -> set[str]:
    """The padding facts of the operand at which the statement's operation is unbounded (``b`` of ``a / b``)."""
    param = operation_of(op_of(stmt)).unbounded_in
    operand = arguments(stmt).get(param) if param else None
    return set().union(*(padding.get(n, set()) for n in names_in(operand))) if operand is not None else set()


def padding(body: list[ast.stmt]) -> dict[str, set[str]]:
    """What the lanes a load's mask left out may hold, per name computed lane by lane from them: MASKED
    (the load's ``other``, and what follows from it), INFINITE (±inf or NaN there: an ``other`` of
    ``-float("inf")``, or a log, a division... of a masked-off value). The reverse sweep keeps a zero
    adjoint times such a value zero there (``0 * inf``), as the unpadded function's gradient is."""
    literals: dict[str, ast.expr] = {}  # `neg_x = -float("inf")`: names the frontend gave literal values
    for stmt in statements(body):
        value = getattr(stmt, "value", None)
        if target_of(stmt) and operation_of(op_of(stmt)).sign:  # `-x`, `+x`, `x`
            literals[target_of(stmt)] = value

    def finite(expr: ast.expr) -> bool:
        """A literal is read (``-float("inf")`` is not finite); other names hold values the kernel computed
        or was passed, finite as far as the derivation can tell."""
        if isinstance(expr, ast.Name):
            return expr.id not in literals or finite(literals[expr.id])
        if isinstance(expr, ast.UnaryOp) and isinstance(expr.op, (ast.USub, ast.UAdd)):
            return finite(expr.operand)
        if (isinstance(expr, ast.Call) and isinstance(expr.func, ast.Name) and expr.func.id == "float"
                and len(expr.args) == 1 and isinstance(expr.args[0], ast.Constant)):
            return math.isfinite(float(expr.args[0].value))
        return not isinstance(expr, ast.Constant) or not isinstance(expr.value, float) or math.isfinite(expr.value)

    def step(sources, stmt, facts):
        if isinstance(stmt, ast.For):
            return set()
        op = op_of(stmt)
        if op.kind in LOADS:
            other = load_other(stmt)
            return set() if is_none(other) else {MASKED} if finite(other) else {MASKED, INFINITE}
        operation = operation_of(op)
        if not (operation.elementwise or operation.lanes == "same"):
            return set()
        inherited = set().union(*(facts.get(n, set()) for n in sources))
        if operation.finite_at_minus_inf:  # the -inf padding of a max or a softmax (+inf is NaN forward already)
            inherited -= {INFINITE}
        return inherited | {INFINITE} if MASKED in padding_at_unbounded(stmt, facts) else inherited

    return {n: v for n, v in _fixpoint(body, step).items() if v}


def loaded_values(body: list[ast.stmt]) -> set[str]:
    """The names computed from loaded data."""
    return downstream(body, {target_of(s) for s in statements(body) if op_of(s).kind in LOADS})


def downstream(body: list[ast.stmt], roots: set[str]) -> set[str]:
    """``roots`` and every name computed from them."""
    def step(sources, stmt, facts):
        return {True} if target_of(stmt) in roots or any(facts.get(n) for n in sources) else set()

    return {n for n, v in _fixpoint(body, step).items() if v}


def program_axes(body: list[ast.stmt], through_stop: bool = True) -> dict[str, set[int]]:
    """For each name, the program-id axes its value depends on (a loop's index: those its range does; without
    ``through_stop``, those its start and step do: which iterations run aside, what each computes)."""
    def step(sources, stmt, facts):
        if isinstance(stmt, ast.For):
            if not through_stop:
                start, _, stride = range_bounds(stmt)
                sources = reads(start) | reads(stride)
            return set().union(*[facts.get(n, set()) for n in sources])
        if operation_of(op_of(stmt)).coordinate == "program":
            axis = axis_of(op_of(stmt))
            return {axis} if axis is not None else {0, 1, 2}
        return set().union(*[facts.get(n, set()) for n in sources])

    return _fixpoint(body, step)


def load_other(stmt: ast.stmt) -> ast.expr:
    """A masked load's ``other`` (the value of the lanes its mask leaves out); None for other loads."""
    b = arguments(stmt)
    if is_none(b.get("mask", ast.Constant(None))):
        return ast.Constant(None)
    return b.get("other", ast.Constant(None))
