"""Loops split where a mask is all true: the iterations whose ``tl.where`` masks hold in every lane run in
a copy of the loop without them.

A causal attention's key loop masks every block with ``rn[None, :] <= rm[:, None]``, but only the block on
the diagonal has a lane where it is false; the derived backward recomputes the mask and selects with it
twice per block (the forward's ``where`` and its adjoint's). On an H200 in bf16 dropping them from the
blocks before the diagonal halved the dQ kernel's time (benchmarks/RESULTS.md). This pass does that for
any loop of a derived kernel, on the source codegen writes:

- a ``tl.where(C, a, b)`` in the loop's body is a candidate where ``C`` is a conjunction (``&``) of
  comparisons between lane ranges: ``tl.arange(0, K)`` shifted by scalars affine in the loop variable
  (``start + tl.arange(0, BN)``, ``pid * BM + tl.arange(0, BM)``), broadcast with ``[None, :]``, or plain
  scalars. ``A <= B`` holds in every lane where ``max(A) <= min(B)``: a scalar test per iteration;
- that test is monotone in the iteration when each comparison's two sides move with the loop variable at
  rates whose difference has a known sign (integer literals, and block sizes: ``tl.arange`` extents and
  the loop's step, positive by Triton's rules), so it holds on a prefix or a suffix of the iterations;
- the kernel finds where that run ends by a binary search over the iterations (a few scalar steps; no
  division, so no rounding), then runs the loop twice: over the iterations where every candidate of one
  direction holds, with ``tl.where(C | True, a, b)`` (the same shape; the compiler folds the select and
  the mask away), and over the rest as written. The iterations keep their order.

Names are followed through single assignments: in the loop's body (before the statement reading them) or
at the kernel's top level before the loop. Anything else is left as written.
"""

from __future__ import annotations

import ast
import copy
from collections.abc import Callable
from dataclasses import dataclass

from ..core.ir import name_node, range_bounds, target_of, tl_call

_FLIP = {ast.Lt: ast.Gt, ast.LtE: ast.GtE, ast.Gt: ast.Lt, ast.GtE: ast.LtE}


class _Unknown(Exception):
    """An expression the pass does not follow."""


@dataclass(frozen=True)
class _Scalar:
    """``rate * i + rest``: ``rate`` an integer, or the product of an integer and names known positive."""

    rate: int  # the integer factor of the rate (0: invariant)
    names: tuple[str, ...]  # positive names multiplying it
    rest: ast.expr  # the invariant part, or the whole expression with the loop variable in it

    @property
    def moves(self) -> bool:
        return self.rate != 0


@dataclass(frozen=True)
class _Range:
    """A lane range: its smallest and largest values, each a scalar."""

    low: _Scalar
    high: _Scalar


@dataclass(frozen=True)
class _Test:
    """A candidate's scalar test (the loop variable in it) and the direction it holds in: True for a prefix
    of the iterations, False for a suffix, None for all or none (invariant)."""

    expr: ast.expr
    prefix: bool | None


def split_at_masks(body: list[ast.stmt], taken: set[str], comment: Callable[[str], ast.stmt]) -> list[ast.stmt]:
    """``body`` (a kernel's top level) with each loop whose masks it can prove all true on a run of its
    iterations split there. ``taken``: the names in use (new ones are added); ``comment(text)``: a statement
    codegen prints as a comment, put before each split."""
    out = []
    for i, stmt in enumerate(body):
        split = _split(stmt, body[:i], body, taken) if isinstance(stmt, ast.For) else None
        if split is None:
            out.append(stmt)
            continue
        lines, note = split
        out += [comment(note), *lines]
    return out


def _split(loop: ast.For, before: list[ast.stmt], kernel: list[ast.stmt], taken: set[str]
           ) -> tuple[list[ast.stmt], str] | None:
    """The statements replacing ``loop`` (the search, then its two copies) and their comment, or None.
    ``before``: the kernel's top-level statements before it; ``kernel``: all of them."""
    bounds = _bounds(loop)
    if bounds is None or not isinstance(loop.target, ast.Name) or loop.orelse:
        return None
    lo, hi, step = bounds
    var, counts, in_loop = loop.target.id, _assigned(kernel), _assigned(loop.body)
    positive = {n for n in _positive_names(kernel) if counts.get(n, 0) == 0}  # parameters: constexprs
    if var in in_loop or (isinstance(step, ast.Name) and step.id not in positive):
        return None
    outside = {}  # names assigned once in the kernel, by a top-level statement before the loop
    for stmt in before:
        t = _plain_target(stmt)
        if t is not None and counts.get(t) == 1:
            outside[t] = stmt.value
    follow = _Follow(var, outside, positive, in_loop, counts)
    tests: dict[int, _Test] = {}  # id of a where call -> its test
    for call, env in _where_calls(loop.body, {}, in_loop):
        try:
            tests[id(call)] = follow.all_true(call.args[0], env)
        except _Unknown:
            continue
    if not tests:
        return None
    moving = [t.prefix for t in tests.values() if t.prefix is not None]
    direction = moving.count(True) >= moving.count(False)
    chosen = {k for k, t in tests.items() if t.prefix in (direction, None)}
    # in the body's order (tests'), not the set's: its ids are addresses, which differ from run to run
    test = _conjunction(list({ast.unparse(t.expr): t.expr for k, t in tests.items() if k in chosen}.values()))
    names = {n: _fresh(taken, f"{var}_{n}") for n in ("trips", "first", "last", "middle", "split")}
    search = _search(test, var, lo, step, hi, names, direction)
    free = copy.deepcopy(loop)
    _unmask(free, chosen, loop)
    kept = copy.deepcopy(loop)
    split = name_node(names["split"])
    if direction:
        free.iter, kept.iter = _range(lo, split, step), _range(split, hi, step)
        loops = [free, kept]
    else:
        kept.iter, free.iter = _range(lo, split, step), _range(split, hi, step)
        loops = [kept, free]
    which = "first" if direction else "last"
    note = (f"the iterations over `{var}` whose masks hold in every lane (the {which} ones, found by a binary "
            f"search) run in a copy of the loop without them (peel.py)")
    return [*search, *loops], note


def _bounds(loop: ast.For) -> tuple[ast.expr, ast.expr, ast.expr] | None:
    """A builtin ``range`` loop's start, stop and step, where the step may be positive (a literal above zero, or
    a name: positive only if a block size, checked with the kernel's names)."""
    it = loop.iter
    if not (isinstance(it, ast.Call) and isinstance(it.func, ast.Name) and it.func.id == "range" and not it.keywords
            and 1 <= len(it.args) <= 3):
        return None
    lo, hi, step = range_bounds(loop)
    if isinstance(step, ast.Name) or (isinstance(step, ast.Constant) and type(step.value) is int and step.value > 0):
        return lo, hi, step
    return None


def _plain_target(stmt: ast.stmt) -> str | None:
    """The name ``stmt`` assigns if it is ``name = value``."""
    return target_of(stmt) if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 else None


def _range(lo: ast.expr, hi: ast.expr, step: ast.expr) -> ast.Call:
    return ast.Call(func=name_node("range"), args=[copy.deepcopy(lo), copy.deepcopy(hi), copy.deepcopy(step)],
                    keywords=[])


def _assigned(body: list[ast.stmt]) -> dict[str, int]:
    """How many times each name is assigned anywhere in ``body`` (loop targets and augmented assignments too)."""
    counts: dict[str, int] = {}
    for node in ast.walk(ast.Module(body=body, type_ignores=[])):
        targets = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign, ast.For)):
            targets = [node.target]
        for t in targets:
            for n in ast.walk(t):
                if isinstance(n, ast.Name):
                    counts[n.id] = counts.get(n.id, 0) + 1
    return counts


def _positive_names(kernel: list[ast.stmt]) -> set[str]:
    """Names used as a ``tl.arange`` extent: constexprs Triton requires to be positive powers of two."""
    found = set()
    for n in ast.walk(ast.Module(body=kernel, type_ignores=[])):
        if (tl_call(n, "arange") and len(n.args) == 2 and isinstance(n.args[0], ast.Constant)
                and n.args[0].value == 0 and isinstance(n.args[1], ast.Name)):
            found.add(n.args[1].id)
    return found


def _where_calls(body: list[ast.stmt], env: dict, in_loop: dict) -> list[tuple[ast.Call, dict]]:
    """The ``tl.where`` calls of a loop's body, each with the names it can read as defined: name -> (value, the
    names its value reads as defined). Into branches (what they define stays in them), not nested loops."""
    found = []
    for stmt in body:
        if isinstance(stmt, ast.If):
            found += _where_calls(stmt.body, env, in_loop) + _where_calls(stmt.orelse, env, in_loop)
            continue
        if isinstance(stmt, (ast.For, ast.While)):
            continue
        found += [(n, env) for n in ast.walk(stmt) if tl_call(n, "where") and len(n.args) == 3 and not n.keywords]
        t = _plain_target(stmt)
        if t is not None and in_loop.get(t) == 1:
            env = {**env, t: (stmt.value, env)}
    return found


class _Follow:
    """Reads a mask as lane ranges of the loop variable ``var``. Names are read in an environment: the loop
    body's single assignments that precede the reading statement (``_where_calls``), None before the loop.
    ``outside``: the kernel's single assignments before the loop; ``positive``: names known positive;
    ``in_loop``, ``counts``: how often the body and the kernel assign each name (a name the kernel never
    assigns is a parameter or a global: a scalar)."""

    def __init__(self, var: str, outside: dict, positive: set[str], in_loop: dict, counts: dict):
        self.var, self.outside, self.positive = var, outside, positive
        self.in_loop, self.counts = in_loop, counts

    def all_true(self, mask: ast.expr, env: dict) -> _Test:
        """The test that ``mask``, read in ``env``, holds in every lane."""
        exprs, directions = [], set()
        for compare, where in self._conjuncts(mask, env):
            left, right = self.lanes(compare.left, where), self.lanes(compare.comparators[0], where)
            op = type(compare.ops[0])
            if op in (ast.Gt, ast.GtE):  # a > b: b < a
                left, right, op = right, left, _FLIP[op]
            largest, smallest = left.high, right.low  # every lane: max(left) < min(right)
            exprs.append(ast.Compare(left=largest.rest, ops=[op()], comparators=[smallest.rest]))
            directions.add(_direction((largest.rate, largest.names), (smallest.rate, smallest.names)))
        moving = directions - {None}
        if len(moving) > 1:
            raise _Unknown("comparisons holding in different runs of iterations")
        return _Test(_conjunction(exprs), moving.pop() if moving else None)

    def _value(self, name: str, env: dict | None) -> tuple[ast.expr, dict | None] | None:
        """What ``name`` holds when read in ``env``: its defining expression and the environment that reads
        (None: a parameter, or the loop variable); raises where the pass cannot say."""
        if env is not None and name == self.var:
            return None
        if env is not None and name in self.in_loop:
            if name in env:
                return env[name]
            raise _Unknown(f"`{name}` changes in the loop")
        if name in self.outside:
            return self.outside[name], None
        if self.counts.get(name, 0) == 0 and name != self.var:
            return None  # a parameter (or a global)
        raise _Unknown(f"`{name}` is assigned more than once")

    def _conjuncts(self, mask: ast.expr, env: dict | None) -> list[tuple[ast.Compare, int | None]]:
        if isinstance(mask, ast.Name):
            found = self._value(mask.id, env)
            if found is None:
                raise _Unknown("not a mask")
            return self._conjuncts(*found)
        if isinstance(mask, ast.BinOp) and isinstance(mask.op, ast.BitAnd):
            return self._conjuncts(mask.left, env) + self._conjuncts(mask.right, env)
        if isinstance(mask, ast.Compare) and len(mask.ops) == 1 and type(mask.ops[0]) in _FLIP:
            return [(mask, env)]
        raise _Unknown("not a conjunction of comparisons")

    def lanes(self, e: ast.expr, env: dict | None) -> _Range:
        """The smallest and largest lane of ``e``, read in ``env``."""
        if isinstance(e, ast.Name):
            found = self._value(e.id, env)
            return self.lanes(*found) if found is not None else _Range(self.scalar(e, env), self.scalar(e, env))
        if isinstance(e, ast.Subscript) and _expands(e.slice):  # x[None, :], x[:, None]
            return self.lanes(e.value, env)
        if tl_call(e, "arange") and len(e.args) == 2 and not e.keywords:
            return _Range(self.scalar(e.args[0], env), _plus(self.scalar(e.args[1], env), -1))
        if isinstance(e, ast.BinOp) and isinstance(e.op, (ast.Add, ast.Sub)):
            left, right = self.lanes(e.left, env), self.lanes(e.right, env)
            if isinstance(e.op, ast.Add):
                return _Range(_add(left.low, right.low, ast.Add), _add(left.high, right.high, ast.Add))
            return _Range(_add(left.low, right.high, ast.Sub), _add(left.high, right.low, ast.Sub))
        s = self.scalar(e, env)
        return _Range(s, s)

    def scalar(self, e: ast.expr, env: dict | None) -> _Scalar:
        """A scalar affine in the loop variable (or invariant in the loop), read in ``env``."""
        if isinstance(e, ast.Name):
            if env is not None and e.id == self.var:
                return _Scalar(1, (), name_node(e.id))
            found = self._value(e.id, env)
            if found is None:  # a parameter
                return _Scalar(0, (), e)
            if found[1] is None:  # assigned before the loop: fixed in it, read by name
                self.scalar(*found)  # a scalar (raises otherwise)
                return _Scalar(0, (), e)
            return self.scalar(*found)
        if isinstance(e, ast.Constant) and type(e.value) is int:
            return _Scalar(0, (), e)
        if tl_call(e, "cast") and len(e.args) == 2 and _int_type(e.args[1]):
            inner = self.scalar(e.args[0], env)
            return _Scalar(inner.rate, inner.names, ast.Call(func=e.func, args=[inner.rest, e.args[1]], keywords=[]))
        if (tl_call(e, "program_id") or tl_call(e, "num_programs")) and all(
                isinstance(a, ast.Constant) for a in e.args):
            return _Scalar(0, (), e)
        if (tl_call(e, "minimum") or tl_call(e, "maximum")) and len(e.args) == 2:
            parts = [self.scalar(a, env) for a in e.args]
            if any(p.moves for p in parts):
                raise _Unknown("a minimum of a moving value")
            return _Scalar(0, (), ast.Call(func=e.func, args=[p.rest for p in parts], keywords=[]))
        if isinstance(e, ast.BinOp) and isinstance(e.op, (ast.Add, ast.Sub)):
            return _add(self.scalar(e.left, env), self.scalar(e.right, env), type(e.op))
        if isinstance(e, ast.BinOp) and isinstance(e.op, ast.Mult):
            left, right = self.scalar(e.left, env), self.scalar(e.right, env)
            rest = ast.BinOp(left=left.rest, op=ast.Mult(), right=right.rest)
            if left.moves and right.moves:
                raise _Unknown("a product of two moving values")
            if not left.moves and not right.moves:
                return _Scalar(0, (), rest)
            moving, factor = (left, e.right) if left.moves else (right, e.left)
            if isinstance(factor, ast.Constant) and type(factor.value) is int:
                return _Scalar(moving.rate * factor.value, moving.names, rest)
            if isinstance(factor, ast.Name) and factor.id in self.positive:
                return _Scalar(moving.rate, tuple(sorted((*moving.names, factor.id))), rest)
            raise _Unknown("a rate of unknown sign")
        raise _Unknown(ast.dump(e)[:60])


def _direction(left: tuple[int, tuple], right: tuple[int, tuple]) -> bool | None:
    """Where ``max(left) < min(right)`` holds: a prefix (True) when the left side rises faster, a suffix
    (False) when the right one does, every or no iteration (None) when neither moves; else unknown."""
    (lr, ln), (rr, rn) = left, right
    if lr == 0 and rr == 0:
        return None
    if rr == 0:
        return lr > 0
    if lr == 0:
        return rr < 0
    if ln == rn:  # the same positive names: the integer factors decide
        if lr == rr:
            return None
        return lr > rr
    raise _Unknown("rates of unknown order")


def _add(a: _Scalar, b: _Scalar, op: type) -> _Scalar:
    rate_b = b.rate if op is ast.Add else -b.rate
    if a.moves and b.moves and a.names != b.names:
        raise _Unknown("rates in different names")
    names = a.names if a.moves else b.names
    rate = a.rate + rate_b
    return _Scalar(rate, names if rate else (), ast.BinOp(left=a.rest, op=op(), right=b.rest))


def _plus(s: _Scalar, k: int) -> _Scalar:
    op = ast.Add() if k >= 0 else ast.Sub()
    return _Scalar(s.rate, s.names, ast.BinOp(left=s.rest, op=op, right=ast.Constant(abs(k))))


def _expands(index: ast.expr) -> bool:
    """``[None, :]``, ``[:, None]``, ``[None]``: a new axis, the values unchanged."""
    parts = index.elts if isinstance(index, ast.Tuple) else [index]
    return all((isinstance(p, ast.Constant) and p.value is None)
               or (isinstance(p, ast.Slice) and p.lower is None and p.upper is None and p.step is None)
               for p in parts)


def _int_type(e: ast.expr) -> bool:
    return isinstance(e, ast.Attribute) and e.attr in ("int32", "int64") and isinstance(e.value, ast.Name)


def _conjunction(exprs: list[ast.expr]) -> ast.expr:
    out = exprs[0]
    for e in exprs[1:]:
        out = ast.BinOp(left=out, op=ast.BitAnd(), right=e)
    return out


def _fresh(taken: set[str], base: str) -> str:
    name = base
    while name in taken:
        name += "_"
    taken.add(name)
    return name


def _search(test: ast.expr, var: str, lo: ast.expr, step: ast.expr, hi: ast.expr, names: dict[str, str],
            prefix: bool) -> list[ast.stmt]:
    """Statements setting ``names["split"]`` to the loop value where the run of iterations passing ``test``
    ends (prefix) or starts (suffix)."""
    n = names
    start = "" if isinstance(lo, ast.Constant) and lo.value == 0 else f"({_src(lo)}) + "
    times = "" if isinstance(step, ast.Constant) and step.value == 1 else f" * ({_src(step)})"
    value = ast.parse(f"{start}{n['middle']}{times}", mode="eval").body
    probe = _substituted(test, var, value)
    passed, failed = (f"{n['first']} = {n['middle']} + 1", f"{n['last']} = {n['middle']}") if prefix else \
        (f"{n['last']} = {n['middle']}", f"{n['first']} = {n['middle']} + 1")
    span = _src(hi) if not start else f"({_src(hi)}) - ({_src(lo)})"
    trips = f"tl.cdiv({span}, {_src(step)})" if times else span
    src = (f"{n['trips']} = tl.maximum({trips}, 0)\n"
           f"{n['first']} = {n['trips']} * 0\n"
           f"{n['last']} = {n['trips']}\n"
           f"while {n['first']} < {n['last']}:\n"
           f"    {n['middle']} = ({n['first']} + {n['last']}) // 2\n"
           f"    if {_src(probe)}:\n"
           f"        {passed}\n"
           f"    else:\n"
           f"        {failed}\n"
           f"{n['split']} = {start}{n['first']}{times}\n")
    return ast.parse(src).body


def _src(e: ast.expr) -> str:
    return ast.unparse(e)


def _substituted(e: ast.expr, var: str, value: ast.expr) -> ast.expr:
    class Put(ast.NodeTransformer):
        def visit_Name(self, node: ast.Name) -> ast.expr:
            return copy.deepcopy(value) if node.id == var else node

    return Put().visit(copy.deepcopy(e))


def _unmask(free: ast.For, chosen: set[int], original: ast.For) -> None:
    """In the copy ``free`` of ``original``, the chosen ``tl.where`` calls' conditions or-ed with True."""
    pairs = zip(ast.walk(original), ast.walk(free), strict=True)
    for before, after in pairs:
        if id(before) in chosen:
            after.args[0] = ast.BinOp(left=after.args[0], op=ast.BitOr(), right=ast.Constant(True))
