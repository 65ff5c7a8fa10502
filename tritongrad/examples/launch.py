"""``Launch``: one forward kernel launch, described before it runs; and the sizes the examples share.

Each example's ``*_launch`` function allocates the output and returns a ``Launch``;
its host launcher just runs it. Keeping the grid and arguments around lets the tests
and ``tritongrad demo`` poison the output first, and run the derived backward of the
very same launch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import triton
import triton.language as tl


@dataclass
class Launch:
    """``kernel[grid](*args, **kwargs)``, which fills ``out``, passed as the parameter ``output``."""

    kernel: Any
    grid: tuple[int, ...]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    output: str
    out: torch.Tensor

    def __call__(self) -> torch.Tensor:
        self.kernel[self.grid](*self.args, **self.kwargs)
        return self.out


def numel(size: int | tuple[int, ...]) -> int:
    """Elements of an example's size (an int, or a shape such as ``(rows, cols)``)."""
    return math.prod(size) if isinstance(size, tuple) else size


def itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def row_block(n: int) -> int:
    """A block holding a row of ``n`` values: the next power of two, at least 1 (``triton.next_power_of_2(0)`` is 0,
    and ``tl.arange(0, 0)`` does not compile: a row of no values, an empty tensor's, runs its masked lanes)."""
    return triton.next_power_of_2(max(n, 1))


def row_warps(block: int) -> int:
    """Warps for a program that holds a row of ``block`` values, as the tutorials size them: more threads for a
    wider row, so that each thread's share stays in registers (a 16384-wide float32 row in Triton's default 4
    warps spills: an H200 ran that layer norm's forward 12x slower)."""
    return 4 if block < 2048 else 8 if block < 8192 else 16 if block < 32768 else 32


def compute_type(dtype: torch.dtype):
    """What a kernel computes in for inputs of ``dtype`` (its ``COMPUTE`` constexpr): float32, as
    production kernels do for half precision, or float64 for float64 inputs (exact checks on CPU)."""
    return tl.float64 if dtype == torch.float64 else tl.float32
