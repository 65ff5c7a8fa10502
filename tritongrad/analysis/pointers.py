"""Which names are pointers and which parameter each comes from (an address traced back through the operations'
``pointer_args``), which parameters are loaded, stored or hold indices, and which are updated in place (what each
load of those reads: in_place.py)."""

from __future__ import annotations

import ast
from dataclasses import dataclass

from ..core.ir import (
    Program,
    address_names,
    arguments,
    construct_origin,
    definitions,
    loops,
    names_in,
    op_of,
    reads,
    refuse,
    statements,
    target_of,
    value_args,
)
from ..core.operations import LOADS, operation_of


@dataclass
class Pointers:
    """Which names are pointers and which parameter each comes from; what is loaded and stored through them."""

    pointer_base: dict[str, str]  # pointer-valued name -> the parameter it comes from
    loads: dict[str, list[ast.stmt]]  # pointer parameter -> its load statements
    stores: dict[str, list[ast.stmt]]  # pointer parameter -> its store / atomic statements
    index_pointers: set[str]  # pointer parameters whose loaded values are used as indices

    # -- the parameters' roles: defined here once, for derivation (analyze.py) and for ops (host/kernel_roles.py)

    @property
    def overwrites(self) -> frozenset[str]:
        """Stored with something other than ``tl.atomic_add``."""
        return frozenset(p for p, ss in self.stores.items()
                         if any(operation_of(op_of(s)).memory != "accumulate" for s in ss))

    @property
    def in_place(self) -> frozenset[str]:
        """Updated in place: loaded, overwritten with ``tl.store`` only, not indices. Derivation accepts them
        where each load is followed by a store of its address and mask, or reads back what the kernel stored
        (in_place.py's ``in_place_pointers``: else it refuses)."""
        return frozenset(p for p in set(self.loads) & set(self.stores) if p not in self.index_pointers
                         and all(operation_of(op_of(s)).access == "store" for s in self.stores[p]))

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
    """The pointer facts of a kernel (all an op's launch record needs to know of its launches' roles)."""
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
            raise refuse(construct_origin(s), f"`{kind}` from the address `{ast.unparse(address)}`",
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
        raise refuse(construct_origin(stmt),
                     f"`{op_of(stmt).kind}` through a pointer that does not come from a parameter",
                     "pointers loaded from memory or built from integers cannot be given shadows")
    raise refuse(construct_origin(stmt), f"an address built from several parameters ({', '.join(options)})",
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

