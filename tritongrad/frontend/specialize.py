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


def constexpr_params(fdef: ast.FunctionDef) -> list[str]:
    return [a.arg for a in fdef.args.args
            if a.annotation is not None and ast.unparse(a.annotation).split(".")[-1] == "constexpr"]


def decisive(fdef: ast.FunctionDef) -> tuple[str, ...]:
    """The constexpr parameters an ``if`` test or conditional expression of the function reads."""
    params = set(constexpr_params(fdef))
    tests = [n.test for n in ast.walk(fdef) if isinstance(n, (ast.If, ast.IfExp))]
    read = {n.id for t in tests for n in ast.walk(t) if isinstance(n, ast.Name)}
    return tuple(sorted(params & read))


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
        try:
            value = eval(compile(ast.Expression(test), "<specialize>", "eval"), {"__builtins__": builtins}, env)
            return bool(plain_value(value))
        except Exception:  # something only Triton knows (a dtype): left to the kernel
            return None

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


def plain_value(value: Any) -> Any:
    """A ``tl.constexpr``'s Python value."""
    return getattr(value, "value", value) if type(value).__name__ == "constexpr" else value
