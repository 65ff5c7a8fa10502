"""What codegen/orient.py knows of a derived kernel's body before it transposes anything: each name's rank (a small
inference over the body), definitions and liveness, which tiles a product computed, which have an axis of one
element, and the groups of tiles elementwise in each other."""

from __future__ import annotations

import ast

from ..core.calls import pure, value_reads
from ..core.ir import every_statement, is_none, tl_call
from ..core.language import HELPERS, Helper, helper_of
from ..core.operations import OPERATIONS, kinds

# reductions whose axis can move to the other one
REDUCTIONS = kinds(reduction="axis")


class TileFacts:
    """What orient.py knows of a body: each name's rank, definitions, and whether a product computed it."""

    def __init__(self, body: list[ast.stmt], params: list[str]):
        self.ranks: dict[str, int | None] = {p: 0 for p in params}
        self.defs: dict[str, list[ast.stmt]] = {}
        self.order: dict[str, int] = {}
        self.pinned: set[str] = set()  # defined otherwise than by `name = ...` / `name op= ...`
        flat = list(every_statement(body))
        for stmt in flat:
            if isinstance(stmt, ast.For):
                self.ranks[stmt.target.id] = 0
                self.pinned.add(stmt.target.id)
            elif isinstance(stmt, (ast.Assign, ast.AugAssign)) and target_name(stmt) is not None:
                self.defs.setdefault(target_name(stmt), []).append(stmt)
                self.order.setdefault(target_name(stmt), len(self.order))
            elif isinstance(stmt, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
                self.pinned |= {n.id for n in ast.walk(stmt)
                                if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
        self._infer_ranks()
        self.dotted = self._dotted()
        self.live = live_names(flat, self.defs)
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
            index = swapped_row(e, self)
            return None if index is None else int(is_none(index.elts[0]))
        if isinstance(e, ast.Call) and reduction_axis(e, keep_dims=True) is not None and self.rank(e.args[0]) == 2:
            return reduction_axis(e, keep_dims=True)
        if isinstance(e, ast.Call) and any(tg_call(e, f) for f in ("unbroadcast", "zeros_grad")):
            return self.unit_axis(e.args[-1])
        operands = elementwise_operands(e)
        if operands is None:
            return None
        ranks = [self.rank(o) for o in operands]
        if None in ranks:
            return None
        axes = {self.unit_axis(o) if r == 2 else 0 for o, r in zip(operands, ranks, strict=True) if r > 0}
        return axes.pop() if len(axes) == 1 else None

    def costly(self, e: ast.expr) -> bool:
        """``e`` is ``tl.trans`` of a product-derived tile with no axis of one element."""
        if not plain_trans(tl_call(e, "trans")):
            return False
        x = e.args[0]
        return self.unit_axis(x) is None and bool(has_dot(x) or value_reads(x) & self.dotted)

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
                        seen.append((rank_of(d.value, self.ranks, pending), isinstance(d, ast.AugAssign)))
                    except Pending:
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
        return rank_of(e, self.ranks)

    def is_tile(self, name: str) -> bool:
        return self.ranks.get(name) == 2 and name not in self.pinned and name in self.defs

    def _dotted(self) -> set[str]:
        """Names a product computed (a ``tl.dot`` in what their values are computed from)."""
        dotted: set[str] = set()
        while True:
            more = {n for n, defs in self.defs.items() if n not in dotted
                    and any(has_dot(d.value) or value_reads(d.value) & dotted for d in defs)}
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
                for other in elementwise_names(d.value, self.ranks):
                    if other in parent:
                        parent[find(other)] = find(name)
        groups: dict[str, set[str]] = {}
        for name in parent:
            groups.setdefault(find(name), set()).add(name)
        return sorted(groups.values(), key=lambda g: min(self.order[n] for n in g))


def reduction_axis(call: ast.Call, keep_dims: bool = False) -> int | None:
    """The axis (0 or 1) of ``tl.sum(x, axis)`` and the like, with kept dims or without, else None."""
    if not any(tl_call(call, fn) for fn in REDUCTIONS) or len(call.args) > 2:
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


def tg_call(e: ast.AST, function: str) -> ast.Call | None:
    """``e`` if it is a call ``tg.<function>(...)``, else None."""
    if (isinstance(e, ast.Call) and isinstance(e.func, ast.Attribute) and e.func.attr == function
            and isinstance(e.func.value, ast.Name) and e.func.value.id == "tg"):
        return e
    return None


def elementwise_operands(e: ast.expr) -> list[ast.expr] | None:
    """The operands of an elementwise operation (an operator, an elementwise ``tl`` function, a cast), else
    None."""
    if isinstance(e, (ast.BinOp, ast.UnaryOp, ast.Compare, ast.BoolOp)):
        return [c for c in ast.iter_child_nodes(e) if isinstance(c, ast.expr)]
    if not isinstance(e, ast.Call):
        return None
    if is_method_to(e):
        return [e.func.value]
    if (tl_call(e, "cast") or (helper_of(e) or NO_HELPER).elementwise) and e.args:
        return [e.args[0]]
    f = e.func
    if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "tl" \
            and elementwise_in_all(f.attr):
        return [*e.args, *(k.value for k in e.keywords)]
    return None


NO_HELPER = Helper()  # what a call that is no helper's is taken to be


def helper_named(fn: str) -> Helper:
    return HELPERS.get(fn, NO_HELPER)


def elementwise_in_all(fn: str) -> bool:
    """``tl.<fn>`` is elementwise in all its arguments (``broadcast_to``'s shape is not an operand)."""
    return fn in OPERATIONS and OPERATIONS[fn].elementwise and fn != "broadcast_to"


def is_method_to(call: ast.Call) -> bool:
    """``x.to(dtype)``."""
    f = call.func
    return isinstance(f, ast.Attribute) and f.attr == "to" and not (isinstance(f.value, ast.Name)
                                                                     and f.value.id in ("tl", "tg"))


def plain_trans(call: ast.Call | None) -> bool:
    return call is not None and len(call.args) == 1 and not call.keywords


def swapped_row(e: ast.Subscript, facts: TileFacts) -> ast.Tuple | None:
    """For ``x[None, :]`` of a 1-D ``x`` the index ``[:, None]``, and the other way round, else None."""
    index = e.slice
    if facts.rank(e.value) != 1 or not isinstance(index, ast.Tuple) or len(index.elts) != 2:
        return None
    kinds = ["new" if is_none(i) else "all" if is_full(i) else "?" for i in index.elts]
    if sorted(kinds) != ["all", "new"]:
        return None
    return ast.Tuple(index.elts[::-1], ast.Load())


def is_full(e: ast.expr) -> bool:
    return isinstance(e, ast.Slice) and e.lower is None and e.upper is None and e.step is None


def target_name(stmt: ast.stmt) -> str | None:
    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
        return stmt.targets[0].id
    if isinstance(stmt, ast.AugAssign) and isinstance(stmt.target, ast.Name):
        return stmt.target.id
    return None


def has_dot(e: ast.AST) -> bool:
    return any(tl_call(n, "dot") for n in ast.walk(e))


def live_names(flat: list[ast.stmt], defs: dict[str, list[ast.stmt]]) -> set[str]:
    """Names whose values reach something the kernel does (a store, a branch, a loop's range, a call's
    effect): a value read only for its shape or type, or by nothing, is dead (Triton drops it)."""
    live: set[str] = set()
    for stmt in flat:
        if isinstance(stmt, ast.If):
            live |= value_reads(stmt.test)
        elif isinstance(stmt, ast.For):
            live |= value_reads(stmt.iter)
        elif isinstance(stmt, (ast.Assign, ast.AugAssign)) and target_name(stmt) is not None:
            if any(isinstance(n, ast.Call) and not pure(n) for n in ast.walk(stmt.value)):
                live |= value_reads(stmt.value) | {target_name(stmt)}
        else:
            live |= value_reads(stmt)
    work = list(live)
    while work:
        for d in defs.get(work.pop(), []):
            for n in value_reads(d.value) - live:
                live.add(n)
                work.append(n)
    return live


def elementwise_names(e: ast.expr, ranks: dict[str, int | None]) -> set[str]:
    """Tiles ``e`` is elementwise in: reached through operators, elementwise calls and the adjoint helpers
    that give a tile the shape of another."""
    if isinstance(e, ast.Name):
        return {e.id} if ranks.get(e.id) == 2 else set()
    operands = elementwise_operands(e)
    if operands is None and (helper_of(e) or NO_HELPER).shaped_like:
        operands = e.args[:2]
    return set().union(*(elementwise_names(o, ranks) for o in operands or []))


class Pending(Exception):
    """A name read before any of its definitions has a rank."""


def rank_of(e: ast.expr, ranks: dict[str, int | None], pending: set[str] = frozenset()) -> int | None:
    """How many dimensions ``e`` has (0: a scalar), or None where that is not known. Raises Pending where
    it reads a name in ``pending``."""
    def of(x):
        return rank_of(x, ranks, pending)

    def widest(items):
        found = [of(x) for x in items]
        return None if any(r is None for r in found) else max(found, default=0)

    if isinstance(e, ast.Name):
        if e.id in pending:
            raise Pending(e.id)
        return ranks.get(e.id)
    if isinstance(e, ast.Constant):
        return 0
    if isinstance(e, (ast.BinOp, ast.Compare, ast.BoolOp, ast.UnaryOp)):
        return widest([c for c in ast.iter_child_nodes(e) if isinstance(c, ast.expr)])
    if isinstance(e, ast.Subscript):
        index = e.slice.elts if isinstance(e.slice, ast.Tuple) else [e.slice]
        inner = of(e.value)
        if inner is None or not all(is_none(i) or is_full(i) for i in index):
            return None
        full = sum(1 for i in index if is_full(i))
        return inner + len(index) - full if full <= inner else None
    if not isinstance(e, ast.Call):
        return None
    f = e.func
    if isinstance(f, ast.Name) and f.id in ("float", "int") and all(isinstance(a, ast.Constant) for a in e.args):
        return 0
    if not isinstance(f, ast.Attribute):
        return None
    if is_method_to(e):
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
            return of(args[0]) if args and (fn == "cast" or plain_trans(e)) else None
        if fn in REDUCTIONS:
            keep = named.get("keep_dims", ast.Constant(False))
            if (not args or len(args) > 2 or set(named) - {"axis", "keep_dims", "dtype"}
                    or not (isinstance(keep, ast.Constant) and isinstance(keep.value, bool))):
                return None  # keep_dims (or indices) given by position or not a literal: not followed
            inner, axis = of(args[0]), args[1] if len(args) > 1 else named.get("axis")
            if inner is None or keep.value:
                return inner
            return 0 if axis is None or is_none(axis) else inner - 1
        if elementwise_in_all(fn):
            return widest([*args, *named.values()])
        return None
    if module == "tg":
        like = helper_named(fn).rank_like
        if like == -1:
            return 0
        return of(args[like]) if like is not None and len(args) > like else None
    return None
