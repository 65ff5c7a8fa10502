"""The host floor of a training step: a minimal hand-written ``torch.autograd.Function`` per example,
launching the example's own forward kernel with ``kernel[grid](...)`` and one hand-written backward kernel, as
a library writes them (Liger-Kernel's Functions are of this kind, with more around them). What a
``tritongrad.op`` adds to a step on the host is measured against it (benchmarks/host_step.py).

Each backward computes in float32 and writes its inputs' gradients in their dtype; a weight's (and bias's)
gradient, summed over rows, is added atomically into a float32 buffer, then cast: the fewest host operations,
not the fastest kernel at large sizes (these floors are for small, host-bound steps). ``FLOORS``: example name ->
a callable with the example's signature.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tritongrad.examples import layernorm, rmsnorm, softmax, swiglu
from tritongrad.examples.launch import compute_type, row_warps


@triton.jit
def _softmax_bwd(y_ptr, dy_ptr, dx_ptr, stride, n, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n
    y = tl.load(y_ptr + row * stride + cols, mask=mask, other=0.0).to(tl.float32)
    dy = tl.load(dy_ptr + row * stride + cols, mask=mask, other=0.0).to(tl.float32)
    dx = y * (dy - tl.sum(y * dy, axis=0))
    tl.store(dx_ptr + row * stride + cols, dx, mask=mask)


class SoftmaxFloor(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        x = x.contiguous()
        y = torch.empty_like(x)
        rows, n = x.shape
        block = triton.next_power_of_2(n)
        softmax.softmax_kernel[(rows,)](x, y, x.stride(0), n, BLOCK=block, COMPUTE=compute_type(x.dtype),
                                        num_warps=row_warps(block))
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, dy):
        (y,) = ctx.saved_tensors
        dy = dy.contiguous()
        dx = torch.empty_like(y)
        rows, n = y.shape
        block = triton.next_power_of_2(n)
        _softmax_bwd[(rows,)](y, dy, dx, y.stride(0), n, BLOCK=block, num_warps=row_warps(block))
        return dx


@triton.jit
def _rmsnorm_bwd(x_ptr, w_ptr, rstd_ptr, dy_ptr, dx_ptr, dw_ptr, stride, n, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n
    x = tl.load(x_ptr + row * stride + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    dy = tl.load(dy_ptr + row * stride + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = tl.load(rstd_ptr + row).to(tl.float32)
    xhat = x * rstd
    g = dy * w
    dx = rstd * (g - xhat * (tl.sum(g * xhat, axis=0) / n))
    tl.store(dx_ptr + row * stride + cols, dx, mask=mask)
    tl.atomic_add(dw_ptr + cols, dy * xhat, mask=mask)


class RMSNormFloor(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, eps=1e-6):
        x = x.contiguous()
        y = torch.empty_like(x)
        rows, n = x.shape
        rstd = torch.empty(rows, device=x.device, dtype=torch.float32)
        block = triton.next_power_of_2(n)
        rmsnorm.rmsnorm_fwd[(rows,)](x, w, y, rstd, x.stride(0), n, eps, BLOCK=block, COMPUTE=tl.float32,
                                     num_warps=row_warps(block))
        ctx.save_for_backward(x, w, rstd)
        return y

    @staticmethod
    def backward(ctx, dy):
        x, w, rstd = ctx.saved_tensors
        dy = dy.contiguous()
        dx = torch.empty_like(x)
        dw = torch.zeros(w.shape, device=w.device, dtype=torch.float32)
        rows, n = x.shape
        block = triton.next_power_of_2(n)
        _rmsnorm_bwd[(rows,)](x, w, rstd, dy, dx, dw, x.stride(0), n, BLOCK=block, num_warps=row_warps(block))
        return dx, dw.to(w.dtype), None


@triton.jit
def _layernorm_bwd(x_ptr, w_ptr, mean_ptr, rstd_ptr, dy_ptr, dx_ptr, dw_ptr, db_ptr, stride, n, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n
    x = tl.load(x_ptr + row * stride + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    dy = tl.load(dy_ptr + row * stride + cols, mask=mask, other=0.0).to(tl.float32)
    mean = tl.load(mean_ptr + row).to(tl.float32)
    rstd = tl.load(rstd_ptr + row).to(tl.float32)
    xhat = tl.where(mask, (x - mean) * rstd, 0.0)
    g = dy * w
    dx = rstd * (g - (tl.sum(g, axis=0) + xhat * tl.sum(g * xhat, axis=0)) / n)
    tl.store(dx_ptr + row * stride + cols, dx, mask=mask)
    tl.atomic_add(dw_ptr + cols, dy * xhat, mask=mask)
    tl.atomic_add(db_ptr + cols, dy, mask=mask)


class LayerNormFloor(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, b, eps=1e-5):
        x = x.contiguous()
        y = torch.empty_like(x)
        rows, n = x.shape
        mean, rstd = (torch.empty(rows, device=x.device, dtype=torch.float32) for _ in range(2))
        block = triton.next_power_of_2(n)
        layernorm.layernorm_kernel[(rows,)](x, w, b, y, mean, rstd, x.stride(0), n, eps, BLOCK=block,
                                            COMPUTE=tl.float32, num_warps=row_warps(block))
        ctx.save_for_backward(x, w, mean, rstd)
        return y

    @staticmethod
    def backward(ctx, dy):
        x, w, mean, rstd = ctx.saved_tensors
        dy = dy.contiguous()
        dx = torch.empty_like(x)
        dw, db = (torch.zeros(w.shape, device=w.device, dtype=torch.float32) for _ in range(2))
        rows, n = x.shape
        block = triton.next_power_of_2(n)
        _layernorm_bwd[(rows,)](x, w, mean, rstd, dy, dx, dw, db, x.stride(0), n, BLOCK=block,
                                num_warps=row_warps(block))
        return dx, dw.to(w.dtype), db.to(w.dtype), None


@triton.jit
def _swiglu_bwd(a_ptr, b_ptr, dy_ptr, da_ptr, db_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    a = tl.load(a_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    dy = tl.load(dy_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    s = tl.sigmoid(a)
    tl.store(da_ptr + offs, dy * b * s * (1.0 + a * (1.0 - s)), mask=mask)
    tl.store(db_ptr + offs, dy * a * s, mask=mask)


class SwiGLUFloor(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, b):
        a, b = a.contiguous(), b.contiguous()
        y = torch.empty_like(a)
        n = a.numel()
        swiglu.swiglu_kernel[(triton.cdiv(n, swiglu.BLOCK),)](a, b, y, n, BLOCK=swiglu.BLOCK,
                                                               COMPUTE=compute_type(a.dtype))
        ctx.save_for_backward(a, b)
        return y

    @staticmethod
    def backward(ctx, dy):
        a, b = ctx.saved_tensors
        dy = dy.contiguous()
        da, db = torch.empty_like(a), torch.empty_like(b)
        n = a.numel()
        _swiglu_bwd[(triton.cdiv(n, swiglu.BLOCK),)](a, b, dy, da, db, n, BLOCK=swiglu.BLOCK)
        return da, db


FLOORS = {
    "softmax": SoftmaxFloor.apply,
    "rmsnorm": RMSNormFloor.apply,
    "layernorm": LayerNormFloor.apply,
    "swiglu": SwiGLUFloor.apply,
}
