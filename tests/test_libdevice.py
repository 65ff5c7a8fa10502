"""libdevice's tanh, log1p, expm1 and pow. The interpreter has no libdevice, so the gradients are checked
on a GPU only; the derivation itself is checked everywhere."""

import pytest
import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice  # the module path of Triton 3.6 and newer

import tritongrad
from tritongrad.tools.testing import backward_launch, poison


@triton.jit
def libdevice_math(x_ptr, p_ptr, y_ptr, N, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    x = tl.load(x_ptr + offs, mask=mask, other=0.5)
    p = tl.load(p_ptr + offs, mask=mask, other=1.0)
    y = libdevice.tanh(x) + libdevice.log1p(x * x) * libdevice.expm1(x) + libdevice.pow(x * x + 0.5, p)
    tl.store(y_ptr + offs, y, mask=mask)


def reference(x, p):
    return torch.tanh(x) + torch.log1p(x * x) * torch.expm1(x) + torch.pow(x * x + 0.5, p)


def test_libdevice_rules_are_derived():
    src = tritongrad.grad(libdevice_math).src
    # the text is the point (the interpreter has no libdevice): test_libdevice_gradients_on_gpu checks the gradients
    assert "tg.pow_grad(" in src and "(1.0 - tanh_x * tanh_x)" in src, src
    assert "d_x" in src and "d_p" in src


@pytest.mark.gpu
def test_libdevice_gradients_on_gpu():
    n, block = 1000, 128
    x = torch.randn(n, dtype=torch.float32, device="cuda")
    p = torch.rand(n, dtype=torch.float32, device="cuda") * 3 - 1
    y = poison(torch.empty_like(x))
    grid = (triton.cdiv(n, block),)
    libdevice_math[grid](x, p, y, n, BLOCK=block)
    leaves = [t.clone().requires_grad_() for t in (x, p)]
    want = reference(*leaves)
    torch.testing.assert_close(y, want.detach(), rtol=1e-5, atol=1e-5)
    dy = torch.randn_like(y)
    got = backward_launch(libdevice_math, grid, (x, p, y, n), {"BLOCK": block}, {"y_ptr": dy})
    for name, w in zip(("x_ptr", "p_ptr"), torch.autograd.grad(want, leaves, dy), strict=True):
        torch.testing.assert_close(got[name], w, rtol=1e-4, atol=1e-4)
