"""The normalized body's shape: flat statements, and the structured ones that hold blocks of them.

A flat statement is ``name = op(atoms)`` or ``op(atoms)``, tagged by the frontend
(``.tg_op``, ``.tg_origin``, ``.tg_where``). Control flow stays structured:

- ``ast.If``: ``.test`` is an atom; each branch is a block ending with the copies
  that give a variable assigned in the branch its value after the ``if``
  (``.tg_merges`` names those merge variables; each is assigned in both branches).
- ``ast.For``: ``.iter`` is ``range(...)``, ``tl.range(...)`` or ``tl.static_range(...)``
  on atoms; ``.tg_carried`` lists the loop-carried variables (:class:`Carried`).

Every name is assigned once (SSA), except merge variables and loop-carried
variables, which are assigned by copies where control flow joins: a carried
variable before the loop (its initial value) and at the end of the body (its value
for the next iteration).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class Carried:
    """A loop-carried variable: its value at the start of each iteration, and after the loop."""

    name: str
    init: ast.expr  # atom assigned to it before the loop
    next: ast.expr  # atom assigned to it at the end of the body
    source: str = ""  # the user's name for it


def is_structured(stmt: ast.stmt) -> bool:
    return isinstance(stmt, (ast.If, ast.For))


def child_blocks(stmt: ast.stmt) -> list[list[ast.stmt]]:
    if isinstance(stmt, ast.If):
        return [stmt.body, stmt.orelse]
    if isinstance(stmt, ast.For):
        return [stmt.body]
    return []


def statements(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """Every flat statement, in program order, those inside branches and loops included."""
    for stmt in body:
        if is_structured(stmt):
            for block in child_blocks(stmt):
                yield from statements(block)
        else:
            yield stmt


def structured(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """Every ``if`` and ``for`` node, outer before inner."""
    for stmt in body:
        if is_structured(stmt):
            yield stmt
            for block in child_blocks(stmt):
                yield from structured(block)


def header(stmt: ast.stmt) -> list[ast.expr]:
    """The expressions a structured node evaluates itself: an if's test, a loop's range."""
    if isinstance(stmt, ast.If):
        return [stmt.test]
    if isinstance(stmt, ast.For):
        return [stmt.iter]
    return []


def reads(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def free_names(block: list[ast.stmt]) -> set[str]:
    """Names a block reads before (or without) assigning them: what must exist when it starts."""
    free: set[str] = set()

    def visit(stmts: list[ast.stmt], bound: set[str]) -> set[str]:
        for s in stmts:
            if is_structured(s):
                for e in header(s):
                    free.update(reads(e) - bound)
                inner = bound | ({s.target.id} if isinstance(s, ast.For) else set())
                after = [visit(b, set(inner)) for b in child_blocks(s)]
                if isinstance(s, ast.If):  # assigned in both branches: defined after the if
                    bound |= set.intersection(*after)
                continue
            free.update(reads(s) - bound)
            bound |= {n.id for n in ast.walk(s) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
        return bound

    visit(block, set())
    return free
