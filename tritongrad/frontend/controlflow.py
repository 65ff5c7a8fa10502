"""Flattening ``if`` and ``for`` statements: blocks of their own, with copies where control flow joins.

A variable assigned in a branch gets a merge name assigned at the end of both branches
(Triton's rule for a runtime ``if``); a variable a loop body assigns that had a value
before the loop is carried: a copy gives it its initial value before the loop, another
its next value at the end of the body (see ir.py).

Early returns outside loops are made structural first (``lift_returns``): the rest of the
body moves into the branch that does not return, so ``if c: return`` followed by ``rest``
reads ``if c: pass else: rest``, a runtime or constexpr ``if`` like any other.
"""

from __future__ import annotations

import ast
import builtins
import copy
import os
from collections.abc import Callable

from ..core.ir import Carried, Op
from ..core.operations import LOADS, operation_of
from ..core.source import triton_language_name
from .expressions import name_node, rename_globals
from .specialize import evaluate_test

# tritongrad's tg helpers (a derived kernel derived again inlines them)
_LANGUAGE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "core", "language.py")


class ControlFlowFlattener:
    """The ``if`` / ``for`` half of :class:`frontend.Normalizer`."""

    def __init__(self, normalizer):
        self.normalizer = normalizer  # the Normalizer whose blocks this flattens if and for into
        # SSA name -> the (test, branch) pairs of the constexpr ifs it is bound only inside (assigned in one branch)
        self.bound_only_in: dict[str, frozenset[tuple[str, bool]]] = {}

    def lift_returns(self, body: list[ast.stmt], value: bool) -> tuple[list[ast.stmt], ast.Return | None]:
        """The function body being flattened, its early returns made structural (see ``lift_returns``)."""
        return lift_returns(body, value, self.normalizer.refuse)

    def nested_block(self, stmts: list[ast.stmt]) -> list[ast.stmt]:
        """Flatten ``stmts`` into a block of their own (a branch or a loop body)."""
        saved, self.normalizer.out = self.normalizer.out, []
        try:
            self.normalizer.block(stmts)
            return self.normalizer.out
        finally:
            self.normalizer.out = saved

    def if_statement(self, stmt: ast.If) -> None:
        """``if`` / ``elif`` / ``else``: each branch a block; a variable either assigns gets a merge name,
        assigned at the end of both branches (Triton's rule for a runtime ``if``). An ``isinstance`` test is
        decided here, as Triton decides it when it compiles: only the branch taken is flattened."""
        decided = self._isinstance_test(stmt.test, stmt)
        if decided is None:
            decided = self._known_test(stmt.test)
        if decided is not None:
            self.normalizer.block(stmt.body if decided else stmt.orelse)
            return
        test = self.normalizer.expressions.condition(stmt.test, stmt)
        static = self.normalizer.is_constexpr(test)
        frame = self.normalizer.frame
        env, gone = dict(frame.env), dict(frame.gone)
        branches = []
        for body in (stmt.body, stmt.orelse):
            frame.env, frame.gone = dict(env), dict(gone)
            branches.append((self.nested_block(body), frame.env, frame.gone))
        frame.env, frame.gone = dict(env), {**branches[0][2], **branches[1][2]}
        merges = []
        names = [n for n in {**branches[0][1], **branches[1][1]} if any(
            n not in env or _differs(b[1].get(n), env[n]) for b in branches)]
        keep = getattr(stmt, "tg_keep", None)  # an `if` lift_returns made: only what it returns is read after it
        if keep is not None:
            line = self.normalizer.origin(stmt).line
            for name in names:
                if name not in keep:
                    frame.gone[name] = f"it is assigned after the early return on line {line}"
            names = [n for n in names if n in keep]
        for name in names:
            values = [b[1].get(name) for b in branches]
            if static:  # a value bound only in the other branch of an earlier `if` on this test is unbound here
                values = [None if self._unbound_in(v, ast.dump(test), taken) else v
                          for v, taken in zip(values, (True, False), strict=True)]
            if None not in values and not _differs(*values):
                frame.env[name] = values[0]
                continue
            if None in values and not static:
                line = self.normalizer.origin(stmt).line
                frame.gone[name] = (f"it is assigned in only one branch of the `if` on line {line}, and Triton "
                                    "keeps a value after a runtime `if` only when both branches assign it")
                continue
            # a version first assigned in a branch becomes the merge variable itself there (no copy)
            blocks = [b[0] for b in branches]
            own = [v is not None and _assigned_at_top(block, v) for block, v in zip(blocks, values, strict=True)]
            merged = next((v.id for v, ok in zip(values, own, strict=True) if ok), None)
            bound = self._bound_only_in(values, ast.dump(test))
            if merged is None:
                merged = self.normalizer.new_version(name)
            if bound is not None:
                self.bound_only_in[merged] = bound
            frame.env[name] = name_node(merged)
            for block, value, ok in zip(blocks, values, own, strict=True):
                if ok:
                    _rename(block, value.id, merged)
                elif value is not None:
                    self.normalizer.out, saved = block, self.normalizer.out
                    self.normalizer.finish(ast.Assign(targets=[name_node(merged, ast.Store())], value=value),
                                           Op("copy", [value]), stmt, join=True)
                    self.normalizer.out = saved
            if all(self.normalizer.is_constexpr(v) for v in values if v is not None):
                self.normalizer.constexprs.add(merged)
            merges.append(merged)
        for name in frame.env:
            frame.gone.pop(name, None)
        node = ast.If(test=test, body=branches[0][0], orelse=branches[1][0])
        self.normalizer.finish(node, Op("if", [test]), stmt, merges=merges, static=static)

    def _unbound_in(self, value: ast.expr | None, test: str, taken: bool) -> bool:
        """Whether ``value`` is surely unbound in the branch ``taken`` of a constexpr ``if`` on ``test``: it is
        bound only inside the other branch of an earlier one (a derived kernel's `if` that recomputes what its
        recomputed forward `if` assigned). Copying it into the merge there would read a name never assigned."""
        return isinstance(value, ast.Name) and (test, not taken) in self.bound_only_in.get(value.id, ())

    def _bound_only_in(self, values: list[ast.expr | None], test: str) -> frozenset[tuple[str, bool]] | None:
        """Where the merge of a constexpr ``if`` one branch of which leaves it unassigned is bound: in the other
        branch, where its value is bound (None: both branches assign it)."""
        if values[0] is not None and values[1] is not None:
            return None
        taken = values[1] is None
        value = values[0] if taken else values[1]
        inner = self.bound_only_in.get(value.id, frozenset()) if isinstance(value, ast.Name) else frozenset()
        return inner | {(test, taken)}

    def conditional(self, node: ast.IfExp, stmt: ast.stmt, target: str | None = None) -> ast.expr:
        """``a if test else b`` as the statement ``if test: t = a`` / ``else: t = b``, and the atom ``t`` now names
        (``t``: ``target``, the name an assignment gives it, else a temporary). Compiled Triton decides a test it
        knows when it compiles and makes a runtime ``if`` of any other, whose branches must give one type: so does
        an ``if`` statement, whose branches are differentiated (a conditional expression kept whole was not)."""
        frame = self.normalizer.frame
        name = target
        if name is None:  # a source name the function being flattened does not use
            used = {n.id for n in ast.walk(frame.fn.tree) if isinstance(n, ast.Name)}
            name = self.normalizer.namer.fresh("choice")
            while name in used:
                name = self.normalizer.namer.fresh("choice")

        def branch(value: ast.expr) -> list[ast.stmt]:
            if isinstance(value, ast.Tuple):
                raise self.normalizer.refuse(stmt, "a conditional expression choosing between tuples",
                                             "write an `if` statement assigning each name in both branches")
            return [ast.copy_location(ast.Assign(targets=[name_node(name, ast.Store())], value=value), stmt)]

        self.if_statement(ast.copy_location(ast.If(test=node.test, body=branch(node.body),
                                                   orelse=branch(node.orelse)), stmt))
        if target is not None:
            return frame.env[name]
        frame.gone.pop(name, None)
        return frame.env.pop(name)

    def _known_test(self, test: ast.expr) -> bool | None:
        """A test on values known at derivation (a helper's ``if`` on a constexpr the kernel passes it, a
        specialized one): its truth, as Triton takes it when it compiles; None where something is unknown."""
        frame, values = self.normalizer.frame, {}
        for node in ast.walk(test):
            if isinstance(node, ast.Name) and node.id not in values:
                atom = frame.env.get(node.id, node)
                known, value = self.normalizer.known_value(atom)
                if not known:
                    return None
                values[node.id] = value
        return evaluate_test(test, values)

    def _isinstance_test(self, test: ast.expr, stmt: ast.stmt) -> bool | None:
        """``isinstance(x, tl.tensor_descriptor)`` (the tutorials' host-or-device descriptor helper): whether ``x``
        is a descriptor here; None for any other test."""
        expressions = self.normalizer.expressions
        if not (isinstance(test, ast.Call) and len(test.args) == 2 and not test.keywords
                and expressions.resolve(test.func) is builtins.isinstance):
            return None
        kind = expressions.resolve(test.args[1])
        if getattr(kind, "__name__", None) not in ("tensor_descriptor", "tensor_descriptor_base"):
            raise self.normalizer.refuse(stmt, f"the test `{ast.unparse(test)}`",
                                         "the `isinstance` test tritongrad decides as Triton does is on "
                                         "`tl.tensor_descriptor`; test a constexpr flag otherwise")
        value = expressions.atom(test.args[0], stmt)
        return isinstance(value, ast.Name) and value.id in self.normalizer.descriptors

    def for_loop(self, stmt: ast.For) -> None:
        """``for`` over ``range`` / ``tl.range`` / ``tl.static_range``. A variable the body assigns that has
        a value before the loop is carried: a copy gives it its initial value before the loop, another its
        next value at the end of the body; names first assigned in the body do not outlive the loop."""
        if stmt.orelse:
            raise self.normalizer.refuse(stmt, "a `for ... else`", "Triton loops have no `else`; put it after the loop")
        if not isinstance(stmt.target, ast.Name):
            raise self.normalizer.refuse(stmt, "a `for` loop with a tuple target",
                                         "loop over one index: `for i in range(n)`")
        iterator = stmt.iter
        obj = self.normalizer.expressions.resolve(iterator.func) if isinstance(iterator, ast.Call) else None
        spelled = iterator.func if isinstance(iterator, ast.Call) else None  # (an interpreter's replacement of it)
        if obj is not builtins.range and triton_language_name(obj, spelled) not in ("range", "static_range"):
            raise self.normalizer.refuse(stmt, f"a `for` loop over `{ast.unparse(iterator)}`",
                              "loop over range(...), tl.range(...) or tl.static_range(...)")
        if any(isinstance(a, ast.Starred) for a in iterator.args) or any(k.arg is None for k in iterator.keywords):
            raise self.normalizer.refuse(stmt, "a loop range with *args or **kwargs", "pass the bounds explicitly")
        args = [self.normalizer.expressions.atom(a, stmt) for a in iterator.args]
        kwargs = {k.arg: self.normalizer.expressions.atom(k.value, stmt) for k in iterator.keywords
                  if k.arg not in SCHEDULING_HINTS}
        if obj is not builtins.range:
            self.normalizer.expressions._import_globals(iterator.func)
        callee = rename_globals(iterator.func, self.normalizer.frame)
        static = triton_language_name(obj, spelled) == "static_range"
        if static and os.path.abspath(self.normalizer.origin(stmt).file) == _LANGUAGE:
            # a derived kernel derived again (double backward) inlines tg helpers: a static loop over a rank,
            # differentiated again, gave a kernel Triton cannot run (shape[i] in a loop kept as a loop); the helpers
            # a derived kernel calls are written without such loops (tg.unbroadcast's compile-time ifs)
            raise self.normalizer.refuse(stmt, f"a `for` loop over `{ast.unparse(iterator)}`",
                                         "a tg helper's static loop is not yet differentiated again")
        frame = self.normalizer.frame
        target = stmt.target.id
        assigned = _assigned_names(stmt.body)
        carried = []
        for name in assigned:
            if name in frame.env and name != target:
                init = frame.env[name]
                phi = self._reusable_init(init)  # `acc = tl.zeros(...)` is the carried variable itself
                if phi is None:
                    phi = self.normalizer.new_version(name)
                    self.normalizer.finish(ast.Assign(targets=[name_node(phi, ast.Store())], value=init),
                                           Op("copy", [init]), stmt)
                carried.append((name, phi, init))
        outside = dict(frame.env)
        index = self.normalizer.new_version(target)
        if static:
            self.normalizer.constexprs.add(index)
        self.normalizer.out, saved = [], self.normalizer.out
        self.normalizer.block(stmt.body)
        records = []
        for name, phi, init in carried:
            nxt = frame.env[name]
            if not _differs(nxt, name_node(phi)):
                continue
            last = _last_assignment(self.normalizer.out, nxt)
            if last is not None and not operation_of(last.tg.op).reads_result and not _reads(
                    self.normalizer.out[self.normalizer.out.index(last) + 1:], {nxt.id, phi}):
                last.targets[0].id = phi  # `acc = acc + x` updates it in place: no copy
            else:
                self.normalizer.finish(ast.Assign(targets=[name_node(phi, ast.Store())], value=nxt), Op("copy", [nxt]),
                                       stmt, join=True)
            records.append(Carried(phi, init, name_node(phi) if last is not None and last.targets[0].id == phi else nxt,
                                   name))
        body, self.normalizer.out = self.normalizer.out, saved
        line = self.normalizer.origin(stmt).line
        for name in set(frame.env) - set(outside) | {target}:
            frame.gone[name] = (f"it is assigned inside the loop on line {line}, and Triton keeps after a loop "
                                "only the variables that had a value before it")
        frame.env = {**outside, **{name: name_node(phi) for name, phi, _ in carried}}
        frame.env.pop(target, None)
        loop = ast.For(target=name_node(index, ast.Store()), iter=ast.Call(func=callee, args=args, keywords=[
            ast.keyword(arg=k, value=v) for k, v in kwargs.items()]), body=body, orelse=[])
        self.normalizer.finish(loop, Op("for", args, kwargs, obj), stmt, carried=records, static=static)

    def _reusable_init(self, init: ast.expr) -> str | None:
        """The name of a loop's initial value, when the loop can carry that variable itself: assigned at
        the top of the current block, read by nothing else, by an operation whose adjoint does not read
        its result (which the loop overwrites), not a load."""
        if not isinstance(init, ast.Name):
            return None
        stmt = _last_assignment(self.normalizer.out, init)
        if stmt is None or operation_of(stmt.tg.op).reads_result or stmt.tg.op.kind in LOADS or _reads(
                self.normalizer.out[self.normalizer.out.index(stmt) + 1:], {init.id}):
            return None  # (a load stays apart: its value types the adjoint without recomputing the loop)
        return init.id


# tl.range options that schedule the forward's own loop (warp specialization, flattening a nest): annotations with
# no meaning to the loops derived from it, which are scheduled by their own options (num_stages stays)
SCHEDULING_HINTS = frozenset({"warp_specialize", "flatten", "loop_unroll_factor", "disallow_acc_multi_buffer",
                              "disable_licm"})


def _differs(a: ast.expr | None, b: ast.expr | None) -> bool:
    return a is None or b is None or ast.dump(a) != ast.dump(b)


def _assigned_at_top(block: list[ast.stmt], atom: ast.expr) -> bool:
    """Whether the block itself assigns ``atom`` (a statement at its top, or the merge of an if there)."""
    if not isinstance(atom, ast.Name):
        return False
    if any(isinstance(s, ast.For) and atom.id in {c.name for c in s.tg.carried} for s in block):
        return False
    return _last_assignment(block, atom) is not None or any(
        isinstance(s, ast.If) and atom.id in s.tg.merges for s in block)


def _last_assignment(block: list[ast.stmt], atom: ast.expr) -> ast.Assign | None:
    """The statement at the top of ``block`` that assigns the name ``atom``, if any."""
    if not isinstance(atom, ast.Name):
        return None
    for s in reversed(block):
        if isinstance(s, ast.Assign) and isinstance(s.targets[0], ast.Name) and s.targets[0].id == atom.id:
            return s
    return None


def _reads(stmts: list[ast.stmt], names: set[str]) -> bool:
    return any(isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and n.id in names
               for s in stmts for n in ast.walk(s))


def _rename(block: list[ast.stmt], old: str, new: str) -> None:
    """Rename a name everywhere in a block (the operations' atoms are the same nodes)."""
    for s in block:
        for n in ast.walk(s):
            if isinstance(n, ast.Name) and n.id == old:
                n.id = new
            if isinstance(n, ast.If):
                n.tg.merges = [new if m == old else m for m in n.tg.merges]


def _assigned_names(stmts: list[ast.stmt]) -> list[str]:
    """Source names a block assigns (loop targets and nested blocks included), in order."""
    names: dict[str, None] = {}
    for stmt in stmts:
        for n in ast.walk(stmt):
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
                names[n.id] = None
    return list(names)



# -- early returns ---------------------------------------------------------------------------------------

def lift_returns(body: list[ast.stmt], value: bool, refuse: Callable) -> tuple[list[ast.stmt], ast.Return | None]:
    """A function body without ``return`` statements, and the one ``return`` to end it with (None: none).

    Early returns are made structural: the statements after an ``if`` that may return move into
    its paths that do not (``if c: return`` then ``rest`` becomes ``if c: pass else: rest``), so
    every path ends at the end of the body. In a kernel (``value`` False) returns carry no value;
    in a helper each path assigns what it returns to a name of its own (``result``; ``result0,
    result1`` for a pair), which the body then returns. A ``return`` inside a loop is refused
    (``refuse(node, construct, hint)``), as Triton refuses it."""
    returns = [n for s in body for n in _walk_statements(s) if isinstance(n, ast.Return)]
    if value and returns == body[-1:]:  # one return, at the end: nothing to lift
        return body[:-1], body[-1]
    if not returns:
        return body, None
    for node in body:
        _refuse_returns_in_loops(node, refuse)
    lifted = _lift(copy.deepcopy(body), [])
    arity = {len(r.value.elts) if isinstance(r.value, ast.Tuple) else 0 if _is_none(r.value) else 1 for r in returns}
    if arity == {0}:  # a kernel, or a helper that returns nothing
        return _replace_returns(_keeping(lifted, set()), None), None
    if not value:
        raise refuse(next(r for r in returns if not _is_none(r.value)), "a `return` with a value in a kernel",
                     "a kernel returns nothing; store its results")
    if len(arity) != 1 or 0 in arity:
        raise refuse(returns[0], "returns of different lengths (or without a value) in one helper",
                     "return the same number of values on every path")
    (count,) = arity
    if not _always_returns(lifted):
        raise refuse(returns[0], "a helper that returns a value on some paths only",
                     "return a value at the end of the helper too")
    taken = {n.id for s in body for n in ast.walk(s) if isinstance(n, ast.Name)}
    names = ["result"] if count == 1 else [f"result{i}" for i in range(count)]
    while set(names) & taken:
        names = [f"{n}_" for n in names]
    returned = ast.Name(names[0], ast.Load()) if count == 1 else ast.Tuple(
        [ast.Name(n, ast.Load()) for n in names], ast.Load())
    return _replace_returns(_keeping(lifted, set(names)), names), ast.copy_location(ast.Return(returned), returns[-1])


def _walk_statements(stmt: ast.stmt):
    """``stmt`` and the statements nested in it (not into nested function definitions)."""
    yield stmt
    for field in ("body", "orelse", "finalbody"):
        for s in getattr(stmt, field, []) or []:
            if isinstance(s, ast.stmt) and not isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield from _walk_statements(s)


def _refuse_returns_in_loops(stmt: ast.stmt, refuse: Callable) -> None:
    if isinstance(stmt, (ast.For, ast.While, ast.With)):
        for n in _walk_statements(stmt):
            if isinstance(n, ast.Return):
                raise refuse(n, f"a `return` inside a `{type(stmt).__name__.lower()}` statement",
                             "Triton refuses it too: guard the rest of the loop body with an `if` instead")
    for s in [*getattr(stmt, "body", []), *getattr(stmt, "orelse", [])]:
        _refuse_returns_in_loops(s, refuse)


def _lift(stmts: list[ast.stmt], cont: list[ast.stmt]) -> list[ast.stmt]:
    """``stmts`` followed by ``cont`` on every path that does not return, with returns only at path ends."""
    out: list[ast.stmt] = []
    for i, s in enumerate(stmts):
        if isinstance(s, ast.Return):
            return [*out, s]  # what follows it never runs
        if isinstance(s, ast.If) and any(isinstance(n, ast.Return) for n in _walk_statements(s)):
            rest = _lift(stmts[i + 1:], cont)
            body, orelse = _lift(s.body, rest), _lift(s.orelse, copy.deepcopy(rest))
            lifted = ast.copy_location(ast.If(test=s.test, body=body or [ast.Pass()], orelse=orelse), s)
            lifted.tg_keep = None  # (set by _keeping)
            return [*out, lifted]
        out.append(s)
    return out + cont


def _is_none(value: ast.expr | None) -> bool:
    return value is None or (isinstance(value, ast.Constant) and value.value is None)


def _keeping(stmts: list[ast.stmt], names: set[str]) -> list[ast.stmt]:
    """Marks the ``if`` s ``_lift`` made: the rest of the function is inside them, so after them only
    ``names`` (what a helper returns) is read; the frontend merges nothing else out of them (a value
    assigned in one branch of a constexpr ``if`` would otherwise outlive it, and its adjoint be started
    where it does not exist)."""
    for s in stmts:
        for node in _walk_statements(s):
            if isinstance(node, ast.If) and hasattr(node, "tg_keep"):
                node.tg_keep = names
    return stmts


def _always_returns(stmts: list[ast.stmt]) -> bool:
    last = stmts[-1] if stmts else None
    return isinstance(last, ast.Return) or (isinstance(last, ast.If) and _always_returns(last.body)
                                            and _always_returns(last.orelse))


def _replace_returns(stmts: list[ast.stmt], names: list[str] | None) -> list[ast.stmt]:
    """Returns (at path ends) dropped, or made assignments of the returned value to ``names``."""
    out = []
    for s in stmts:
        if isinstance(s, ast.Return):
            if names is None:
                continue
            target = ast.Name(names[0], ast.Store()) if len(names) == 1 else ast.Tuple(
                [ast.Name(n, ast.Store()) for n in names], ast.Store())
            s = ast.copy_location(ast.Assign(targets=[target], value=s.value), s)
        elif isinstance(s, ast.If):
            s.body = _replace_returns(s.body, names) or [ast.Pass()]
            s.orelse = _replace_returns(s.orelse, names)
        out.append(s)
    return out
