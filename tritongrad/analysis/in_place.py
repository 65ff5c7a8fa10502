"""Pointers a kernel updates in place, and what each of their loads reads: the values the kernel was given, or what
it stored over them earlier (a reload).

An update: a load followed, in its block, by a ``tl.store`` to the same address under the same mask (a rotary
embedding applied in place; a fused add + norm writing the sum into x). The stores write distinct elements (checked
as for any output: lanes, programs, iterations, and several stores apart, analysis/stores.py), so every element a
lane reads is written by that later store alone, and read by no other lane: the load sees the value the kernel was
given, the store sets a new one. The derived kernel reads the new values' gradient at each store and sets it to zero
there, and the loads' adjoints add the old values' gradient to the same memory (reverse/memory.py).

A reload: the chunked add + norm for rows longer than one block. A first loop loads x and r, stores s = x + r over
x and sums s * s; a second loop, over the same range, loads s back from x and stores the norm. A load that no store
of its address follows is accepted where it reads, in each lane, what this program's store wrote there earlier:

- the store and the load are each directly in the body of a loop (or of loops nested alike), the outermost two in
  one block, the store's first, their ranges alike and the load's address and mask the store's, written out
  through their definitions with the load's loop indices read as the store's (``canonical_atom``): the store ran in
  that lane and iteration before the load;
- what those read that the kernel assigns are the indices of these loops or of loops around both (the same at the
  store and at the load), or pure values of them (alike as text, alike in value): a name assigned more than once
  (carried, merged) may have changed in between, an atomic's result or a load from memory the kernel stores to
  differ from one evaluation to the next;
- no store to the pointer follows it in the kernel (refused as "changed again", though the stores' check would make
  such a store write elsewhere).

Each element a reload reads was then written once, by that store: it holds at the launch's end what the reload read.
The backward's recomputation loads it from the tensor as the launch left it, a parameter of its own (``as_left_param``:
the pointer parameter itself is bound to the values before the launch), and the reload's adjoint adds into the pointer's
shadow, where the store's adjoint, reversed after it, reads it (reverse/memory.py). Same-block reloads never reach
here: frontend/forwarding.py reads them as the stored value.

A load in the other branch of an ``if`` from every store to its pointer (an early return's) reads the value the
kernel was given (``_Reads.apart``). Where every load of a pointer is such (``InPlace.unchanged``), no store of the
launch changes an element they read: the backward may read the tensor as the launch left it (``read_unchanged``).
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..core.errors import NotDifferentiableError
from ..core.ir import (
    Program,
    arguments,
    canonical_atom,
    child_blocks,
    computed_from,
    construct_origin,
    definitions,
    expanded,
    is_structured,
    op_of,
    range_bounds,
    refuse,
    statements,
    target_of,
)
from ..core.operations import operation_of
from .pointers import Pointers


@dataclass(frozen=True)
class InPlace:
    """The pointers a kernel updates in place, its reloads, and the parameter each reloaded pointer's values after
    the launch take in the backward."""

    pointers: frozenset[str] = frozenset()
    reloads: dict[str, str] = field(default_factory=dict)  # a reload's result -> the pointer it reads back
    as_left: dict[str, str] = field(default_factory=dict)  # a reloaded pointer -> as_left_param(it)
    updates: dict[int, tuple[str, ...]] = field(default_factory=dict)  # id(a store) -> the results of the loads
    # whose elements it overwrites (same address and mask, after them in their block)
    unchanged: frozenset[str] = frozenset()  # pointers every load of which is in the other branch of an if from
    # every store to it (``_Reads.apart``): what they read, no store of the launch changes (``read_unchanged``)


def as_left_param(param: str, params: Sequence[str]) -> str:
    """The backward's parameter for ``param``'s values as the forward launch left them: ``<param>_stored``
    (underscores added while a parameter of the forward has that name)."""
    name = f"{param}_stored"
    while name in params:
        name += "_"
    return name


def in_place_pointers(program: Program, found: Pointers) -> InPlace:
    """The pointer parameters a kernel updates in place (``found.in_place``), each load of them checked to be an
    update or a reload (see the module's docstring), and the reloads; any other pointer both loaded and stored
    refused."""
    if not set(found.loads) & set(found.stores):
        return InPlace()
    reads = _Reads(program, found)
    reloads, updates, changed = {}, {}, set()
    for name in sorted(set(found.loads) & set(found.stores)):
        for s in found.loads[name]:
            if reads.reading(name, s) is not None:
                reloads[target_of(s)] = name
                changed.add(name)
            else:
                for store in reads.own(name, s):
                    updates[id(store)] = (*updates.get(id(store), ()), target_of(s))
                    changed.add(name)
    assert found.in_place == set(found.loads) & set(found.stores)  # (the rest refused above)
    params = program.param_names()
    as_left = {p: as_left_param(p, params) for p in sorted(set(reloads.values()))}
    used = {n.id for n in ast.walk(ast.Module(program.body, [])) if isinstance(n, ast.Name)}
    for load in (s for s in statements(program.body) if target_of(s) in reloads):
        if as_left[reloads[target_of(load)]] in used:
            raise refuse(construct_origin(load),
                         f"a load reading back what the kernel stored over `{reloads[target_of(load)]}`, in a kernel"
                         f" that names a value `{as_left[reloads[target_of(load)]]}`",
                         "rename that value: its backward takes the tensor as the launch left it under that name")
    return InPlace(found.in_place, reloads, as_left, updates, frozenset(found.in_place - changed))


def read_unchanged(program: Program, found: Pointers) -> frozenset[str]:
    """The pointers a kernel updates in place whose loads all read elements no store of the launch writes: each
    load in the other branch of an ``if`` from every store to its pointer, at one of those stores' addresses or at
    its row plus a loaded index (``_Reads.apart``: Liger's cross-entropy zeroes an ignored row's logits and
    returns, the other rows read theirs). A program that loads never stores, and the stores write distinct
    elements, so at every element a load reads, the tensor as the launch left it holds the values the kernel was
    given: the backward may read it in place of a copy taken before the launch (host/launch_record.py takes none). Empty
    where a load is refused: the op's planning says why."""
    try:
        return in_place_pointers(program, found).unchanged
    except NotDifferentiableError:
        return frozenset()


def reloaded(program: Program, found: Pointers) -> frozenset[str]:
    """The pointers updated in place some load of which may read back what the kernel stored: one after a store to
    the pointer, that no store of its address follows in its block. What ``in_place_pointers`` accepts as reloads
    in any specialization of ``program`` (a constexpr ``if`` decided only drops statements or merges a branch into
    its block), or refuses: an op binds ``as_left_param`` for them, and passes it where the derived kernel takes it."""
    if not found.in_place:
        return frozenset()
    reads = _Reads(program, found)
    return frozenset(name for name in found.in_place for s in found.loads[name]
                     if not reads.own(name, s) and reads.earlier(name, s))


class _Reads:
    """What the loads of a kernel's loaded and stored pointers read."""

    def __init__(self, program: Program, found: Pointers):
        self.found = found
        self.defs = definitions(program.body)
        self.order = {id(s): i for i, s in enumerate(statements(program.body))}
        self.around: dict[int, list[ast.stmt]] = {}  # id(statement) -> the structured nodes around it, outermost first
        self.place: dict[int, tuple[int, int]] = {}  # id(statement, flat or not) -> (id(its block), its index there)
        self._index(program.body, [])

    def _index(self, block: list[ast.stmt], around: list[ast.stmt]) -> None:
        for i, s in enumerate(block):
            self.place[id(s)], self.around[id(s)] = (id(block), i), around
            if is_structured(s):
                for b in child_blocks(s):
                    self._index(b, [*around, s])

    def key(self, stmt: ast.stmt, renames: dict[str, str] | None = None) -> tuple[str, str]:
        b = arguments(stmt)
        return canonical_atom(b["pointer"], self.defs, renames), canonical_atom(b["mask"], self.defs, renames)

    def reading(self, name: str, load: ast.stmt) -> ast.stmt | None:
        """None where a store of ``load``'s address and mask follows it in its block (it reads the value the kernel
        was given); else the store whose value it reads back. Refused where neither holds."""
        stores = self.found.stores[name]
        if name in self.found.index_pointers:
            raise refuse(construct_origin(load), f"a load of indices from `{name}`, which the kernel also stores to",
                         "read indices and write results through different pointers")
        kinds = {op_of(t).kind for t in stores}
        if kinds != {"store"}:
            raise refuse(construct_origin(load), f"a load from `{name}`, which the kernel also updates with "
                         f"{', '.join(sorted(kinds - {'store'}))}", "update a tensor in place with tl.store only")
        own, earlier = self.own(name, load), self.earlier(name, load)
        why = {id(t): self.reads_back(t, load) for t in earlier}
        back = [t for t in earlier if why[id(t)] is None]
        if own:
            if back:  # (the stores' check refuses two stores of one element too; this says why, first)
                raise refuse(construct_origin(load), f"a load from `{name}` that reads back what the store on line "
                             f"{construct_origin(back[-1]).line} wrote, then stored over again on line "
                             f"{construct_origin(own[0]).line}",
                             f"store to `{name}` once, with its final values; keep the values between in registers "
                             "or in another tensor")
            return None
        if not earlier:
            if self.apart(name, load):
                return None
            later = [t for t in stores if self.order[id(t)] > self.order[id(load)] and not self.exclusive(t, load)
                     and self.place[id(t)][0] != self.place[id(load)][0]]
            if later:
                raise refuse(construct_origin(load), f"a load from `{name}` whose values the store on line "
                             f"{construct_origin(later[0]).line} overwrites later, in another pass (not an update of "
                             "what each lane loaded: a store of the same address and mask after the load, in its "
                             "block)",
                             "update in place only what each lane loads (load, compute, then store to the same "
                             "address with the same mask in one block); a kernel that writes its own gradient "
                             "over its input (a cross-entropy's HAS_GRADIENTS) is differentiated launched "
                             "loss-only: the derived backward computes that gradient")
            raise refuse(construct_origin(load), f"a load from `{name}`, which the kernel also stores to, where no "
                         "store of the same address and mask follows it in the same block",
                         "update in place only what each lane loads (load, compute, then store to the same "
                         "address with the same mask), read back only what the same lane stored before (the "
                         "same address and mask), or write to another tensor")
        if not back:
            last = earlier[-1]
            raise refuse(construct_origin(load), f"a load from `{name}` after the store to it on line "
                         f"{construct_origin(last).line}, which may read what no store of this lane and program wrote "
                         f"({why[id(last)]}): its backward "
                         f"would need values of `{name}` the launch leaves nowhere",
                         "read back only what the same lane stored: the same address and mask, right after the "
                         "store in its block or in a loop over the same range as the store's; or keep the values in "
                         f"registers, or store them to another tensor and copy that into `{name}` after the kernel")
        later = [t for t in stores if self.order[id(t)] > self.order[id(load)]]
        if later:
            raise refuse(construct_origin(later[0]), f"a store to `{name}` after the load on line "
                         f"{construct_origin(load).line} that reads back what line {construct_origin(back[-1]).line} "
                         f"stored: `{name}` changes again after it is read back, and the backward reads it back from "
                         "the tensor as the launch leaves it",
                         f"store to `{name}` last, after its values are read back; or store the later values to "
                         "another tensor")
        return back[-1]

    def own(self, name: str, load: ast.stmt) -> list[ast.stmt]:
        """The stores of ``load``'s address and mask that follow it in its block."""
        block, i = self.place[id(load)]
        return [t for t in self.found.stores[name] if self.place[id(t)][0] == block and self.place[id(t)][1] > i
                and self.key(t) == self.key(load)]

    def earlier(self, name: str, load: ast.stmt) -> list[ast.stmt]:
        """The stores to ``name`` that may run before ``load``: before it in program order, not in the other branch
        of an ``if`` (an early return's: ``if y == ignore: store zeros; return`` then loads)."""
        return [t for t in self.found.stores[name] if self.order[id(t)] < self.order[id(load)]
                and not self.exclusive(t, load)]

    def exclusive(self, a: ast.stmt, b: ast.stmt) -> bool:
        """Whether ``a`` and ``b`` lie in the two branches of one ``if`` (no program runs both: a Triton ``if``
        tests a scalar)."""
        outer, inner = self.around[id(a)], self.around[id(b)]
        common = 0
        while common < min(len(outer), len(inner)) and outer[common] is inner[common]:
            common += 1
        if common == 0 or not isinstance(outer[common - 1], ast.If):
            return False
        below_a = outer[common] if common < len(outer) else a
        below_b = inner[common] if common < len(inner) else b
        return self.place[id(below_a)][0] != self.place[id(below_b)][0]

    def apart(self, name: str, load: ast.stmt) -> bool:
        """Whether ``load`` reads the value the kernel was given, though no store of its address follows it: every
        store to ``name`` is in the other branch of an ``if`` than the load (this program runs none of them), and
        the load's address and mask are one of those stores' (in loops nested alike over one range, as for a
        reload), so no other program or lane stores the element it reads either: the stores write distinct
        elements (analysis/stores.py). Liger's cross-entropy zeroes an ignored row's logits and returns; the other
        rows read theirs."""
        stores = self.found.stores[name]
        if not all(self.exclusive(t, load) for t in stores):
            return False
        return any(self.reads_back(t, load, across=True) is None or self.indexed(t, load) for t in stores)

    def indexed(self, store: ast.stmt, load: ast.stmt) -> bool:
        """Whether ``load`` reads one element of what ``store`` would write in this program, at an index: its address
        is the store's own pointer (a name both add to, assigned once: the program's row) plus a scalar loaded from
        a tensor the kernel does not store (a cross-entropy's target logit, ``X_ptr + y``). The index is data: the
        element is the program's own where the index lies within what the store would write (a target within the
        row: what a cross-entropy's loss means), which the launch does not check."""
        parts = []
        for stmt in (store, load):
            ptr = arguments(stmt)["pointer"]
            found = self.defs.get(ptr.id, []) if isinstance(ptr, ast.Name) else []
            if len(found) != 1 or isinstance(found[0], ast.For) or (
                    operation_of(op_of(found[0])).on_host is not operator.add):
                return False
            parts.append([a.id for a in op_of(found[0]).args if isinstance(a, ast.Name)])
        shared = [a for a in parts[0] if a in parts[1] and len(self.defs.get(a, [])) <= 1]
        if len(shared) != 1 or len(parts[1]) != 2 or parts[1][0] == parts[1][1]:
            return False
        index = parts[1][1 - parts[1].index(shared[0])]
        loads = [d for n in computed_from([index], self.defs) for d in self.defs.get(n, ())
                 if not isinstance(d, ast.For)]
        kinds = {op_of(d).kind for d in loads}
        return "load" in kinds and "arange" not in kinds and all(
            self.found.pointer_base.get(arguments(d)["pointer"].id) not in self.found.stores
            for d in loads if operation_of(op_of(d)).access == "load")

    def reads_back(self, store: ast.stmt, load: ast.stmt, across: bool = False) -> str | None:
        """Why ``load`` may read in some lane what ``store`` did not write there before it in this program (None: it
        reads exactly what the store wrote, in each lane). ``across``: the two in the two branches of an ``if``
        (``apart``): whether the load reads the element the store would have written."""
        outer, inner = self.around[id(store)], self.around[id(load)]
        common = 0
        while common < min(len(outer), len(inner)) and outer[common] is inner[common]:
            common += 1
        mine, theirs = outer[common:], inner[common:]
        if not mine and not theirs and not across:  # one block: frontend/forwarding.py took it, were they alike
            return "its address or mask is not the store's"
        if len(mine) != len(theirs) or not all(isinstance(n, ast.For) for n in (*mine, *theirs)) or (
                not mine and not across):
            return "the store and the load are not each directly in loops nested alike, in one block"
        if mine and not across and self.place[id(mine[0])][0] != self.place[id(theirs[0])][0]:
            return "the store's loop and the load's are not in one block"
        renames = {}
        for a, b in zip(mine, theirs, strict=True):
            renames[b.target.id] = a.target.id
            if [self.bound(x, {}) for x in range_bounds(a)] != [self.bound(x, renames) for x in range_bounds(b)]:
                return "the store's loop and the load's do not run over the same range"
        if self.key(store) != self.key(load, renames):
            return "its address or mask is not the store's"
        indices = {n.target.id for n in (*outer, *inner) if isinstance(n, ast.For)}
        for stmt, nodes in ((store, outer), (load, inner)):
            ranges = [x for n in nodes if isinstance(n, ast.For) for x in range_bounds(n)]
            atoms = [a for a in (arguments(stmt)["pointer"], arguments(stmt)["mask"], *ranges)
                     if isinstance(a, ast.Name)]
            for atom in atoms:
                for n in ast.walk(expanded(atom, self.defs)):
                    if isinstance(n, ast.Name) and n.id in self.defs and (n.id not in indices
                                                                          or len(self.defs[n.id]) != 1):
                        return f"it reads `{n.id}`, assigned more than once, which may change in between"
            for n in computed_from([a.id for a in atoms], self.defs):  # alike as text, alike in value: pure
                for d in self.defs.get(n, ()):
                    if isinstance(d, ast.For):
                        continue
                    operation = operation_of(op_of(d))
                    if op_of(d).kind == "call" or (operation.memory is not None and (operation.access != "load" or (
                            self.found.pointer_base.get(
                                arguments(d)["pointer"].id) in self.found.stores))):
                        return f"it reads `{n}`, which two evaluations may give different values"
        return None

    def bound(self, atom: ast.expr, renames: dict[str, str]) -> str:
        return canonical_atom(atom, self.defs, renames) if isinstance(atom, ast.Name) else ast.dump(atom)
