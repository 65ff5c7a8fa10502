"""Exponentials of a derived kernel in base two, where only arithmetic reads them.

Triton compiles a float32 ``tl.exp(x)`` as ``ex2.approx.f32(x * log2 e)``, which keeps subnormal results and
pays for that with a few instructions around each exponential; ``tl.exp2`` compiles to
``ex2.approx.ftz.f32``, which flushes them to zero. An attention backward recomputes an exponential per
score, twice (its dQ kernel and its dK/dV kernel): written as ``tl.exp2(x * log2 e)`` they ran 15-20%
faster on an H200 (benchmarks/RESULTS.md), as every hand-written flash attention writes them.

The two differ only in rounding and below 2**-126, so a backward may use either wherever the exponential's
value reaches nothing but arithmetic: sums, products, further smooth functions, the stored gradients. It
does not where the value makes a decision (a comparison, a ``where``'s condition, a max whose gradient
picks the elements equal to it, an address, a cast to an integer type): there the backward computes it
as the forward does, so that a rounding does not send a gradient elsewhere. This pass rewrites
``tl.exp(x)`` as ``tg.exp(x)`` (language.py: base two in float32, ``tl.exp`` otherwise) where every use of
its value, followed through the assignments it flows into, is one of those listed below; and a softmax
written out (composites.py: ``tg.softmax``) as ``tg.softmax_base_two`` on the same condition.
"""

from __future__ import annotations

import ast

from ..core.ir import every_statement, header, tl_call
from ..core.language import HELPERS
from ..core.operations import OPERATIONS

# call -> the argument positions (and keywords) whose value may flow on through it: arithmetic, shape moves,
# smooth functions (the table's flows), the adjoint helpers (HELPERS' flows); the stores of gradients end the flow
_FLOWS: dict[str, tuple[tuple[int, ...], tuple[str, ...]]] = {
    **{f"tl.{kind}": operation.flows for kind, operation in OPERATIONS.items() if operation.flows is not None},
    **{f"tg.{name}": (helper.flows, ()) for name, helper in HELPERS.items() if helper.flows},
}
_ARITHMETIC = (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.USub, ast.UAdd)


def base_two_exponentials(body: list[ast.stmt]) -> list[ast.stmt]:
    """``body`` with each ``tl.exp(x)`` whose value only arithmetic reads written ``tg.exp(x)`` (in place)."""
    parents = {id(c): p for p in ast.walk(ast.Module(body, [])) for c in ast.iter_child_nodes(p)}
    readers: dict[str, list[ast.stmt]] = {}
    for stmt in every_statement(body):
        for node in _own_nodes(stmt):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
                readers.setdefault(node.id, []).append(stmt)
    for stmt in every_statement(body):
        for node in _own_nodes(stmt):
            if tl_call(node, "exp") is not None and len(node.args) == 1 and not node.keywords \
                    and not isinstance(node.args[0], ast.Constant) and _only_arithmetic(node, readers, parents):
                node.func = ast.Attribute(value=ast.Name("tg", ast.Load()), attr="exp", ctx=ast.Load())
            elif _is_tg_softmax(node) and _only_arithmetic(node, readers, parents):  # a softmax written out
                node.func.attr = "softmax_base_two"
    return body


def _is_tg_softmax(node: ast.AST) -> bool:
    """``tg.softmax(z, axis)`` (composites.py)."""
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "softmax"
            and isinstance(node.func.value, ast.Name) and node.func.value.id == "tg")


def _own_nodes(stmt: ast.stmt) -> list[ast.AST]:
    """The nodes of ``stmt`` itself: a loop's or branch's header, not its blocks."""
    if isinstance(stmt, ast.While):  # (peel.py's binary search; not a structured node to ir.header)
        return list(ast.walk(stmt.test))
    if isinstance(stmt, (ast.If, ast.For)):
        return [n for e in header(stmt) for n in ast.walk(e)]
    return list(ast.walk(stmt))


def _only_arithmetic(node: ast.expr, readers: dict[str, list[ast.stmt]], parents: dict[int, ast.AST]) -> bool:
    """Whether the value of ``node`` reaches only arithmetic, through every name it is assigned to (``parents``:
    each node's parent in the body)."""
    seen: set[str] = set()
    todo = [node]
    while todo:
        target = _flows_to(todo.pop(), parents)
        if target is False:
            return False
        if target is True or target in seen:
            continue
        seen.add(target)
        for reader in readers.get(target, []):
            if isinstance(reader, (ast.For, ast.If, ast.While)):
                return False  # a loop's bounds or a branch's test
            todo += [n for n in ast.walk(reader) if isinstance(n, ast.Name) and n.id == target
                     and isinstance(n.ctx, ast.Load)]
    return True


def _flows_to(node: ast.expr, parents: dict[int, ast.AST]) -> str | bool:
    """Where the value of ``node`` goes in its statement: the name it is assigned to, True where it ends in a store
    of a gradient or a metadata read (``x.shape``), False where something other than arithmetic reads it."""
    while True:
        parent = parents.get(id(node))
        if isinstance(parent, (ast.Assign, ast.AugAssign)):
            targets = parent.targets if isinstance(parent, ast.Assign) else [parent.target]
            if node is parent.value and len(targets) == 1 and isinstance(targets[0], ast.Name):
                return targets[0].id
            return False
        if isinstance(parent, ast.Return):
            return True
        if isinstance(parent, ast.BinOp) and isinstance(parent.op, _ARITHMETIC) or \
                isinstance(parent, ast.UnaryOp) and isinstance(parent.op, _ARITHMETIC):
            node = parent
        elif isinstance(parent, ast.Subscript) and node is parent.value:  # x[:, None]
            node = parent
        elif isinstance(parent, ast.Attribute) and node is parent.value:
            if parent.attr in ("shape", "dtype"):
                return True
            call = parents.get(id(parent))
            if parent.attr != "to" or not isinstance(call, ast.Call) or call.func is not parent:
                return False
            if call.args and ast.unparse(call.args[0]).startswith(("tl.int", "tl.uint")):
                return False  # rounded to an integer: a decision
            node = call  # x.to(type): the flow goes on
        elif isinstance(parent, ast.Call) and node is not parent.func:
            positions, _ = _FLOWS.get(ast.unparse(parent.func), ((), ()))
            if not any(node is parent.args[i] for i in positions if i < len(parent.args)):
                return False
            if isinstance(parents.get(id(parent)), ast.Expr):  # a store of a gradient, or a tape put
                return True
            node = parent
        elif isinstance(parent, ast.keyword):
            call = parents.get(id(parent))
            _, keywords = _FLOWS.get(ast.unparse(call.func), ((), ())) if isinstance(call, ast.Call) else ((), ())
            if parent.arg not in keywords:
                return False
            if isinstance(parents.get(id(call)), ast.Expr):
                return True
            node = call
        else:
            return False
