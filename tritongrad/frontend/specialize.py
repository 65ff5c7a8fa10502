"""Derivation per constexpr specialization: an ``if`` (or a conditional expression) on ``tl.constexpr`` parameters
keeps only the branch taken.

Triton compiles one kernel per value of its constexpr parameters and drops the branches
those values rule out; a kernel written for several modes (``if reduction == NONE:
tl.store(...)`` / ``elif ...: tl.store(...)``, ``if HAS_WEIGHT: w = tl.load(...)``) is, for
one launch, the kernel of one mode. So is its backward: the source is specialized before
it is flattened, and every analysis sees only what the launch runs.

``decisive`` names the constexpr parameters that some ``if`` (or conditional expression)
tests: only their values key the cache of derived kernels (a block size does not).
"""

from __future__ import annotations

import ast
import builtins
import copy
from collections.abc import Mapping
from typing import Any

from ..core.source import Source, is_jit


def constexpr_params(fdef: ast.FunctionDef) -> list[str]:
    return [a.arg for a in fdef.args.args
            if a.annotation is not None and ast.unparse(a.annotation).split(".")[-1] == "constexpr"]


def decisive(fdef: ast.FunctionDef, scope: Mapping[str, Any] | None = None) -> tuple[str, ...]:
    """The constexpr parameters an ``if`` test or conditional expression of the function reads, directly, through
    the kernel's own assignments, or through the arguments it passes to a ``@triton.jit`` helper whose tests
    read them (``scope``: the function's globals, where its helpers are found)."""
    params = set(constexpr_params(fdef))
    return tuple(sorted(params & _tested(fdef, scope or {}, set())))


def _tested(fdef: ast.FunctionDef, scope: Mapping[str, Any], seen: set) -> set[str]:
    """The names a function's tests read, closed over its assignments and the helpers it calls."""
    tests = [n.test for n in ast.walk(fdef) if isinstance(n, (ast.If, ast.IfExp))]
    read = {n.id for t in tests for n in ast.walk(t) if isinstance(n, ast.Name)}
    for call in (n for n in ast.walk(fdef) if isinstance(n, ast.Call)):
        helper = _helper(call.func, scope)
        if helper is None or helper.fn in seen:
            continue
        seen.add(helper.fn)
        try:
            source = Source.of(helper)
        except Exception:  # (its own derivation says why)
            continue
        hparams = [a.arg for a in source.tree.args.args]
        inner = _tested(source.tree, source.scope, seen)
        passed = [*zip(hparams, call.args, strict=False), *((k.arg, k.value) for k in call.keywords)]
        read |= {n.id for p, arg in passed if p in inner for n in ast.walk(arg) if isinstance(n, ast.Name)}
    assigned: dict[str, list[ast.expr]] = {}
    for node in ast.walk(fdef):
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                for n in ast.walk(t):
                    if isinstance(n, ast.Name):
                        assigned.setdefault(n.id, []).append(node.value)
    work = list(read)
    while work:  # a local a test reads is decided by what it is assigned from
        for value in assigned.get(work.pop(), ()):
            for n in ast.walk(value):
                if isinstance(n, ast.Name) and n.id not in read:
                    read.add(n.id)
                    work.append(n.id)
    return read


def _helper(func: ast.expr, scope: Mapping[str, Any]) -> Any:
    """The ``@triton.jit`` function a call names, or None."""
    parts = []
    while isinstance(func, ast.Attribute):
        parts.append(func.attr)
        func = func.value
    if not isinstance(func, ast.Name) or func.id not in scope:
        return None
    obj = scope[func.id]
    for attr in reversed(parts):
        obj = getattr(obj, attr, None)
    return obj if is_jit(obj) else None


def specialize(fdef: ast.FunctionDef, scope: dict[str, Any], values: Mapping[str, Any]) -> ast.FunctionDef:
    """``fdef`` with each ``if`` whose test can be decided from ``values`` (constexpr parameters) and the
    module's globals replaced by the branch taken (``fdef`` itself if none can)."""
    if not values:
        return fdef
    env = {**scope, **{k: plain_value(v) for k, v in values.items()}}
    assigned = {n.id for n in ast.walk(fdef) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    unknown = ({a.arg for a in fdef.args.args} | assigned) - set(values)  # runtime values, or reassigned
    fdef = copy.deepcopy(fdef)

    def decided(test: ast.expr) -> bool | None:
        names = {n.id for n in ast.walk(test) if isinstance(n, ast.Name)}
        if names & unknown:
            return None
        return evaluate_test(test, env)

    def block(stmts: list[ast.stmt]) -> list[ast.stmt]:
        out = []
        for s in stmts:
            if isinstance(s, ast.If):
                taken = decided(s.test)
                if taken is not None:
                    out += block(s.body if taken else s.orelse)
                    continue
                s.body, s.orelse = block(s.body) or [ast.Pass()], block(s.orelse)
            elif isinstance(s, (ast.For, ast.While)):
                s.body = block(s.body) or [ast.Pass()]
            out.append(s)
        return out

    class Choose(ast.NodeTransformer):  # a conditional expression on constexprs: the value taken
        def visit_IfExp(self, node: ast.IfExp) -> ast.expr:
            taken = decided(node.test)
            return self.generic_visit(node) if taken is None else self.visit(node.body if taken else node.orelse)

    fdef.body = block(fdef.body) or [ast.Pass()]
    fdef.body = [Choose().visit(s) for s in fdef.body]
    return fdef


def evaluate_test(test: ast.expr, values: Mapping[str, Any]) -> bool | None:
    """An ``if`` test's truth from ``values`` of the names it reads, as Triton takes it when it compiles; None
    where it reads something only Triton can evaluate (a dtype's property)."""
    try:
        return bool(plain_value(eval(compile(ast.Expression(test), "<test>", "eval"), {"__builtins__": builtins},
                                     dict(values))))
    except Exception:  # left to the kernel
        return None


def plain_value(value: Any) -> Any:
    """A ``tl.constexpr``'s Python value."""
    return getattr(value, "value", value) if type(value).__name__ == "constexpr" else value
