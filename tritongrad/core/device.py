"""What a device gives the passes that size work for it: its multiprocessors and memory, asked of CUDA once per device
(each ask costs ~30 µs of host time, and launches need them on every backward). In Triton's interpreter or without a
device, kernels are not compiled for one: no multiprocessors."""

from __future__ import annotations

import contextlib
import contextvars
import functools
import os
from typing import Any


def cuda_properties(device: Any) -> Any:
    """A CUDA device's properties (multiprocessors, memory)."""
    import torch

    index = device.index if isinstance(device, torch.device) else device
    return _properties(torch.cuda.current_device() if index is None else index)


@functools.cache
def _properties(index: int) -> Any:
    import torch

    return torch.cuda.get_device_properties(index)


def compiled_multiprocessors(device: Any) -> int:
    """A GPU's multiprocessors where kernels are compiled for it; 0 in Triton's interpreter or without a device."""
    count = _multiprocessors.get(device)
    if count is None:
        compiled = device is not None and device.type == "cuda" and os.environ.get("TRITON_INTERPRET", "0") != "1"
        count = _multiprocessors[device] = cuda_properties(device).multi_processor_count if compiled else 0
    return count


def multiprocessors(device: Any) -> int:
    """How many programs fill the device: its multiprocessors on a GPU, one in Triton's interpreter."""
    return compiled_multiprocessors(device) or 1


_multiprocessors: dict[Any, int] = {}


def capturing() -> bool:
    """Whether a CUDA graph is being captured on the current stream (asked on every op's call: whether CUDA is
    there at all is asked once, ``cuda_available``)."""
    import torch

    return cuda_available() and torch.cuda.is_current_stream_capturing()


@functools.cache
def cuda_available() -> bool:
    """``torch.cuda.is_available()``, asked once (microseconds each time: it reads the environment)."""
    import torch

    return torch.cuda.is_available()


_tracing: contextvars.ContextVar[bool] = contextvars.ContextVar("tritongrad_tracing", default=False)


def tracing() -> bool:
    """Whether torch.compile is tracing a derived backward (``traced``): its tensors are fake, so nothing may be
    timed, read back or checked on the device, and tensors have no data pointers (``address``)."""
    return _tracing.get()


@contextlib.contextmanager
def traced():
    """``with traced():`` a backward run on fake tensors, its launches issued through ``wrap_triton``."""
    token = _tracing.set(True)
    try:
        yield
    finally:
        _tracing.reset(token)


_recorded: contextvars.ContextVar[bool] = contextvars.ContextVar("tritongrad_recorded", default=False)


def recorded() -> bool:
    """Whether a backward run as an op (double backward, ``recording``) records its launches: each must go through
    Triton's run, where tritongrad's hook sees it (no direct launch: runtime/relaunch.py), and nothing is timed (its
    trials would be recorded too: runtime/tuning.py)."""
    return _recorded.get()


@contextlib.contextmanager
def recording():
    """``with recording():`` a backward whose launches of derived kernels are recorded (ops/autograd_function.py)."""
    token = _recorded.set(True)
    try:
        yield
    finally:
        _recorded.reset(token)


def address(t: Any) -> tuple[Any, int]:
    """Where a tensor's first element lies: (region, byte address), regions sharing no memory. A real tensor: (None,
    its data pointer). A traced one (fake: its data pointer is no address): (its storage, its offset in bytes), so
    views of one storage lie in one region."""
    if _tracing.get():
        return storage_id(t), t.storage_offset() * t.element_size()
    return None, t.data_ptr()


def storage_of(t: Any) -> int:
    """A tensor's storage, as a number that views of the same storage share: its data pointer, or a traced one's
    ``storage_id``."""
    return storage_id(t) if _tracing.get() else t.untyped_storage().data_ptr()


def storage_id(t: Any) -> int:
    """A traced tensor's storage, as a number (views of one storage have the same)."""
    import torch

    if isinstance(t, torch._subclasses.functional_tensor.FunctionalTensor):
        t = torch._from_functional_tensor(t.elem)
    return t.untyped_storage()._cdata


_allocation: Any = None  # triton.runtime._allocation once imported (False: this Triton has none)


def ensure_allocator() -> None:
    """Kernels that make tensor descriptors need Triton's global scratch allocator (``triton.set_allocator``). One
    set in the forward's context is not seen where autograd runs the backward (a thread of its own on a GPU):
    where none is set there, scratch memory comes from torch's caching allocator."""
    global _allocation
    if _allocation is None:  # (imported once: every backward asks)
        try:
            from triton.runtime import _allocation
        except ImportError:  # a Triton without one
            _allocation = False
    if _allocation is False:
        return
    current = getattr(_allocation, "_allocator", None)
    if current is not None and type(current.get()).__name__ == "NullAllocator":
        _allocation.set_allocator(_torch_scratch) if hasattr(_allocation, "set_allocator") else current.set(
            _torch_scratch)


def _torch_scratch(size: int, alignment: int, stream: Any) -> Any:
    import torch

    return torch.empty(size, dtype=torch.int8, device="cuda")
