"""Guard bands: a checked backward lays each buffer its kernels write between bands of a sentinel byte and, after
the kernel, refuses any band that changed, naming the buffer and the derived kernel, so that a write out of bounds
is a message rather than corrupted memory (on a GPU, silently; in the interpreter, a crash in ``free()`` later).

The first backward of each kind of call is checked (host/backward.py: its shadows and the buffers
runtime/launching.py makes: private buffers, a kernel of its own's buffers, partial rows, state tapes, a prologue's
values, later adds); ``TRITONGRAD_CHECKED=1`` checks every backward, and a direct ``bwd[grid](...)`` or
``bwd.gradients(...)`` launch's buffers too. Gradient buffers are also zero between their elements (a strided
view's gaps): gradient there means the forward read outside the tensor it was passed (host/backward.py says so).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from ..core.errors import OpError

CHECKED = os.environ.get("TRITONGRAD_CHECKED", "0") not in ("", "0")  # (read once: os.environ costs microseconds)
SENTINEL = 0xA5  # each byte of a band: no float, integer or pointer a kernel writes is likely to be all of it
GUARD = (1024, 1 << 20)  # a band's elements: the buffer's own count, within these bounds
ALIGN = 128  # a band's bytes are a multiple of this: the buffer keeps the alignment Triton specializes on


class StrayWriteError(OpError):
    """A derived kernel wrote outside a buffer a checked backward gave it."""


def band(numel: int, itemsize: int) -> int:
    """Elements of each band around a buffer of ``numel`` elements of ``itemsize`` bytes."""
    n = min(max(numel, GUARD[0]), GUARD[1]) * itemsize
    return -(-n // ALIGN) * ALIGN // itemsize


def fill_bands(flat: Any, pad: int) -> Any:
    """Fill the first and last ``pad`` elements of each row of ``flat`` (contiguous) with the sentinel."""
    rows = _bytes(flat)
    width = pad * flat.element_size()
    rows[:, :width] = SENTINEL
    rows[:, rows.shape[1] - width:] = SENTINEL
    return flat


def written_outside(flat: Any, pad: int, views: tuple | None = None) -> bool:
    """Whether a band of ``flat``'s rows changed; with ``views`` (size, stride, offset in a row past its band), also
    whether anything between the bands but outside every view is not zero (gradient between a strided view's
    elements). Waits for the device."""
    raw, width = _bytes(flat), pad * flat.element_size()
    if bool((raw[:, :width] != SENTINEL).any() | (raw[:, raw.shape[1] - width:] != SENTINEL).any()):
        return True  # (first: views need not fit a buffer laid out wrongly)
    if views is None:
        return False
    rows = flat.reshape(-1, flat.shape[-1])
    inner = rows[:, pad:rows.shape[1] - pad] != 0  # NaN too
    for size, stride, offset in views:
        inner.as_strided((inner.shape[0], *size), (inner.stride(0), *stride), offset).fill_(False)
    return bool(inner.any())


@dataclass(frozen=True)
class Banded:
    """A scratch buffer a kernel writes, between bands: ``flat`` (the bands and the buffer), the kernel's
    parameter, what it holds."""

    param: str
    what: str
    flat: Any
    pad: int


def banded(made: dict[str, Any], what: str, keep: bool = True) -> tuple[dict[str, Any], tuple[Banded, ...]]:
    """``made`` (a launch's scratch arguments: parameter -> tensor or count) with each tensor moved between bands,
    its contents kept (``keep``: not for a tape, made empty: a copy of gigabytes would cost time); and the bands to
    check after the kernel."""
    import torch

    out, bands = dict(made), []
    for param, t in made.items():
        if not isinstance(t, torch.Tensor):
            continue
        n = t.numel()
        pad = band(n, t.element_size())
        flat = fill_bands(torch.empty(n + 2 * pad, dtype=t.dtype, device=t.device), pad)
        inner = flat[pad:pad + n]
        if keep:
            inner.copy_(t.reshape(-1))
        out[param] = inner.view(t.shape)
        bands.append(Banded(param, what, flat, pad))
    return out, tuple(bands)


def check_bands(bands: tuple[Banded, ...], kernel: Any) -> None:
    """Refuse a write ``kernel`` made outside one of these scratch buffers (a fault of the derived kernel or of
    the buffer's size, not of the user's code)."""
    for b in bands:
        if written_outside(b.flat, b.pad):
            raise StrayWriteError(f"the derived kernel `{kernel_name(kernel)}` wrote outside its {b.what} `{b.param}` "
                                  f"({b.flat.numel() - 2 * b.pad} elements of {b.flat.dtype}): a fault of tritongrad "
                                  "(the buffer's size or the kernel's indexing), not of the forward; please report it "
                                  "with the launch")


def kernel_name(kernel: Any) -> str:
    """A jit function's name (the derived kernel's ``def``)."""
    return getattr(getattr(kernel, "fn", None), "__name__", None) or getattr(kernel, "__name__", repr(kernel))


def _bytes(flat: Any) -> Any:
    import torch

    return flat.reshape(-1, flat.shape[-1]).view(torch.uint8)
