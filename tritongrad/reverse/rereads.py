"""One input read at one address by sibling loops over one range (the tutorial layer norm's mean, variance and
normalize passes over a row): the loads' adjoints are written once, not once per loop.

The reversed loops run in reverse order, so the first forward loop's is the last to run; every adjoint the others
compute depends only on values known by then (their loops carry no nonlinear state: each reversed loop recomputes
its iteration). memory.py writes no adjoint for the later loads (``defer``) and, at the first load, names the
adjoint it writes (``MergePoint.total``); :func:`merge_rereads` then copies into that loop, before the write, the
statements each other loop computes its load's adjoint with (the loop index and every name they assign renamed),
adds them to the total, and drops from the other loops what only those adjoints needed (a loop left with nothing
to do goes). One write per element instead of one per loop: a plain store where the first load's addresses are
apart and cover the tensor (input_facts.py), one atomic instead of several otherwise.

Anything it cannot show recomputable is ``NotMergeable``: asked before the write plans are made (feasibility.py),
writes/input_facts.py's ``plan_writes`` then writes that input's loads apart, as before.
"""

from __future__ import annotations

import ast
import copy
from dataclasses import dataclass, field

from ..core.calls import pure
from ..core.ir import child_blocks, is_structured, targets_of
from .interchange import read_by, without_unused


class NotMergeable(Exception):
    def __init__(self, param: str, why: str):
        super().__init__(f"{param}: {why}")
        self.param, self.why = param, why


@dataclass(frozen=True)
class Deferred:
    """A later load whose adjoint is not written where it is computed."""

    param: str
    g: str  # its adjoint
    names: frozenset[str]  # what its write would have read: the adjoint, the shadow's addresses, the mask


@dataclass
class MergePoint:
    """The first load's adjoint write: ``total = <its adjoint>`` emitted just before it."""

    param: str
    total: str
    deferred: list[Deferred]  # the other loads', in their reversed loops
    writes: list[tuple[ast.For, frozenset[str]]] = field(default_factory=list)  # (found: each one's loop)


def merge_rereads(out: list[ast.stmt], unclaimed: list[Deferred], points: list[MergePoint], fresh, comment,
                  is_comment, protected: set[str]) -> dict[str, str]:
    """Each point's deferred adjoints computed again in its loop and added to its total (see the module's doc).
    ``unclaimed``: deferred adjoints no first load took (none may be left); ``fresh(base)``: a new name;
    ``comment(text)``: a comment statement; ``is_comment(stmt)``: whether it is one; ``protected``: names read after
    the body is built. Returns the copies' names (name -> its copy's), so that codegen folds a copied temporary as
    it folds the original."""
    if unclaimed:
        raise NotMergeable(unclaimed[0].param, "its first load has no adjoint to write the others' with")
    copies: dict[str, str] = {}
    for point in points:
        parent, first, at = _find_total(out, point)
        added = []
        for d in point.deferred:
            other = next((s for s in parent if isinstance(s, ast.For) and s is not first
                          and any(d.g in targets_of(t) for t in s.body)), None)
            if other is None or ast.dump(other.iter) != ast.dump(first.iter):
                raise NotMergeable(point.param, f"the adjoint `{d.g}` is not in a sibling loop over the same range")
            point.writes.append((other, d.names))
            added += _recomputed(point, parent, other, d.g, first.target.id, fresh, copies)
        loops = ", ".join(f"`{other.target.id}`" for other, _ in point.writes)
        note = comment(f"the adjoints of `{point.param}`'s loads in the loops over {loops} (the same addresses, "
                       "recomputed here): added to this one's and written with it, once")
        first.body[at + 1:at + 1] = [note, *added]
    for point in points:
        parent, _, _ = _find_total(out, point)
        _drop_unused(out, parent, point, protected, is_comment)
    return copies


def _find_total(out: list[ast.stmt], point: MergePoint) -> tuple[list[ast.stmt], ast.For, int]:
    """The block holding the loop of ``total = g``, that loop, and the assignment's position in its body."""
    work = [out]
    while work:
        block = work.pop()
        for s in block:
            if isinstance(s, ast.For):
                at = next((i for i, t in enumerate(s.body) if isinstance(t, ast.Assign)
                           and targets_of(t) == [point.total]), None)
                if at is not None:
                    return block, s, at
            work += child_blocks(s)
    raise NotMergeable(point.param, "its first load's adjoint is not written in a loop")


def _recomputed(point: MergePoint, parent: list[ast.stmt], other: ast.For, g: str, index: str, fresh,
                copies: dict[str, str]) -> list[ast.stmt]:
    """The statements of ``other``'s body that compute ``g``, renamed, then ``total += g``."""
    body = other.body
    kept, needed = _slice(body, {g})
    for s in body:
        if set(_assigned([s])) & needed and (is_structured(s) or not isinstance(s, (ast.Assign, ast.AugAssign))
                                            or len(targets_of(s)) != 1):
            raise NotMergeable(point.param, f"`{g}` is computed under a branch or loop of its own")
    if not all(_recomputable(s.value) for s in kept):
        raise NotMergeable(point.param, f"`{g}` reads memory its kernel writes, or calls an impure function")
    local = set(_assigned(body))
    later = set(_assigned(parent[parent.index(other):]))  # (nested bodies too: the other loops and the first)
    renamed = {other.target.id: index}
    for s in kept:
        for name in read_by(s):
            if name == other.target.id or name in renamed:
                continue
            if name in local:  # assigned in the iteration before it is read, else it is carried between them
                raise NotMergeable(point.param, f"`{g}` reads `{name}` as carried between iterations")
            if name in later:  # read after the loops changed it
                raise NotMergeable(point.param, f"`{g}` reads `{name}`, which changes after its loop")
        name = targets_of(s)[0]
        if name not in renamed:
            renamed[name] = copies[name] = fresh(name)
    statements = [_renamed(copy.deepcopy(s), renamed) for s in kept]
    return [*statements, ast.AugAssign(target=ast.Name(point.total, ast.Store()), op=ast.Add(),
                                       value=ast.Name(renamed[g], ast.Load()))]


def _recomputable(value: ast.expr) -> bool:
    """Whether every call in ``value`` is pure (a load reads what the backward does not write: a forward value
    or an output's gradient; an input updated in place is never merged)."""
    return all(pure(c) for c in ast.walk(value) if isinstance(c, ast.Call))


def _assigned(block: list[ast.stmt]) -> list[str]:
    found = []
    for s in block:
        found += targets_of(s) if isinstance(s, (ast.Assign, ast.AugAssign)) else []
        if isinstance(s, ast.For) and isinstance(s.target, ast.Name):
            found.append(s.target.id)
        for inner in child_blocks(s):
            found += _assigned(inner)
    return found


def _renamed(node: ast.AST, renamed: dict[str, str]) -> ast.AST:
    for n in ast.walk(node):
        if isinstance(n, ast.Name) and n.id in renamed:
            n.id = renamed[n.id]
    return node


def _drop_unused(out: list[ast.stmt], parent: list[ast.stmt], point: MergePoint, protected: set[str],
                 is_comment) -> None:
    """The other loops without the statements only their deferred writes read (the adjoint, the address and the
    mask), to a fixed point; a loop left with nothing but comments dropped, with the comments before it.
    ``protected``: names read after the body is built (partial sums, their shadows and masks)."""
    for loop, names in point.writes:
        if not any(s is loop for s in parent):
            continue
        candidates = {id(s) for s in _slice(loop.body, names)[0]}
        keep = {n for s in _all_but(out, loop) for n in read_by(s)} | protected
        keep |= {t for s in loop.body if id(s) not in candidates or len(targets_of(s)) != 1 for t in targets_of(s)}
        loop.body = without_unused(loop.body, keep)
        if all(is_comment(s) for s in loop.body):
            at = next(i for i, s in enumerate(parent) if s is loop)
            start = at
            while start > 0 and is_comment(parent[start - 1]):
                start -= 1
            del parent[start:at + 1]
        else:
            loop.body = [s for i, s in enumerate(loop.body)  # comments no longer followed by their statements
                         if not (is_comment(s) and (i + 1 == len(loop.body) or is_comment(loop.body[i + 1])))]


def _slice(body: list[ast.stmt], names: set[str]) -> tuple[list[ast.stmt], set[str]]:
    """The assignments of ``body`` (its own statements, in order) that ``names`` are computed from, and every name
    they read."""
    needed, found = set(names), []
    for s in reversed(body):
        if isinstance(s, (ast.Assign, ast.AugAssign)) and set(targets_of(s)) & needed:
            found.append(s)
            needed |= read_by(s)
    return found[::-1], needed


def _all_but(out: list[ast.stmt], loop: ast.For):
    """Every statement of ``out`` (nested ones too) outside ``loop``'s body; structured ones by their headers."""
    for s in out:
        if s is loop:
            yield ast.Expr(loop.iter)
            continue
        if is_structured(s):
            yield ast.Expr(s.iter if isinstance(s, ast.For) else s.test)
            for block in child_blocks(s):
                yield from _all_but(block, loop)
        else:
            yield s
