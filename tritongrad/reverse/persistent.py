"""The persistent wrap: a backward body as a loop over the forward's programs along an axis, each program of the
backward summing the gradients of the inputs those programs share (a weight) in registers or in a partial row of its
own (writes/strategies.py chooses where; the rows are summed after the kernel), or, for a kernel of an input's own
(interchange.py), looping over all of them."""

from __future__ import annotations

import ast
import copy
from collections import Counter
from dataclasses import dataclass
from typing import Any

from ..core.ir import (
    Namer,
    Op,
    Tag,
    axis_of,
    is_none,
    is_structured,
    name_node,
    names_in,
    needed_by,
    program_axis,
    reads,
    statements,
    target_of,
    targets_of,
    tl_call,
)
from ..core.operations import instantiate, operation_of
from .interchange import NotInterchangeable


@dataclass(frozen=True)
class PartialSum:
    """An input accumulated in registers: ``accumulator += g`` per program, stored once after the loop."""

    accumulator: str
    shadow: str  # the shadow pointer tile of the load
    mask: ast.expr


def persistent(recomputed: list[ast.stmt], sweep: list[ast.stmt], axis: int, programs: str, rows: dict[str, str],
               sums: list[PartialSum], reassigned: set[str], params: set[str], namer: Namer,
               every: bool = False, guard: Any = None, stages: str | None = None,
               held: str | None = None) -> list[ast.stmt]:
    """The backward body as a loop over the forward's programs along ``axis``: this program takes every
    ``tl.num_programs(axis)``-th of the forward's ``programs`` (``every``: all of them, the programs along
    ``axis`` being a loop's iterations: interchange.py). ``rows``: shadow parameter -> the parameter holding
    its partial rows' stride (each program writes its own row). Values that do not depend on the program (a
    weight's addresses and values) are computed once, before the loop; with ``every``, the sweep's too (the
    addresses the sums are stored at, after the loop). ``guard`` (interchange.Guard): the forward program's work
    runs under it, but for what its trip count and the sums' addresses are computed from.
    ``stages`` (a constexpr parameter): the loop is ``tl.range(..., num_stages=stages)``, whose loads Triton
    pipelines (it pipelines a loop's loads that feed no ``tl.dot`` only when the loop asks): the next rows are
    read while this one is computed (on an H200, a bf16 RMSNorm backward ran 1.35x faster with 3 stages than 1).

    ``held`` (a constexpr parameter): the loads computed once (a weight's values, and what is computed from them)
    are so under ``if held:``, and loaded again for each row under ``if not held:`` (from cache), which tuning
    chooses: held in registers across the loop beside the partial sums, a 16384-wide row's weight made a layer
    norm backward spill (H200, bf16: 877 µs against 810 reloading it; benchmarks/layernorm_rows_probe.py), where
    at 4096 holding it was the faster. Not for a loop with products: their operands stay held."""
    dependent = depends_on_program(recomputed + sweep, axis)
    # every name the body binds, a loop's index and a static loop's `trips: tl.constexpr = ...` included: a statement
    # reading one is hoisted only after its definition is
    local = set(params) | {n.id for n in ast.walk(ast.Module(body=recomputed + sweep, type_ignores=[]))
                           if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    if every:  # a name is reassigned where it is assigned twice, also inside a branch (`d += ...` under an if)
        counts = Counter(t for s in statements(recomputed + sweep) for t in targets_of(s))
        reassigned = {n for n, c in counts.items() if c > 1}
    if held is not None and any(tl_call(n, "dot")
                                for n in ast.walk(ast.Module(body=recomputed + sweep, type_ignores=[]))):
        held = None  # a loop with products holds their operands, tiles of the kernel's blocks, as a hand-written
        # kernel does (and orient.py reads their single definitions)
    order = recomputed + (sweep if every else [])
    allowed = set(reassigned) if every else set()  # reassigned, but every assignment computed once before the loop
    while True:
        hoisted, kept, known, loaded, loaded_names = [], [], set(params), [], set()
        for s in order:
            t = target_of(s)
            if (t is not None and t not in dependent and (t not in reassigned or t in allowed)
                    and not is_structured(s) and reads(s.value) & local <= known):
                if held is not None and (_loads(s) or reads(s.value) & loaded_names):
                    loaded.append(s)
                    loaded_names.add(t)
                else:
                    hoisted.append(s)
                known.add(t)
            else:
                kept.append(s)
        unsound = {n for n in allowed if not _hoisted_whole(n, order, hoisted)}
        if not unsound:
            break
        allowed -= unsound
    if every:
        sweep = [s for s in kept if s in sweep]
        kept = [s for s in kept if s not in sweep]
        late = {n for s in sums for n in (s.shadow, *names_in(s.mask))} - known
        if late:  # stored after the loop, but computed in it (from a name the body assigns twice)
            raise NotInterchangeable(f"the address its sums are stored at (`{sorted(late)[0]}`) changes from "
                                     "one of the forward's programs to another")
    starts = [s for s in kept if program_axis(s) == axis]
    if len(starts) == 1 and not _used_as_tensor(starts[0].targets[0].id, kept + sweep):
        loop_var = starts[0].targets[0].id  # `row = tl.program_id(0)`: the loop runs over `row`, as by hand
        kept.remove(starts[0])
    else:
        loop_var = namer.fresh(f"pid_{axis}")
    _rewrite_program_queries(hoisted + loaded + kept + sweep, axis, loop_var, programs)  # hoisted: num_programs
    prologue = [ast.parse(f"{shadow} = {shadow} + tl.program_id({axis}).to(tl.int64) * {stride}").body[0]
                for shadow, stride in rows.items()]
    prologue += hoisted
    if loaded:  # held across the loop, or loaded for each row (tuning picks)
        prologue.append(ast.If(test=name_node(held), body=loaded, orelse=[]))
        kept.insert(0, ast.If(test=ast.UnaryOp(ast.Not(), name_node(held)), body=copy.deepcopy(loaded), orelse=[]))
    prologue += [ast.Assign(targets=[ast.Name(s.accumulator, ast.Store())], value=instantiate(
        "tg.zeros_to_sum(d)", {"d": name_node(s.shadow)})) for s in sums]
    bounds = f"0, {programs}" if every else f"tl.program_id({axis}), {programs}, tl.num_programs({axis})"
    span = f"range({bounds})" if stages is None else f"tl.range({bounds}, num_stages={stages})"
    body = kept + sweep
    if guard is not None:
        before = needed_by(body, reads(guard.count) | {n for s in sums for n in (s.shadow, *names_in(s.mask))})
        body = [*before, guard.count, ast.If(test=guard.test, body=[s for s in body if s not in before] or [ast.Pass()],
                                             orelse=[])]
    loop = ast.For(target=ast.Name(loop_var, ast.Store()), iter=ast.parse(span, mode="eval").body,
                   body=body or [ast.Pass()], orelse=[])
    epilogue = [ast.Expr(ast.Call(ast.parse("tl.store", mode="eval").body,
                                  [name_node(s.shadow), name_node(s.accumulator)],
                                  [] if is_none(s.mask) else [ast.keyword("mask", s.mask)])) for s in sums]
    return [*prologue, loop, *epilogue]


def _hoisted_whole(name: str, order: list[ast.stmt], hoisted: list[ast.stmt]) -> bool:
    """Whether every assignment of a reassigned ``name`` is in ``hoisted`` and nothing left in the loop reads it
    before the last of them (it would read the last value where it read an earlier one): an attention's key
    offset, set before the loop and advanced past it in closed form, read by the loop after both."""
    ids = {id(s) for s in hoisted}
    writes = [i for i, s in enumerate(order) if any(name == t for t in _assigned(s))]
    if not writes or any(id(order[i]) not in ids for i in writes):
        return False
    return not any(id(s) not in ids and name in reads(s) for s in order[:writes[-1]])


def _assigned(stmt: ast.stmt) -> list[str]:
    return [t for s in statements([stmt]) for t in targets_of(s)]


def _loads(stmt: ast.stmt) -> bool:
    return any(tl_call(node, "load") for node in ast.walk(stmt))


def depends_on_program(body: list[ast.stmt], axis: int) -> set[str]:
    """Names whose values depend on the program id along ``axis`` (or an unknown axis), or that are
    assigned inside a loop or branch (not computed once before the persistent loop)."""
    found: set[str] = set()
    flat = list(statements(body))
    for s in flat:
        if program_axis(s) in (axis, -1):
            found.add(target_of(s))
    for node in body:
        if is_structured(node):
            found |= {target_of(s) for s in statements([node]) if target_of(s)}
    changed = True
    while changed:
        changed = False
        for s in flat:
            t = target_of(s)
            if t is not None and t not in found and reads(s.value) & found:
                found.add(t)
                changed = True
    return found


def _rewrite_program_queries(body: list[ast.stmt], axis: int, loop_var: str, programs: str) -> None:
    """``tl.program_id(axis)`` is now the loop's variable; ``tl.num_programs(axis)`` the forward's count."""
    for s in statements(body):
        tag = getattr(s, "tg", None)
        if tag is None or not isinstance(s, ast.Assign):
            continue
        if tag.op.kind == "program_index":  # the forward's program's place in its grid (a tape's row)
            s.value = instantiate(f"tg.program_index({axis}, i, n)", {"i": name_node(loop_var),
                                                                     "n": name_node(programs)})
        elif program_axis(s) == axis:  # a tensor, as tl.program_id's is (the interpreter's loop gives an int)
            s.value = instantiate("tl.cast(i, tl.int32)", {"i": name_node(loop_var)})
            s.tg = Tag(Op("cast", [name_node(loop_var), s.value.args[1]]), tag.origin, tag.where)
        elif operation_of(tag.op).coordinate == "programs" and axis_of(tag.op) == axis:
            s.value = name_node(programs)
            s.tg = Tag(_copy_op(programs), tag.origin, tag.where)


def _used_as_tensor(name: str, body: list[ast.stmt]) -> bool:
    """Whether a method or attribute of ``name`` is used (``row.to(tl.int64)``)."""
    return any(isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == name
               for s in body for n in ast.walk(s))


def _copy_op(name: str) -> Op:
    return Op("copy", [name_node(name)])
