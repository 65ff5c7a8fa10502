"""Rotary position embedding, rotate-half form: each head vector's halves ``x1, x2`` become
``x1 * cos - x2 * sin`` and ``x2 * cos + x1 * sin`` (the angle of its position), stored at
``out + cols`` and ``out + half + cols``. One program per (batch, head, position) row; the op
launches the kernel for q, then for k. q, k: (batch, heads, seq, head_dim); cos, sin: (1, seq, head_dim)."""

import torch
import triton
import triton.language as tl

import tritongrad

from .launch import compute_type, itemsize, numel, row_block


@triton.jit
def rotary_kernel(x_ptr, cos_ptr, sin_ptr, out_ptr, S, D, HALF: tl.constexpr, COMPUTE: tl.constexpr):
    row = tl.program_id(0)  # (batch * heads * seq) rows of D
    pos = row % S
    cols = tl.arange(0, HALF)
    mask = cols < D // 2
    x1 = tl.load(x_ptr + row * D + cols, mask=mask, other=0.0).to(COMPUTE)
    x2 = tl.load(x_ptr + row * D + D // 2 + cols, mask=mask, other=0.0).to(COMPUTE)
    cos1 = tl.load(cos_ptr + pos * D + cols, mask=mask, other=0.0)
    cos2 = tl.load(cos_ptr + pos * D + D // 2 + cols, mask=mask, other=0.0)
    sin1 = tl.load(sin_ptr + pos * D + cols, mask=mask, other=0.0)
    sin2 = tl.load(sin_ptr + pos * D + D // 2 + cols, mask=mask, other=0.0)
    tl.store(out_ptr + row * D + cols, x1 * cos1 - x2 * sin1, mask=mask)
    tl.store(out_ptr + row * D + D // 2 + cols, x2 * cos2 + x1 * sin2, mask=mask)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x = x.contiguous()
    out = torch.empty_like(x)
    s, d = x.shape[-2:]
    rotary_kernel[(x.numel() // d if d else 0,)](x, cos, sin, out, s, d, HALF=row_block(d // 2),
                                     COMPUTE=compute_type(x.dtype))
    return out


@tritongrad.op("tritongrad_examples::rotary")
def rotary(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor,
           sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    assert q.shape[-1] % 2 == 0 and cos.shape[-2:] == sin.shape[-2:] == q.shape[-2:]
    cos, sin = cos.contiguous(), sin.contiguous()
    return _rotate(q, cos, sin), _rotate(k, cos, sin)


def reference(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    def rotate_half(x):
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((-x2, x1), dim=-1)

    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)  # (1, 1, seq, head_dim): every batch and head
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


def make_inputs(size=(2, 3, 5, 12), device="cpu", dtype=torch.float32) -> tuple[torch.Tensor, ...]:
    """``size`` is (batch, heads, seq, head_dim); the angles are those of positions and frequencies."""
    batch, heads, seq, dim = size
    q, k = (torch.randn(batch, heads, seq, dim, device=device, dtype=dtype) for _ in range(2))
    freqs = torch.rand(dim // 2, device=device, dtype=torch.float32) + 0.1
    angles = torch.arange(seq, device=device, dtype=torch.float32)[:, None] * freqs
    angles = torch.cat((angles, angles), dim=-1)[None]  # (1, seq, head_dim)
    return q, k, angles.cos().to(dtype), angles.sin().to(dtype)


SIZES = ((2, 3, 5, 12), (1, 2, 7, 20))  # halves of 6 and 10 in blocks of 8 and 16
BENCH_SIZES = ((4, 32, 1024, 128), (4, 32, 4096, 128), (4, 32, 8192, 128))
DTYPES = (torch.float64, torch.float32, torch.bfloat16, torch.float16)


def traffic(size, dtype) -> dict[str, int]:
    qk = 2 * numel(size) * itemsize(dtype)
    return {"fwd": 2 * qk, "bwd": 2 * qk}  # q, k read, rotated written; their gradients likewise
