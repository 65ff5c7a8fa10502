"""What a kernel's stores through some of its pointers are computed from: the parameters their values, addresses and
masks, and the conditions and bounds of the branches and loops around them, are computed from (through memory too:
a load reads what a store of its pointer may have written). Over-approximate: a name assigned anywhere is followed
through every assignment of it. host/remake.py asks it before running a launch again with a stand-in for a tensor
the op did not keep: only what the needed stores are not computed from may be a stand-in."""

from __future__ import annotations

import ast
from collections.abc import Iterable

from ..core.ir import Program, arguments, child_blocks, definitions, header, is_structured, op_of, reads
from ..core.operations import operation_of
from .pointers import pointers


def stored_from(program: Program, sinks: Iterable[str]) -> frozenset[str]:
    """The parameters that what the kernel stores (or adds atomically) through the pointer parameters ``sinks`` is
    computed from."""
    found = pointers(program)
    defs = definitions(program.body)
    around: dict[int, frozenset[str]] = {}  # statement -> the names of the headers of the branches and loops around it
    _enclose(program.body, frozenset(), around)
    names: set[str] = set()
    work: list[ast.stmt] = [s for p in sinks for s in found.stores.get(p, [])]
    seen: set[int] = set()
    while work:
        s = work.pop()
        if id(s) in seen:
            continue
        seen.add(id(s))
        new = (reads(s.iter) if isinstance(s, ast.For) else reads(s)) | around.get(id(s), frozenset())
        if not isinstance(s, ast.For) and operation_of(op_of(s)).memory not in (None, "store"):
            # a load, or an atomic (it returns the old value): what stores of its pointer wrote may be read
            address = arguments(s)["pointer"]
            base = found.pointer_base.get(address.id) if isinstance(address, ast.Name) else None
            work += found.stores.get(base, []) if base is not None else [t for ts in found.stores.values() for t in ts]
        for n in new - names:
            names.add(n)
            work += defs.get(n, [])
    return frozenset(names) & frozenset(program.param_names())


def _enclose(body: list[ast.stmt], outer: frozenset[str], around: dict[int, frozenset[str]]) -> None:
    for s in body:
        around[id(s)] = outer
        if is_structured(s):
            inner = outer | frozenset(n for e in header(s) for n in reads(e))
            for block in child_blocks(s):
                _enclose(block, inner, around)
