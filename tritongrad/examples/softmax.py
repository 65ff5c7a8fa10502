"""Row softmax, as in the Triton tutorial: one program per row, padding loaded as -inf."""

import torch
import triton
import triton.language as tl

from .launch import Launch


@triton.jit
def softmax_kernel(x_ptr, y_ptr, stride, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride + cols, mask=mask, other=-float("inf"))
    z = x - tl.max(x, axis=0)
    numerator = tl.exp(z)
    denominator = tl.sum(numerator, axis=0)
    y = numerator / denominator
    tl.store(y_ptr + row * stride + cols, y, mask=mask)


def softmax_launch(x: torch.Tensor) -> Launch:
    assert x.is_contiguous() and x.dim() == 2
    y = torch.empty_like(x)
    rows, n_cols = x.shape
    args = (x, y, x.stride(0), n_cols)
    return Launch(softmax_kernel, (rows,), args, {"BLOCK": triton.next_power_of_2(n_cols)}, "y_ptr", y)


def softmax(x: torch.Tensor) -> torch.Tensor:
    return softmax_launch(x)()


def reference(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x, dim=-1)


def make_inputs(device="cpu", dtype=torch.float32) -> tuple[torch.Tensor]:
    return (torch.randn(6, 37, device=device, dtype=dtype),)
