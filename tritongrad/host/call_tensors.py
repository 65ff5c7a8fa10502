"""The distinct tensors of one call of an op, each described by what the launch record's key and checks read: storage
(numbered in order of appearance, not named by address), dtype, sizes, strides, offset, device, ``requires_grad``;
and the tensors an op's arguments hold inside containers (pytrees: ``tensor_leaves``, ``nested_tensors``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch.utils import _pytree as pytree

from ..core.device import storage_id, tracing
from .shadows import View


class CallTensors:
    """The distinct tensors of one call (by identity), each described by what the checks read.

    ``device``: the first tensor's; ``mixed``: whether some other tensor is elsewhere.
    """

    __slots__ = ("tensors", "index", "described", "storages", "device", "on_cpu", "mixed")

    def __init__(self):
        self.tensors: list[torch.Tensor] = []
        self.index: dict[int, int] = {}  # id(tensor) -> position in tensors
        self.described: list[tuple] = []  # per tensor: (storage key, dtype, size, stride, offset, device, grad)
        self.storages: dict[int, int] = {}  # storage address -> key (1, 2, ... in order of appearance)
        self.device, self.on_cpu, self.mixed = None, False, False  # on_cpu: device.type is slow to read

    def take(self, values: tuple) -> tuple[tuple, tuple]:
        """Each value's position among the call's tensors (None for a value that is not a tensor),
        and the values with tensors replaced by None. New tensors are described.

        One loop with everything inlined: this runs on every argument of every launch.
        """
        index, tensors, described, storages = self.index, self.tensors, self.described, self.storages
        positions, kept, traced = [], [], None
        for v in values:
            if not isinstance(v, _Tensor):
                positions.append(None)
                kept.append(v)
                continue
            i = index.get(id(v))
            if i is None:
                i = index[id(v)] = len(tensors)
                tensors.append(v)
                dtype, size, offset, device = v.dtype, v.shape, v.storage_offset(), v.device
                if traced is None:
                    traced = tracing()
                # (a traced tensor is fake: its storage stands for the address it lacks)
                address = storage_id(v) + offset * (_ITEMSIZE.get(dtype) or dtype.itemsize) if traced \
                    else v.data_ptr()
                # the storage's address (the view's, less its offset: untyped_storage() makes an object);
                # a tensor without elements aliases nothing; storages are numbered, not named by address,
                # so that the description is the same on every call with the same layout
                key = storages.setdefault(address - offset * (_ITEMSIZE.get(dtype) or dtype.itemsize),
                                          len(storages) + 1) if address and 0 not in size else 0
                described.append((key, dtype, size, v.stride(), offset, device, v.requires_grad))
                if device != self.device:
                    self._another_device(device)
            positions.append(i)
            kept.append(None)
        return tuple(positions), tuple(kept)

    def _another_device(self, device: torch.device) -> None:
        if self.device is None:
            self.device, self.on_cpu = device, device == _CPU
        else:
            self.mixed = True

    def view(self, i: int) -> View:
        key, dtype, size, stride, offset, device, _ = self.described[i]
        return View(key, dtype, tuple(size), stride, offset, device)

    def requires_grad(self, i: int) -> bool:
        return self.described[i][6]


def as_tuple(result: Any) -> tuple:
    """An op's outputs as a tuple: a host function may return one tensor, a tuple or a list."""
    return tuple(result) if isinstance(result, (tuple, list)) else (result,)


def is_container(value: Any) -> bool:
    """Whether a value holds others as a pytree does (lists, tuples, dicts, namedtuples, registered nodes)."""
    return isinstance(value, (list, tuple, dict)) or type(value) in pytree.SUPPORTED_NODES


def tensor_leaves(value: Any) -> list[tuple[str, torch.Tensor]]:
    """The tensors inside a container (its pytree leaves), each with its path in it (``[1]['w']``)."""
    leaves, _ = pytree.tree_flatten_with_path(value)
    return [(pytree.keystr(path), t) for path, t in leaves if isinstance(t, _Tensor)]


def nested_tensors(values: Iterable) -> tuple[tuple[str, ...], tuple[torch.Tensor, ...]]:
    """The tensors inside the containers among ``values`` (an op's arguments), and their paths (``#2[0]``: the
    third value's first element); nothing where no value is a container (the usual call: one loop, no pytree)."""
    paths, tensors = [], []
    for i, v in enumerate(values):
        if type(v) not in _LEAVES and not isinstance(v, _Tensor) and is_container(v):
            for path, t in tensor_leaves(v):
                paths.append(f"#{i}{path}")
                tensors.append(t)
    return tuple(paths), tuple(tensors)


_LEAVES = frozenset({torch.Tensor, int, float, bool, str, type(None)})  # (the usual arguments: no further test)


_CPU = torch.device("cpu")
_Tensor = torch.Tensor  # a module global: read on every argument of every launch
_ITEMSIZE = {d: d.itemsize for d in vars(torch).values() if isinstance(d, torch.dtype)}  # dtype.itemsize is slow
