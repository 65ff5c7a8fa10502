"""A mask's bounds on the coordinates of addresses.py's forms: its ``e < B`` conjuncts, each a sum of coordinates
below a scalar (``mask_bounds``), which the store checks (stores.py) and the write strategies (writes/) read."""

from __future__ import annotations

import ast
import operator

from ..core.ir import arguments, op_of
from ..core.operations import operation_of
from .addresses import _add, _rank, _reshaped, _shift, descriptor_made
from .forms import SCALAR, Form, Lane, form_of_terms, varies
from .launch_values import Expr
from .scalars import loop_start, scalar_expr, starts_at_zero


def mask_bounds(mask: ast.expr, forms: dict[str, Form], defs: dict, shapes: dict, exact: bool = False,
                loaded: bool = False) -> list[tuple[Form, Expr]] | None:
    """The conjuncts ``e < B`` (``e <= B``, ``B > e``) of a mask where ``e`` is exactly a sum of coordinates
    (no constant part) and ``B`` a scalar: ``(e's form in the mask's axes, B - 1)``. With ``exact``, None
    unless the mask is nothing but such conjuncts (no mask: none). With ``loaded``, ``B`` may also be a
    scalar computed from loaded data (``end - start``), which only a check reading the loaded values can
    evaluate."""
    unknown = None if exact else []
    if isinstance(mask, ast.Constant) and mask.value is None:
        return []
    if not isinstance(mask, ast.Name) or len(defs.get(mask.id, [])) != 1 or not hasattr(defs[mask.id][0], "tg"):
        return unknown
    stmt = defs[mask.id][0]
    op = op_of(stmt)
    rank = _rank(mask, shapes)
    if rank is None:
        return unknown
    lanes = operation_of(op).lanes
    conjunction = op.kind == "and_"
    if conjunction or lanes is not None:
        parts = op.args[:2] if conjunction else op.args[:1]
        found = []
        for part in parts:
            bounds = mask_bounds(part, forms, defs, shapes, exact, loaded)
            if bounds is None:
                return None
            for form, limit in bounds:
                if lanes == "moved":
                    form = _reshaped(op.kind, op, form, rank, arguments(stmt))
                found.append((_shift(form, rank), limit))
        return found
    compare = operation_of(op).on_host  # an order of integers: `<`, `<=`, `>`, `>=`
    if compare not in (operator.lt, operator.le, operator.gt, operator.ge):
        return unknown
    e, bound = op.args[:2] if compare in (operator.lt, operator.le) else op.args[1::-1]
    if isinstance(e, ast.Name) and e.id in forms and forms[e.id].affine and starts_at_zero(e, defs, forms):
        form, offset = forms[e.id], None
    else:
        split = _scalar_offset(e, forms, defs, loaded)  # `start + cols < end` reads `cols < end - start`
        if split is None:
            return unknown
        form, offset = split
    moved = _moved_term(bound, forms, defs)
    if moved is not None:  # `offs_k < K - k * BLOCK_K` reads `offs_k + k * BLOCK_K < K`
        term, bound = moved
        form = _add([form, term], max(form.rank, term.rank), negate=False)
    lane_free = isinstance(bound, ast.Constant) or (isinstance(bound, ast.Name) and (
        bound.id not in forms or (loaded and not varies(bound.id, forms))))
    if not lane_free or not form.affine:
        return unknown
    limit = _atom_expr(bound) if offset is None else _atom_expr(bound) - offset
    return [(form, limit if compare in (operator.le, operator.ge) else limit - Expr.const(1))]


def _scalar_offset(e: ast.expr, forms: dict[str, Form], defs: dict, loaded: bool) -> tuple[Form, Expr] | None:
    """For ``e`` a sum of coordinate sums from zero and scalars (constants, parameters, or with ``loaded`` ones
    computed from loaded data that no coordinate moves), through nested sums (a descriptor's index
    ``(pid * BLOCK + SECOND) + tl.arange(0, B)``) and reshapes: (the coordinates' form, the scalars' sum)."""
    if not isinstance(e, ast.Name) or len(defs.get(e.id, [])) != 1 or not hasattr(defs[e.id][0], "tg"):
        return None
    op = op_of(defs[e.id][0])
    if operation_of(op).reshapes and operation_of(op).lanes == "moved" and e.id in forms:  # `(cols + half)[None, :]`:
        inner = _scalar_offset(op.args[0], forms, defs, loaded)  # the same offset, its sum in this shape
        return None if inner is None else (forms[e.id], inner[1])
    if operation_of(op).on_host is not operator.add:
        return None
    coordinates, offset = [], None
    for part in op.args[:2]:
        if isinstance(part, ast.Name) and part.id in forms and forms[part.id].affine and starts_at_zero(
                part, defs, forms):
            coordinates.append(forms[part.id])
            continue
        if isinstance(part, ast.Constant) or (isinstance(part, ast.Name) and (
                part.id not in forms or (loaded and not varies(part.id, forms)))):
            found = (SCALAR, scalar_expr(part, defs))  # (an offset the kernel computes, `BLOCK_N // 2`, through
        else:  # its definition); a loop's index: its range's start plus its coordinate (`range(start, end, B)`)
            found = loop_start(part, forms, defs, loaded) or _scalar_offset(part, forms, defs, loaded)
            if found is None:
                return None
        coordinates.append(found[0])
        offset = found[1] if offset is None else offset + found[1]
    if offset is None or not coordinates:
        return None
    return _add(coordinates, max(f.rank for f in coordinates), negate=False), offset


def _moved_term(bound: ast.expr, forms: dict[str, Form], defs: dict) -> tuple[Form, ast.expr] | None:
    """For a bound ``B - t`` (``t`` a sum of coordinates from zero, ``B`` a scalar): ``(t's form, B)``."""
    if not isinstance(bound, ast.Name) or bound.id not in forms or len(defs.get(bound.id, [])) != 1:
        return None
    (stmt,) = defs[bound.id]
    if not hasattr(stmt, "tg") or operation_of(op_of(stmt)).on_host is not operator.sub:
        return None
    b, t = op_of(stmt).args[:2]
    if not (isinstance(t, ast.Name) and t.id in forms and forms[t.id].affine and starts_at_zero(t, defs, forms)):
        return None
    if not (isinstance(b, ast.Constant) or (isinstance(b, ast.Name) and b.id not in forms)):
        return None
    return forms[t.id], b


def _atom_expr(atom: ast.expr) -> Expr:
    if isinstance(atom, ast.Constant) and isinstance(atom.value, (int, float)):
        return Expr.const(atom.value)
    return Expr.of_text(ast.unparse(atom))


def descriptor_bounds(stmt: ast.stmt, forms: dict[str, Form], defs: dict) -> list[tuple[Form, Expr]]:
    """A descriptor access's bounds as a mask's (``mask_bounds``): along each dimension whose offset is a sum of
    coordinates from zero (or 0), ``offset + lane < size``, the elements past it clipped by the descriptor; the
    other dimensions none (their lanes counted as if read: only cautious)."""
    made = descriptor_made(arguments(stmt)["pointer"].id, defs)
    offsets, sizes = arguments(stmt)["offsets"].elts, arguments(made)["shape"].elts
    rank, found = len(offsets), []
    for d, (offset, size) in enumerate(zip(offsets, sizes, strict=True)):
        if isinstance(offset, ast.Constant) and offset.value == 0:
            terms = {}
        elif isinstance(offset, ast.Name) and offset.id in forms and forms[offset.id].affine and starts_at_zero(
                offset, defs, forms):
            terms = dict(forms[offset.id].terms)
        else:
            continue
        if not (isinstance(size, ast.Constant) or isinstance(size, ast.Name) and size.id not in forms):
            continue  # (a size some coordinate moves is no bound)
        found.append((form_of_terms({**terms, Lane(d): (1, ())}, rank), _atom_expr(size) - Expr.const(1)))
    return found
