"""Online softmax: a running max that only stabilizes, replaced by its final value.

Flash attention and an online log-sum-exp keep a running max ``m`` over a loop and rescale their sums by
``alpha = exp(m - m_new)`` whenever it grows::

    m_new = tl.maximum(m, tl.max(s, 1))
    alpha = tl.exp(m - m_new)
    l = l * alpha + tl.sum(tl.exp(s - m_new[:, None]), 1)
    acc = acc * alpha[:, None] + tl.dot(p, v)
    m = m_new

As written, every carried value is nonlinear (loops.py): the backward needs each iteration's state. But the max
only stabilizes: had the loop used the final max ``M`` from the start, each ``alpha`` would be 1 and ``l``, ``acc``
plain sums, each ``exp(M - m_j)`` times the value the loop holds at iteration ``j`` (by induction, from zero; they
agree after the last iteration, where ``m_j = M``). So the kernel is rewritten before it is analysed:

    m_max = m                                       # a pass computing the max alone (its statements renamed)
    for ...: ...; m_max = tl.maximum(m_max, tl.max(s, 1))
    M = tg.stop_gradient(m_max)
    for ...: m_new = M; ...; l = l + ...; acc = acc + ...   # the rescalings gone: linear accumulators
    ... M after the loop where m was read ...

Its value is the forward's; its gradient is the forward's where nothing the kernel stores depends on ``M``: the
perturbation analysis of stabilizers.py (``M`` moved, ``l`` and ``acc`` scaling with ``exp(-M)`` through the loop)
proves it, and the loop is left as written (a state tape) where it cannot. The backward is then the hand-written
one: the final max and sum, and one linear reverse loop (with finals kept by the forward: augment.py).

Matched: a loop not nested in another, whose carried ``m`` is updated by ``maximum(m, x)`` with ``x`` computed
from values that do not depend on the loop's nonlinear state, ``m``'s old value read only there and in
``exp(m - m_new)`` (or ``exp2``), each such factor (or its broadcast) only multiplying a carried value. A sum that
does not start at zero (the tutorial's ``l_i = 1``; a second stage starting from the first's sums) starts from
``s0 * exp(m0 - M)``, what the forward's rescalings make of it, kept as it is where ``M`` is -inf (no value was
seen: the forward never rescaled it). A loop refused is tried again after another is rewritten: a causal
attention's first stage is proven once its second no longer rescales by the first's max. A cast on the rescaled
path to a type the source does not spell is compiled with a check that it is a float type (``tg.to_float``): a
rescaling commutes with float casts only.
"""

from __future__ import annotations

import ast
import copy
import math
import operator
from dataclasses import replace

from ..core.ir import (
    Carried,
    Namer,
    Op,
    Program,
    arguments,
    assign,
    child_blocks,
    is_structured,
    name_node,
    op_of,
    reads,
    statements,
    tagged,
    target_of,
    targets_of,
    value_args,
)
from ..core.operations import operation_of
from .stabilizers import GUARD, INVARIANT, ZERO, Changes, Scale, _is_zeros, follow

VISIT = "online_visit"  # the attribute numbering the loops online_softmax has looked at
NOTE = ("online softmax: the running max {m} only stabilizes (nothing stored depends on it), so a pass of\n"
        "its own computes its final value first, and {sums} {verb} summed with that, without rescaling")


def online_maxima(program: Program) -> set[int]:
    """The running maxima ``online_softmax`` proves only stabilize, found on a copy of ``program``: the tags (by id)
    of the statements in their loops that assign each one (its update, and the carried copy). Forward mode, which
    runs the loops as written, gives them no tangent: by induction each carried sum the loop rescales is the sum
    rescaled to the last max, whichever maxima it was rescaled through, and the proof shows the outputs do not
    depend on that last one."""
    found: set[int] = set()
    online_softmax(replace(program, body=copy.deepcopy(program.body), names=set(program.names),
                           temporaries=set(program.temporaries)), found)
    return found


def online_softmax(program: Program, maxima: set[int] | None = None) -> Program:
    """``program`` with each online-softmax loop rewritten as above (the same object, changed in place); ``maxima``:
    where given, the ids of the tags of each rewritten loop's statements assigning its running max
    (``online_maxima``)."""
    namer = Namer(set(program.names) | {n.id for n in ast.walk(ast.Module(program.body, [])) if isinstance(
        n, ast.Name)} | set(program.param_names()))
    visits = 0
    while (loop := next((s for _, s in _top_loops(program.body) if not hasattr(s, VISIT)), None)) is not None:
        visits += 1
        setattr(loop, VISIT, visits)  # copies keep it: a loop is visited once, and found again in a trial copy
        found = _match(loop)
        if found is None:
            continue
        m, alphas, rescaled, base = found
        assigning = {id(s.tg) for s in statements(loop.body) if target_of(s) in (m.name, target_of(_max_update(
            m, loop.body)))}
        trial = copy.deepcopy(program.body)  # statements' tags are shared; only their ASTs are new
        copied = _find(trial, visits)
        if copied is None:  # (a copy keeps the mark: not expected) the loop stays as written: a state tape
            continue
        renamed = _rewrite(trial, *copied, m, alphas, rescaled, base, namer)
        if renamed is not None:
            if maxima is not None:
                maxima |= assigning
            program.body[:] = trial
            program.names |= namer.taken
            program.temporaries |= {new for old, new in renamed.items() if old in program.temporaries}
            for _, other in _top_loops(program.body):  # a loop refused before may be proven now (the next
                if hasattr(other, VISIT):              # stage of a causal attention, rewritten first)
                    delattr(other, VISIT)
    for _, loop in _top_loops(program.body):  # unmarked: a copy of this body may be rewritten again
        if hasattr(loop, VISIT):
            delattr(loop, VISIT)
    return program


def _top_loops(body: list[ast.stmt]):
    """(block, loop) for each loop not inside another loop."""
    for s in body:
        if isinstance(s, ast.For):
            yield body, s
        elif isinstance(s, ast.If):
            for block in child_blocks(s):
                yield from _top_loops(block)


def _find(body: list[ast.stmt], visit: int) -> tuple[list[ast.stmt], ast.For] | None:
    """The loop of this visit in ``body`` (a copy of the body the loop was visited in), and its block. (Not by
    its tag: a rewrite renaming what a later loop reads gives that loop a new tag.)"""
    return next(((block, loop) for block, loop in _top_loops(body) if getattr(loop, VISIT, None) == visit), None)


def _match(loop: ast.For):
    """(the carried max, the names of its rescaling factors, the carried values they rescale, the base of their
    ``exp``), or None. That those values start at zero is left to the proof (``follow`` lets only such a sum
    scale through its loop)."""
    body = loop.body
    top = {target_of(s): s for s in body if target_of(s) is not None}
    users: dict[str, list[ast.stmt]] = {}
    for s in statements(body):
        for n in value_args(s):
            users.setdefault(n, []).append(s)
    carried = {c.name: c for c in loop.tg.carried}
    for c in loop.tg.carried:
        update = _max_update(c, body)
        if update is None:
            continue
        m_new = target_of(update)
        alphas: set[str] = set()
        factors: dict[str, str] = {}  # a rescaled carried value -> the statement multiplying it
        exps: set[str] = set()  # the exponentials' bases
        ok = True
        for s in users.get(c.name, []):
            if s is update:
                continue
            b = op_of(s)
            if not (operation_of(b).on_host is operator.sub and _atom_names(b.args) == [c.name, m_new]
                    and target_of(s) in top):
                ok = False
                break
            for e in users.get(target_of(s), []):
                base = operation_of(op_of(e)).exponential
                if base is None or target_of(e) not in top:
                    ok = False
                    break
                exps.add(base)
                alphas |= _factor_family(target_of(e), users, top)
        if not ok or not alphas:
            continue
        for a in (t for t in top if t in alphas):  # in body order, not the set's: it orders the starts emitted
            for s in users.get(a, []):
                if target_of(s) in alphas:
                    continue
                args = _atom_names(op_of(s).args)
                others = [n for n in args if n not in alphas]
                if (operation_of(op_of(s)).on_host is not operator.mul or len(others) != 1 or others[0] not in carried
                        or others[0] in factors or target_of(s) not in top):
                    ok = False
                    break
                factors[others[0]] = target_of(s)
        if not ok or c.name in factors or not factors or len(exps) != 1:
            continue
        if any(c.name in reads(s) for s in body if is_structured(s)):
            continue  # read in a branch or an inner loop
        return c, alphas, factors, math.e if exps == {"e"} else 2.0
    return None


def _max_update(c: Carried, body: list[ast.stmt]) -> ast.stmt | None:
    """The statement ``m_new = tl.maximum(m, x)`` that ``c`` (``m``) is set to at the end of the body."""
    last = next((s for s in reversed(body) if target_of(s) == c.name), None)
    if last is None or op_of(last).kind != "copy" or not isinstance(op_of(last).args[0], ast.Name):
        return None
    source = op_of(last).args[0].id
    s = next((s for s in body if target_of(s) == source), None)
    if s is None or op_of(s).kind != "maximum":
        return None
    args = _atom_names(op_of(s).args)
    return s if len(args) == 2 and args.count(c.name) == 1 else None


def _factor_family(alpha: str, users: dict[str, list[ast.stmt]], top: dict[str, ast.stmt]) -> set[str]:
    """``alpha`` and its broadcasts (``alpha[:, None]``)."""
    family, work = {alpha}, [alpha]
    while work:
        for s in users.get(work.pop(), []):
            t = target_of(s)
            if operation_of(op_of(s)).reshapes and t in top and t not in family:
                family.add(t)
                work.append(t)
    return family


def _atom_names(atoms: list[ast.expr]) -> list[str]:
    return [a.id for a in atoms if isinstance(a, ast.Name)] if all(isinstance(a, ast.Name) for a in atoms) else []


def _rewrite(trial: list[ast.stmt], block: list[ast.stmt], loop: ast.For, m: Carried, alphas: set[str],
             rescaled: dict[str, str], base: float, namer: Namer) -> dict[str, str] | None:
    """Rewrite the loop in ``block`` of ``trial`` (a copy of the program's body): the names the max pass gave
    the statements it copies, or None where the result is not proven to have the forward's gradient."""
    body = list(loop.body)  # (the loop's own list is rewritten below)
    update = _max_update(m, body)
    m_new = target_of(update)
    carried = {c.name: c for c in loop.tg.carried}
    # the max pass: the statements the new maximum needs, the carried values among them carried again
    needed, order = _slice(body, update, m.name, carried)
    if needed is None or needed & set(rescaled):
        return None
    renamed = {n: namer.fresh(f"{n}_max") for n in sorted(needed | {loop.target.id})}  # (not a set's order)
    renamed[m.name] = namer.fresh(f"{m.source or m.name}_max")
    pre_body = [_copy(s, renamed) for s in order]
    last = _copy(update, renamed)
    last.targets[0].id = renamed[m.name]  # the carried max itself, as the frontend writes an update
    pre_body.append(last)
    pre_carried = [Carried(renamed[c], name_node(renamed[c]), name_node(renamed[c]), carried[c].source)
                   for c in carried if c in needed | {m.name}]
    inits = [tagged(ast.Assign([name_node(renamed[c], ast.Store())], copy.deepcopy(carried[c].init)),
                     Op("copy", [copy.deepcopy(carried[c].init)]), loop) for c in carried if c in needed | {m.name}]
    pre = ast.For(target=name_node(renamed[loop.target.id], ast.Store()), iter=copy.deepcopy(loop.iter),
                  body=pre_body, orelse=[])
    pre.tg = replace(loop.tg, carried=pre_carried)
    ast.copy_location(pre, loop)
    final = namer.fresh(f"{m.source or m.name}_final")
    stop = tagged(ast.Assign([name_node(final, ast.Store())], ast.Call(
        ast.Attribute(name_node("tg"), "stop_gradient", ast.Load()), [name_node(renamed[m.name])], [])),
        Op("stop_gradient", [name_node(renamed[m.name])]), loop)
    # the loop itself: m_new is the final max, the rescalings are gone, m is no longer carried
    new_body = []
    for s in body:
        t = target_of(s)
        if s is update:
            s = tagged(ast.Assign([name_node(m_new, ast.Store())], name_node(final)), Op("copy", [name_node(final)]),
                        s)
        elif t in alphas or (t is not None and operation_of(op_of(s)).on_host is operator.sub
                             and m.name in value_args(s)):
            continue  # m - m_new, its exp and broadcasts
        elif t in rescaled.values():
            x = next(n for n in value_args(s) if n not in alphas)
            s = tagged(ast.Assign([name_node(t, ast.Store())], name_node(x)), Op("copy", [name_node(x)]), s)
        elif t == m.name:
            continue  # m = m_new
        new_body.append(s)
    loop.body[:] = _dead_code_removed(new_body, loop, block)
    sums = [c.source for c in loop.tg.carried if c.name in rescaled]
    note = NOTE.format(m=m.source, sums=", ".join(sums), verb="is" if len(sums) == 1 else "are")
    loop.tg = replace(loop.tg, carried=[c for c in loop.tg.carried if c.name != m.name], note=note)
    scaled = _scaled_starts(trial, block, body, loop, m, m_new, alphas, rescaled, final, namer)
    if scaled is None:
        return None
    starts = scaled
    at = block.index(loop)
    block[at:at] = [*inits, pre, stop, *starts]
    _read_instead(block, block.index(loop) + 1, m.name, final)
    guarded = _guard_casts(trial, final)
    try:
        kinds = follow(trial, final, guarded)
    except Changes:
        return None
    # value for value the forward's (by induction) only where exactly the rescaled sums scale, as exp(-M) does
    for c in loop.tg.carried:
        moved = kinds.get(c.name, INVARIANT)
        if (moved != Scale(base, -1.0)) if c.name in rescaled else moved not in (INVARIANT, ZERO):
            return None
    return None if any(m.name in reads(s) for s in loop.body) else renamed


def _scaled_starts(trial: list[ast.stmt], block: list[ast.stmt], body: list[ast.stmt], loop: ast.For, m: Carried,
                   m_new: str, alphas: set[str], rescaled: dict[str, str], final: str, namer: Namer):
    """Statements scaling each rescaled sum's start ``s0`` to the final max, ``s0 * exp(m0 - M)`` (the loop no
    longer rescales it: a first stage's sum, or the tutorial's ``l_i = 1``), guarded: where
    ``M`` is -inf (no iteration saw a finite value), ``m0`` is too and the start is kept, as the forward keeps
    it (the guard is marked for follow). A start of zeros is left as it is. The sum's one definition before the
    loop (in ``block``) is renamed: the scaled start takes its name. None where it has another."""
    zeros = {target_of(s) for s in statements(trial) if _is_zeros(s)}
    carried = {c.name: c for c in loop.tg.carried}
    scaled = [c for c in rescaled if not (isinstance(carried[c].init, ast.Name) and carried[c].init.id in zeros)]
    if not scaled:
        return []
    before = block[:block.index(loop)]
    for c in scaled:
        defs = [i for i, s in enumerate(before) if _defines(s, c)]
        if len(defs) != 1 or is_structured(before[defs[0]]) or any(c in reads(s) for s in before[defs[0] + 1:]):
            return None
    start = namer.fresh(f"{m.source or m.name}_start")
    out = [tagged(assign(start, copy.deepcopy(m.init)), Op("copy", [copy.deepcopy(m.init)]), loop)]
    renamed = {m.name: start, m_new: final}
    factors = [s for s in body if target_of(s) in alphas or (
        target_of(s) is not None and operation_of(op_of(s)).on_host is operator.sub and m.name in value_args(s))]
    renamed |= {target_of(s): namer.fresh(f"{target_of(s)}_start") for s in factors}
    for s in factors:  # m0 - M, its exp (guarded) and broadcasts, as the loop computed them from m and m_new
        new = _copy(s, renamed)
        if operation_of(op_of(s)).exponential:
            raw, picked = namer.fresh(f"{target_of(s)}_raw"), new.targets[0].id
            new.targets[0].id = raw
            empty = namer.fresh(f"{final}_empty")
            inf = ast.parse("float('-inf')", mode="eval").body
            out += [new, tagged(assign(empty, ast.Compare(name_node(final), [ast.Eq()], [copy.deepcopy(inf)])),
                                Op("eq", [name_node(final), inf]), loop)]
            new = tagged(assign(picked, ast.parse(f"tl.where({empty}, 1.0, {raw})", mode="eval").body),
                         Op("where", [name_node(empty), ast.Constant(1.0), name_node(raw)]), loop)
            setattr(new, GUARD, True)
        out.append(new)
    for c in scaled:  # s0 * factor, the factor broadcast as the loop's rescaling statement has it
        factor = next(n for n in value_args(next(s for s in body if target_of(s) == rescaled[c])) if n in alphas)
        unscaled = namer.fresh(f"{carried[c].source or c}_unscaled")
        next(s for s in before if c in targets_of(s)).targets[0].id = unscaled
        start = tagged(assign(c, ast.BinOp(name_node(unscaled), ast.Mult(), name_node(renamed[factor]))),
                       Op("mul", [name_node(unscaled), name_node(renamed[factor])]), loop)
        out.append(start)
        carried[c] = replace(carried[c], init=name_node(c))  # (assigned just before the loop)
    loop.tg = replace(loop.tg, carried=list(carried.values()))
    return out


def _defines(stmt: ast.stmt, name: str) -> bool:
    """Whether the statement assigns ``name`` (an ``if`` merging it, a loop carrying it included)."""
    if isinstance(stmt, ast.If):
        return name in stmt.tg.merges
    if isinstance(stmt, ast.For):
        return name in {c.name for c in stmt.tg.carried}
    return name in targets_of(stmt)


def _slice(body: list[ast.stmt], update: ast.stmt, m: str, carried: dict[str, Carried]):
    """The names the update's operand needs from the body, and the statements computing them, in order (an
    ``if`` assigning one of them whole); (None, None) where one of them writes memory or is an inner loop."""
    home: dict[str, ast.stmt] = {}  # name -> the top-level statement assigning it
    for s in body:
        for inner in statements([s]) if is_structured(s) else [s]:
            if target_of(inner) is not None:
                home.setdefault(target_of(inner), s)
    needed: set[str] = set()
    taken: list[ast.stmt] = []
    work = [n for n in value_args(update) if n != m]
    while work:
        n = work.pop()
        if n in needed or n == m:
            continue
        if n in carried:  # a carried value the max needs (an index or pointer advanced each iteration)
            needed.add(n)
            for s in body:
                if target_of(s) == n:
                    work += value_args(s)
            continue
        s = home.get(n)
        if s is None or s is update:
            continue  # from before the loop
        if isinstance(s, ast.For) or any(_writes(i) for i in (statements([s]) if is_structured(s) else [s])):
            return None, None
        if is_structured(s):
            if s not in taken:
                taken.append(s)
                needed |= {target_of(i) for i in statements([s])} - {None}
                work += list(reads(s.test)) + [a for i in statements([s]) for a in value_args(i)]
            continue
        needed.add(n)
        work += value_args(s)
    order = [s for s in body if s is not update and (s in taken or (not is_structured(s) and target_of(s) in needed))]
    return needed, order


def _writes(stmt: ast.stmt) -> bool:
    """Whether a flat statement writes memory (a store or an atomic)."""
    return operation_of(op_of(stmt)).memory not in (None, "load")


def _copy(stmt: ast.stmt, renamed: dict[str, str]) -> ast.stmt:
    """A copy of a statement (an ``if`` or ``for`` with its blocks) with names renamed, its operation copied too
    (an operation's atoms are its statement's own nodes, as the frontend makes them)."""
    op = stmt.tg.op
    if is_structured(stmt):
        header, args, kwargs = copy.deepcopy((stmt.test if isinstance(stmt, ast.If) else stmt.iter, op.args,
                                              op.kwargs))
        for node in [header, *args, *kwargs.values()]:
            _rename_in(node, renamed)
        tag = replace(stmt.tg, op=Op(op.kind, args, kwargs, op.func))
        if isinstance(stmt, ast.If):
            new = ast.If(test=header, body=[_copy(s, renamed) for s in stmt.body],
                         orelse=[_copy(s, renamed) for s in stmt.orelse])
            tag.merges = [renamed.get(m, m) for m in stmt.tg.merges]
        else:
            new = ast.For(target=copy.deepcopy(stmt.target), iter=header, body=[_copy(s, renamed) for s in stmt.body],
                          orelse=[])
            tag.carried = [replace(c, init=_renamed_atom(c.init, renamed), next=_renamed_atom(c.next, renamed))
                           for c in stmt.tg.carried]
        new.tg = tag
        return ast.copy_location(new, stmt)
    new, args, kwargs = copy.deepcopy((stmt, op.args, op.kwargs))  # one memo: the atoms stay the statement's
    for node in [new, *args, *kwargs.values()]:
        _rename_in(node, renamed)
    new.tg = replace(stmt.tg, op=Op(op.kind, args, kwargs, op.func))
    return new


def _renamed_atom(atom: ast.expr, renamed: dict[str, str]) -> ast.expr:
    atom = copy.deepcopy(atom)
    _rename_in(atom, renamed)
    return atom


def _rename_in(node: ast.AST, renamed: dict[str, str]) -> None:
    for n in ast.walk(node):
        if isinstance(n, ast.Name) and n.id in renamed:
            n.id = renamed[n.id]


def _read_instead(block: list[ast.stmt], start: int, old: str, new: str) -> None:
    """Statements of ``block`` from ``start`` on that read ``old`` replaced by copies reading ``new`` (operations
    are shared with the program being rewritten: they are copied, not changed)."""
    for i, s in enumerate(block[start:], start):
        if old in reads(s):  # (an operation's atoms are its statement's nodes, or copies of them)
            block[i] = _copy(s, {old: new})


def _dead_code_removed(body: list[ast.stmt], loop: ast.For, block: list[ast.stmt]) -> list[ast.stmt]:
    """The body without the pure statements nothing reads any more (the max the pass before computes)."""
    outside = set().union(*(reads(s) for s in block if s is not loop)) | {c.name for c in loop.tg.carried}
    while True:
        used = outside | set().union(*(reads(s) for s in body), set())
        keep = [s for s in body if is_structured(s) or target_of(s) is None or target_of(s) in used or _writes(s)]
        if len(keep) == len(body):
            return body
        body = keep


def _guard_casts(body: list[ast.stmt], final: str) -> set[int]:
    """Casts on the path of the final max to a type the source does not spell (a constexpr, ``x.dtype``):
    compiled through ``tg.to_float`` (which refuses another type at compile time). Their ids, for the
    perturbation analysis (which refuses a cast to a type spelled and not a float type)."""
    moved = {final}
    guarded = set()
    for s in statements(body):
        t = target_of(s)
        if t is None or not set(value_args(s)) & moved:
            continue
        moved.add(t)
        op = op_of(s)
        if operation_of(op).converts:
            b = arguments(s)
            if not ast.unparse(b["dtype"]).startswith("tl.") and _plain(b):  # tl.int32: left to the analysis
                s.value = ast.Call(ast.Attribute(name_node("tg"), "to_float", ast.Load()),
                                   [copy.deepcopy(b["input"]), copy.deepcopy(b["dtype"])], [])
                ast.fix_missing_locations(s)
                guarded.add(id(s))
    return guarded


def _plain(cast: dict[str, ast.expr]) -> bool:
    """Whether a cast's other arguments are their defaults (``tg.to_float`` passes none on): no rounding mode,
    no bitcast. Another cast of rescaled values is left to the perturbation analysis, which refuses it."""
    return all(isinstance(cast[k], ast.Constant) and cast[k].value in (None, False)
               for k in ("fp_downcast_rounding", "bitcast"))
