"""A kernel whose constexpr mode chooses which of two stores runs (a KL divergence storing per-element losses, or a
row sum), launched without its defaulted constexprs: the backward is derived for the specialization the launch ran,
with the defaults the launch took. Float64 against PyTorch, each mode, bare and named."""

import pytest
import torch
import triton
import triton.language as tl

import tritongrad

NONE: tl.constexpr = tl.constexpr(0)  # a module-level constexpr, as kernels name their modes


@triton.jit
def kl_div_kernel(y_ptr, y_stride, t_ptr, t_stride, loss_ptr, loss_stride, n_cols, eps,
                  BLOCK: tl.constexpr, reduction: tl.constexpr, log_target: tl.constexpr = False):
    pid = tl.program_id(0).to(tl.int64)
    y_ptr += pid * y_stride
    t_ptr += pid * t_stride
    loss_ptr += pid * loss_stride
    total = tl.zeros((), y_ptr.dtype.element_ty)  # (typed: a loop-carried value keeps its type compiled)
    for i in range(0, n_cols, BLOCK):
        offs = i + tl.arange(0, BLOCK)
        mask = offs < n_cols
        y = tl.load(y_ptr + offs, mask=mask, other=0.0)
        t = tl.load(t_ptr + offs, mask=mask, other=0.0)
        if not log_target:
            loss = t * (tl.log(tl.maximum(t, eps)) - y)
        else:
            loss = tl.exp(t) * (t - y)
        if reduction == NONE:
            tl.store(loss_ptr + offs, loss, mask=mask)
        else:
            total += tl.sum(loss, axis=0)
    if reduction != NONE:
        tl.store(loss_ptr, total)


def kl_div(y: torch.Tensor, t: torch.Tensor, reduction: int = 0) -> torch.Tensor:
    rows, cols = y.shape
    out = torch.empty((rows, cols) if reduction == 0 else (rows,), dtype=y.dtype, device=y.device)
    kl_div_kernel[(rows,)](y, y.stride(0), t, t.stride(0), out, out.stride(0), cols, 1e-10, BLOCK=16,
                           reduction=reduction)  # log_target: its default
    return out


def kl_div_log_target(y: torch.Tensor, t: torch.Tensor, reduction: int = 0) -> torch.Tensor:
    rows, cols = y.shape
    out = torch.empty((rows, cols) if reduction == 0 else (rows,), dtype=y.dtype, device=y.device)
    kl_div_kernel[(rows,)](y, y.stride(0), t, t.stride(0), out, out.stride(0), cols, 1e-10, BLOCK=16,
                           reduction=reduction, log_target=True)
    return out


def reference(y, t, reduction, log_target):
    loss = t.exp() * (t - y) if log_target else t * (t.clamp_min(1e-10).log() - y)
    return loss if reduction == 0 else loss.sum(1)


OPS = {
    ("bare", False): tritongrad.op(kl_div),
    ("bare", True): tritongrad.op(kl_div_log_target),
    ("named", False): tritongrad.op("tgtest::kl_div")(kl_div),
    ("named", True): tritongrad.op("tgtest::kl_div_log_target")(kl_div_log_target),
}


@pytest.mark.parametrize("reduction", [0, 1])
@pytest.mark.parametrize("log_target", [False, True])
@pytest.mark.parametrize("form", ["bare", "named"])
def test_each_reduction_mode_gets_pytorchs_gradients(device, form, log_target, reduction):
    y = torch.randn(5, 37, device=device, dtype=torch.float64, requires_grad=True)
    t = (torch.rand(5, 37, device=device, dtype=torch.float64) + 0.05).requires_grad_()
    out = OPS[(form, log_target)](y, t, reduction)
    want = reference(y, t, reduction, log_target)
    torch.testing.assert_close(out, want)
    g = torch.randn_like(want)
    got = torch.autograd.grad(out, (y, t), g)
    torch.testing.assert_close(got, torch.autograd.grad(want, (y, t), g))
