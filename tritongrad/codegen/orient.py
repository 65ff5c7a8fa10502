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

from ..core.ir import is_none, name_node, reads, tl_call
from ..core.operations import OPERATIONS

# tg helpers elementwise in their first argument (the others are types)
_ELEMENTWISE_HELPERS = ("to_float", "cast_grad", "widened", "stop_gradient")
# reductions whose axis can move to the other one
_REDUCTIONS = ("sum", "max", "min")


class _Unknown(Exception):
    """A value the pass cannot transpose."""


def orient_tiles(body: list[ast.stmt], params: list[str], comment: Callable[[str], ast.stmt],
                 every: bool = False) -> list[ast.stmt]:
    """``body`` (a kernel's) with the groups of tiles that are cheaper transposed computed transposed.
    ``params``: the kernel's parameters (scalars and pointers); ``comment(text)``: a statement codegen prints
    as a comment, put before the first transposed definition; ``every``: transpose every group the pass can,
    whatever it costs (tests: the rewrite on every kernel, not only where it pays)."""
    if not every and not any(_plain_trans(tl_call(n, "trans")) for n in ast.walk(ast.Module(body, []))):
        return body  # nothing transposed: nothing to save
    facts = _Facts(body, params)
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


class _Facts:
    """What the pass knows of a body: each name's rank, definitions, and whether a product computed it."""

    def __init__(self, body: list[ast.stmt], params: list[str]):
        self.ranks: dict[str, int | None] = {p: 0 for p in params}
        self.defs: dict[str, list[ast.stmt]] = {}
        self.order: dict[str, int] = {}
        self.pinned: set[str] = set()  # defined otherwise than by `name = ...` / `name op= ...`
        flat = list(_flat(body))
        for stmt in flat:
            if isinstance(stmt, ast.For):
                self.ranks[stmt.target.id] = 0
                self.pinned.add(stmt.target.id)
            elif isinstance(stmt, (ast.Assign, ast.AugAssign)) and _target(stmt) is not None:
                self.defs.setdefault(_target(stmt), []).append(stmt)
                self.order.setdefault(_target(stmt), len(self.order))
            elif isinstance(stmt, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
                self.pinned |= {n.id for n in ast.walk(stmt)
                                if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
        self._infer_ranks()
        self.dotted = self._dotted()
        self.live = _live(flat, self.defs)
        self.unit: dict[str, int] = {}  # tiles with an axis of one element: name -> that axis
        for _ in range(2):
            for name, defs in self.defs.items():
                axes = {self.unit_axis(d.value) for d in defs if self.ranks.get(name) == 2}
                if len(axes) == 1 and None not in axes:
                    self.unit[name] = axes.pop()

    def unit_axis(self, e: ast.expr) -> int | None:
        """The axis of one element of the tile ``e`` (``x[:, None]``: 1), where known."""
        if isinstance(e, ast.Name):
            return self.unit.get(e.id)
        if isinstance(e, ast.Subscript):
            index = _swapped_row(e, self)
            return None if index is None else int(is_none(index.elts[0]))
        if isinstance(e, ast.Call) and _reduction_axis(e, keep_dims=True) is not None and self.rank(e.args[0]) == 2:
            return _reduction_axis(e, keep_dims=True)
        if isinstance(e, ast.Call) and any(_tg_call(e, f) for f in ("unbroadcast", "zeros_grad")):
            return self.unit_axis(e.args[-1])
        operands = _elementwise_operands(e)
        if operands is None:
            return None
        ranks = [self.rank(o) for o in operands]
        if None in ranks:
            return None
        axes = {self.unit_axis(o) if r == 2 else 0 for o, r in zip(operands, ranks, strict=True) if r > 0}
        return axes.pop() if len(axes) == 1 else None

    def costly(self, e: ast.expr) -> bool:
        """``e`` is ``tl.trans`` of a product-derived tile with no axis of one element."""
        if not _plain_trans(tl_call(e, "trans")):
            return False
        x = e.args[0]
        return self.unit_axis(x) is None and bool(_has_dot(x) or _value_reads(x) & self.dotted)

    def _infer_ranks(self) -> None:
        """Each defined name's rank: the one its assignments agree on (updates ``x op= y`` no wider), None
        where they do not or one is unknown. Iterated to a fixed point: a definition that reads a name with
        no rank yet (a loop-carried name read before its update) waits for a later round."""
        while True:
            changed = False
            for name, defs in self.defs.items():
                pending = set(self.defs) - set(self.ranks)
                seen = []
                for d in defs:
                    try:
                        seen.append((_rank(d.value, self.ranks, pending), isinstance(d, ast.AugAssign)))
                    except _Pending:
                        continue
                assigned = {r for r, update in seen if not update}
                if not assigned:
                    continue
                rank = assigned.pop() if len(assigned) == 1 else None
                if rank is not None and any(r is None or r > rank for r, update in seen if update):
                    rank = None
                if self.ranks.get(name, "unset") != rank and self.ranks.get(name, 0) is not None:
                    self.ranks[name] = rank if name not in self.ranks else None
                    changed = True
            if not changed:
                break
        for name in self.defs:
            self.ranks.setdefault(name, None)

    def rank(self, e: ast.expr) -> int | None:
        return _rank(e, self.ranks)

    def is_tile(self, name: str) -> bool:
        return self.ranks.get(name) == 2 and name not in self.pinned and name in self.defs

    def _dotted(self) -> set[str]:
        """Names a product computed (a ``tl.dot`` in what their values are computed from)."""
        dotted: set[str] = set()
        while True:
            more = {n for n, defs in self.defs.items() if n not in dotted
                    and any(_has_dot(d.value) or _value_reads(d.value) & dotted for d in defs)}
            if not more:
                return dotted
            dotted |= more

    def groups(self) -> list[set[str]]:
        """The tiles, grouped with those they are elementwise in."""
        parent = {n: n for n in self.defs if self.is_tile(n)}

        def find(n: str) -> str:
            while parent[n] != n:
                parent[n] = parent[parent[n]]
                n = parent[n]
            return n

        for name in parent:
            for d in self.defs[name]:
                for other in _elementwise_names(d.value, self.ranks):
                    if other in parent:
                        parent[find(other)] = find(name)
        groups: dict[str, set[str]] = {}
        for name in parent:
            groups.setdefault(find(name), set()).add(name)
        return sorted(groups.values(), key=lambda g: min(self.order[n] for n in g))


class _Rewriter:
    """Writes a body with the names in ``flipped`` holding their transposes, and counts the transposes of
    product-derived tiles left in statements whose values are used."""

    def __init__(self, facts: _Facts, flipped: set[str]):
        self.facts, self.flipped = facts, flipped

    def cost(self, body: list[ast.stmt]) -> int:
        """How many transposes of product-derived tiles the rewritten body computes."""
        out, count = self.body(body), 0
        for stmt in _flat(out):
            if isinstance(stmt, (ast.Assign, ast.AugAssign)) and _target(stmt) not in self.facts.live:
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
                name = _target(stmt)
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
            if (_plain_trans(inner) and isinstance(inner.args[0], ast.Name) and inner.args[0].id not in self.flipped
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
        if _plain_trans(tl_call(e, "trans")) and self.facts.rank(call.args[0]) == 2:
            return self.flip(call.args[0])
        if (tl_call(e, "reshape") or tl_call(e, "view")) and call.args and isinstance(call.args[0], ast.Name) \
                and call.args[0].id in self.flipped and self.facts.unit_axis(call.args[0]) is not None:
            # an axis of one element: the transpose has its elements in the same order
            return _with_args(call, [call.args[0], *map(self.keep, call.args[1:])],
                              {k.arg: self.keep(k.value) for k in call.keywords})
        if call is not None and _reduction_axis(call) is not None and self.facts.rank(call.args[0]) == 2 \
                and isinstance(call.args[0], ast.Name) and call.args[0].id in self.flipped:
            other = ast.Constant(1 - _reduction_axis(call))
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
            index = _swapped_row(e, self.facts)
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
        if _is_method_to(e):
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
        if module == "tl" and fn == "trans" and _plain_trans(e):
            return self.keep(e.args[0])
        if (module == "tl" and fn == "cast" or module == "tg" and fn in _ELEMENTWISE_HELPERS) and e.args:
            rest = [self.keep(a) for a in e.args[1:]]  # types
            return _with_args(e, [self.flip(e.args[0]), *rest],
                              {k.arg: self.keep(k.value) for k in e.keywords})
        if module == "tl" and _elementwise(fn):
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
# helpers' arguments read for their shape (and type) only, by position
_SHAPE_ARGS = {"unbroadcast": {1}, "sum_grad": {1}, "zeros_grad": {0}, "zeros_to_sum": {0}}


def _shape_args(call: ast.Call) -> set[int]:
    f = call.func
    if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "tg":
        return _SHAPE_ARGS.get(f.attr, set())
    return set()


def _reduction_axis(call: ast.Call, keep_dims: bool = False) -> int | None:
    """The axis (0 or 1) of ``tl.sum(x, axis)`` and the like, with kept dims or without, else None."""
    if not any(tl_call(call, fn) for fn in _REDUCTIONS) or len(call.args) > 2:
        return None
    named = {k.arg: k.value for k in call.keywords}
    kept = isinstance(named.get("keep_dims"), ast.Constant) and named["keep_dims"].value is True
    if set(named) - {"axis", "keep_dims"} or kept != keep_dims or "keep_dims" in named and not (
            isinstance(named["keep_dims"], ast.Constant) and isinstance(named["keep_dims"].value, bool)):
        return None
    axis = call.args[1] if len(call.args) == 2 else named.get("axis")
    if isinstance(axis, ast.Constant) and axis.value in (0, 1, -1, -2):
        return axis.value % 2
    return None


def _tg_call(e: ast.AST, function: str) -> ast.Call | None:
    """``e`` if it is a call ``tg.<function>(...)``, else None."""
    if (isinstance(e, ast.Call) and isinstance(e.func, ast.Attribute) and e.func.attr == function
            and isinstance(e.func.value, ast.Name) and e.func.value.id == "tg"):
        return e
    return None


def _elementwise_operands(e: ast.expr) -> list[ast.expr] | None:
    """The operands of an elementwise operation (an operator, an elementwise ``tl`` function, a cast), else
    None."""
    if isinstance(e, (ast.BinOp, ast.UnaryOp, ast.Compare, ast.BoolOp)):
        return [c for c in ast.iter_child_nodes(e) if isinstance(c, ast.expr)]
    if not isinstance(e, ast.Call):
        return None
    if _is_method_to(e):
        return [e.func.value]
    if any(tl_call(e, "cast") or _tg_call(e, f) for f in _ELEMENTWISE_HELPERS) and e.args:
        return [e.args[0]]
    f = e.func
    if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "tl" and _elementwise(f.attr):
        return [*e.args, *(k.value for k in e.keywords)]
    return None


def _elementwise(fn: str) -> bool:
    """``tl.<fn>`` is elementwise in all its arguments (``broadcast_to``'s shape is not an operand)."""
    return fn in OPERATIONS and OPERATIONS[fn].elementwise and fn != "broadcast_to"


def _is_method_to(call: ast.Call) -> bool:
    """``x.to(dtype)``."""
    f = call.func
    return isinstance(f, ast.Attribute) and f.attr == "to" and not (isinstance(f.value, ast.Name)
                                                                     and f.value.id in ("tl", "tg"))


def _is_false(e: ast.expr) -> bool:
    return isinstance(e, ast.Constant) and e.value is False


def _plain_trans(call: ast.Call | None) -> bool:
    return call is not None and len(call.args) == 1 and not call.keywords


def _trans(e: ast.expr) -> ast.Call:
    return ast.Call(ast.Attribute(name_node("tl"), "trans", ast.Load()), [e], [])


def _column(e: ast.expr) -> ast.Subscript:
    """``e[:, None]``."""
    return ast.Subscript(e, ast.Tuple([ast.Slice(), ast.Constant(None)], ast.Load()), ast.Load())


def _swapped_row(e: ast.Subscript, facts: _Facts) -> ast.Tuple | None:
    """For ``x[None, :]`` of a 1-D ``x`` the index ``[:, None]``, and the other way round, else None."""
    index = e.slice
    if facts.rank(e.value) != 1 or not isinstance(index, ast.Tuple) or len(index.elts) != 2:
        return None
    kinds = ["new" if is_none(i) else "all" if _is_full(i) else "?" for i in index.elts]
    if sorted(kinds) != ["all", "new"]:
        return None
    return ast.Tuple(index.elts[::-1], ast.Load())


def _is_full(e: ast.expr) -> bool:
    return isinstance(e, ast.Slice) and e.lower is None and e.upper is None and e.step is None


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


def _fixed(name: str, facts: _Facts) -> bool:
    """Assigned once (or a parameter): the same value wherever it is read."""
    return name not in facts.pinned and len(facts.defs.get(name, [])) <= 1


# -- what the pass reads ---------------------------------------------------------------------------------

def _flat(body: list[ast.stmt]):
    for stmt in body:
        yield stmt
        for block in (getattr(stmt, "body", None), getattr(stmt, "orelse", None)):
            if isinstance(block, list):
                yield from _flat(block)


def _target(stmt: ast.stmt) -> str | None:
    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
        return stmt.targets[0].id
    if isinstance(stmt, ast.AugAssign) and isinstance(stmt.target, ast.Name):
        return stmt.target.id
    return None


def _value_reads(e: ast.AST) -> set[str]:
    """Names whose values ``e`` reads: not those it reads only for a shape or a type."""
    if isinstance(e, ast.Attribute) and e.attr in ("dtype", "shape"):
        return set()
    if isinstance(e, ast.Name):
        return {e.id} if isinstance(e.ctx, ast.Load) else set()
    if isinstance(e, ast.Call):
        shaped = _shape_args(e)
        found = _value_reads(e.func)
        for i, a in enumerate(e.args):
            if i not in shaped:
                found |= _value_reads(a)
        for k in e.keywords:
            found |= _value_reads(k.value)
        return found
    found = set()
    for child in ast.iter_child_nodes(e):
        found |= _value_reads(child)
    return found


def _has_dot(e: ast.AST) -> bool:
    return any(tl_call(n, "dot") for n in ast.walk(e))


def _transposes(e: ast.AST, facts: _Facts) -> int:
    """How many costly ``tl.trans`` ``e`` computes (not those read for a shape or type)."""
    if isinstance(e, ast.Attribute) and e.attr in ("dtype", "shape"):
        return 0
    if isinstance(e, ast.Call):
        shaped = _shape_args(e)
        children = [e.func, *(a for i, a in enumerate(e.args) if i not in shaped), *(k.value for k in e.keywords)]
        return int(facts.costly(e)) + sum(_transposes(c, facts) for c in children)
    return sum(_transposes(c, facts) for c in ast.iter_child_nodes(e))


def _costly_reads(body: list[ast.stmt], facts: _Facts) -> set[str]:
    """Names read inside a ``tl.trans`` of a product-derived value in a statement whose value is used."""
    found = set()
    for stmt in _flat(body):
        if isinstance(stmt, (ast.Assign, ast.AugAssign)) and _target(stmt) not in facts.live:
            continue
        if isinstance(stmt, (ast.If, ast.For)):
            continue
        for node in ast.walk(stmt):
            if facts.costly(node):
                found |= _value_reads(node)
    return found


def _live(flat: list[ast.stmt], defs: dict[str, list[ast.stmt]]) -> set[str]:
    """Names whose values reach something the kernel does (a store, a branch, a loop's range, a call's
    effect): a value read only for its shape or type, or by nothing, is dead (Triton drops it)."""
    live: set[str] = set()
    for stmt in flat:
        if isinstance(stmt, ast.If):
            live |= _value_reads(stmt.test)
        elif isinstance(stmt, ast.For):
            live |= _value_reads(stmt.iter)
        elif isinstance(stmt, (ast.Assign, ast.AugAssign)) and _target(stmt) is not None:
            if any(isinstance(n, ast.Call) and not _pure(n) for n in ast.walk(stmt.value)):
                live |= _value_reads(stmt.value) | {_target(stmt)}
        else:
            live |= _value_reads(stmt)
    work = list(live)
    while work:
        for d in defs.get(work.pop(), []):
            for n in _value_reads(d.value) - live:
                live.add(n)
                work.append(n)
    return live


def _pure(call: ast.Call) -> bool:
    f = call.func
    if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "tl":
        op = OPERATIONS.get(f.attr)
        return op is None or op.memory in (None, "load")
    if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "tg":
        return not f.attr.startswith(("tape_put", "add_later"))
    return True


def _elementwise_names(e: ast.expr, ranks: dict[str, int | None]) -> set[str]:
    """Tiles ``e`` is elementwise in: reached through operators, elementwise calls and the adjoint helpers
    that give a tile the shape of another."""
    if isinstance(e, ast.Name):
        return {e.id} if ranks.get(e.id) == 2 else set()
    operands = _elementwise_operands(e)
    if operands is None and any(_tg_call(e, f) for f in ("unbroadcast", "sum_grad", "extremum_grad", "zeros_grad")):
        operands = e.args[:2]
    return set().union(*(_elementwise_names(o, ranks) for o in operands or []))


def _with_comment(body: list[ast.stmt], flipped: set[str], marker: ast.stmt) -> list[ast.stmt]:
    """``body`` with ``marker`` before the statement holding the first definition of a flipped name."""
    for i, stmt in enumerate(body):
        if any(isinstance(s, (ast.Assign, ast.AugAssign)) and _target(s) in flipped for s in _flat([stmt])):
            if isinstance(stmt, (ast.Assign, ast.AugAssign)):
                return [*body[:i], marker, *body[i:]]
            stmt = copy.copy(stmt)
            stmt.body = _with_comment(stmt.body, flipped, marker)
            if marker not in stmt.body and isinstance(stmt, ast.If):
                stmt.orelse = _with_comment(stmt.orelse, flipped, marker)
            return [*body[:i], stmt, *body[i + 1:]]
    return body


# -- ranks ---------------------------------------------------------------------------------------------------

_KEEP_RANK_HELPERS = ("cast_grad", "widened", "stop_gradient", "to_float", "zeros_grad", "zeros_to_sum")


class _Pending(Exception):
    """A name read before any of its definitions has a rank."""


def _rank(e: ast.expr, ranks: dict[str, int | None], pending: set[str] = frozenset()) -> int | None:
    """How many dimensions ``e`` has (0: a scalar), or None where that is not known. Raises _Pending where
    it reads a name in ``pending``."""
    def of(x):
        return _rank(x, ranks, pending)

    def widest(items):
        found = [of(x) for x in items]
        return None if any(r is None for r in found) else max(found, default=0)

    if isinstance(e, ast.Name):
        if e.id in pending:
            raise _Pending(e.id)
        return ranks.get(e.id)
    if isinstance(e, ast.Constant):
        return 0
    if isinstance(e, (ast.BinOp, ast.Compare, ast.BoolOp, ast.UnaryOp)):
        return widest([c for c in ast.iter_child_nodes(e) if isinstance(c, ast.expr)])
    if isinstance(e, ast.Subscript):
        index = e.slice.elts if isinstance(e.slice, ast.Tuple) else [e.slice]
        inner = of(e.value)
        if inner is None or not all(is_none(i) or _is_full(i) for i in index):
            return None
        full = sum(1 for i in index if _is_full(i))
        return inner + len(index) - full if full <= inner else None
    if not isinstance(e, ast.Call):
        return None
    f = e.func
    if isinstance(f, ast.Name) and f.id in ("float", "int") and all(isinstance(a, ast.Constant) for a in e.args):
        return 0
    if not isinstance(f, ast.Attribute):
        return None
    if _is_method_to(e):
        return of(f.value)
    if not isinstance(f.value, ast.Name):
        return None
    module, fn, args = f.value.id, f.attr, e.args
    named = {k.arg: k.value for k in e.keywords}
    if module == "tl":
        if fn in ("program_id", "num_programs"):
            return 0
        if fn == "arange":
            return 1
        if fn in ("zeros", "full", "reshape", "view", "broadcast_to"):
            at = 0 if fn in ("zeros", "full") else 1
            shape = args[at] if len(args) > at else named.get("shape")  # (a shape in several arguments: unknown)
            if isinstance(shape, (ast.List, ast.Tuple)):
                return len(shape.elts)
            if isinstance(shape, ast.Attribute) and shape.attr == "shape":  # x.shape
                return of(shape.value)
            return None
        if fn == "load":
            return of(args[0]) if args else None
        if fn == "dot":
            ranks_ = {of(a) for a in args[:2]}
            return ranks_.pop() if len(ranks_) == 1 and len(args) >= 2 else None
        if fn in ("trans", "cast"):
            return of(args[0]) if args and (fn == "cast" or _plain_trans(e)) else None
        if fn in _REDUCTIONS:
            keep = named.get("keep_dims", ast.Constant(False))
            if (not args or len(args) > 2 or set(named) - {"axis", "keep_dims", "dtype"}
                    or not (isinstance(keep, ast.Constant) and isinstance(keep.value, bool))):
                return None  # keep_dims (or indices) given by position or not a literal: not followed
            inner, axis = of(args[0]), args[1] if len(args) > 1 else named.get("axis")
            if inner is None or keep.value:
                return inner
            return 0 if axis is None or is_none(axis) else inner - 1
        if _elementwise(fn):
            return widest([*args, *named.values()])
        return None
    if module == "tg":
        if fn in ("trip_count", "program_index"):
            return 0
        if fn in _KEEP_RANK_HELPERS:
            return of(args[0]) if args else None
        if fn in ("unbroadcast", "sum_grad", "extremum_grad"):
            return of(args[1]) if len(args) > 1 else None
        if fn == "tape_get":
            return of(args[2]) if len(args) > 2 else None
    return None
