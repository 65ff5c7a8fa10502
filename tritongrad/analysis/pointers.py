"""Which names are pointers and which parameter each comes from (an address traced back through the operations'
``pointer_args``), which parameters are loaded, stored or hold indices, and which are updated in place."""

from __future__ import annotations

import ast
from dataclasses import dataclass

from ..core.ir import (
    Program,
    address_names,
    arguments,
    block_positions,
    canonical_atom,
    definitions,
    loops,
    names_in,
    op_of,
    reads,
    refuse,
    statements,
    target_of,
    value_args,
    where,
)
from ..core.operations import LOADS, operation_of


@dataclass
class Pointers:
    """Which names are pointers and which parameter each comes from; what is loaded and stored through them."""

    pointer_base: dict[str, str]  # pointer-valued name -> the parameter it comes from
    loads: dict[str, list[ast.stmt]]  # pointer parameter -> its load statements
    stores: dict[str, list[ast.stmt]]  # pointer parameter -> its store / atomic statements
    index_pointers: set[str]  # pointer parameters whose loaded values are used as indices

    # -- the parameters' roles: defined here once, for derivation (analyze.py) and for ops (ops/kernel_roles.py)

    @property
    def overwrites(self) -> frozenset[str]:
        """Stored with something other than ``tl.atomic_add``."""
        return frozenset(p for p, ss in self.stores.items()
                         if any(operation_of(op_of(s)).memory != "accumulate" for s in ss))

    @property
    def in_place(self) -> frozenset[str]:
        """Updated in place: loaded, overwritten with ``tl.store`` only, not indices. Derivation accepts them
        where each load is followed by a store of its address and mask (``in_place_pointers``: else it refuses)."""
        return frozenset(p for p in set(self.loads) & set(self.stores) if p not in self.index_pointers
                         and all(op_of(s).kind == "store" for s in self.stores[p]))

    @property
    def inputs(self) -> frozenset[str]:
        """What may have a gradient: loaded and never stored unless updated in place (index pointers included: a
        float tensor passed there has one, ``x[argmax(x)]``)."""
        return frozenset(set(self.loads) - set(self.stores)) | self.in_place

    @property
    def default_wrt(self) -> frozenset[str]:
        """What derivation differentiates unless told: the inputs that are not indices (it sees no dtypes)."""
        return self.inputs - self.index_pointers


def pointers(program: Program) -> Pointers:
    """The pointer facts of a kernel (all the tape needs to know of its launches' roles)."""
    params = program.param_names()
    body = list(statements(program.body))
    defs = definitions(program.body)

    # -- pointers -------------------------------------------------------------------------
    candidates: dict[str, set[str]] = {p: {p} for p in params}
    scalar_use: set[str] = set()  # parameters used other than additively: not pointers
    for s in body:
        op = op_of(s)
        pointer_args = _pointer_positions(s)
        for i, a in enumerate([*op.args, *op.kwargs.values()]):
            for n in names_in(a):
                if n in params and i not in pointer_args:
                    scalar_use.add(n)
    changed = True
    while changed:  # a fixpoint: loop-carried pointers feed their own definitions
        changed = False
        for s in body:
            t = target_of(s)
            if t is not None and t not in params:
                new = set().union(*[candidates.get(n, set()) for n in _pointer_operands(s)])
                if not new <= candidates.get(t, set()):
                    candidates[t] = candidates.get(t, set()) | new
                    changed = True

    pointer_base: dict[str, str] = {}
    loads: dict[str, list[ast.stmt]] = {}
    stores: dict[str, list[ast.stmt]] = {}

    def mark_chain(name: str, base: str) -> None:
        if pointer_base.get(name) == base:
            return
        pointer_base[name] = base
        for d in defs.get(name, []):
            if target_of(d) is None:
                continue
            for n in _pointer_operands(d):
                if base in candidates.get(n, set()):
                    mark_chain(n, base)

    for s in body:
        kind = op_of(s).kind
        if operation_of(op_of(s)).memory is None:
            continue
        address = arguments(s)["pointer"]
        if not isinstance(address, ast.Name):
            raise refuse(where(s), f"`{kind}` from the address `{ast.unparse(address)}`",
                         "load and store through pointer arguments")
        base = _choose_base(address.id, candidates, scalar_use, s)
        mark_chain(address.id, base)
        (loads if kind in LOADS else stores).setdefault(base, []).append(s)

    feeds_address = _feeds_addresses(body, defs, loops(program.body))
    index_pointers = {pointer_base[arguments(s)["pointer"].id] for s in body
                      if op_of(s).kind in LOADS and target_of(s) in feeds_address}
    return Pointers(pointer_base, loads, stores, index_pointers)


def _pointer_positions(stmt: ast.stmt) -> set[int]:
    """Argument positions through which a pointer may flow without making it a scalar use."""
    operation = operation_of(op_of(stmt))
    return {0} if operation.memory is not None else set(operation.pointer_args)


def _pointer_operands(stmt: ast.stmt) -> list[str]:
    op = op_of(stmt)
    if operation_of(op).memory is not None:
        return []
    return [n for i in _pointer_positions(stmt) if i < len(op.args) for n in names_in(op.args[i])]


def _choose_base(address: str, candidates: dict[str, set[str]], scalar_use: set[str], stmt: ast.stmt) -> str:
    options = sorted(candidates.get(address, set()) - scalar_use) or sorted(candidates.get(address, set()))
    if len(options) > 1:
        named = [p for p in options if "ptr" in p.lower()]
        if len(named) == 1:
            options = named
    if len(options) == 1:
        return options[0]
    if not options:
        raise refuse(where(stmt), f"`{op_of(stmt).kind}` through a pointer that does not come from a parameter",
                     "pointers loaded from memory or built from integers cannot be given shadows")
    raise refuse(where(stmt), f"an address built from several parameters ({', '.join(options)})",
                 "name the pointer parameter with `ptr` in it (`x_ptr`) so it can be told from offsets")


def _feeds_addresses(body: list[ast.stmt], defs: dict[str, ast.stmt], loops: list[ast.For] = ()) -> set[str]:
    """Names whose values flow into an address, a mask or a loop's range: integers, not gradients."""
    seen: set[str] = set()
    work = [n for f in loops for n in reads(f.iter)]
    for s in body:
        if operation_of(op_of(s)).memory is not None:
            work += address_names(s) + names_in(arguments(s).get("mask", ast.Constant(None)))
    while work:
        n = work.pop()
        if n in seen:
            continue
        seen.add(n)
        for d in defs.get(n, []):
            work += value_args(d)
    return seen


def in_place_pointers(program: Program, found: Pointers) -> frozenset[str]:
    """The pointer parameters a kernel updates in place (``found.in_place``), each checked; any other pointer both
    loaded and stored refused.

    Accepted: each load of the pointer is followed, in the same block, by a ``tl.store`` to the same
    address under the same mask. The stores write distinct elements (checked as for any output: lanes,
    programs, iterations, and several stores apart), so every element a lane reads is written by that
    later store alone, and read by no other lane: the loads see the values the kernel was given, the
    stores set new ones. The derived kernel reads the new values' gradient at each store and sets it to
    zero there, and the loads' adjoints add the old values' gradient to the same memory (memory.py).
    """
    loads, stores, index_pointers = found.loads, found.stores, found.index_pointers
    place = block_positions(program.body)
    defs = definitions(program.body)
    for name in sorted(set(loads) & set(stores)):
        for s in loads[name]:
            if name in index_pointers:
                raise refuse(where(s), f"a load of indices from `{name}`, which the kernel also stores to",
                             "read indices and write results through different pointers")
            kinds = {op_of(t).kind for t in stores[name]}
            if kinds != {"store"}:
                raise refuse(where(s), f"a load from `{name}`, which the kernel also updates with "
                             f"{', '.join(sorted(kinds - {'store'}))}", "update a tensor in place with tl.store only")
            block, i = place[id(s)]
            address, mask = canonical_atom(arguments(s)["pointer"], defs), canonical_atom(arguments(s)["mask"], defs)
            later = [t for t in stores[name] if place[id(t)][0] is block and place[id(t)][1] > i]
            if not any((canonical_atom(arguments(t)["pointer"], defs), canonical_atom(arguments(t)["mask"], defs))
                       == (address, mask) for t in later):
                before = sorted(where(t).line for t in stores[name]
                                if where(t).line < where(s).line and place[id(t)][0] is not block)
                if before:  # it reads back what an earlier loop overwrote (a chunked add + norm's second loop)
                    raise refuse(where(s), f"a load from `{name}` after the store to it on line {before[-1]}: it "
                                 f"reads back values the kernel wrote over `{name}`'s own, and its backward would "
                                 "need both the values it was given and the ones it stored",
                                 "read back in the same loop, right after the store (the same address and mask), or "
                                 "keep the values in registers between the loops, or store them to another tensor "
                                 f"and copy that into `{name}` after the kernel")
                raise refuse(where(s), f"a load from `{name}`, which the kernel also stores to, where no store "
                             "of the same address and mask follows it in the same block",
                             "update in place only what each lane loads (load, compute, then store to the same "
                             "address with the same mask), read back only what the same lane stored before (the "
                             "same address and mask, in the same block), or write to another tensor")
    assert found.in_place == set(loads) & set(stores)  # (the rest refused above)
    return found.in_place
