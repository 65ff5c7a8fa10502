"""A kernel's integer scalars as expressions a launch evaluates: ``scalar_expr`` (integer math on the parameters and the
grid), ``program_expr`` (also on the program ids: a value each program computes, a swizzle's; ``iteration_values``:
a loop's index and what it advances, for a persistent kernel's; ``program_value``: such a value as a coordinate of
its own), ``divisor_text`` (an
index split's divisor), ``loop_start`` (a loop's index as its range's start plus its coordinate); and
``starts_at_zero``, whether an integer tile counts from zero (what makes a split's digits stand for the index)."""

from __future__ import annotations

import ast
import operator
from collections.abc import Mapping

from ..core.ir import axis_of, canonical_atom, op_of, range_bounds, statements, value_args
from ..core.operations import operation_of
from ..core.per_kind import PerKind
from .forms import Form, LoopIndex, ProgramValue, coefficient_expr, form_of_terms, form_program_axes, varies
from .launch_values import Expr


def program_expr(name: str, defs: dict[str, list[ast.stmt]], params: frozenset[str],
                 iterating: Mapping[str, Expr] | None = None) -> Expr | None:
    """A scalar as an expression over the program ids, the grid and the kernel's parameters (None: it reads
    something else, a loaded value, a loop's index other than ``iterating``'s: a grid-stride loop's index, or state
    it carries, as an expression over that index)."""
    ids = {n: axis_of(op_of(d)) for n, ds in defs.items() for d in ds
           if not isinstance(d, ast.For) and operation_of(op_of(d)).coordinate == "program" and len(ds) == 1}
    iterating = iterating or {}

    def expand(n: str) -> Expr | None:
        if n in iterating:
            return iterating[n]
        if n in ids:
            return Expr("program_id", (ids[n],)) if ids[n] is not None else None
        found = scalar_expr(ast.Name(n), defs)
        return None if n in params or found == Expr.name(n) else found

    value = scalar_expr(ast.Name(name), defs)
    for _ in range(16):
        more = value.substitute(expand)
        if more == value:
            break
        value = more
    return value if value.names() <= params and _readable(value) else None


def _readable(e: Expr) -> bool:
    return e.op != "unknown" and all(_readable(a) for a in e.args if isinstance(a, Expr))


def scalar_expr(atom: ast.expr, defs: dict[str, list[ast.stmt]], depth: int = 0) -> Expr:
    """A scalar as an expression over the kernel's parameters and the grid where it is integer math on
    them (``tl.cdiv(K, BLOCK)``, ``R - 1``, ``tl.num_programs(1)``), for launch checks; else its name."""
    if isinstance(atom, ast.Constant) and isinstance(atom.value, int):
        return Expr.const(atom.value)
    if not isinstance(atom, ast.Name):
        return Expr.of_text(ast.unparse(atom))
    found = [d for d in defs.get(atom.id, []) if not isinstance(d, ast.For)]
    if depth < 8 and len(found) == 1:
        op = op_of(found[0])
        if operation_of(op).on_host is not None or op.kind == "minimum":
            kind = "min" if op.kind == "minimum" else op.kind
            return Expr(kind, tuple(scalar_expr(a, defs, depth + 1) for a in op.args))
        if operation_of(op).coordinate == "programs" and axis_of(op) is not None:
            return Expr("grid", (axis_of(op),))
    return Expr.name(atom.id)


def starts_at_zero(atom: ast.expr, defs: dict, forms: dict | None = None) -> bool:
    """Whether a coordinate sum has no constant part: built from ``tl.arange(0, ...)`` and program ids (a
    carried ``cols += BLOCK`` too: its steps are the loop's coordinate), or (``forms``: addresses.py's) a value
    programs compute that is a coordinate of its own, whole (forms.ProgramValue: none negative, at launch)."""
    if isinstance(atom, ast.Constant):
        return atom.value == 0
    if not isinstance(atom, ast.Name):
        return False
    if forms is not None and atom.id in forms and [(type(k).__name__, c) for k, c in forms[atom.id].terms] == [
            ("ProgramValue", (1, ()))]:
        return True
    headers = [d for d in defs.get(atom.id, []) if isinstance(d, ast.For)]
    if headers:  # a loop's index: from a range starting at 0
        start = range_bounds(headers[0])[0]
        return len(headers) == 1 and isinstance(start, ast.Constant) and start.value == 0
    own = [d for d in defs.get(atom.id, []) if not (operation_of(op_of(d)).on_host is operator.add and any(
        isinstance(a, ast.Name) and a.id == atom.id for a in op_of(d).args[:2]))]  # not `cols = cols + BLOCK`
    if len(own) != 1:
        return False
    op = op_of(own[0])
    operation = operation_of(op)
    if operation.coordinate == "lane":
        return isinstance(op.args[0], ast.Constant) and op.args[0].value == 0
    if operation.coordinate == "program":
        return True
    if operation.lanes == "same":
        return starts_at_zero(op.args[0], defs, forms)
    combine = FROM_ZERO.get(op.kind)
    return combine is not None and combine(starts_at_zero(a, defs, forms) for a in op.args[:2])


# Whether an operation's result counts from zero, from whether its operands (the first two) do.
FROM_ZERO = PerKind("whether an integer operation's result counts from zero (scalars.py)", unknown=(
    "copy pos to cast program_id num_programs arange multiple_of max_contiguous max_constancy "  # lanes, coordinate
    "sub neg trans permute truediv pow exp exp2 log log2 sqrt sqrt_rn rsqrt sin cos sigmoid erf abs tanh log1p "
    "expm1 fpow fma div_rn fdiv maximum minimum where clamp sum softmax max min cumsum cumprod dot reshape view item "
    "linear_scan split join lt le gt ge eq ne and_ or_ xor lshift rshift invert not_ is_ is_not in_ not_in boolop "
    "ifexp zeros zeros_like full cdiv floor ceil argmax argmin umulhi rand randn randint rand4x randn4x randint4x "
    "static_assert device_assert static_print device_print debug_barrier print stop_gradient load store atomic_add "
    "atomic_max atomic_min atomic_and atomic_or atomic_xor atomic_xchg atomic_cas desc_load desc_store "
    "desc_atomic_add make_tensor_descriptor xor_sum reduce"))
FROM_ZERO.register("add")(all)
FROM_ZERO.register("mul")(any)
FROM_ZERO.register("floordiv mod subscript expand_dims broadcast_to")(next)  # a digit of a split (`pid // n`,
# `pid % n`) from 0 where its index is; a reshape of a tile from 0


def loop_start(atom: ast.expr, forms: dict, defs: dict, loaded: bool) -> tuple[Form, Expr] | None:
    """A loop's index over ``range(start, ...)`` read as ``start + step * i``: its form (the loop's coordinate
    alone) and the start, where that is a scalar no coordinate moves (a constant, a parameter; with ``loaded``, also
    one computed from loaded data: ``range(start, end, BLOCK)`` over a sequence whose bounds come from
    ``cu_seqlens``), so a mask ``off + cols < end`` bounds the loop's coordinate and the lanes by ``end - start``."""
    if not isinstance(atom, ast.Name) or len(defs.get(atom.id, [])) != 1 or not isinstance(defs[atom.id][0], ast.For):
        return None
    form, start = forms.get(atom.id), range_bounds(defs[atom.id][0])[0]
    if form is None or not form.affine or [k for k, _ in form.terms] != [LoopIndex(atom.id)]:
        return None
    if (isinstance(start, ast.Constant) and type(start.value) is int) or (isinstance(start, ast.Name) and (
            start.id not in forms or (loaded and not varies(start.id, forms)))):
        return form, scalar_expr(start, defs)
    return None


def divisor_text(atom: ast.expr, defs: dict) -> str:
    """A digit's divisor, written out through its definitions where that reads as integer math on the launch's
    values (``H * W``: two temporaries computing it give one divisor, so ``offs // HW`` and ``offs % HW`` are
    partners), else as spelled."""
    text = canonical_atom(atom, defs) if isinstance(atom, ast.Name) else ast.unparse(atom)
    return text if Expr.of_text(text).op != "unknown" else ast.unparse(atom)


def iteration_values(body: list[ast.stmt], defs: dict, pinned: dict, params: frozenset[str]) -> dict[str, Expr]:
    """For each loop not inside another whose bounds a launch reads (the start may read the program ids: a
    grid-stride loop), its index as an ``index`` expression (launch_values.Expr), and each carried value it
    advances by a fixed amount as one over that index (``tile_c = start - P`` then ``tile_c += P``), where only
    the loop reads that value (the loop's own names do not outlive it)."""
    found: dict[str, Expr] = {}
    for node in (s for s in body if isinstance(s, ast.For)):  # (a nested loop's bounds may read an outer index)
        bounds = [program_expr(a.id, defs, params) if isinstance(a, ast.Name) else scalar_expr(a, defs)
                  for a in range_bounds(node)]
        if None in bounds or any(not b.names() <= params for b in bounds) or any(
                b.program_axes() for b in bounds[1:]):
            continue
        start, _, step = bounds
        index = Expr("index", (node.target.id, *bounds))
        found[node.target.id] = index
        inside = {id(s) for s in statements(node.body)}
        for name, (init, key, advance) in pinned.items():
            if key.index != node.target.id or any(name in value_args(s) and id(s) not in inside
                                                  for s in statements(body)):
                continue  # (read before or after the loop, where it holds its first or last value)
            before = [d for d in defs.get(name, []) if not isinstance(d, ast.For) and id(d) not in inside]
            first = (program_expr(init.id, defs, params) if isinstance(init, ast.Name) and init.id != name else
                     _assigned_value(before[0], defs, params) if len(before) == 1 else None)
            if first is not None:
                found[name] = first + coefficient_expr(advance) * Expr("floordiv", (index - start, step))
    return found


def _assigned_value(stmt: ast.stmt, defs: dict, params: frozenset[str]) -> Expr | None:
    """A scalar assignment's value over the program ids and parameters, or None."""
    op = op_of(stmt)
    if operation_of(op).on_host is None:
        return None
    args = [program_expr(a.id, defs, params) if isinstance(a, ast.Name) else scalar_expr(a, defs) for a in op.args]
    return None if None in args else Expr(op.kind, tuple(args))


def program_value(name: str, form: Form | None, axes: set[int], rank: int | None, defs: dict,
                  params: frozenset[str], iterating: dict[str, Expr]) -> Form | None:
    """``form``, or for a scalar computed from the program ids by integer math that loses them as coordinates (a
    swizzle: ``pid_n = (pid % in_group) // group_size``, ``min(...)``), the coordinate of its own that its value
    over the grid gives (forms.ProgramValue), where that value is integer math on the ids and parameters (and a
    loop's index, ``iterating``: a persistent kernel's swizzled tile)."""
    if not axes or (form is not None and axes <= form_program_axes(form)) or rank != 0:
        return form
    moved = {k: ProgramValue(k.index, iterating[k.index]) for k, _ in (form.terms if form is not None else ())
             if isinstance(k, LoopIndex) and k.index in iterating}
    if moved and form.affine:  # `i * BLOCK` over a range the programs compute: the index a value of its own
        terms = {moved.get(k, k): c for k, c in form.terms}
        indexed = form_of_terms(terms, form.rank, form.affine)
        if axes <= form_program_axes(indexed):
            return indexed
    value = program_expr(name, defs, params, iterating)
    return form if value is None else form_of_terms({ProgramValue(name, value): (1, ())}, 0)
