"""An operation's tangent, from the same table of operations (core/operations.py) the reverse rules come from.

An elementwise operation's Jacobian is diagonal: its adjoint template with ``g`` put as an argument's tangent is that
argument's contribution, and the result's tangent is their sum (broadcast as the operation broadcasts). Any other
operation says its tangent in the table (``tangents``): a template, a function giving one, or ``LINEAR`` (the same
call on the tangents). A differentiated argument without a tangent has a zero one; an operation with none is
refused, naming what forward mode does not yet handle."""

from __future__ import annotations

import ast
import copy

from ..analysis.flow import INFINITE, MASKED, padding_at_unbounded
from ..core.ir import arguments, construct_origin, name_node, op_of, reads, refuse
from ..core.operations import LINEAR, instantiate, operation_of

HINT = "forward mode does not yet handle {what}: differentiate it in reverse mode (tritongrad.grad), or write it " \
       "with operations that have a tangent rule"
METADATA = ("shape", "dtype", "numel", "type")  # `x.shape`: read of a value, not its value


def unsupported(stmt: ast.stmt, what: str) -> Exception:
    """The refusal of a construct forward mode does not yet handle, naming it."""
    return refuse(construct_origin(stmt), f"{what} in forward mode", HINT.format(what=what))


def zeros_of(atom: ast.expr) -> ast.expr:
    """A zero tangent for ``atom``: its shape and type where it is a tile, else ``0.0``."""
    if isinstance(atom, ast.Name):
        return instantiate("tl.zeros_like(x)", {"x": atom})
    return ast.Constant(0.0)


class OperationTangents:
    """Operations' tangents (loads and stores aside: builder.py), for a :class:`builder.TangentBuilder`."""

    def __init__(self, builder):
        self.builder = builder  # tangent_of(atom) -> its tangent or None, same_shape(a, b), analysis

    def tangent(self, stmt: ast.stmt, t: str) -> ast.expr | None:
        """The tangent of ``t = <operation>`` (None: no differentiated argument has one)."""
        op = op_of(stmt)
        rule = operation_of(op)
        if op.kind == "custom":
            raise unsupported(stmt, "a helper with a hand-written adjoint (tritongrad.custom_vjp)")
        if rule.no_tangent:
            raise unsupported(stmt, rule.no_tangent)
        if not rule.has_rule:
            return None
        bound = arguments(stmt)
        tangents = self.argument_tangents(bound, rule.adjoints)
        if not tangents:
            return None
        if rule.tangents is None:
            if not rule.elementwise:
                raise unsupported(stmt, f"`{op.kind}` (no tangent rule)")
            return self.elementwise(stmt, t, bound, tangents)
        if rule.tangents == LINEAR:
            return self.linear(stmt, bound, rule.adjoints, tangents)
        template = rule.tangents
        if callable(template):
            try:
                template = template(bound, frozenset(tangents))
            except ValueError as e:
                raise unsupported(stmt, f"`{op.kind}` with {e}") from e
        env = {**bound, "out": name_node(t)}
        for param, arg in bound.items():
            if param in rule.adjoints:
                env[f"t_{param}"] = tangents.get(param) or zeros_of(arg)
                for i, e in enumerate(getattr(arg, "elts", ())):
                    env[f"t_{param}_{i}"] = tangents.get(f"{param}[{i}]") or zeros_of(e)
        return instantiate(template, env)

    def argument_tangents(self, bound: dict[str, ast.expr], differentiable) -> dict[str, ast.expr]:
        """Differentiated parameter (a tuple's element as ``param[i]``) -> its argument's tangent, where it has
        one."""
        found = {}
        for param, arg in bound.items():
            if param not in differentiable:
                continue
            tangent = self.builder.tangent_of(arg)
            if tangent is not None:
                found[param] = tangent
            for i, e in enumerate(getattr(arg, "elts", ())):
                tangent = self.builder.tangent_of(e)
                if tangent is not None:
                    found[f"{param}[{i}]"] = tangent
        return found

    def elementwise(self, stmt: ast.stmt, t: str, bound: dict[str, ast.expr], tangents: dict[str, ast.expr]
                    ) -> ast.expr:
        """The sum over the differentiated arguments of the adjoint template with ``g`` as each one's tangent."""
        rule = operation_of(op_of(stmt))
        total, shaped = None, False
        for param, tangent in tangents.items():
            template = rule.adjoints[param]
            contribution = instantiate(template, {**bound, "g": tangent, "out": name_node(t)})
            if self.reads_infinite_padding(stmt, contribution):  # 0 * inf in a lane a mask left out: 0
                contribution = instantiate("tl.where(g == 0.0, 0.0, c)", {"g": tangent, "c": contribution})
            total = contribution if total is None else ast.BinOp(total, ast.Add(), contribution)
            arg = bound[param]  # (a contribution has at least its argument's shape: broadcasting never shrinks)
            shaped |= isinstance(arg, ast.Name) and self.builder.same_shape(arg.id, t)
        sig = rule.signature  # a one-operand elementwise operation keeps its operand's shape
        unary = len(sig.positional) == 1 and not sig.keyword and sig.vararg is None
        if not shaped and not unary and self.builder.shape_of(t) != ():
            # (by adding zeros of the result's shape: tl.broadcast_to needs equal ranks, and an operand of lower
            # rank, `grid + x` with x (BLOCK,) and grid (BLOCK, BLOCK), may be the only one with a tangent)
            total = instantiate("c + tl.zeros_like(out)", {"c": total, "out": name_node(t)})
        return total

    def reads_infinite_padding(self, stmt: ast.stmt, contribution: ast.expr) -> bool:
        """As the reverse rule's guard (reverse/rules.py): a contribution reading a value that may be infinite in
        lanes a load's mask left out, or dividing by a masked-off value, is kept zero where the tangent is."""
        rule, padding = operation_of(op_of(stmt)), self.builder.analysis.padding
        if not (rule.elementwise or rule.lanes == "same"):
            return False
        return (any(INFINITE in padding.get(n, ()) for n in reads(contribution))
                or MASKED in padding_at_unbounded(stmt, padding))

    def linear(self, stmt: ast.stmt, bound: dict[str, ast.expr], differentiable, tangents: dict[str, ast.expr]
               ) -> ast.expr:
        """The same call, each differentiated argument replaced by its tangent (zeros where it has none); its
        shapes and types (``x.shape``) read as they are."""
        renames: dict[str, ast.expr] = {}
        for param, arg in bound.items():
            if param in differentiable:
                for i, e in enumerate(getattr(arg, "elts", None) or [arg]):
                    key = param if e is arg else f"{param}[{i}]"
                    if isinstance(e, ast.Name):
                        renames[e.id] = tangents.get(key) or zeros_of(e)

        class Rename(ast.NodeTransformer):
            def visit_Attribute(self, n: ast.Attribute) -> ast.expr:
                return n if n.attr in METADATA else self.generic_visit(n)

            def visit_Name(self, n: ast.Name) -> ast.expr:
                return copy.deepcopy(renames[n.id]) if n.id in renames else n

        return Rename().visit(copy.deepcopy(stmt.value))
