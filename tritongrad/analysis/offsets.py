"""The part of an address that depends on no coordinate: its offset, a polynomial in scalar names (``half`` in
``out + half + cols``); several stores to one output are apart where their offsets differ by a constant."""

from __future__ import annotations

import ast
import collections

from ..core.ir import loops, op_of, range_bounds, statements, target_of
from ..core.operations import operation_of
from ..core.per_kind import PerKind
from .addresses import FORMS
from .forms import Digit, Form, LoopIndex, ProgramDigit, ProgramValue, varies
from .launch_values import Expr
from .scalars import scalar_expr

Poly = tuple[tuple[tuple[str, ...], int], ...]  # sum of integer * product of names, sorted; () is 0
ZERO: Poly = ()


def poly(terms: dict[tuple[str, ...], int]) -> Poly:
    return tuple(sorted((k, c) for k, c in terms.items() if c != 0))


def poly_add(a: Poly, b: Poly, sign: int = 1) -> Poly:
    total = dict(a)
    for k, c in b:
        total[k] = total.get(k, 0) + sign * c
    return poly(total)


def poly_mul(a: Poly, b: Poly) -> Poly:
    total: dict[tuple[str, ...], int] = {}
    for ka, ca in a:
        for kb, cb in b:
            k = tuple(sorted(ka + kb))
            total[k] = total.get(k, 0) + ca * cb
    return poly(total)


def poly_expr(p: Poly) -> Expr:
    """The polynomial as an expression for launch checks."""
    out = None
    for names, c in p:
        term = Expr.const(c)
        for n in names:
            term = term * Expr.name(n)
        out = term if out is None else out + term
    return out if out is not None else Expr.const(0)


def offset_of(name: str, offsets: dict[str, Poly | None], forms: dict[str, Form]) -> Poly | None:
    """A name's offset (``address_offsets``); a parameter or scalar defined by no + - * is itself."""
    return _poly_of(ast.Name(name), offsets, forms)


def canonical(p: Poly, defs: dict[str, list[ast.stmt]]) -> tuple:
    """``p`` with each name written over the kernel's parameters (``scalar_expr``), so that scalars computed
    twice alike (``tl.num_programs(1)`` in two places) compare equal."""
    terms: dict = {}
    for names, c in p:
        key = tuple(sorted(str(scalar_expr(ast.Name(n), defs)) for n in names))
        terms[key] = terms.get(key, 0) + c
    return tuple(sorted((k, c) for k, c in terms.items() if c))


def address_offsets(body: list[ast.stmt], forms: dict[str, Form]) -> dict[str, Poly | None]:
    """Each integer or pointer name's offset: the part of its value that depends on no coordinate (lane,
    program id, loop iteration), as a polynomial in scalar names (parameters, and what the kernel computes
    from them in ways other than ``+ - *``, such as ``half = D // 2``); None where it is not known (an
    operation that is not affine, definitions that disagree)."""
    indices: dict[str, Poly | None] = {}
    pinned = {}  # carried names advanced by a fixed amount each iteration: their initial value's offset
    for node in loops(body):
        indices[node.target.id] = _poly_of(range_bounds(node)[0], {}, forms)
        for c in node.tg.carried:
            if c.name in forms and any(isinstance(k, LoopIndex) and k.index == node.target.id
                                       for k, _ in forms[c.name].terms):
                pinned[c.name] = c.init
    offsets: dict[str, Poly | None] = dict(indices)
    for _ in range(3):  # loop-carried names feed their own definitions: a few passes settle them
        previous, offsets = offsets, dict(indices)
        seen = collections.ChainMap(offsets, previous)  # this pass's offsets, the last pass's for names not yet met
        defined: set[str] = set()
        for stmt in statements(body):
            t = target_of(stmt)
            if t is None:
                continue
            new = _poly_of(pinned[t], seen, forms) if t in pinned else _offset_of(stmt, seen, forms)
            if t in defined and offsets[t] != new:
                new = None  # two definitions disagree
            defined.add(t)
            offsets[t] = new
    return offsets


def _poly_of(atom: ast.expr, offsets: dict, forms: dict) -> Poly | None:
    if isinstance(atom, ast.Constant) and isinstance(atom.value, int) and not isinstance(atom.value, bool):
        return poly({(): atom.value})
    if isinstance(atom, ast.Name):
        if atom.id in offsets:
            return offsets[atom.id]
        return None if varies(atom.id, forms) else poly({(atom.id,): 1})
    return None


def _offset_of(stmt: ast.stmt, offsets: dict, forms: dict) -> Poly | None:
    op = op_of(stmt)
    t = target_of(stmt)
    coordinate = operation_of(op).coordinate
    if coordinate == "lane":
        return _poly_of(op.args[0], offsets, forms)
    if coordinate == "program":
        return ZERO
    args = [_poly_of(a, offsets, forms) for a in op.args[:2]]
    rule = OFFSETS.get(op.kind)
    found = rule(op, t, args, forms) if rule is not None else _NOT_SAID
    if found is not _NOT_SAID:
        return found
    if operation_of(op).lanes is not None and args and args[0] is not None:
        return args[0]  # a copy, cast or shape operation
    if varies(t, forms) and [type(k) for k, _ in forms[t].terms] == [ProgramValue]:
        return ZERO  # a value the programs compute: a coordinate of its own
    return None if varies(t, forms) else poly({(t,): 1})  # a scalar not made by + - * of others: itself


# An operation's offset from its operands' (``args``: the first two's, None where unknown), given its Op, its
# target and the forms; _NOT_SAID leaves it to the rules after (a lanes fact, a coordinate of its own, itself).
OFFSETS = PerKind("the offset of an integer operation's result (offsets.py)",
                  unknown=FORMS.unknown | set("subscript expand_dims broadcast_to trans permute".split()))
_NOT_SAID = object()


@OFFSETS.register("add", sign=1)
@OFFSETS.register("sub", sign=-1)
def _sum(op, t: str, args: list, forms: dict, sign: int):
    return poly_add(args[0], args[1], sign) if len(args) == 2 and None not in args else _NOT_SAID


@OFFSETS.register("mul")
def _product(op, t: str, args: list, forms: dict):
    if len(args) != 2 or None in args:
        return _NOT_SAID
    if all(isinstance(a, ast.Name) and varies(a.id, forms) for a in op.args[:2]):
        return None
    return poly_mul(args[0], args[1])


@OFFSETS.register("neg")
def _negated(op, t: str, args: list, forms: dict):
    return poly_add(ZERO, args[0], -1) if args and args[0] is not None else _NOT_SAID


@OFFSETS.register("floordiv mod")
def _digit(op, t: str, args: list, forms: dict):
    if varies(t, forms) and all(isinstance(k, (ProgramDigit, Digit)) for k, _ in forms[t].terms):
        return ZERO  # a digit: a coordinate of its own
    return _NOT_SAID
