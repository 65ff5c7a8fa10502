"""Memory bounds in Triton's interpreter: every address a kernel loads, stores or adds at atomically (its
masked-on lanes) must lie inside a tensor the launch was given.

The interpreter runs on CPU memory through raw pointers: an address past a tensor reads or writes the
process's heap, which shows up (if at all) as a glibc abort far from its cause, or as a gradient taken
from memory that belongs to another tensor. Under :func:`checked` such an access raises at once, naming
the addresses and the tensors' ranges (the fuzzer runs every kernel so).
"""

from __future__ import annotations

import contextlib

import numpy as np


class OutOfBounds(RuntimeError):
    pass


_ranges: list[list[tuple[int, int]]] = []  # per running launch: its tensors' storages, [start, end) bytes


def _storages(arg, found: list[tuple[int, int]]) -> None:
    if isinstance(arg, (tuple, list)):
        for a in arg:
            _storages(a, found)
    elif hasattr(arg, "untyped_storage"):
        s = arg.untyped_storage()
        found.append((s.data_ptr(), s.data_ptr() + s.nbytes()))


def _check(ptrs, mask, what: str) -> None:
    if not _ranges:
        return
    addresses = np.asarray(ptrs.data).astype(np.uint64)
    if mask is not None:
        addresses = addresses[np.broadcast_to(np.asarray(mask.data), addresses.shape).astype(bool)]
    addresses = addresses.ravel()
    if addresses.size == 0:
        return
    width = max(1, ptrs.get_element_ty().primitive_bitwidth // 8)
    inside = np.zeros(addresses.shape, dtype=bool)
    for start, end in _ranges[-1]:
        inside |= (addresses >= start) & (addresses + width <= end)
    if not inside.all():
        bad = ", ".join(hex(int(a)) for a in addresses[~inside][:4])
        tensors = ", ".join(f"[{hex(s)}, {hex(e)})" for s, e in _ranges[-1])
        raise OutOfBounds(f"{what} outside every tensor of the launch: {bad} (tensors: {tensors})")


@contextlib.contextmanager
def checked():
    """Raise :class:`OutOfBounds` at any interpreted load, store or atomic outside the launch's tensors."""
    from triton.runtime import interpreter

    executor, builder = interpreter.GridExecutor, interpreter.InterpreterBuilder
    call = executor.__call__
    load, store, rmw = builder.create_masked_load, builder.create_masked_store, builder.create_atomic_rmw

    def launch(self, *args, **kwargs):
        found: list[tuple[int, int]] = []
        _storages([*args, *kwargs.values()], found)
        _ranges.append(found)
        try:
            return call(self, *args, **kwargs)
        finally:
            _ranges.pop()

    def checked_load(self, ptrs, mask, *rest):
        _check(ptrs, mask, "a load")
        return load(self, ptrs, mask, *rest)

    def checked_store(self, ptrs, value, mask, *rest):
        _check(ptrs, mask, "a store")
        return store(self, ptrs, value, mask, *rest)

    def checked_rmw(self, op, ptrs, value, mask, *rest):
        _check(ptrs, mask, "an atomic")
        return rmw(self, op, ptrs, value, mask, *rest)

    executor.__call__ = launch
    builder.create_masked_load, builder.create_masked_store = checked_load, checked_store
    builder.create_atomic_rmw = checked_rmw
    try:
        yield
    finally:
        executor.__call__ = call
        builder.create_masked_load, builder.create_masked_store, builder.create_atomic_rmw = load, store, rmw
