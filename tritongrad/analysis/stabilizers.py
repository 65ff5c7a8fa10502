"""Values that only stabilize: a row's max, subtracted before ``exp`` and normalized away.

Softmax and log-sum-exp subtract the max before ``exp`` so that it cannot overflow, and
their results do not depend on it: ``exp(x - m) / sum(exp(x - m))`` and
``m + log(sum(exp(x - m)))`` are the same for every ``m``. So the adjoint of ``m`` is
exactly zero; computed, it costs two reductions per row (the sum giving it, and the tie
count spreading it over the maxima) and adds only rounding noise. A hand-written backward
never computes it.

The proof is a perturbation analysis: move ``m`` to ``m + c`` (everything else that does
not depend on ``m`` fixed) and follow how each value computed from it changes:

- ``Shift(k)``: by ``k * c`` (``x - m``: -1; ``log`` of a ``Scale``);
- ``Scale(base, k)``: multiplied by ``base ** (k * c)`` (``exp`` of a ``Shift``: base e,
  ``exp2``: base 2; a sum or a product of scaled values);
- unchanged (the normalized ratio ``e / s``, the log-sum-exp ``m + log(s)``).

``m`` is a stabilizer when every value stored, every address, mask and branch test, and
every value crossing a loop comes out unchanged; then its adjoint is dropped. Anything
the rules below do not know about counts as a change.
"""

from __future__ import annotations

import ast
import math
from dataclasses import dataclass

from ..core.ir import (
    Program,
    arguments,
    child_blocks,
    is_none,
    is_structured,
    literal_value,
    op_of,
    reads,
    statements,
    target_of,
)
from ..core.operations import STORES, kinds, operation_of
from ..core.per_kind import PerKind

INVARIANT = None
GUARD = "tg_guard"  # the attribute marking a guard (follow), kept by a statement's copies


@dataclass(frozen=True)
class Shift:
    k: float


@dataclass(frozen=True)
class Scale:
    base: float
    k: float


@dataclass(frozen=True)
class Zero:
    """A sum not yet added to: zero, which every scaling leaves as it is (a loop's first visit)."""


ZERO = Zero()


@dataclass(frozen=True)
class Unknown:
    """Moved in a way the rules cannot follow: harmless until it reaches something observable (a max pass
    computing the next loop's final max, read only through ``tg.stop_gradient``)."""


UNKNOWN = Unknown()


class Changes(Exception):
    """A value the perturbation reaches where it must not (an output, an address, a branch) or that the
    rules cannot follow."""


def stabilizers(program: Program, active: set[str]) -> set[str]:
    """The active results of ``tl.max`` reductions whose perturbation leaves everything observable unchanged."""
    found = set()
    for stmt in statements(program.body):
        t = target_of(stmt)
        if t in active and op_of(stmt).kind == "max":
            try:
                moved = follow(program.body, t)
                if any(moved.get(n) is not INVARIANT for r in program.returns or () for n in _all_names(r)):
                    raise Changes(stmt)  # a tile function's result
            except Changes:
                continue
            found.add(t)
    for stmt in statements(program.body):  # its copies in another shape (`m[:, None]`) have no adjoint either
        op = op_of(stmt)
        if (op.kind == "copy" or operation_of(op).reshapes) and op.args and isinstance(op.args[0], ast.Name) \
                and op.args[0].id in found:
            found.add(target_of(stmt))
    return found



def follow(body: list[ast.stmt], m: str, guarded: frozenset[int] | set[int] = frozenset()) -> dict[str, object]:
    """How each value moves with ``m``; raises Changes where moving ``m`` changes something observable.

    A loop-carried value may move only as an accumulator that starts at zero (online.py's rewritten sums): visited
    first as ``ZERO``, it then scales as its next value came out, which the loop is visited again to confirm.
    A value the rules cannot follow is ``UNKNOWN``: a Change only where it is observed. ``tg.stop_gradient`` ends
    a movement: what it stops has no adjoint, whatever moves it (online.py proves that of its final maxima).
    ``guarded``: ids of casts compiled with a check that their type is a float type (online.py). A statement
    marked ``GUARD`` is a ``tl.where(c, x, y)`` picking ``x`` only where ``y`` is undefined (``exp(-inf + inf)``):
    it moves as ``y`` does (online.py's scaled starts)."""
    kinds: dict[str, object] = {m: Shift(1.0)}  # name -> how it moves (every definition must agree)
    zeros = {target_of(s) for s in statements(body) if _is_zeros(s)}

    def kind_of(atom: ast.expr):
        if isinstance(atom, ast.Name):
            return kinds.get(atom.id, INVARIANT)
        if any(kinds.get(n, INVARIANT) is not INVARIANT for n in _all_names(atom)):  # a tuple holding a moved value
            raise Changes(atom)
        return INVARIANT

    def visit_loop(loop: ast.For, carried_outside: set[str]) -> None:
        carried = {c.name: c for c in loop.tg.carried}
        assumed = {n: ZERO if isinstance(c.init, ast.Name) and c.init.id in zeros else kinds.get(n, INVARIANT)
                   for n, c in carried.items()}
        for _ in range(2 * len(carried) + 2):
            before = dict(kinds)
            kinds.update(assumed)
            visit(loop.body, carried_outside | set(carried))
            moved = {n: kind_of(c.next) for n, c in carried.items()}
            if moved == assumed:
                return
            for n, kind in moved.items():  # a sum from zero scales as what is added to it
                if kind != assumed[n]:
                    if kind is UNKNOWN:  # (checked where it is observed)
                        assumed[n] = kind
                    elif assumed[n] is not ZERO or not (kind is INVARIANT or isinstance(kind, Scale)):
                        raise Changes(loop)
                    else:
                        assumed[n] = kind
            kinds.clear()
            kinds.update(before)
        raise Changes(loop)

    def visit(block: list[ast.stmt], carried: set[str]) -> None:
        for s in block:
            if is_structured(s):
                tests = [s.test] if isinstance(s, ast.If) else [s.iter]
                if any(kinds.get(n, INVARIANT) is not INVARIANT for t in tests for n in reads(t)):
                    raise Changes(s)
                if isinstance(s, ast.For):
                    visit_loop(s, carried)
                else:
                    for b in child_blocks(s):
                        visit(b, carried)
                continue
            op = op_of(s)
            moved = any(kind_of(a) is not INVARIANT for a in [*op.args, *op.kwargs.values()])
            if moved and (operation_of(op).memory is not None or op.kind == "call"):  # stored, an address, a mask
                raise Changes(s)
            t = target_of(s)
            if t is None or t == m:
                continue  # an assert or a print: nothing the gradient sees
            new = _moved(s, kind_of, id(s) in guarded, getattr(s, GUARD, False)) if moved else INVARIANT
            if t in carried:  # a carried value's update: its loop checks it against the assumption
                kinds[t] = new
                continue
            if (t in kinds and kinds[t] != new) or (carried and s.tg.join and new is not INVARIANT):
                raise Changes(s)  # definitions that disagree, or a moved value carried across iterations
            kinds[t] = new

    visit(body, set())
    return kinds


def _moved(stmt: ast.stmt, kind_of, float_cast: bool, guard: bool):
    """How a flat, pure statement's result moves: UNKNOWN where the rules cannot say."""
    op = op_of(stmt)
    if op.kind == "stop_gradient":
        return INVARIANT
    if guard:
        return kind_of(op.args[2])
    if any(kind_of(a) is UNKNOWN for a in [*op.args, *op.kwargs.values()]):
        return UNKNOWN
    try:
        return _rule(stmt, kind_of, float_cast)
    except Changes:
        return UNKNOWN


def _is_zeros(stmt: ast.stmt) -> bool:
    """Whether the statement makes a tile of zeros (``tl.zeros``, ``tl.zeros_like``, ``tl.full`` of 0)."""
    op = op_of(stmt)
    if op.kind == "full":
        value = op.kwargs.get("value", op.args[1] if len(op.args) > 1 else None)
        return value is not None and literal_value(value) == 0.0
    return op.kind in ("zeros", "zeros_like")


def _all_names(atom: ast.expr) -> set[str]:
    return {n.id for n in ast.walk(atom) if isinstance(n, ast.Name)}


def _rule(stmt: ast.stmt, kind_of, float_cast: bool = False):
    """How the statement's result moves, given how its operands do (``float_cast``: a cast checked to be to a
    float type)."""
    op = op_of(stmt)
    a = [kind_of(x) for x in op.args]
    rule = MOVES.get(op.kind)
    if rule is None:
        raise Changes(stmt)
    return rule(stmt, op, a, kind_of, float_cast)


# How each operation's result moves, given its statement, its Op, how its operands move, ``kind_of`` (an atom's
# movement) and whether a cast is checked to be to a float type; Changes where it cannot say.
MOVES = PerKind("how moving a stabilizer moves an operation's result (stabilizers.py)", unknown=(
    kinds(no_gradient=True) | kinds(memory="load") | STORES | {"mod", "make_tensor_descriptor"}
    | set("pow sqrt sqrt_rn rsqrt sin cos sigmoid erf abs tanh log1p expm1 fpow fma div_rn fdiv clamp cumsum "
          "cumprod item linear_scan split join xor_sum reduce full ifexp boolop multiple_of max_contiguous "
          "max_constancy".split())))


@MOVES.register("copy pos subscript expand_dims broadcast_to reshape view trans permute")
def _as_operand(stmt, op, a, kind_of, float_cast):
    return a[0]


@MOVES.register("to cast")
def _cast(stmt, op, a, kind_of, float_cast):
    b = arguments(stmt)
    dtype = ast.unparse(b["dtype"])
    bitcast = not (isinstance(b.get("bitcast"), ast.Constant) and b["bitcast"].value is False)
    if a[0] is INVARIANT or (not bitcast and (float_cast or dtype.startswith(("tl.float", "tl.bfloat")))):
        return a[0]
    raise Changes(stmt)


@MOVES.register("dot")
def _dot(stmt, op, a, kind_of, float_cast):  # linear in each operand: scales multiply; the accumulator must scale
    b = arguments(stmt)  # as the product
    x, y = kind_of(b["input"]), kind_of(b["other"])
    acc = kind_of(b["acc"]) if "acc" in b and not is_none(b["acc"]) else INVARIANT
    if ZERO in (x, y) or isinstance(x, Shift) or isinstance(y, Shift) or (x and y and x.base != y.base):
        raise Changes(stmt)
    k = (x.k if x else 0.0) + (y.k if y else 0.0)
    product = INVARIANT if k == 0 else Scale((x or y).base, k)
    if "acc" in b and not is_none(b["acc"]) and acc not in (product, ZERO) and not (
            acc is INVARIANT and literal_value(b["acc"]) == 0.0):
        raise Changes(stmt)
    return product


@MOVES.register("add", sign=1.0)
@MOVES.register("sub", sign=-1.0)
def _sum(stmt, op, a, kind_of, float_cast, sign):
    x, y = a[0], a[1]
    if sign == 1.0 and ZERO in (x, y):  # 0 + y = y
        return y if x is ZERO else x
    if isinstance(x, Shift | type(None)) and isinstance(y, Shift | type(None)):
        k = (x.k if x else 0.0) + sign * (y.k if y else 0.0)
        return INVARIANT if k == 0 else Shift(k)
    if sign == 1.0 and isinstance(x, Scale) and x == y:  # a sum of equally scaled values
        return x
    raise Changes(stmt)


@MOVES.register("neg")
def _neg(stmt, op, a, kind_of, float_cast):
    if isinstance(a[0], Shift):
        return Shift(-a[0].k)
    raise Changes(stmt)


@MOVES.register("mul", power=1)
@MOVES.register("truediv", power=-1)
def _product(stmt, op, a, kind_of, float_cast, power):
    x, y = a[0], a[1]
    if power == 1 and ZERO in (x, y):  # 0 * y = 0
        return ZERO
    if isinstance(x, Shift) or isinstance(y, Shift):
        factor = literal_value(op.args[1] if isinstance(x, Shift) else op.args[0])
        if power == 1 and (x is INVARIANT or y is INVARIANT) and factor is not None:
            k = (x or y).k * factor
            return INVARIANT if k == 0 else Shift(k)
        raise Changes(stmt)
    bx, by = (x.base if x else None), (y.base if y else None)
    if bx and by and bx != by:
        raise Changes(stmt)
    k = (x.k if x else 0.0) + power * (y.k if y else 0.0)
    return INVARIANT if k == 0 else Scale(bx or by, k)


@MOVES.register("exp", base=math.e)
@MOVES.register("exp2", base=2.0)
def _exponential(stmt, op, a, kind_of, float_cast, base):
    if not isinstance(a[0], Shift):
        raise Changes(stmt)
    return Scale(base, a[0].k)


@MOVES.register("log", base=math.e)
@MOVES.register("log2", base=2.0)
def _logarithm(stmt, op, a, kind_of, float_cast, base):
    if not (isinstance(a[0], Scale) and a[0].base == base):
        raise Changes(stmt)
    return Shift(a[0].k)


@MOVES.register("max min")
def _extremum(stmt, op, a, kind_of, float_cast):  # the extremum of values all moved alike moves alike
    if isinstance(a[0], Shift | Scale):
        return a[0]
    raise Changes(stmt)


@MOVES.register("softmax")
def _softmax(stmt, op, a, kind_of, float_cast):  # exp(z + c) / sum(exp(z + c)) = exp(z) / sum(exp(z))
    if isinstance(a[0], Shift):
        return INVARIANT
    raise Changes(stmt)


@MOVES.register("sum")
def _summed(stmt, op, a, kind_of, float_cast):
    if isinstance(a[0], Scale):
        return a[0]
    raise Changes(stmt)


@MOVES.register("maximum minimum")
def _elementwise_extremum(stmt, op, a, kind_of, float_cast):
    if a[0] == a[1]:
        return a[0]
    raise Changes(stmt)


@MOVES.register("where")
def _where(stmt, op, a, kind_of, float_cast):
    b = arguments(stmt)
    if kind_of(b["condition"]) is not INVARIANT:
        raise Changes(stmt)
    return _merge(kind_of(b["x"]), kind_of(b["y"]), b["x"], b["y"], stmt)


def _merge(x, y, ax: ast.expr, ay: ast.expr, stmt: ast.stmt):
    """``tl.where(c, x, y)``: both sides must move alike; a constant that moving cannot change (±inf for a
    shift, 0 for a scale) goes with either."""
    if x == y:
        return x
    for moved, other in ((x, ay), (y, ax)):
        value = literal_value(other)
        if isinstance(moved, Shift) and value is not None and math.isinf(value):
            return moved
        if isinstance(moved, Scale) and value == 0.0:
            return moved
    raise Changes(stmt)

