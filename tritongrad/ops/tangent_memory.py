"""Where forward mode runs a call's launches (ops/forward_mode.py): tangent memory per storage, and the tangent kernel
each launch runs, found once per kernel and specialization."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..core.bounded import Bounded
from ..core.device import storage_of
from ..core.source import unwrap
from ..frontend.specialize import plain_value
from ..runtime.derivation import decisive_constexprs, hashable
from ..runtime.tangent_kernel import jvp as tangent_kernel

# (a kernel's function, the values of its constexprs that decide an `if`) -> its tangent kernel for them
_tangent_kernels: dict[tuple, Any] = Bounded()


def specialized(kernel: Any, named: dict) -> Any:
    """The tangent kernel a launch with these arguments runs (``TangentKernel.for_launch``'s), found once per kernel
    and specialization: a repeated call neither derives nor looks up twice, nor binds its arguments again."""
    jit_fn = unwrap(kernel)
    try:
        key = (jit_fn.fn, tuple(hashable(plain_value(named[k])) if k in named else _MISSING
                                for k in decisive_constexprs(jit_fn)))
        found = _tangent_kernels.get(key)
    except TypeError:  # (an unhashable value: derived as it is)
        key = found = None
    if found is None:
        found = tangent_kernel(kernel).for_launch(named)
        if key is not None:
            _tangent_kernels[key] = found
    return found


_MISSING = object()


class TangentMemory:
    """Tangent memory per storage: a zero-filled buffer as long as the storage, each tensor's tangent the same
    strided view of it as the tensor is of its storage (a view's tangent is the tangent's view)."""

    def __init__(self, error: Callable[[str], Exception]):
        self.error = error  # (the call's: an OpError naming the op)
        self.buffers: dict[int, torch.Tensor] = {}
        self.arguments: set[int] = set()

    def argument(self, x: torch.Tensor) -> None:
        self.arguments.add(storage_of(x))

    def holds(self, x: torch.Tensor) -> bool:
        return storage_of(x) in self.buffers or storage_of(x) in self.arguments

    def view(self, x: torch.Tensor) -> torch.Tensor:
        key = storage_of(x)
        buffer = self.buffers.get(key)
        if buffer is None:
            buffer = self.buffers[key] = torch.zeros(_elements(x), dtype=x.dtype, device=x.device)
        if buffer.dtype != x.dtype:
            raise self.error(f"launches read one storage as {buffer.dtype} and as {x.dtype}")
        return buffer.as_strided(x.size(), x.stride(), x.storage_offset())

    def scratch(self, x: torch.Tensor) -> torch.Tensor:
        """Zeros laid out as ``x`` in memory of their own (where a tangent kernel stores the forward's values)."""
        return torch.zeros(_elements(x), dtype=x.dtype, device=x.device).as_strided(
            x.size(), x.stride(), x.storage_offset())

    def put(self, x: torch.Tensor, t: torch.Tensor) -> None:
        """``x``'s tangent written into its storage's tangent memory (``check``, once all are: read back, for
        elements ``x`` reads twice (stride 0) or that another argument shares must have one tangent)."""
        t = t.to(x.dtype).expand(x.shape)
        if 0 not in x.stride():  # (the usual argument: no dimension to narrow)
            self.view(x).copy_(t)
            return
        index = tuple(slice(0, 1) if s == 0 and n > 1 else slice(None) for s, n in zip(x.stride(), x.shape,
                                                                                        strict=True))
        self.view(x)[index].copy_(t[index])

    def check(self, x: torch.Tensor, t: torch.Tensor) -> None:
        if not torch.equal(self.view(x), t.to(x.dtype).expand(x.shape)):
            raise self.error(f"an argument ({layout_of(x)}) shares memory with itself (stride 0) or another "
                                  "argument, and the tangents given for the shared elements differ")


def _elements(x: torch.Tensor) -> int:
    return x.untyped_storage().nbytes() // x.element_size()


def layout_of(x: torch.Tensor) -> str:
    return f"{x.dtype}, sizes {tuple(x.shape)}"
