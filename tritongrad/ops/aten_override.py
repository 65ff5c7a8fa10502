"""``tritongrad.override``: run a Triton host function in place of an aten operator.

    with tritongrad.override("aten::sin", triton_sin):   # restored on exit
        y = model(x)                                      # torch.sin on CUDA tensors runs triton_sin

    handle = tritongrad.override("aten::sin", triton_sin) # permanent, until handle.remove()

``fn`` takes the operator's arguments and returns its result, like seed 003's
``triton_sin``. It is registered at the device's dispatch key (``CUDA`` by default), so
aten's autograd formula still computes the backward. With ``backward="derived"`` an
``Autograd<Device>`` kernel is registered too: ``fn`` is run as a ``tritongrad.op`` and
the backward is derived from its kernels. ``fn`` must not call the operator it replaces.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

from .torch_op import bare_op

_alive: set[override] = set()  # permanent overrides: a Library unregisters itself when collected


class override:
    """Register ``fn`` as the kernel of ``op`` ("namespace::name[.overload]") for one device type."""

    def __init__(self, op: str, fn: Any, *, backward: str = "aten", device: str = "cuda"):
        if backward not in ("aten", "derived"):
            raise ValueError(f"backward must be 'aten' or 'derived', not {backward!r}")
        namespace, _, name = op.partition("::")
        if not name:
            raise ValueError(f"expected an operator name like 'aten::sin', got {op!r}")
        key = device.upper()
        self.op, self.fn, self.backward = op, fn, backward
        self._lib = torch.library.Library(namespace, "IMPL")
        # newer torch asks for allow_override=True to replace an existing registration
        extra = {"allow_override": True} if "allow_override" in inspect.signature(self._lib.impl).parameters else {}
        self._lib.impl(name, fn, key, **extra)
        if backward == "derived":
            self._lib.impl(name, _differentiable(fn), "Autograd" + key, **extra)
        _alive.add(self)

    def remove(self) -> None:
        """Restore the operator's previous kernels."""
        if self in _alive:
            _alive.discard(self)
            self._lib._destroy()

    def __enter__(self) -> override:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.remove()

    def __repr__(self) -> str:
        return f"override({self.op!r}, {getattr(self.fn, '__name__', self.fn)!r}, backward={self.backward!r})"


def _differentiable(fn: Any) -> Any:
    op_fn = bare_op(fn)

    def autograd_kernel(*args, **kwargs):
        # the Autograd key is dispatched whether or not anything requires grad: skip the record when nothing does
        if any(isinstance(a, torch.Tensor) and a.requires_grad for a in (*args, *kwargs.values())):
            return op_fn(*args, **kwargs)
        return fn(*args, **kwargs)

    return autograd_kernel
