"""Values an op's backward may read back from the output the forward stored them in, instead of recomputing them.

A softmax's backward needs ``y`` (composites.py: ``dz = y * (dy - sum(dy * y))``); recomputed, ``y`` costs the
row's max, exponentials and sum before the backward's own reduction, and at 16384 columns a program per row
cannot hide that work behind its loads. Read back, it is one load in place of the load of ``x`` (PyTorch's
softmax saves its output for the same reason). A value qualifies where:

- it is defined once and stored once, both in the kernel's top-level block, by a ``tl.store`` into a pointer
  parameter stored nowhere else (the recomputation loads it where it was defined: the statements computing the
  store's address move up with it);
- it is computed through a reduction (an elementwise recomputation overlaps the loads: reading back would gain
  nothing), and some derivative rule reads it or a value computed from it (else the backward never needs it,
  and saving the output would only refuse in-place changes PyTorch allows: a layer norm's ``y``);
- outside the store's mask its value is known (``outside``: a softmax of ``-inf`` padding is 0), so the
  load's ``other`` makes every lane what the recomputation would have computed; an unmasked store has no such lanes.

Reading back is the caller's promise that the parameter holds what this launch stored when the backward runs
(``grad(..., kept_outputs=...)``): an op's launch record saves those outputs for the backward (their version counters
then refuse an in-place change before it) and keeps none that a later launch of the op writes again.
A half-precision output is read back as stored, rounded, only for a softmax (``StoredValue.rounds``: as
PyTorch's and hand-written backwards read it); a statistic (a row's mean, its rstd) only from float32 or
float64 outputs, where it is exact.
"""

from __future__ import annotations

import ast
import math
from dataclasses import dataclass

from ..core.ir import (
    Program,
    arguments,
    canonical_atom,
    definitions,
    is_none,
    literal_value,
    op_of,
    reads,
    statements,
    target_of,
)
from ..core.operations import operation_of
from ..core.per_kind import PerKind
from .flow import downstream


@dataclass(frozen=True)
class StoredValue:
    """A value and the store that wrote it; ``other``: its value outside the store's mask (None: no mask)."""

    name: str
    param: str
    store: ast.stmt
    other: float | None
    rounds: bool = False  # a softmax: may be read back rounded to a half-precision output's type


def stored_values(program: Program, stores: dict[str, list[ast.stmt]]) -> dict[str, StoredValue]:
    """The values of ``program`` that qualify, by name (``stores``: pointer parameter -> its stores)."""
    defs = definitions(program.body)
    top = {id(s) for s in program.body}
    found = {}
    for param, written in stores.items():
        if len(written) != 1 or operation_of(op_of(written[0])).access != "store" or id(written[0]) not in top:
            continue
        store = written[0]
        b = arguments(store)
        value = b["value"]
        if not isinstance(value, ast.Name) or len(defs.get(value.id, ())) != 1:
            continue
        if id(defs[value.id][0]) not in top or not _reduces(value.id, defs) or not _read_by_rules(value.id, program):
            continue
        other = None
        if not is_none(b["mask"]):
            other = outside(value.id, canonical_atom(b["mask"], defs), defs)
            if other is None:
                continue
        found[value.id] = StoredValue(value.id, param, store, other, op_of(defs[value.id][0]).kind == "softmax")
    return found


def _reduces(name: str, defs: dict) -> bool:
    """Whether a reduction is among what ``name`` is computed from."""
    seen, work = set(), [name]
    while work:
        n = work.pop()
        if n in seen:
            continue
        seen.add(n)
        for d in defs.get(n, ()):
            if isinstance(d, ast.Assign):
                if operation_of(op_of(d)).reduction is not None:
                    return True
                work += [a.id for a in ast.walk(d.value) if isinstance(a, ast.Name)]
    return False


def _read_by_rules(name: str, program: Program) -> bool:
    """Whether a derivative rule reads ``name`` or a value computed from it (as its result ``out`` or as an
    operand), taking every operand to be active."""
    computed = downstream(program.body, {name})
    for stmt in statements(program.body):
        rule = operation_of(op_of(stmt))
        if not rule.has_rule or not reads(stmt) & computed | ({target_of(stmt)} & computed):
            continue
        bound = arguments(stmt)
        for template in rule.adjoints.values():
            try:
                read = reads(ast.parse(template(bound) if callable(template) else template, mode="eval"))
            except ValueError:
                return True  # (a rule its arguments do not build: taken to read everything)
            if ("out" in read and target_of(stmt) in computed) or any(
                    p in read and isinstance(a, ast.Name) and a.id in computed for p, a in bound.items()):
                return True
    return False


def outside(name: str, mask: str, defs: dict, depth: int = 0) -> float | None:
    """The value ``name`` holds in every lane the mask (canonical form ``mask``) leaves out, where the kernel
    fixes it there: a load under that mask gives its ``other`` (``tl.where`` on that mask its second value), and
    what follows from it lane by lane. Values
    not fixed there (a reduction's result, a parameter) are finite as far as the derivation can tell, as
    analysis.padding takes them."""
    found = defs.get(name, ())
    if len(found) != 1 or depth > 64 or not isinstance(found[0], ast.Assign) or target_of(found[0]) != name:
        return None
    stmt = found[0]
    rule = OUTSIDE.get(op_of(stmt).kind)
    return rule(stmt, mask, defs, depth) if rule is not None else None


# An operation's value outside the mask (canonical form ``mask``), from its statement: None where not known.
OUTSIDE = PerKind("an operation's value in the lanes a mask leaves out (stored_outputs.py)", unknown=(
    "pow exp2 log log2 sqrt sqrt_rn rsqrt sin cos sigmoid erf abs tanh log1p expm1 fpow fma div_rn fdiv "
    "maximum minimum clamp broadcast_to sum max min cumsum cumprod dot subscript expand_dims reshape view trans "
    "permute item linear_scan split join lt le gt ge eq ne and_ or_ xor lshift rshift invert not_ floordiv is_ is_not "
    "in_ not_in boolop ifexp program_id num_programs arange zeros zeros_like full cdiv floor ceil argmax argmin "
    "umulhi multiple_of max_contiguous max_constancy rand randn randint rand4x randn4x randint4x static_assert "
    "device_assert static_print device_print debug_barrier print stop_gradient mod store atomic_add atomic_max "
    "atomic_min atomic_and atomic_or atomic_xor atomic_xchg atomic_cas desc_load desc_store desc_atomic_add "
    "make_tensor_descriptor xor_sum reduce"))


def _operands(stmt: ast.stmt, mask: str, defs: dict, depth: int) -> list[float | None]:
    return [_of(a, mask, defs, depth) for a in op_of(stmt).args]


@OUTSIDE.register("load")
def _loaded(stmt: ast.stmt, mask: str, defs: dict, depth: int) -> float | None:
    b = arguments(stmt)
    if is_none(b["mask"]) or canonical_atom(b["mask"], defs) != mask:
        return None
    return literal_value(b.get("other"), defs)


@OUTSIDE.register("where")
def _picked(stmt: ast.stmt, mask: str, defs: dict, depth: int) -> float | None:  # outside the mask,
    b = arguments(stmt)  # `tl.where(mask, x, y)` is y
    return _of(b["y"], mask, defs, depth) if canonical_atom(b["condition"], defs) == mask else None


@OUTSIDE.register("to cast copy pos")
def _same(stmt: ast.stmt, mask: str, defs: dict, depth: int) -> float | None:
    args = _operands(stmt, mask, defs, depth)
    return args[0] if args else None


@OUTSIDE.register("neg")
def _negated(stmt: ast.stmt, mask: str, defs: dict, depth: int) -> float | None:
    args = _operands(stmt, mask, defs, depth)
    return -args[0] if args[0] is not None else None


@OUTSIDE.register("add", sign=1)
@OUTSIDE.register("sub", sign=-1)
def _sum(stmt: ast.stmt, mask: str, defs: dict, depth: int, sign: int) -> float | None:
    x, y = _operands(stmt, mask, defs, depth)[:2]
    y = -y if sign == -1 and y is not None else y
    if x is None or y is None:  # an infinity plus a finite value
        known = x if y is None else y
        return known if known is not None and math.isinf(known) else None
    return None if math.isnan(x + y) else x + y


@OUTSIDE.register("exp", exp=True)
@OUTSIDE.register("softmax", exp=False)
def _exponential(stmt: ast.stmt, mask: str, defs: dict, depth: int, exp: bool) -> float | None:
    x = _operands(stmt, mask, defs, depth)[0]  # a softmax's padding: exp(-inf) = 0
    return 0.0 if x == -math.inf else (math.exp(x) if exp and x is not None and math.isfinite(x) else None)


@OUTSIDE.register("mul", divides=False)
@OUTSIDE.register("truediv", divides=True)
def _product(stmt: ast.stmt, mask: str, defs: dict, depth: int, divides: bool) -> float | None:
    x, y = _operands(stmt, mask, defs, depth)[:2]
    if x == 0.0 and (y is None or math.isfinite(y)) and (not divides or y != 0.0):
        return 0.0  # zero times (or over) a finite value
    if not divides and y == 0.0 and (x is None or math.isfinite(x)):
        return 0.0
    return None


def _of(atom: ast.expr, mask: str, defs: dict, depth: int) -> float | None:
    if isinstance(atom, ast.Name):
        return outside(atom.id, mask, defs, depth + 1)
    return literal_value(atom, defs)

