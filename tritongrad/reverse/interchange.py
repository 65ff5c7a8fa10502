"""The loop interchange of a re-parallelized adjoint: a loop's iterations become programs of the grid.

A tiled matmul's program ``(m, n)`` loops over ``k``, loading ``A[m, k]``. Every program along
``n`` reads the same tiles of ``A``, so ``dA[m, k]`` is a sum over ``n``. A hand-written backward
gives ``dA`` a kernel of its own whose program ``(m, k)`` loops over ``n`` and stores its tile once,
instead of adding from every ``(m, n)`` with atomics. :func:`loop_to_grid` does that to a derived
backward body (one input's gradient only, sweep.py): the reverse loop around the input's adjoint
runs one iteration per program (``k = start + tl.program_id(axis) * step``, each carried pointer
advanced to that iteration in closed form), and persistent.py then loops every program over
all of the forward's programs along ``axis``, summing the adjoint in registers.

Legal when each iteration's adjoint needs nothing from the others: the loop carries only values
advanced by a loop-invariant amount (pointers, offsets), its adjoint flows nowhere after the loop,
and nothing outside it has an effect (each program runs that part once per iteration it owns).
Otherwise :class:`NotInterchangeable` says why, and the input keeps another write strategy.
"""

from __future__ import annotations

import ast
import copy
from collections import Counter
from dataclasses import dataclass

from ..core.ir import (
    Namer,
    Op,
    Tag,
    assign,
    computed_from,
    is_structured,
    name_node,
    needed_by,
    op_of,
    range_bounds,
    reads,
    statements,
    target_of,
    targets_of,
    tl_call,
)
from ..core.language import HELPERS, helper_of
from ..core.operations import instantiate, kinds
from .state_tape import StateTape


class NotInterchangeable(Exception):
    """Why a backward body cannot give a loop's iterations to the grid."""


@dataclass(frozen=True)
class Guard:
    """A forward program's work in an interchanged kernel runs where its loop reaches the program's iteration:
    ``count`` assigns that program's trip count, ``test`` compares the iteration with it."""

    count: ast.Assign
    test: ast.expr


@dataclass(frozen=True)
class Prologue:
    """Values every program of an interchanged kernel would recompute for each forward program it loops over,
    computed once per forward program by a kernel of their own on the forward's grid (``body``, ending in
    ``tg.tape_put_exactly`` of each) and read from a one-slot tape (``tape``): attention's dO / l and the row
    sums of dO * o (FlashAttention-2's preprocessing kernel)."""

    body: list[ast.stmt]
    tape: StateTape
    rounded: dict[str, str]  # values kept in the one type their readers round them to -> that type


def loop_to_grid(recomputed: list[ast.stmt], sweep: list[ast.stmt], accumulators: list[str], axis: int,
                 comments: dict[str, str], namer: Namer, keep: set[str], per_program: set[str] = frozenset(),
                 likes: dict[str, tuple[ast.expr, tuple[str, ...]]] | None = None,
                 loaded: dict[str, str] | None = None) -> tuple[list[ast.stmt], Guard | None, Prologue | None]:
    """``sweep`` with the top-level loop that sums into ``accumulators`` (the inputs' adjoints a kernel of their
    own writes: attention's dK and dV, one loop) replaced by the iteration this program owns along ``axis``;
    what no longer has a use dropped (``keep``: what is read after it). ``per_program``: the loops whose trip
    count differs from one of the forward's programs to another (a causal attention's): then also the
    :class:`Guard` under which a forward program's work runs (persistent.py puts it around that work).
    ``likes``: adjoints that may be computed by a :class:`Prologue` -> (zeros of their shape and type, the shape
    as written); ``loaded``: names of loaded values -> the pointer parameter they are loaded from."""
    found = [i for i, s in enumerate(sweep) if isinstance(s, ast.For) and any(_sums_into(s, a) for a in accumulators)]
    if len(found) != 1 or not all(_sums_into(sweep[found[0]], a) for a in accumulators):
        raise NotInterchangeable("its adjoint is not summed in one loop at the kernel's top level")
    at = found[0]
    node = sweep[at]
    if any(is_structured(s) for s in recomputed + sweep[:at] + sweep[at + 1:]):
        raise NotInterchangeable("the backward runs another loop or branch beside it (each program would "
                                 "run it once per iteration it owns)")
    if any(_has_effect(s, comments) for s in recomputed + sweep[:at] + sweep[at + 1:]):
        raise NotInterchangeable("the backward writes memory outside the loop")
    body = node.body
    assigned = {t for s in statements(body) for t in targets_of(s)} - set(accumulators)
    later = set().union(set(), *[reads(s) for s in sweep[at + 1:]])
    if assigned & later:
        raise NotInterchangeable(f"`{sorted(assigned & later)[0]}` flows out of the loop")
    carried = _read_before_written(body, assigned)
    steps = {}
    for s in body:
        name = target_of(s)
        if name in carried:
            steps[name] = _step_of(s, name)
    if set(steps) != carried or any(target_of(s) in carried for s in statements(body) if s not in body):
        raise NotInterchangeable(f"`{sorted(carried - set(steps))[0] if carried - set(steps) else 'a value'}` "
                                 "is carried from one iteration to the next other than by a fixed step")
    invariant = _invariant(body, assigned)
    defs = {target_of(s): [s] for s in body if target_of(s) is not None}
    needed = computed_from({n for sign, inc in steps.values() for n in reads(inc)}, defs) & set(defs)
    if not needed <= invariant:
        raise NotInterchangeable("a carried value's step changes from one iteration to the next")
    moved = [s for s in body if target_of(s) in needed]
    rest = [s for s in body if s not in moved and target_of(s) not in carried]
    iteration = namer.fresh(f"{node.target.id}_iteration")
    start, _, step = range_bounds(node)
    head: list[ast.stmt] = [*moved, assign(iteration, instantiate(f"tl.program_id({axis})", {}))]
    head.append(assign(node.target.id, instantiate(
        "start + i * step", {"start": start, "step": step, "i": name_node(iteration)})))
    renamed = {}
    for name, (sign, inc) in steps.items():
        renamed[name] = namer.fresh(f"{name}_at")
        head.append(assign(renamed[name], instantiate(f"x {sign} i * inc", {
            "x": name_node(name), "i": name_node(iteration), "inc": inc})))
    rest = [_rename(s, renamed) for s in rest]
    guard = None
    if node.target.id in per_program:
        trips = namer.fresh(f"{node.target.id}_trips")
        guard = Guard(assign(trips, instantiate("tg.trip_count(start, stop, step)", {
            "start": start, "stop": range_bounds(node)[1], "step": step})),
            instantiate("i < n", {"i": name_node(iteration), "n": name_node(trips)}))
    markers = [s.value.id for s in sweep[:at] if isinstance(s, ast.Expr) and isinstance(s.value, ast.Name)
               and s.value.id in comments]
    if markers and comments[markers[-1]].startswith("loop over"):  # the loop's plan: say where it went
        first = comments[markers[-1]].splitlines()[0]
        comments[markers[-1]] = f"{first}\nEach program runs one iteration: the one tl.program_id({axis}) numbers."
    keep = keep | set(accumulators) | (reads(guard.count) if guard else set())
    before, prologue = _prologue(recomputed, sweep[:at], [*head, *rest], likes or {}, namer, node, loaded or {})
    return without_unused([*before, *head, *rest, *sweep[at + 1:]], keep), guard, prologue


# the helpers that read the program's ids themselves
READ_PROGRAM_IDS = {"program_index", *(name for name, helper in HELPERS.items() if "program_index" in helper.calls)}


def group_programs(body: list[ast.stmt]) -> bool:
    """An interchanged kernel's 2-D grid taken in groups (``tg.grouped_program_id``): its programs are
    independent (each stores the tiles it owns), so any order of them computes the same, and one whose programs
    running at once read the same rows and columns of tiles keeps them in L2 (a matmul's dA program (m, k) reads
    dC's row m and B's row k of tiles: in launch order the programs running at once need all of dC, and an H200
    read it from memory again for every few k, ncu: DRAM at 46% of its peak, compute at 63%). Rewrites every
    ``tl.program_id(0 | 1)`` in place; not where a helper reads the program's ids itself (``tg.program_index``:
    a tape's row) or a third axis is read. Whether it did."""
    calls = [n for n in ast.walk(ast.Module(body=body, type_ignores=[])) if isinstance(n, ast.Call)]
    ids = [c for c in calls if tl_call(c, "program_id")]
    axes = {c.args[0].value if c.args and isinstance(c.args[0], ast.Constant) else None for c in ids}
    if axes != {0, 1} or any(helper_of(c) is not None and c.func.attr in READ_PROGRAM_IDS for c in calls):
        return False

    class Grouped(ast.NodeTransformer):
        def visit_Call(self, node: ast.Call) -> ast.expr:
            self.generic_visit(node)
            if tl_call(node, "program_id"):
                return ast.copy_location(instantiate(f"tg.grouped_program_id({node.args[0].value})", {}), node)
            return node

    for stmt in body:
        Grouped().visit(stmt)
    return True


# reductions and reads of memory: worth computing once per forward program
COSTLY = frozenset({*(f"tl.{kind}" for kind in kinds(costly=True)),
                    *(f"tg.{name}" for name, helper in HELPERS.items() if helper.costly)})


def _prologue(recomputed: list[ast.stmt], before: list[ast.stmt], iteration: list[ast.stmt],
              likes: dict[str, tuple[ast.expr, tuple[str, ...]]], namer: Namer, loop: ast.For,
              loaded: dict[str, str]) -> tuple[list[ast.stmt], Prologue | None]:
    """The adjoints a forward program's work computes before the iteration and the iteration reads, where
    computing them takes a reduction or a kept state (a row sum, a division by the kept sum): a prologue
    computes them once per forward program; ``before`` reads them from its tape instead. One that the
    iteration only ever rounds to one type (attention's dO / l, cast to v's type for its two products) is kept
    in that type: the same values, half the bytes to read for each forward program."""
    read = set().union(set(), *[reads(s) for s in iteration])
    defined = Counter(t for s in recomputed + before for t in targets_of(s))
    found = []
    for s in before:
        name = target_of(s)
        if (isinstance(s, ast.Assign) and name in read and name in likes and defined[name] == 1
                and _costly(needed_by(recomputed + before, {name}))):
            found.append(name)
    if not found or getattr(loop, "tg", None) is None:  # (the loop's tag places the reading program's row)
        return before, None
    slots = namer.fresh("prologue_slots")
    params = {n: namer.fresh(f"{n}_kept") for n in found}
    likes = dict(likes)
    rounded = {}
    for n in found:
        rounded[n] = _rounded_to(n, recomputed + before + iteration, loaded)
        if rounded[n] is not None:
            likes[n] = (instantiate(f"tl.zeros(({''.join(f'{e}, ' for e in likes[n][1])}), {rounded[n]})", {}),
                        likes[n][1])
    tape = StateTape(slots, tuple((params[n], likes[n][1]) for n in found), None, None, tuple(found), final=True)
    rows = {n: namer.fresh(f"{n}_row") for n in found}

    def row(n: str, program: str) -> ast.Assign:
        return assign(rows[n], instantiate("tg.tape_row(tape, like, slots, program, like.dtype)", {
            "tape": name_node(params[n]), "like": likes[n][0], "slots": name_node(slots),
            "program": name_node(program)}))

    program = namer.fresh("program")
    computed = [copy.deepcopy(s) for s in needed_by(recomputed + before, set(found))]
    puts = [assign(program, instantiate("tg.program_index()", {}))]
    for n in found:
        puts.append(row(n, program))
        value = name_node(n) if rounded[n] is None else instantiate(f"x.to({rounded[n]})", {"x": name_node(n)})
        puts.append(ast.Expr(instantiate("tg.tape_put_exactly(row, x, like)", {
            "row": name_node(rows[n]), "x": value, "like": likes[n][0]})))
    reading = namer.fresh("program")
    index = assign(reading, instantiate("tg.program_index()", {}))
    index.tg = Tag(Op("program_index", []), loop.tg.origin, loop.tg.where)  # (the forward's program: persistent)
    out = []
    for s in before:
        name = target_of(s)
        if name in params:
            out += [index] if index not in out else []
            out.append(row(name, reading))
            out.append(assign(name, instantiate("tg.tape_get(row, 0, like)", {
                "row": name_node(rows[name]), "like": likes[name][0]})))
        else:
            out.append(s)
    return out, Prologue([*computed, *puts], tape, {n: t for n, t in rounded.items() if t is not None})


PASSING = ("tg.unbroadcast", "tg.cast_grad")  # an adjoint's value unchanged (a float type's; to its own shape)


def _rounded_to(name: str, body: list[ast.stmt], loaded: dict[str, str]) -> str | None:
    """The type every use of ``name`` in ``body`` casts it to (through assignments that pass it on unchanged),
    spelled so that any kernel of the backward can say it (``v_ptr.dtype.element_ty`` for ``v.dtype`` where
    ``v`` is loaded through ``v_ptr``); None where a use computes with it or the casts differ."""
    flat = list(statements(body))
    everything = list(ast.walk(ast.Module(body, [])))  # (tests and ranges of branches and loops too)
    defs = Counter(t for s in flat for t in targets_of(s))
    values = {target_of(s): s.value for s in flat if isinstance(s, ast.Assign) and target_of(s)}
    found: set[str] = set()
    names, seen = [name], set()
    while names:
        current = names.pop()
        seen.add(current)
        uses = [n for n in everything if isinstance(n, ast.Name) and n.id == current and isinstance(n.ctx, ast.Load)]
        casts = [c for c in everything if _is_cast_of(c, current)]
        passed = [s for s in flat if isinstance(s, ast.Assign) and (_is_name(s.value, current) or (  # a copy
                  isinstance(s.value, ast.Call) and ast.unparse(s.value.func) in PASSING and s.value.args
                  and _is_name(s.value.args[0], current) and not any(_is_name(a, current) for a in s.value.args[1:])))]
        if len(uses) != len(casts) + len(passed):
            return None
        for s in passed:
            if defs[target_of(s)] != 1 or target_of(s) in seen:
                return None
            names.append(target_of(s))
        found |= {_type_spelled(c.args[0], values, defs, loaded) for c in casts}
    return found.pop() if len(found) == 1 and None not in found else None


def _cast_type(node: ast.AST) -> ast.expr | None:
    """``T`` of ``x.to(T)``."""
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "to"
            and len(node.args) == 1 and not node.keywords):
        return node.args[0]
    return None


def _is_cast_of(node: ast.AST, name: str) -> bool:
    return _cast_type(node) is not None and _is_name(node.func.value, name)


def _is_name(node: ast.AST, name: str) -> bool:
    return isinstance(node, ast.Name) and node.id == name


def _type_spelled(dtype: ast.expr, values: dict[str, ast.expr], defs: Counter, loaded: dict[str, str]) -> str | None:
    """``dtype`` as an expression of the kernel's parameters: a type written out (``tl.bfloat16``), a name the
    body never assigns (a constexpr parameter), ``x.dtype`` of a loaded ``x`` (its pointer's element type) or of
    a value cast to a type (that type's); None otherwise."""
    if isinstance(dtype, ast.Name) and not defs[dtype.id]:
        return dtype.id
    if isinstance(dtype, ast.Attribute) and isinstance(dtype.value, ast.Name) and dtype.value.id == "tl":
        return ast.unparse(dtype)
    if not (isinstance(dtype, ast.Attribute) and dtype.attr == "dtype" and isinstance(dtype.value, ast.Name)):
        return None
    x = dtype.value.id
    if x in loaded and defs[x] == 1:
        return f"{loaded[x]}.dtype.element_ty"
    value = values.get(x)
    if defs[x] != 1 or not isinstance(value, ast.Call):
        return None
    if ast.unparse(value.func) == "tg.to_float" and len(value.args) == 2:
        return _type_spelled(value.args[1], values, defs, loaded)
    cast = _cast_type(value)
    return _type_spelled(cast, values, defs, loaded) if cast is not None else None


def _costly(stmts: list[ast.stmt]) -> bool:
    return any(ast.unparse(n.func) in COSTLY for s in stmts for n in ast.walk(s) if isinstance(n, ast.Call))




def read_by(s: ast.stmt) -> set[str]:
    """The names a statement reads: ``x += e`` reads ``x`` too."""
    return reads(s) | ({s.target.id} if isinstance(s, ast.AugAssign) else set())


def without_unused(body: list[ast.stmt], keep: set[str]) -> list[ast.stmt]:
    """``body`` without the assignments nothing else reads (the other carried values, their starting points);
    ``x += e`` reads ``x``: the two go together."""
    def unused(s: ast.stmt, readers: Counter) -> bool:  # read by nothing but itself (an update)
        names = targets_of(s)
        return bool(names) and names[0] not in keep and readers[names[0]] == isinstance(s, ast.AugAssign)

    while True:
        readers = Counter(n for s in body for n in read_by(s))
        kept = [s for s in body if not unused(s, readers)]
        if len(kept) == len(body):
            return kept
        body = kept


def _sums_into(node: ast.For, accumulator: str) -> bool:
    return any(isinstance(s, ast.AugAssign) and s.target.id == accumulator for s in statements(node.body))


def _has_effect(stmt: ast.stmt, comments: dict[str, str]) -> bool:
    """A statement that is not an assignment, a comment marker or a ``tl.static_assert`` (checked as the kernel
    compiles, however often it runs): a store, an atomic, a device assert."""
    return isinstance(stmt, ast.Expr) and not (isinstance(stmt.value, ast.Name) and stmt.value.id in comments) and not (
        hasattr(stmt, "tg") and op_of(stmt).kind == "static_assert")


def _read_before_written(body: list[ast.stmt], assigned: set[str]) -> set[str]:
    """Names of ``assigned`` some statement reads before the body assigns them: carried across iterations."""
    seen: set[str] = set()
    carried: set[str] = set()
    for s in statements(body):
        value = s.value if isinstance(s, (ast.Assign, ast.AugAssign, ast.Expr)) else s
        carried |= (reads(value) & assigned) - seen
        seen.update(targets_of(s))
    return carried


def fixed_step(stmt: ast.stmt, name: str) -> tuple[str, ast.expr] | None:
    """``name = name + inc`` (or ``inc + name``, ``name - inc``): the sign and ``inc``; else None."""
    v = stmt.value
    if isinstance(v, ast.BinOp) and isinstance(v.op, (ast.Add, ast.Sub)):
        if isinstance(v.left, ast.Name) and v.left.id == name and name not in reads(v.right):
            return ("+" if isinstance(v.op, ast.Add) else "-"), v.right
        if isinstance(v.op, ast.Add) and isinstance(v.right, ast.Name) and v.right.id == name \
                and name not in reads(v.left):
            return "+", v.left
    return None


def _step_of(stmt: ast.stmt, name: str) -> tuple[str, ast.expr]:
    step = fixed_step(stmt, name)
    if step is None:
        raise NotInterchangeable(f"`{name}` is carried from one iteration to the next other than by a fixed step")
    return step


def _invariant(body: list[ast.stmt], assigned: set[str]) -> set[str]:
    """Names the body assigns from values that do not change between iterations."""
    invariant: set[str] = set()
    for s in body:  # in order: a definition reads only what was defined before it
        t = target_of(s)
        if t is not None and isinstance(s, ast.Assign) and reads(s.value) & assigned <= invariant:
            invariant.add(t)
    return invariant


def _rename(stmt: ast.stmt, renamed: dict[str, str]) -> ast.stmt:
    """``stmt`` reading each carried value at the program's own iteration."""
    class Sub(ast.NodeTransformer):
        def visit_Name(self, n: ast.Name) -> ast.expr:
            if isinstance(n.ctx, ast.Load) and n.id in renamed:
                return ast.copy_location(ast.Name(renamed[n.id], ast.Load()), n)
            return n

    new = Sub().visit(copy.deepcopy(stmt))
    if hasattr(stmt, "tg"):
        new.tg = stmt.tg
    return new
