"""A user's kernels, in a module of their own that my_ops.py (beside it) imports."""

import triton
import triton.language as tl


@triton.jit
def softplus_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    tl.store(y_ptr + offs, tl.log(1.0 + tl.exp(x)), mask=mask)


@triton.jit
def atomic_max_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.atomic_max(y_ptr + offs * 0, tl.load(x_ptr + offs, mask=mask, other=0.0), mask=mask)
