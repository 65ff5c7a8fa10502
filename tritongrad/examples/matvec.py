"""Matrix-vector product ``out = w @ x``, from seed 000 (forward and backward written by hand).

``get_1d_offset`` and friends are seed 000's ``triton_util`` helpers, written as the
user's own ``@triton.jit`` functions. ``fwd_kernel`` and ``bwd_kernel`` are the
seed's, with one change so that m and n need not be powers of two: the tile that
spans a whole axis is padded to a power of two (``bn``, ``bm``; the seed used ``n``
and ``m`` themselves, which ``tl.arange`` only accepts when they are powers of two),
and the masked loads read zeros (``other=0.0``) so the padding adds nothing to the sums.
The seed's masks already cover the padding.
"""

import torch
import triton
import triton.language as tl

import tritongrad

from .launch import Launch, itemsize, row_block

BS = 16  # the seed's `threads`: rows (forward) or columns (backward) per program


@triton.jit
def get_1d_offset(size, n_prev_chunks):
    return n_prev_chunks * size + tl.arange(0, size)


@triton.jit
def get_2d_offset(offs_0, offs_1, stride_0, stride_1=1):
    return offs_0[:, None] * stride_0 + offs_1[None, :] * stride_1


@triton.jit
def get_1d_mask(offs, max):
    return offs < max


@triton.jit
def get_2d_mask(offs_0, offs_1, max_0, max_1):
    return (offs_0[:, None] < max_0) & (offs_1[None, :] < max_1)


@triton.jit
def fwd_kernel(w_ptr, x_ptr, out_ptr, m, n, bs: tl.constexpr, bn: tl.constexpr):
    pid = tl.program_id(0)

    offs_m = get_1d_offset(bs, pid)  # split m axis into chunks of size `bs`, take chunk no 'pid'
    offs_n = get_1d_offset(bn, 0)  # entire n axis (padded to a power of two)

    offs_w = get_2d_offset(offs_m, offs_n, stride_0=n)

    mask_out = get_1d_mask(offs_m, m)
    mask_x = get_1d_mask(offs_n, n)
    mask_w = get_2d_mask(offs_m, offs_n, m, n)

    x = tl.load(x_ptr + offs_n, mask_x, other=0.0)  # shape (n)
    w = tl.load(w_ptr + offs_w, mask_w, other=0.0)  # shape (m,n)

    # note: we can't use tl.dot as it require all dims to be >= 16, so let's do manual matmul
    out = tl.sum(tl.sum(w[:, :, None] * x[None, :, None], 1), 1)  # (m,n),(n) -> (m,n,1),(1,n,1) -> (m,1) -> (m)

    tl.store(out_ptr + offs_m, out, mask_out)


@triton.jit
def bwd_kernel(d_ptr, w_ptr, x_ptr, dw_ptr, dx_ptr, m, n, bs: tl.constexpr, bm: tl.constexpr):
    # shapes: d = (m), w = (m,n), x = (n)
    pid = tl.program_id(0)

    offs_m = get_1d_offset(bm, 0)  # entire m axis (padded to a power of two)
    offs_n = get_1d_offset(bs, pid)  # split n axis into chunks of size `bs`, take chunk no 'pid'

    offs_w = get_2d_offset(offs_m, offs_n, stride_0=n)

    mask_d = get_1d_mask(offs_m, m)
    mask_x = get_1d_mask(offs_n, n)
    mask_w = get_2d_mask(offs_m, offs_n, m, n)

    d = tl.load(d_ptr + offs_m, mask_d, other=0.0)  # shape (m)
    x = tl.load(x_ptr + offs_n, mask_x, other=0.0)  # shape (n)
    w = tl.load(w_ptr + offs_w, mask_w, other=0.0)  # shape (m,n)

    # note: we can't use tl.dot as it require all dims to be >= 16, so let's do manual matmul
    dx = tl.sum(tl.sum(d[None, :, None] * w[None, :, :], 1), 0)  # (m),(m,n) -> (1,m,1),(1,m,n) -> (1,n) -> (n)
    dw = d[:, None] * x[None, :]  # (m),(n) -> (m,1),(1,n) -> (m,n)

    tl.store(dx_ptr + offs_n, dx, mask_x)
    tl.store(dw_ptr + offs_w, dw, mask_w)


def matvec_launch(w: torch.Tensor, x: torch.Tensor) -> Launch:
    # shapes: (m,n) @ (n) -> (m)
    assert w.is_contiguous() and x.is_contiguous()
    m, n = w.shape
    out = torch.empty(m, device=w.device, dtype=w.dtype)
    args = (w, x, out, m, n)
    return Launch(fwd_kernel, (triton.cdiv(m, BS),), args, {"bs": BS, "bn": row_block(n)}, "out_ptr", out)


@tritongrad.op("tritongrad_examples::matvec")
def matvec(w: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return matvec_launch(w.contiguous(), x.contiguous())()


def matvec_backward(d: torch.Tensor, w: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The seed's hand-written backward: ``(dw, dx)`` for the incoming gradient ``d`` of ``out``."""
    d = d.contiguous()  # autograd can return non-contiguous grads
    m, n = w.shape
    dx = torch.zeros_like(x)
    dw = torch.zeros_like(w)
    bwd_kernel[(triton.cdiv(n, BS),)](d, w, x, dw, dx, m, n, bs=BS, bm=row_block(m))
    return dw, dx


def reference(w: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return w @ x


def make_inputs(size=(37, 23), device="cpu", dtype=torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    m, n = size
    return torch.randn(m, n, device=device, dtype=dtype), torch.randn(n, device=device, dtype=dtype)


KERNELS = (fwd_kernel,)  # bwd_kernel is the seed's hand-written backward
SIZES = ((37, 23), (20, 50))
BENCH_SIZES = ()
DTYPES = (torch.float64, torch.float32)


def traffic(size, dtype) -> dict[str, int]:
    m, n = size
    item = itemsize(dtype)
    return {"fwd": (m * n + n + m) * item, "bwd": (2 * m * n + 2 * n + m) * item}
