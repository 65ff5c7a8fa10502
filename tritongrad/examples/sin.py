"""``sin``, from seed 003 (Triton with PyTorch), masked so the length need not be a multiple of the block."""

import torch
import triton
import triton.language as tl

import tritongrad

from .launch import Launch, itemsize, numel

BLOCK_SIZE = 256


@triton.jit
def _sin(x_ptr, output_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
    pid = tl.program_id(axis=0)
    block_start = pid * BLOCK_SIZE
    offsets = block_start + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    # Load data
    x = tl.load(x_ptr + offsets, mask=mask)
    output = tl.sin(x)
    # Write-back output
    tl.store(output_ptr + offsets, output, mask=mask)


def sin_launch(x: torch.Tensor) -> Launch:
    assert x.is_contiguous()
    output = torch.empty_like(x)
    n_elements = x.numel()
    grid = (triton.cdiv(n_elements, BLOCK_SIZE),)
    return Launch(_sin, grid, (x, output, n_elements), {"BLOCK_SIZE": BLOCK_SIZE}, "output_ptr", output)


def triton_sin(x: torch.Tensor) -> torch.Tensor:
    """The seed's host function, as a plain function (tests wrap it themselves)."""
    return sin_launch(x)()


@tritongrad.op("tritongrad_examples::sin")
def sin(x: torch.Tensor) -> torch.Tensor:
    return sin_launch(x.contiguous())()


def reference(x: torch.Tensor) -> torch.Tensor:
    return torch.sin(x)


def make_inputs(size=750, device="cpu", dtype=torch.float32) -> tuple[torch.Tensor]:
    return (torch.randn(size, device=device, dtype=dtype),)


SIZES = (750, 1000)  # 750: three programs, the last one masked
BENCH_SIZES = (2**20, 2**22, 2**24, 2**26)
DTYPES = (torch.float64, torch.float32)  # tl.sin takes float32 and float64


def traffic(size, dtype) -> dict[str, int]:
    n = numel(size) * itemsize(dtype)
    return {"fwd": 2 * n, "bwd": 3 * n}  # x read, y written; x and dy read, dx written
