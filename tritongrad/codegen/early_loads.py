"""Loads of a derived kernel issued as soon as their operands are known.

A derived backward first recomputes the forward's values, then reads each output's gradient where the reverse
sweep reaches the output's store: after the forward's reductions (a softmax's max and sum, a norm's mean and
variance). A reduction across warps waits at a barrier, and the compiler does not move a global load across
one, so the gradient's load would start only once the recomputation is done: the kernel waits for two loads in a
row where a hand-written backward waits for both at once. This pass moves each load up its block, past
statements that neither compute what it reads nor touch memory, to just after the last one that does; the
load's latency then overlaps the work in between. Loads keep their order among themselves, never leave
their block (a loop's body, a branch) and never cross a store, an atomic, a barrier or a call it does not
know; so every load reads what it read before.
"""

from __future__ import annotations

import ast
from collections.abc import Callable

from ..core.calls import pure
from ..core.ir import tl_call
from ..reverse.sweep import is_comment_marker

NOTE = "loaded ahead of its first use: its latency overlaps the work in between (early_loads.py)"
LEFT = "`{}`: loaded above, ahead of its first use"


def issue_loads_early(body: list[ast.stmt], comment: Callable[[str], ast.stmt]) -> list[ast.stmt]:
    """``body`` with each load moved up its block as far as it may go, a ``comment`` above each one moved."""
    out: list[ast.stmt] = []
    moved: set[int] = set()  # loads moved here: the next one moved right after one shares its comment
    for stmt in body:
        for field in ("body", "orelse"):
            block = getattr(stmt, field, None)
            if isinstance(block, list) and block and not isinstance(stmt, ast.FunctionDef):
                setattr(stmt, field, issue_loads_early(block, comment))
        at = _earliest(out, stmt) if _is_load(stmt) else len(out)
        if any(not is_comment_marker(s) for s in out[at:]):
            out[at:at] = [stmt] if at and id(out[at - 1]) in moved else [comment(NOTE), stmt]
            out.append(comment(LEFT.format(stmt.targets[0].id)))  # where the sweep put it
            moved.add(id(stmt))
        else:
            out.append(stmt)
    return out


def _earliest(before: list[ast.stmt], load: ast.stmt) -> int:
    """The first position in ``before`` the load may move to: after the last statement it must follow."""
    names, target = _every_name(load), _defines(load)
    for i in range(len(before) - 1, -1, -1):
        s = before[i]
        if is_comment_marker(s):
            continue
        if _is_load(s) or not _pure(s) or _defines(s) & names or target & _every_name(s):
            return i + 1
    return 0


def _is_load(stmt: ast.stmt) -> bool:
    """``name = <expression reading memory through tl.load>``, writing nothing."""
    return (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)
            and any(tl_call(n, "load") is not None for n in ast.walk(stmt.value)) and _pure(stmt))


def _pure(stmt: ast.stmt) -> bool:
    """A plain statement whose calls are all pure (core/calls.py: nothing written or ordered)."""
    if not isinstance(stmt, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Pass)):
        return False
    return all(pure(n) for n in ast.walk(stmt) if isinstance(n, ast.Call))


def _every_name(stmt: ast.stmt) -> set[str]:
    return {n.id for n in ast.walk(stmt) if isinstance(n, ast.Name)}


def _defines(stmt: ast.stmt) -> set[str]:
    return {n.id for n in ast.walk(stmt) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
