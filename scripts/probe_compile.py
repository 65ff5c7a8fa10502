"""Early probe: derived kernels compile and match torch on a GPU (no interpreter)."""
import torch
import triton
import triton.language as tl

import tritongrad as tg
import tritongrad.testing  # noqa: F401


@triton.jit
def k_all(x_ptr, w_ptr, y_ptr, z_ptr, N, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    x = tl.load(x_ptr + row * N + cols, mask=mask, other=-float("inf"))
    w = tl.load(w_ptr + cols, mask=mask, other=0.0)
    m = tl.max(x, axis=0)
    e = tl.exp(x - m)
    s = tl.sum(e, axis=0)
    y = e / s * w[None, :].reshape(BLOCK) + tl.maximum(x, 0.0).to(tl.float32)
    tl.store(y_ptr + row * N + cols, y, mask=mask)
    xx = tl.where(mask, x, 0.0)
    t = tl.sum(xx[:, None] * w[None, :], axis=1)
    tl.store(z_ptr + row * N + cols, t.to(z_ptr.dtype.element_ty), mask=mask)


def ref(x, w):
    y = torch.softmax(x, -1) * w + torch.relu(x)
    z = x * w.sum()
    return y, z


for dtype in (torch.float32, torch.float64):
    M, N = 5, 37
    x = torch.randn(M, N, device="cuda", dtype=dtype, requires_grad=True)
    w = torch.randn(N, device="cuda", dtype=dtype, requires_grad=True)
    y = torch.full_like(x, float("nan")); z = torch.full_like(x, float("nan"))
    k_all[(M,)](x, w, y, z, N, BLOCK=64)
    ry, rz = ref(x, w)
    dy, dz = torch.randn_like(x), torch.randn_like(x)
    torch.autograd.backward([ry, rz], [dy, dz])
    g = tg.testing.backward_launch(k_all, (M,), (x, w, y, z, N), {"BLOCK": 64}, {"y_ptr": dy, "z_ptr": dz})
    print(dtype, "fwd", (y - ry).abs().max().item(), (z - rz).abs().max().item(),
          "dx", (g["x_ptr"] - x.grad).abs().max().item(), "dw", (g["w_ptr"] - w.grad).abs().max().item())
print(tg.grad(k_all).src)
