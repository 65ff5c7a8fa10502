"""Tiles computed transposed where that saves transposing them in registers.

A product's adjoint reads the other operand transposed: for ``s = tl.dot(q, tl.trans(k))`` the gradient
of ``k`` is ``tl.dot(tl.trans(d_s), q)``, and ``p``'s role in ``tl.dot(p, v)`` gives ``v`` the gradient
``tl.dot(tl.trans(p), d_o)``. When the transposed tile is one the kernel computed from a product (it is in
registers, in the product's layout), the compiler transposes it through shared memory on every iteration.
A hand-written attention backward computes the transposes instead (``s^T = tl.dot(k, tl.trans(q))``, then
``p^T``, ``d_s^T``, elementwise), and its products read them as they are. This pass does that for any
derived kernel, on the source codegen writes:

- tiles (2-D values) that are elementwise in each other form a group; a group is computed transposed
  where that leaves fewer transposes of product-derived tiles in statements whose values are used (a
  transpose of a loaded tile is free: it becomes a product's operand through shared memory anyway);
- a transposed group's definitions compute the transpose: ``tl.dot(a, b)`` as ``tl.dot(b^T, a^T)``,
  elementwise operations on their operands' transposes, ``x[:, None]`` and ``x[None, :]`` swapped, a 1-D
  operand broadcast as ``x[:, None]``, a reduction or broadcast back over the other axis;
- its reads elsewhere: ``tl.trans(x)`` reads ``x``, ``tl.sum(x, axis)`` sums over the other axis, any
  other read reads ``tl.trans(x)`` (always right, possibly slower: counted by the choice above).

Ranks come from a small inference over the body; a group holding a value whose rank is unknown, or not 2,
or that is defined other than by a plain assignment, stays as written.
"""

from __future__ import annotations

import ast
import copy
import textwrap
from collections.abc import Callable

from ..core.calls import shape_only, value_reads
from ..core.ir import every_statement, name_node, reads, tl_call
from .tiles import (
    TileFacts,
    elementwise_in_all,
    helper_named,
    is_method_to,
    plain_trans,
    reduction_axis,
    swapped_row,
    target_name,
)


class _Unknown(Exception):
    """A value the pass cannot transpose."""


def orient_tiles(body: list[ast.stmt], params: list[str], comment: Callable[[str], ast.stmt],
                 every: bool = False) -> list[ast.stmt]:
    """``body`` (a kernel's) with the groups of tiles that are cheaper transposed computed transposed.
    ``params``: the kernel's parameters (scalars and pointers); ``comment(text)``: a statement codegen prints
    as a comment, put before the first transposed definition; ``every``: transpose every group the pass can,
    whatever it costs (tests: the rewrite on every kernel, not only where it pays)."""
    if not every and not any(plain_trans(tl_call(n, "trans")) for n in ast.walk(ast.Module(body, []))):
        return body  # nothing transposed: nothing to save
    facts = TileFacts(body, params)
    costly = _costly_reads(body, facts)
    if not costly and not every:
        return body
    groups = [g for g in facts.groups() if every or g & costly]
    chosen: set[str] = set()
    best = _Rewriter(facts, chosen).cost(body)
    for group in groups:
        try:
            cost = _Rewriter(facts, chosen | group).cost(body)
        except _Unknown:
            continue
        if cost < best or every:
            chosen, best = chosen | group, cost
    if not chosen:
        return body
    out = _Rewriter(facts, chosen).body(body)
    names = ", ".join(sorted(chosen, key=facts.order.get))
    text = textwrap.fill(f"computed transposed (orient.py), so that the products reading their transposes read "
                         f"them as they are, not transposed in registers: {names}", 110)
    return _with_comment(out, chosen, comment(text))


class _Rewriter:
    """Writes a body with the names in ``flipped`` holding their transposes, and counts the transposes of
    product-derived tiles left in statements whose values are used."""

    def __init__(self, facts: TileFacts, flipped: set[str]):
        self.facts, self.flipped = facts, flipped

    def cost(self, body: list[ast.stmt]) -> int:
        """How many transposes of product-derived tiles the rewritten body computes."""
        out, count = self.body(body), 0
        for stmt in every_statement(out):
            if isinstance(stmt, (ast.Assign, ast.AugAssign)) and target_name(stmt) not in self.facts.live:
                continue  # dead: Triton drops it
            for e in ([stmt.test] if isinstance(stmt, ast.If) else [stmt.iter] if isinstance(stmt, ast.For)
                      else [stmt.value] if getattr(stmt, "value", None) is not None else []):
                count += _transposes(e, self.facts)
        return count

    def body(self, block: list[ast.stmt]) -> list[ast.stmt]:
        out = []
        for stmt in block:
            stmt = copy.copy(stmt)
            if isinstance(stmt, ast.If):
                stmt.test, stmt.body, stmt.orelse = self.keep(stmt.test), self.body(stmt.body), self.body(stmt.orelse)
            elif isinstance(stmt, ast.For):
                stmt.iter, stmt.body = self.keep(stmt.iter), self.body(stmt.body)
            elif isinstance(stmt, (ast.Assign, ast.AugAssign)):
                name = target_name(stmt)
                stmt.value = self.flip(stmt.value) if name in self.flipped else self.keep(stmt.value)
            elif isinstance(stmt, (ast.Expr, ast.Return)) and stmt.value is not None:
                stmt.value = self.keep(stmt.value)
            out.append(stmt)
        return out

    def transposed(self, e: ast.expr) -> ast.expr:
        """``tl.trans(e)`` (``y`` for ``e`` a name assigned once, ``tl.trans(y)``, where neither holds its
        transpose)."""
        if isinstance(e, ast.Name) and e.id not in self.flipped and len(self.facts.defs.get(e.id, [])) == 1:
            inner = tl_call(self.facts.defs[e.id][0].value, "trans")
            if (plain_trans(inner) and isinstance(inner.args[0], ast.Name) and inner.args[0].id not in self.flipped
                    and _fixed(inner.args[0].id, self.facts)):
                return name_node(inner.args[0].id)
        return _trans(e)

    # -- reads as written ---------------------------------------------------------------------------------

    def keep(self, e: ast.expr) -> ast.expr:
        """``e`` with the flipped names in it read as what they were."""
        if not reads(e) & self.flipped:
            return e
        if isinstance(e, ast.Name):
            return self.transposed(e) if isinstance(e.ctx, ast.Load) else e
        if isinstance(e, ast.Attribute) and e.attr == "dtype":
            return e  # a transpose has the same type
        if isinstance(e, ast.Attribute) and e.attr == "shape":
            return ast.Attribute(self.keep(e.value), "shape", ast.Load())
        call = e if isinstance(e, ast.Call) else None
        if plain_trans(tl_call(e, "trans")) and self.facts.rank(call.args[0]) == 2:
            return self.flip(call.args[0])
        if (tl_call(e, "reshape") or tl_call(e, "view")) and call.args and isinstance(call.args[0], ast.Name) \
                and call.args[0].id in self.flipped and self.facts.unit_axis(call.args[0]) is not None:
            # an axis of one element: the transpose has its elements in the same order
            return _with_args(call, [call.args[0], *map(self.keep, call.args[1:])],
                              {k.arg: self.keep(k.value) for k in call.keywords})
        if call is not None and reduction_axis(call) is not None and self.facts.rank(call.args[0]) == 2 \
                and isinstance(call.args[0], ast.Name) and call.args[0].id in self.flipped:
            other = ast.Constant(1 - reduction_axis(call))
            return _with_args(call, [self.flip(call.args[0])], {"axis": other})
        return _map_children(e, self.keep)

    # -- transposes -------------------------------------------------------------------------------------------

    def flip(self, e: ast.expr) -> ast.expr:
        """The transpose of the tile ``e`` (flipped names read as they are)."""
        rank = self.facts.rank(e)
        if rank != 2:
            raise _Unknown(ast.unparse(e))
        if isinstance(e, ast.Name):
            return e if e.id in self.flipped else self.transposed(e)
        if isinstance(e, ast.Subscript):
            index = swapped_row(e, self.facts)
            if index is not None:
                return ast.Subscript(self.keep(e.value), index, ast.Load())
        elif isinstance(e, (ast.BinOp, ast.UnaryOp, ast.Compare, ast.BoolOp)):
            return _map_children(e, lambda child: self.operand(child))
        elif isinstance(e, ast.Call):
            flipped = self.flip_call(e)
            if flipped is not None:
                return flipped
        return self.transposed(self.keep(e))

    def operand(self, e: ast.expr) -> ast.expr:
        """An operand of an elementwise operation on a tile, in the transposed operation."""
        rank = self.facts.rank(e)
        if rank == 0:
            return self.keep(e)
        if rank == 1:  # broadcast along the rows: as a column in the transpose
            return _column(self.keep(e))
        return self.flip(e)

    def flip_call(self, e: ast.Call) -> ast.expr | None:
        f = e.func
        if is_method_to(e):
            return ast.Call(ast.Attribute(self.flip(f.value), "to", ast.Load()),
                            [self.keep(a) for a in e.args],
                            [ast.keyword(k.arg, self.keep(k.value)) for k in e.keywords])
        if not (isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name)):
            return None
        module, fn = f.value.id, f.attr
        if module == "tl" and fn == "dot" and len(e.args) == 2 and all(k.arg in _DOT_KEYWORDS for k in e.keywords):
            a, b = e.args
            if self.facts.rank(a) != 2 or self.facts.rank(b) != 2:
                return None
            acc = {k.arg: self.flip(k.value) for k in e.keywords if k.arg == "acc"}
            return _with_args(e, [self.flip(b), self.flip(a)], acc)
        if module == "tl" and fn == "trans" and plain_trans(e):
            return self.keep(e.args[0])
        if (module == "tl" and fn == "cast" or module == "tg" and helper_named(fn).elementwise) and e.args:
            rest = [self.keep(a) for a in e.args[1:]]  # types
            return _with_args(e, [self.flip(e.args[0]), *rest],
                              {k.arg: self.keep(k.value) for k in e.keywords})
        if module == "tl" and elementwise_in_all(fn):
            args = [self.operand(a) for a in e.args]
            return _with_args(e, args, {k.arg: self.operand(k.value) for k in e.keywords})
        if module == "tg" and fn == "unbroadcast" and len(e.args) == 2 and self.facts.rank(e.args[0]) == 2:
            return _with_args(e, [self.flip(e.args[0]), self.flip(e.args[1])], {})
        if module == "tg" and fn == "zeros_grad" and len(e.args) == 1:
            return _with_args(e, [self.flip(e.args[0])], {})
        if module == "tg" and fn in ("sum_grad", "extremum_grad") and not e.keywords:
            return self.flip_reduction_grad(e)
        return None

    def flip_reduction_grad(self, e: ast.Call) -> ast.expr | None:
        """``tg.sum_grad(g, x, axis, keep_dims)``, ``tg.extremum_grad(g, x, out, axis, keep_dims)``: the
        reduction's operand ``x`` transposed, the other axis."""
        *values, axis, keep_dims = e.args
        if len(values) not in (2, 3) or not (isinstance(keep_dims, ast.Constant) and isinstance(axis, ast.Constant)):
            return None
        if axis.value is not None and axis.value not in (0, 1, -1, -2):
            return None
        g, x, *out = values
        if any(self.facts.rank(v) is None for v in (g, *out)):
            raise _Unknown(ast.unparse(e))
        reduced = [self.flip(v) if self.facts.rank(v) == 2 else self.keep(v) for v in (g, *out)]
        other = ast.Constant(None if axis.value is None else 1 - axis.value % 2)
        return _with_args(e, [reduced[0], self.flip(x), *reduced[1:], other, keep_dims], {})


_DOT_KEYWORDS = ("acc", "input_precision", "allow_tf32", "max_num_imprecise_acc", "out_dtype")


def _is_false(e: ast.expr) -> bool:
    return isinstance(e, ast.Constant) and e.value is False


def _trans(e: ast.expr) -> ast.Call:
    return ast.Call(ast.Attribute(name_node("tl"), "trans", ast.Load()), [e], [])


def _column(e: ast.expr) -> ast.Subscript:
    """``e[:, None]``."""
    return ast.Subscript(e, ast.Tuple([ast.Slice(), ast.Constant(None)], ast.Load()), ast.Load())


def _with_args(call: ast.Call, args: list[ast.expr], keywords: dict[str, ast.expr]) -> ast.Call:
    kept = [k for k in call.keywords if k.arg not in keywords]
    return ast.Call(call.func, args, kept + [ast.keyword(k, v) for k, v in keywords.items()])


def _map_children(e: ast.expr, f: Callable[[ast.expr], ast.expr]) -> ast.expr:
    """A shallow copy of ``e`` with ``f`` applied to each child expression."""
    e = copy.copy(e)
    for field, value in ast.iter_fields(e):
        if isinstance(value, ast.expr) and not isinstance(value, ast.expr_context):
            setattr(e, field, f(value))
        elif isinstance(value, list):
            setattr(e, field, [f(v) if isinstance(v, ast.expr) else _keyword(v, f) for v in value])
    return e


def _keyword(v, f):
    if isinstance(v, ast.keyword):
        return ast.keyword(v.arg, f(v.value))
    return v


def _fixed(name: str, facts: TileFacts) -> bool:
    """Assigned once (or a parameter): the same value wherever it is read."""
    return name not in facts.pinned and len(facts.defs.get(name, [])) <= 1


# -- what the pass reads ---------------------------------------------------------------------------------


def _transposes(e: ast.AST, facts: TileFacts) -> int:
    """How many costly ``tl.trans`` ``e`` computes (not those read for a shape or type)."""
    if isinstance(e, ast.Attribute) and e.attr in ("dtype", "shape"):
        return 0
    if isinstance(e, ast.Call):
        shaped = set(shape_only(e))
        children = [e.func, *(a for i, a in enumerate(e.args) if i not in shaped), *(k.value for k in e.keywords)]
        return int(facts.costly(e)) + sum(_transposes(c, facts) for c in children)
    return sum(_transposes(c, facts) for c in ast.iter_child_nodes(e))


def _costly_reads(body: list[ast.stmt], facts: TileFacts) -> set[str]:
    """Names read inside a ``tl.trans`` of a product-derived value in a statement whose value is used."""
    found = set()
    for stmt in every_statement(body):
        if isinstance(stmt, (ast.Assign, ast.AugAssign)) and target_name(stmt) not in facts.live:
            continue
        if isinstance(stmt, (ast.If, ast.For)):
            continue
        for node in ast.walk(stmt):
            if facts.costly(node):
                found |= value_reads(node)
    return found


def _with_comment(body: list[ast.stmt], flipped: set[str], marker: ast.stmt) -> list[ast.stmt]:
    """``body`` with ``marker`` before the statement holding the first definition of a flipped name."""
    for i, stmt in enumerate(body):
        if any(isinstance(s, (ast.Assign, ast.AugAssign)) and target_name(s) in flipped
               for s in every_statement([stmt])):
            if isinstance(stmt, (ast.Assign, ast.AugAssign)):
                return [*body[:i], marker, *body[i:]]
            stmt = copy.copy(stmt)
            stmt.body = _with_comment(stmt.body, flipped, marker)
            if marker not in stmt.body and isinstance(stmt, ast.If):
                stmt.orelse = _with_comment(stmt.orelse, flipped, marker)
            return [*body[:i], stmt, *body[i + 1:]]
    return body


# -- ranks ---------------------------------------------------------------------------------------------------


