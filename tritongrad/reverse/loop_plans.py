"""Which reversal strategy each ``for`` loop gets, and why (see loops.py's docstring): its carried variables
recomputed, linear accumulators or nonlinear state, and the stores that must follow its index."""

from __future__ import annotations

import ast
import operator
from dataclasses import dataclass, field

from ..analysis.analyze import Analysis
from ..analysis.forms import LoopIndex, moves_with
from ..core.ir import (
    address_names,
    arguments,
    construct_origin,
    header,
    loops,
    op_of,
    reads,
    refuse,
    statements,
    structured,
    target_of,
    value_args,
)
from ..core.operations import operation_of


@dataclass
class LoopPlan:
    node: ast.For
    accumulators: dict[str, set[str]] = field(default_factory=dict)  # carried name -> its chain of partial sums
    recomputed: list[str] = field(default_factory=list)  # carried names re-run in the reverse loop
    nonlinear: list[str] = field(default_factory=list)  # carried names whose adjoint changes every iteration
    why: str = ""  # what makes the first of them nonlinear
    comment: str = ""


class NotLinear(Exception):
    def __init__(self, stmt: ast.stmt | None, why: str):
        super().__init__(why)
        self.stmt, self.why = stmt, why


def classify_loops(a: Analysis) -> dict[int, LoopPlan]:
    """Each loop's plan, by ``id`` of its ``for`` node."""
    plans: dict[int, LoopPlan] = {}
    for node in reversed(loops(a.program.body)):  # inner loops first: an outer chain may run through them
        plans[id(node)] = _classify(a, node, plans)
    return plans


def _classify(a: Analysis, node: ast.For, plans: dict[int, LoopPlan]) -> LoopPlan:
    plan = LoopPlan(node)
    _check_stores_follow_the_loop(a, node)
    active = [c for c in node.tg.carried if c.name in a.active]
    state = _depends_on(node, {c.name for c in active})
    for c in node.tg.carried:
        if c.name not in a.active:
            plan.recomputed.append(c.name)
            continue
        try:
            plan.accumulators[c.name] = _linear_chain(a, node, c, state, plans)
        except NotLinear as e:
            plan.nonlinear.append(c.name)
            if not plan.why:
                culprit = f" in `{construct_origin(e.stmt).text}`" if e.stmt is not None else ""
                plan.why = f"{c.source}: {e.why}{culprit}"
    plan.comment = _comment(node, plan)
    return plan


def _check_stores_follow_the_loop(a: Analysis, node: ast.For) -> None:
    """A store to an output inside the loop must move with the iterations: one that writes the same
    addresses twice keeps only the last value, and the gradient belongs to that value alone. The
    address must be an affine form (addresses.py) in the loop index, or in carried state advanced by a fixed
    amount each iteration; lanes.py has checked that its stride keeps iterations apart."""
    roots = {node.target.id, *(c.name for c in node.tg.carried)}
    coordinate = LoopIndex(node.target.id)
    for s in statements(node.body):
        if operation_of(op_of(s)).memory != "store":
            continue
        if a.pointer_base.get(arguments(s)["pointer"].id) not in a.outputs:
            continue
        addresses = address_names(s)
        if not any(moves_with(a.forms[n], coordinate) for n in addresses if n in a.forms):
            what = ("at addresses that may repeat between iterations"
                    if any(n in _depends_on(node, roots) for n in addresses)
                    else "to the same addresses in every iteration")
            raise refuse(construct_origin(s), f"a tl.store inside the loop over `{node.target.id}` {what} "
                         "(only the last value stays)",
                         "store after the loop, or offset the address by the loop index times a stride")


def _depends_on(node: ast.For, roots: set[str], through: set[str] | None = None) -> set[str]:
    """Names in the loop whose values depend on ``roots`` (through the operations ``through``, or any
    operation and the tests of branches)."""
    found = set(roots)
    changed = True
    while changed:
        changed = False
        for s in statements(node.body):
            t = target_of(s)
            if t is None or t in found or (through is not None and op_of(s).kind not in through):
                continue
            if any(n in found for n in value_args(s)):
                found.add(t)
                changed = True
        for inner in structured(node.body):  # values assigned under a test that depends on them
            if through is None and isinstance(inner, ast.If) and reads(inner.test) & found:
                for s in statements([inner]):
                    t = target_of(s)
                    if t is not None and t not in found:
                        found.add(t)
                        changed = True
    return found


def _linear_chain(a: Analysis, node: ast.For, c, state: set[str], plans: dict[int, LoopPlan]) -> set[str]:
    """The names holding ``c`` plus partial sums, if ``c`` is a linear accumulator; else NotLinear."""
    chain = {c.name}

    def walk(block: list[ast.stmt]) -> None:
        for s in block:
            for e in header(s):
                if reads(e) & chain:
                    raise NotLinear(s, "a branch or loop bound reads it")
            if isinstance(s, ast.For):
                inner = plans[id(s)]
                for ic in s.tg.carried:  # an inner loop adds to it: fine if linear there too
                    if ic.name in chain:
                        if ic.name not in inner.accumulators:
                            raise NotLinear(s, "an inner loop carries it nonlinearly")
                        chain.update(inner.accumulators[ic.name])
                walk(s.body)
            elif isinstance(s, ast.If):
                walk(s.body)
                walk(s.orelse)
                for m in s.tg.merges:  # both branches must hand on a partial sum, or neither
                    defs = a.defs[m]
                    sums = [any(n in chain for n in value_args(d)) for d in defs]
                    if any(sums) and not all(sums):
                        raise NotLinear(defs[0], "one branch of an `if` replaces it")
            else:
                step(s)

    def step(s: ast.stmt) -> None:
        used = [n for n in value_args(s) if n in chain]
        kind, t = op_of(s).kind, target_of(s)
        if not used:
            if t in chain:  # `acc = f(i)`: the carried value is replaced, not added to
                raise NotLinear(s, "it is overwritten")
            return
        operation = operation_of(op_of(s))
        added = kind in ("copy", "add") or (operation.on_host is operator.sub and _is(arguments(s)["a"], chain)) or (
            kind == "dot" and _is(arguments(s)["acc"], chain)) or (
            operation.converts and operation.adjoints["input"](arguments(s)) == "g")  # to a float type
        if t is None or len(used) > 1 or not added:
            raise NotLinear(s, "it is used other than by adding to it")
        if any(x in state for x in value_args(s) if x not in chain):
            raise NotLinear(s, "what is added to it reads a loop-carried value")
        chain.add(t)

    walk(node.body)
    if not _is(c.next, chain):
        raise NotLinear(None, "its next value is not itself plus something")
    return chain


def _is(atom: ast.expr | None, names: set[str]) -> bool:
    return isinstance(atom, ast.Name) and atom.id in names


def _comment(node: ast.For, plan: LoopPlan) -> str:
    note = f"{node.tg.note}.\n" if node.tg.note else ""
    return note + _strategy(node, plan)


def _strategy(node: ast.For, plan: LoopPlan) -> str:
    index = node.target.id
    parts = []
    if plan.accumulators:
        names = ", ".join(c.source for c in node.tg.carried if c.name in plan.accumulators)
        verb, adjoint = ("is", "its adjoint is") if len(plan.accumulators) == 1 else ("are", "their adjoints are")
        parts.append(f"{names} {verb} accumulated linearly, so {adjoint} the same in every iteration")
    if plan.recomputed:
        names = ", ".join(c.source for c in node.tg.carried if c.name in plan.recomputed)
        parts.append(f"{names} {'is' if len(plan.recomputed) == 1 else 'are'} updated as in the forward")
    if not parts and not plan.nonlinear:
        parts.append("no state is carried between iterations")
    if plan.nonlinear:
        names = ", ".join(c.source for c in node.tg.carried if c.name in plan.nonlinear)
        parts.insert(0, f"{names} {'is' if len(plan.nonlinear) == 1 else 'are'} carried nonlinearly ({plan.why})")
        return f"loop over {index}: {'; '.join(parts)}."
    return (f"loop over {index}: {'; '.join(parts)}.\n"
            "The reverse loop runs the same iterations, each recomputed before its adjoints.")
