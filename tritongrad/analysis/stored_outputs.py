"""Values an op's backward may read back from the output the forward stored them in, instead of replaying them.

A softmax's backward needs ``y`` (composites.py: ``dz = y * (dy - sum(dy * y))``); replayed, ``y`` costs the
row's max, exponentials and sum before the backward's own reduction, and at 16384 columns a program per row
cannot hide that work behind its loads. Read back, it is one load in place of the load of ``x`` (PyTorch's
softmax saves its output for the same reason). A value qualifies where:

- it is defined once and stored once, both in the kernel's top-level block, by a ``tl.store`` into a pointer
  parameter stored nowhere else (the replay loads it where it was defined: the statements computing the
  store's address move up with it);
- it is computed through a reduction (an elementwise replay overlaps the loads: reading back would gain
  nothing), and some derivative rule reads it or a value computed from it (else the backward never needs it,
  and saving the output would only refuse in-place changes PyTorch allows: a layer norm's ``y``);
- outside the store's mask its value is known (``outside``: a softmax of ``-inf`` padding is 0), so the
  load's ``other`` makes every lane what the replay would have computed; an unmasked store has no such lanes.

Reading back is the caller's promise that the parameter holds what this launch stored when the backward runs
(``grad(..., kept_outputs=...)``): an op's tape saves those outputs for the backward (their version counters
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
        if len(written) != 1 or op_of(written[0]).kind != "store" or id(written[0]) not in top:
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
    stmt, kind = found[0], op_of(found[0]).kind
    if kind == "load":
        b = arguments(stmt)
        if is_none(b["mask"]) or canonical_atom(b["mask"], defs) != mask:
            return None
        return literal_value(b.get("other"), defs)
    if kind == "where":  # outside the mask, `tl.where(mask, x, y)` is y
        b = arguments(stmt)
        return _of(b["y"], mask, defs, depth) if canonical_atom(b["condition"], defs) == mask else None
    args = [_of(a, mask, defs, depth) for a in op_of(stmt).args]
    if kind in ("to", "cast", "copy", "pos") and args:
        return args[0]
    if kind == "neg":
        return -args[0] if args[0] is not None else None
    if kind in ("add", "sub"):
        x, y = args[0], args[1]
        y = -y if kind == "sub" and y is not None else y
        if x is None or y is None:  # an infinity plus a finite value
            known = x if y is None else y
            return known if known is not None and math.isinf(known) else None
        return None if math.isnan(x + y) else x + y
    if kind in ("exp", "softmax"):  # a softmax's padding: exp(-inf) = 0
        return 0.0 if args[0] == -math.inf else (math.exp(args[0]) if kind == "exp" and args[0] is not None
                                                  and math.isfinite(args[0]) else None)
    if kind in ("mul", "truediv"):
        x, y = args[0], args[1]
        if x == 0.0 and (y is None or math.isfinite(y)) and (kind == "mul" or y != 0.0):
            return 0.0  # zero times (or over) a finite value
        if kind == "mul" and y == 0.0 and (x is None or math.isfinite(x)):
            return 0.0
    return None


def _of(atom: ast.expr, mask: str, defs: dict, depth: int) -> float | None:
    if isinstance(atom, ast.Name):
        return outside(atom.id, mask, defs, depth + 1)
    return literal_value(atom, defs)

