"""What a call in a derived kernel does, for the passes that move, drop or transpose statements
(codegen/early_loads.py, codegen/orient.py, reverse/recompute.py): whether it is pure (reads at most memory, writes
none, orders nothing), which arguments it reads for their shape only, and so which names it reads for their values.
``tl`` functions are read off the table of operations, ``tg`` helpers off language.HELPERS; a call neither knows
(a user's function) is taken as impure and reading every argument's value: the safe default."""

from __future__ import annotations

import ast

from .language import HELPERS
from .operations import OPERATIONS

PURE_METHODS = frozenset({"to", "reshape", "trans", "broadcast_to", "expand_dims", "permute", "view"})
ORDERING = frozenset({"debug_barrier", "device_print", "device_assert", "print"})  # order or show: never moved


def _named(call: ast.Call) -> tuple[str, str] | None:
    """``("tl", "load")`` for ``tl.load(...)``, ``("tg", "unbroadcast")``, ``("", "to")`` for a method, else None."""
    f = call.func
    if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id in ("tl", "tg"):
        return f.value.id, f.attr
    if isinstance(f, ast.Attribute):
        return "", f.attr
    return None


def pure(call: ast.Call) -> bool:
    """Whether the call writes no memory and orders nothing (it may read memory: a load)."""
    named = _named(call)
    if named is None:
        return False
    module, name = named
    if module == "tl":
        op = OPERATIONS.get(name)
        return name not in ORDERING and not name.startswith("atomic_") and (op is None or not op.stores)
    if module == "tg":
        return name in HELPERS and not HELPERS[name].writes
    return name in PURE_METHODS


def shape_only(call: ast.Call) -> tuple[int, ...]:
    """The positions of the arguments the call reads for their shape and type only."""
    named = _named(call)
    if named is None:
        return ()
    module, name = named
    if module == "tg":
        return HELPERS[name].shape_only if name in HELPERS else ()
    if module == "tl":
        op = OPERATIONS.get(name)
        return op.shape_only if op is not None else ()
    return ()


def value_reads(e: ast.AST) -> set[str]:
    """The names ``e`` reads for their values: not those it reads only for a shape or a type (an argument a call
    reads for its shape, ``x.shape``, ``x.dtype``)."""
    if isinstance(e, ast.Attribute) and e.attr in ("dtype", "shape"):
        return set()
    if isinstance(e, ast.Name):
        return {e.id} if isinstance(e.ctx, ast.Load) else set()
    if isinstance(e, ast.Call):
        shaped = set(shape_only(e))
        found = value_reads(e.func)
        for i, a in enumerate(e.args):
            if i not in shaped:
                found |= value_reads(a)
        for k in e.keywords:
            found |= value_reads(k.value)
        return found
    return set().union(*(value_reads(child) for child in ast.iter_child_nodes(e)))
