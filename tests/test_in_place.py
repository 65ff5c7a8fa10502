"""Kernels that update a tensor in place (issue 11 #5): each load is followed by a store to the same
address under the same mask, as a rotary embedding applied to q and k in place is written. The derived
kernel turns the new values' gradient into the old values' (analysis.in_place_pointers, memory.py); in an
op, the tape copies what such a launch overwrites before it runs, and a bare op gives a tensor with a
history that a launch updated the new history (segments.py). Checked in float64 against PyTorch autograd,
sizes that are not powers of two, random upstream gradients."""

import pytest
import torch
import triton
import triton.language as tl

import tritongrad
from tritongrad.core.errors import OpError

DTYPE = torch.float64


@triton.jit
def rotary_in_place_kernel(q_ptr, k_ptr, cos_ptr, sin_ptr, stride_q, stride_k, half, BLOCK: tl.constexpr):
    """One program per token: q and k rotated in place, each row's two halves read, then overwritten."""
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < half
    cos = tl.load(cos_ptr + row * half + cols, mask=mask, other=0.0)
    sin = tl.load(sin_ptr + row * half + cols, mask=mask, other=0.0)
    q1 = tl.load(q_ptr + row * stride_q + cols, mask=mask, other=0.0)
    q2 = tl.load(q_ptr + row * stride_q + half + cols, mask=mask, other=0.0)
    tl.store(q_ptr + row * stride_q + cols, q1 * cos - q2 * sin, mask=mask)
    tl.store(q_ptr + row * stride_q + half + cols, q2 * cos + q1 * sin, mask=mask)
    k1 = tl.load(k_ptr + row * stride_k + cols, mask=mask, other=0.0)
    k2 = tl.load(k_ptr + row * stride_k + half + cols, mask=mask, other=0.0)
    tl.store(k_ptr + row * stride_k + cols, k1 * cos - k2 * sin, mask=mask)
    tl.store(k_ptr + row * stride_k + half + cols, k2 * cos + k1 * sin, mask=mask)


def rotary_in_place(q, k, cos, sin):
    """As production host functions do it: q and k changed in place, nothing returned."""
    half = q.shape[1] // 2
    rotary_in_place_kernel[(q.shape[0],)](q, k, cos, sin, q.stride(0), k.stride(0), half,
                                          BLOCK=triton.next_power_of_2(half))


def rotary_reference(x, cos, sin):
    half = x.shape[1] // 2
    x1, x2 = x[:, :half], x[:, half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=1)


@triton.jit
def scale_rows_in_place_kernel(x_ptr, w_ptr, stride, n, BLOCK: tl.constexpr):
    """One program per row, a loop over column blocks: x = tanh(x) * w, in place."""
    row = tl.program_id(0)
    for start in range(0, n, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < n
        x = tl.load(x_ptr + row * stride + cols, mask=mask, other=0.0)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0)
        e = tl.exp(2.0 * x)
        tl.store(x_ptr + row * stride + cols, (e - 1.0) / (e + 1.0) * w, mask=mask)


def scale_rows_in_place(x, w):
    scale_rows_in_place_kernel[(x.shape[0],)](x, w, x.stride(0), x.shape[1], BLOCK=16)


@triton.jit
def square_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(y_ptr + offs, x * x, mask=mask)


def leaves(*shapes, device):
    return [torch.randn(*shape, dtype=DTYPE, device=device, requires_grad=True) for shape in shapes]


def assert_grads(got_out, want_out, inputs, twins):
    torch.testing.assert_close(got_out, want_out, rtol=1e-10, atol=1e-10)
    g = torch.randn_like(want_out)
    for a, b in zip(torch.autograd.grad(got_out, inputs, g), torch.autograd.grad(want_out, twins, g), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


def test_rotary_embedding_applied_to_q_and_k_in_place(device):
    @tritongrad.op
    def attention_inputs(x, wq, wk, cos, sin):
        q, k = x @ wq, x @ wk  # tensors with a history, rotated in place by the kernel
        rotary_in_place(q, k, cos, sin)
        return torch.cat([q, k], dim=1)

    tokens, dim, head = 7, 10, 2 * 13  # half = 13: a masked block of 16
    inputs = leaves((tokens, dim), (dim, head), (dim, head), (tokens, head // 2), (tokens, head // 2), device=device)
    twins = [t.detach().clone().requires_grad_() for t in inputs]
    x, wq, wk, cos, sin = twins
    want = torch.cat([rotary_reference(x @ wq, cos, sin), rotary_reference(x @ wk, cos, sin)], dim=1)
    assert_grads(attention_inputs(*inputs), want, inputs, twins)


def test_chained_in_place_updates_of_a_buffer_a_launch_wrote(device):
    @tritongrad.op
    def f(x, w):
        h = torch.empty_like(x)
        square_kernel[(triton.cdiv(x.numel(), 64),)](x, h, x.numel(), BLOCK=64)
        scale_rows_in_place(h, w)  # reads what the first launch wrote, overwrites it
        scale_rows_in_place(h, w)
        return h

    x, w = leaves((5, 37), (37,), device=device)
    twins = [t.detach().clone().requires_grad_() for t in (x, w)]
    want = torch.tanh(torch.tanh(twins[0] ** 2) * twins[1]) * twins[1]
    assert_grads(f(x, w), want, [x, w], twins)


def test_the_derived_kernel_of_an_in_place_update(device):
    bwd = tritongrad.grad(scale_rows_in_place_kernel)
    assert bwd.wrt == ("x_ptr", "w_ptr") and bwd.outputs == ("x_ptr",)
    assert list(bwd.shadow_params) == ["x_ptr", "w_ptr"] and bwd.params.count("d_x_ptr") == 1
    assert "tl.store(d_x_ptr + row * stride + cols, 0.0, mask=mask)" in bwd.src and "tl.debug_barrier()" in bwd.src
    x, w = torch.randn(6, 45, dtype=DTYPE, device=device), torch.randn(45, dtype=DTYPE, device=device)
    g = torch.randn(6, 45, dtype=DTYPE, device=device)
    twins = [t.clone().requires_grad_() for t in (x, w)]
    want = torch.autograd.grad(torch.tanh(twins[0]) * twins[1], twins, g)
    named = dict(x_ptr=x.clone(), w_ptr=w, stride=45, n=45, BLOCK=16)  # x_ptr: the values before the update
    got = bwd.gradients((6,), named, {"x_ptr": g})
    torch.testing.assert_close(got["x_ptr"], want[0], rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(got["w_ptr"], want[1], rtol=1e-10, atol=1e-10)


def test_a_named_op_updating_its_argument_in_place_is_refused_with_the_way_out(device):
    @tritongrad.op("tgtest_in_place::scale")
    def scale(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        scale_rows_in_place(x, w)
        return x

    with pytest.raises(OpError, match=r"writes to `x_ptr`, a tensor that requires grad.*a bare @tritongrad.op may "
                                      "update such a tensor in place"):
        scale(*leaves((3, 20), (20,), device=device))


def test_a_leaf_updated_in_place_is_refused_by_pytorch(device):
    @tritongrad.op
    def scale(x, w):
        scale_rows_in_place(x, w)
        return x

    with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
        scale(*leaves((3, 20), (20,), device=device))


def test_an_in_place_update_of_memory_an_earlier_launch_read(device):
    @tritongrad.op
    def f(x, w):
        h = x * 1.0
        y = torch.empty_like(h)
        square_kernel[(triton.cdiv(h.numel(), 64),)](h, y, h.numel(), BLOCK=64)
        scale_rows_in_place(h, w)  # the first launch's backward replays against a copy taken before this
        return y, h

    x, w = leaves((3, 20), (20,), device=device)
    twins = [t.detach().clone().requires_grad_() for t in (x, w)]
    want = torch.cat([twins[0] ** 2, torch.tanh(twins[0]) * twins[1]])
    assert_grads(torch.cat(f(x, w)), want, [x, w], twins)


@triton.jit
def mul_kernel(a_ptr, b_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(a_ptr + offs, mask=mask) * tl.load(b_ptr + offs, mask=mask), mask=mask)


def test_a_buffer_a_later_launch_overwrites_is_read_as_it_was(device):
    @tritongrad.op
    def f(x, b):
        y = torch.empty_like(x)
        grid = (triton.cdiv(x.numel(), 32),)
        mul_kernel[grid](x, b, y, x.numel(), BLOCK=32)
        square_kernel[grid](x, b, x.numel(), BLOCK=32)  # b overwritten: the copy taken before keeps its values
        return y

    (x,) = leaves((70,), device=device)
    b = torch.randn(70, dtype=DTYPE, device=device)
    twin = x.detach().clone().requires_grad_()
    assert_grads(f(x, b.clone()), twin * b, [x], [twin])


@triton.jit
def double_and_clear_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    """y = 2 x, and x cleared in place: a value without gradient stored over it."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    tl.store(y_ptr + offs, x * 2.0, mask=mask)
    tl.store(x_ptr + offs, tl.zeros_like(x), mask=mask)


def test_the_gradient_of_values_overwritten_by_a_constant_does_not_reach_the_old_ones(device):
    """The store's adjoint zeroes the new values' gradient even where the stored value has none (it once left it
    there, and the old values got it as theirs)."""
    @tritongrad.op
    def double_and_clear(x):
        y = torch.empty_like(x)
        double_and_clear_kernel[(triton.cdiv(x.numel(), 32),)](x, y, x.numel(), BLOCK=32)
        return y, x

    (x,) = leaves((70,), device=device)
    twin = x.detach().clone().requires_grad_()
    assert_grads(torch.cat(double_and_clear(x.clone())), torch.cat([twin * 2.0, twin * 0.0]), [x], [twin])


# -- reading back what was stored ----------------------------------------------------------------------


@triton.jit
def softplus_then_scale_kernel(x_ptr, y_ptr, z_ptr, stride, n, BLOCK: tl.constexpr):
    """Stores softplus(x) per block, reads it back to scale x by it (a loop over column blocks)."""
    row = tl.program_id(0)
    for start in range(0, n, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < n
        x = tl.load(x_ptr + row * stride + cols, mask=mask, other=0.0)
        tl.store(y_ptr + row * stride + cols, tl.log(1.0 + tl.exp(x)), mask=mask)
        y = tl.load(y_ptr + row * stride + cols, mask=mask, other=0.0)  # what this lane just stored
        tl.store(z_ptr + row * stride + cols, x * y, mask=mask)


@triton.jit
def read_back_a_neighbour_kernel(x_ptr, y_ptr, z_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=mask) * 2.0, mask=mask)
    y = tl.load(y_ptr + offs + 1, mask=offs + 1 < n)  # another lane's element: # refused
    tl.store(z_ptr + offs, y, mask=offs + 1 < n)


def test_a_value_read_back_after_it_was_stored_is_the_stored_value(device):
    @tritongrad.op
    def softplus_then_scale(x):
        y, z = torch.full_like(x, float("nan")), torch.full_like(x, float("nan"))  # poisoned
        softplus_then_scale_kernel[(x.shape[0],)](x, y, z, x.stride(0), x.shape[1], BLOCK=16)
        return y, z

    (x,) = leaves((5, 37), device=device)
    twin = x.detach().clone().requires_grad_()
    y, z = softplus_then_scale(x)
    want_y = torch.nn.functional.softplus(twin)
    want_z = twin * want_y
    torch.testing.assert_close(y, want_y, rtol=1e-10, atol=1e-10)
    gy, gz = torch.randn_like(y), torch.randn_like(z)
    got = torch.autograd.grad((y, z), x, (gy, gz))[0]
    torch.testing.assert_close(got, torch.autograd.grad((want_y, want_z), twin, (gy, gz))[0], rtol=1e-10,
                               atol=1e-10)
    assert "# what this lane just stored" in tritongrad.grad(softplus_then_scale_kernel).src


def test_reading_back_another_lanes_element_is_refused():
    with pytest.raises(tritongrad.NotDifferentiableError, match="read back only what the same lane stored") as e:
        tritongrad.grad(read_back_a_neighbour_kernel)
    assert e.value.line == read_back_a_neighbour_kernel.fn.__code__.co_firstlineno + 5


@triton.jit
def read_back_elsewhere_kernel(x_ptr, y_ptr, z_ptr, BLOCK: tl.constexpr):
    """Stores y[3 i] and reads y[2 i + 1]: written out through their temporaries, `offs * (two + 1)` and
    `offs * two + 1` must not read alike (they once compared equal as text, and the load was forwarded)."""
    offs = tl.arange(0, BLOCK)
    two = offs * 0 + 2
    tl.store(y_ptr + offs * (two + 1), tl.load(x_ptr + offs) * 3.0)
    y = tl.load(y_ptr + offs * two + 1)  # refused: not what this lane stored
    tl.store(z_ptr + offs, y)


def test_addresses_compare_with_their_precedence():
    with pytest.raises(tritongrad.NotDifferentiableError, match="`y_ptr`") as e:
        tritongrad.grad(read_back_elsewhere_kernel)
    assert e.value.line == read_back_elsewhere_kernel.fn.__code__.co_firstlineno + 7


@triton.jit
def fused_add_rmsnorm_kernel(x_ptr, r_ptr, w_ptr, y_ptr, stride, n_cols, eps, BLOCK: tl.constexpr):
    """The residual stream's convention (vLLM, Liger): the sum x + r written back into x, its norm into y."""
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride + cols, mask=mask, other=0.0)
    r = tl.load(r_ptr + row * stride + cols, mask=mask, other=0.0)
    s = x + r
    tl.store(x_ptr + row * stride + cols, s, mask=mask)
    rstd = 1.0 / tl.sqrt(tl.sum(s * s, axis=0) / n_cols + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0)
    tl.store(y_ptr + row * stride + cols, s * rstd * w, mask=mask)


@tritongrad.op
def fused_add_rmsnorm(x, r, w):
    y = torch.empty_like(x)
    fused_add_rmsnorm_kernel[(x.shape[0],)](x, r, w, y, x.stride(0), x.shape[1], 1e-6,
                                            BLOCK=triton.next_power_of_2(x.shape[1]))
    return y, x


def test_a_fused_add_and_norm_writing_the_sum_into_x_gets_pytorchs_gradients(device):
    x0 = torch.randn(6, 37, dtype=DTYPE, device=device, requires_grad=True)
    r = torch.randn(6, 37, dtype=DTYPE, device=device, requires_grad=True)
    w = torch.randn(37, dtype=DTYPE, device=device, requires_grad=True)
    y, s = fused_add_rmsnorm(x0.clone(), r, w)
    want_s = x0 + r
    want_y = want_s * torch.rsqrt((want_s * want_s).mean(-1, keepdim=True) + 1e-6) * w
    torch.testing.assert_close(s, want_s)
    torch.testing.assert_close(y, want_y)
    gy, gs = torch.randn_like(y), torch.randn_like(s)
    got = torch.autograd.grad((y, s), (x0, r, w), (gy, gs))
    for name, a, b in zip(("x", "r", "w"), got, torch.autograd.grad((want_y, want_s), (x0, r, w), (gy, gs)),
                          strict=True):
        torch.testing.assert_close(a, b, msg=f"d{name}")


def test_a_fused_add_and_norm_where_only_the_norm_gets_a_gradient(device):
    """The new x gets no gradient: the backward still passes x's through its shadow (zero there), as an output."""
    x0, r = leaves((6, 37), (6, 37), device=device)
    (w,) = leaves((37,), device=device)
    y, _ = fused_add_rmsnorm(x0.clone(), r, w)
    s = x0 + r
    want = s * torch.rsqrt((s * s).mean(-1, keepdim=True) + 1e-6) * w
    g = torch.randn_like(want)
    for a, b in zip(torch.autograd.grad(y, (x0, r, w), g), torch.autograd.grad(want, (x0, r, w), g), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


@triton.jit
def chunked_add_rmsnorm_kernel(x_ptr, r_ptr, w_ptr, y_ptr, stride, n_cols, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < n_cols
        s = tl.load(x_ptr + row * stride + cols, mask=mask, other=0.0) + tl.load(r_ptr + row * stride + cols,
                                                                                  mask=mask, other=0.0)
        tl.store(x_ptr + row * stride + cols, s, mask=mask)
        acc += s * s
    rstd = 1.0 / tl.sqrt(tl.sum(acc, axis=0) / n_cols + eps)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < n_cols
        s = tl.load(x_ptr + row * stride + cols, mask=mask, other=0.0)  # refused: reads back the first loop's sums
        w = tl.load(w_ptr + cols, mask=mask, other=0.0)
        tl.store(y_ptr + row * stride + cols, s * rstd * w, mask=mask)


def test_reading_back_in_another_loop_what_the_kernel_overwrote_is_refused_naming_the_store():
    """The chunked add + norm (rows too long for one block): the second loop reads the sums the first wrote over x.
    Not yet differentiated (the backward would need x's values before and after); refused naming both lines."""
    read_back = r"a load from `x_ptr` after the store to it on line \d+"
    with pytest.raises(tritongrad.NotDifferentiableError, match=read_back) as e:
        tritongrad.grad(chunked_add_rmsnorm_kernel, wrt=("x_ptr", "r_ptr", "w_ptr"), outputs=("x_ptr", "y_ptr"))
    assert "another tensor" in str(e.value)
