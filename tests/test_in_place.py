"""Kernels that update a tensor in place: each load is followed by a store to the same
address under the same mask, as a rotary embedding applied to q and k in place is written, or reads back
in a later loop what the same lane stored (a chunked fused add + norm). The derived kernel
turns the new values' gradient into the old values' (analysis/in_place.py, memory.py); in an op, the launch record
copies what such a launch overwrites before it runs (and what it read back, where a later launch
overwrites it), and a bare op gives a tensor with a history that a launch updated the new history
(segments.py). Checked in float64 against PyTorch autograd, sizes that are not powers of two, random
upstream gradients."""

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
    # the load's adjoint is stored over the new values' gradient, once every thread has read it (the barrier); its
    # store sets every element the zeros would have
    assert "tl.store(d_x_ptr + row * stride + cols, d_x, mask=mask)" in bwd.src and "tl.debug_barrier()" in bwd.src
    assert "tl.store(d_x_ptr + row * stride + cols, 0.0, mask=mask)" not in bwd.src
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
        scale_rows_in_place(h, w)  # the first launch's backward recomputes against a copy taken before this
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
    """The chunked add + norm (rows longer than one block): the second loop reads back the sums the first wrote
    over x, each lane what it stored (analysis/in_place.py)."""
    row = tl.program_id(0)
    acc = tl.zeros((BLOCK,), dtype=x_ptr.dtype.element_ty)
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
        s = tl.load(x_ptr + row * stride + cols, mask=mask, other=0.0)  # the sums, read back
        w = tl.load(w_ptr + cols, mask=mask, other=0.0)
        tl.store(y_ptr + row * stride + cols, s * rstd * w, mask=mask)


@tritongrad.op
def chunked_add_rmsnorm(x, r, w):
    y = torch.empty_like(x)
    chunked_add_rmsnorm_kernel[(x.shape[0],)](x, r, w, y, x.stride(0), x.shape[1], 1e-6, BLOCK=16)
    return y, x


def add_rmsnorm_reference(x, r, w):
    s = x + r
    return s * torch.rsqrt((s * s).mean(-1, keepdim=True) + 1e-6) * w, s


def assert_all_grads(got, want, inputs, only=None):
    """Outputs alike, and the inputs' gradients alike for random gradients of every output (``only``: of that one)."""
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    given = [torch.randn_like(t) if only is None or i == only else None for i, t in enumerate(want)]
    picked = [i for i, g in enumerate(given) if g is not None]
    grads = [torch.autograd.grad([outs[i] for i in picked], inputs, [given[i] for i in picked])
             for outs in (got, want)]
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("n_cols", [37, 100])
@pytest.mark.parametrize("only", [None, 0], ids=["y-and-x", "only-y"])
def test_a_chunked_add_and_norm_reading_back_its_sums_gets_pytorchs_gradients(device, n_cols, only):
    """Rows of 37 and 100 columns in blocks of 16: the backward recomputes the first loop against x as it was given
    (the launch record's copy) and the second against x as the launch left it, and the second loop's gradient of the
    sums reaches x, r and w through the first loop's store."""
    for _ in range(3):  # fresh inputs; the third backward launches what the second kept (host/launcher.py)
        x, r = leaves((5, n_cols), (5, n_cols), device=device)
        (w,) = leaves((n_cols,), device=device)
        assert_all_grads(chunked_add_rmsnorm(x.clone(), r, w), add_rmsnorm_reference(x, r, w), [x, r, w], only)


def test_a_chunked_add_and_norm_of_a_tensor_without_gradient(device):
    """x needs no gradient, r and w do: the backward still passes the sums' gradient through x's shadow."""
    x = torch.randn(4, 37, dtype=DTYPE, device=device)
    r, w = leaves((4, 37), (37,), device=device)
    assert_all_grads(chunked_add_rmsnorm(x.clone(), r, w), add_rmsnorm_reference(x, r, w), [r, w])


def test_two_chunked_updates_of_one_tensor(device):
    """The second launch overwrites what the first read back: the launch record copies x as the first left it, before
    the second runs."""
    @tritongrad.op
    def twice(x, r1, r2, w):
        y1, y2 = torch.empty_like(x), torch.empty_like(x)
        for r, y in ((r1, y1), (r2, y2)):
            chunked_add_rmsnorm_kernel[(x.shape[0],)](x, r, w, y, x.stride(0), x.shape[1], 1e-6, BLOCK=16)
        return y1, y2, x

    x, r1, r2 = leaves((4, 37), (4, 37), (4, 37), device=device)
    (w,) = leaves((37,), device=device)
    y1, s1 = add_rmsnorm_reference(x, r1, w)
    y2, s2 = add_rmsnorm_reference(s1, r2, w)
    assert_all_grads(twice(x.clone(), r1, r2, w), (y1, y2, s2), [x, r1, r2, w])


def test_changing_the_read_back_tensor_before_the_backward_is_refused_by_pytorch(device):
    x, r = leaves((3, 37), (3, 37), device=device)
    (w,) = leaves((37,), device=device)
    y, s = chunked_add_rmsnorm(x.clone(), r, w)
    s.mul_(2.0)  # what the backward reads back (saved, as the launch left it): its version counter says so
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        torch.autograd.grad(y, x, torch.ones_like(y))


def test_the_derived_kernel_of_a_chunked_add_and_norm(device):
    """Derived directly: it takes `x_ptr_stored`, x as the launch left it, after the shadows (x_ptr: its values
    before), and says so in its docstring."""
    bwd = tritongrad.grad(chunked_add_rmsnorm_kernel)
    assert bwd.wrt == ("x_ptr", "r_ptr", "w_ptr") and bwd.outputs == ("x_ptr", "y_ptr")
    assert bwd.params[-5:] == ("d_x_ptr", "d_y_ptr", "d_r_ptr", "d_w_ptr", "x_ptr_stored")
    assert bwd.stored_params == {"x_ptr": "x_ptr_stored"}
    assert "Then `x_ptr_stored`: `x_ptr` as the forward launch left it" in bwd.src
    assert "tl.load(x_ptr_stored + row * stride + cols_1, mask=mask_1, other=0.0)" in bwd.src
    rows, n = 5, 37
    x, r, w = (torch.randn(*shape, dtype=DTYPE, device=device) for shape in ((rows, n), (rows, n), (n,)))
    new, y = x.clone(), torch.empty_like(x)
    chunked_add_rmsnorm_kernel[(rows,)](new, r, w, y, n, n, 1e-6, BLOCK=16)
    twins = [t.clone().requires_grad_() for t in (x, r, w)]
    want_y, want_s = add_rmsnorm_reference(*twins)
    gy, gs = torch.randn_like(y), torch.randn_like(new)
    want = torch.autograd.grad((want_y, want_s), twins, (gy, gs))
    named = dict(x_ptr=x.clone(), r_ptr=r, w_ptr=w, y_ptr=y, stride=n, n_cols=n, eps=1e-6, BLOCK=16, x_ptr_stored=new)
    got = bwd.gradients((rows,), named, {"x_ptr": gs, "y_ptr": gy})
    for p, b in zip(("x_ptr", "r_ptr", "w_ptr"), want, strict=True):
        torch.testing.assert_close(got[p], b, rtol=1e-10, atol=1e-10)
    dx, dr, dw = gs.clone(), torch.zeros_like(r), torch.zeros_like(w)  # d_x_ptr: the new values' gradient in
    bwd[(rows,)](x.clone(), r, w, y, n, n, 1e-6, 16, dx, gy, dr, dw, new)
    for a, b in zip((dx, dr, dw), want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)
    with pytest.raises(ValueError, match="one tensor was passed to both"):
        bwd.gradients((rows,), {**named, "x_ptr": new}, {"x_ptr": gs, "y_ptr": gy})
    with pytest.raises(TypeError, match="pass a tensor to `x_ptr_stored`"):
        bwd.gradients((rows,), {k: v for k, v in named.items() if k != "x_ptr_stored"}, {"x_ptr": gs, "y_ptr": gy})
    with pytest.raises(ValueError, match="reads back on line .* name `x_ptr` in both wrt and outputs"):
        tritongrad.grad(chunked_add_rmsnorm_kernel, wrt=("r_ptr", "w_ptr"), outputs=("x_ptr", "y_ptr"))


@triton.jit
def grid_stride_product_kernel(x_ptr, r_ptr, w_ptr, y_ptr, stride, n_rows, n_cols, BLOCK: tl.constexpr):
    """Both loops inside a loop over rows (a program per few rows): x = x * r stored, read back row by row."""
    for row in range(tl.program_id(0), n_rows, tl.num_programs(0)):
        acc = tl.zeros((BLOCK,), dtype=x_ptr.dtype.element_ty)
        for start in range(0, n_cols, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            mask = cols < n_cols
            a = tl.load(x_ptr + row * stride + cols, mask=mask, other=0.0)
            r = tl.load(r_ptr + row * n_cols + cols, mask=mask, other=0.0)
            tl.store(x_ptr + row * stride + cols, a * r, mask=mask)
            acc += (a * r) * (a + r)
        t = tl.sum(acc, axis=0)
        for start in range(0, n_cols, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            mask = cols < n_cols
            p = tl.load(x_ptr + row * stride + cols, mask=mask, other=0.0)  # this row's products, read back
            w = tl.load(w_ptr + cols, mask=mask, other=0.0)
            tl.store(y_ptr + row * n_cols + cols, tl.sin(p) * w + t, mask=mask)


def test_reading_back_inside_a_loop_over_rows(device):
    @tritongrad.op
    def products(x, r, w):
        y = torch.empty_like(r)
        grid_stride_product_kernel[(2,)](x, r, w, y, x.stride(0), r.shape[0], r.shape[1], BLOCK=16)
        return y, x

    x, r = leaves((5, 37), (5, 37), device=device)
    (w,) = leaves((37,), device=device)
    p = x * r
    want = (torch.sin(p) * w + (p * (x + r)).sum(-1, keepdim=True), p)
    assert_all_grads(products(x.clone(), r, w), want, [x, r, w])


@triton.jit
def chunked_rmsnorm_kernel(x_ptr, r_ptr, w_ptr, y_ptr, stride, n_cols, eps, HAS_RESIDUAL: tl.constexpr,
                           BLOCK: tl.constexpr):
    """As production kernels write it, a flag choosing whether the residual is added (and the sums stored over x)."""
    row = tl.program_id(0)
    acc = tl.zeros((BLOCK,), dtype=x_ptr.dtype.element_ty)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < n_cols
        s = tl.load(x_ptr + row * stride + cols, mask=mask, other=0.0)
        if HAS_RESIDUAL:
            s += tl.load(r_ptr + row * stride + cols, mask=mask, other=0.0)
            tl.store(x_ptr + row * stride + cols, s, mask=mask)
        acc += s * s
    rstd = 1.0 / tl.sqrt(tl.sum(acc, axis=0) / n_cols + eps)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < n_cols
        s = tl.load(x_ptr + row * stride + cols, mask=mask, other=0.0)  # the sums read back, or x
        w = tl.load(w_ptr + cols, mask=mask, other=0.0)
        tl.store(y_ptr + row * stride + cols, s * rstd * w, mask=mask)


@pytest.mark.parametrize("residual", [True, False])
def test_a_chunked_norm_whose_flag_decides_whether_it_stores_and_reads_back(device, residual):
    """The op's roles see both branches (x may be read back); the launch's specialization decides: with the
    residual, the backward takes x as the launch left it, without, x is only read."""
    @tritongrad.op
    def norm(x, r, w):
        y = torch.empty_like(x)
        chunked_rmsnorm_kernel[(x.shape[0],)](x, r, w, y, x.stride(0), x.shape[1], 1e-6, HAS_RESIDUAL=residual,
                                              BLOCK=16)
        return y, x

    for _ in range(3):  # (the third backward launches what the second kept)
        x, r = leaves((4, 37), (4, 37), device=device)
        (w,) = leaves((37,), device=device)
        assert_all_grads(norm(x.clone(), r, w), add_rmsnorm_reference(x, r if residual else 0.0 * r, w), [x, r, w])
    assert ("x_ptr_stored" in tritongrad.grad(chunked_rmsnorm_kernel, constexprs={"HAS_RESIDUAL": residual}).params
            ) == residual


# -- what cannot be read back: refused, naming the lines -------------------------------------------------


@triton.jit
def read_back_shifted_kernel(x_ptr, r_ptr, y_ptr, stride, n_cols, SHIFT_ROW: tl.constexpr, BLOCK: tl.constexpr):
    """Reads back the element of the next lane (or of the next program's row): not what this lane stored."""
    row = tl.program_id(0)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < n_cols
        s = tl.load(x_ptr + row * stride + cols, mask=mask) + tl.load(r_ptr + row * stride + cols, mask=mask)
        tl.store(x_ptr + row * stride + cols, s, mask=mask)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols + 1 < n_cols
        if SHIFT_ROW:
            s = tl.load(x_ptr + (row + 1) * stride + cols, mask=mask)  # refused: another program's
        else:
            s = tl.load(x_ptr + row * stride + cols + 1, mask=mask)  # refused: another lane's
        tl.store(y_ptr + row * stride + cols, s * 2.0, mask=mask)


@triton.jit
def read_first_block_after_the_loop_kernel(x_ptr, r_ptr, y_ptr, stride, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < n_cols
        s = tl.load(x_ptr + row * stride + cols, mask=mask) + tl.load(r_ptr + row * stride + cols, mask=mask)
        tl.store(x_ptr + row * stride + cols, s, mask=mask)
    cols = tl.arange(0, BLOCK)
    first = tl.load(x_ptr + row * stride + cols, mask=cols < n_cols)  # refused: not in a loop like the store's
    tl.store(y_ptr + row * stride + cols, first * 2.0, mask=cols < n_cols)


@triton.jit
def read_back_then_store_again_kernel(x_ptr, r_ptr, y_ptr, stride, n_cols, LATER: tl.constexpr,
                                      BLOCK: tl.constexpr):
    """Reads back the sums, then stores over them again: in the same loop, or in a later one."""
    row = tl.program_id(0)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < n_cols
        s = tl.load(x_ptr + row * stride + cols, mask=mask) + tl.load(r_ptr + row * stride + cols, mask=mask)
        tl.store(x_ptr + row * stride + cols, s, mask=mask)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < n_cols
        s = tl.load(x_ptr + row * stride + cols, mask=mask)  # read back
        tl.store(y_ptr + row * stride + cols, s * 2.0, mask=mask)
        if not LATER:
            tl.store(x_ptr + row * stride + cols, s * 3.0, mask=mask)  # x changed again
    if LATER:
        for start in range(0, n_cols, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            tl.store(x_ptr + row * stride + cols, tl.zeros((BLOCK,), dtype=tl.float64), mask=cols < n_cols)


def _line(kernel, marker: str) -> int:
    """The line of ``kernel`` whose text holds ``marker``."""
    import inspect

    lines, first = inspect.getsourcelines(kernel.fn)
    return first + next(i for i, text in enumerate(lines) if marker in text)


@pytest.mark.parametrize("shift_row", [False, True], ids=["another-lane", "another-program"])
def test_reading_back_another_lanes_or_programs_element_is_refused_naming_both_lines(shift_row):
    marker = "another program's" if shift_row else "another lane's"
    with pytest.raises(tritongrad.NotDifferentiableError, match=r"a load from `x_ptr` after the store to it on line "
                       rf"{_line(read_back_shifted_kernel, 'tl.store(x_ptr')}.*its address or mask is not the "
                       "store's") as e:
        tritongrad.grad(read_back_shifted_kernel, constexprs={"SHIFT_ROW": shift_row})
    assert e.value.line == _line(read_back_shifted_kernel, marker)
    assert "in a loop over the same range as the store's" in e.value.hint and "another tensor" in e.value.hint


def test_a_load_after_the_store_at_addresses_no_store_matches_is_refused():
    with pytest.raises(tritongrad.NotDifferentiableError, match="not each directly in loops nested alike") as e:
        tritongrad.grad(read_first_block_after_the_loop_kernel)
    assert e.value.line == _line(read_first_block_after_the_loop_kernel, "refused")
    assert f"on line {_line(read_first_block_after_the_loop_kernel, 'tl.store(x_ptr')}" in str(e.value)


@pytest.mark.parametrize("later", [False, True], ids=["same-loop", "later-loop"])
def test_storing_again_over_what_was_read_back_is_refused(later):
    kernel = read_back_then_store_again_kernel
    first = _line(kernel, "tl.store(x_ptr + row * stride + cols, s, mask=mask)")
    with pytest.raises(tritongrad.NotDifferentiableError) as e:
        tritongrad.grad(kernel, constexprs={"LATER": later})
    if later:  # the later store is named, with the load it follows
        assert e.value.line == _line(kernel, "tl.zeros((BLOCK,)")
        assert (f"a store to `x_ptr` after the load on line {_line(kernel, '# read back')} that reads back what line "
                f"{first} stored: `x_ptr` changes again") in str(e.value)
    else:
        assert e.value.line == _line(kernel, "# read back")
        assert (f"reads back what the store on line {first} wrote, then stored over again on line "
                f"{_line(kernel, 'x changed again')}") in str(e.value)


@triton.jit
def read_back_at_a_moving_offset_kernel(x_ptr, r_ptr, y_ptr, n, BLOCK: tl.constexpr):
    """The store's address moves with `off`, carried by its loop; the load reads `off` after that loop, where it
    holds its last value: the same text, another address."""
    off = tl.zeros((), dtype=tl.int32)
    for start in range(0, n, BLOCK):
        tl.store(x_ptr + off + tl.arange(0, BLOCK), tl.load(r_ptr + start + tl.arange(0, BLOCK)) * 2.0)
        off += BLOCK
    for start in range(0, n, BLOCK):
        v = tl.load(x_ptr + off + tl.arange(0, BLOCK))  # refused: `off` moved on
        tl.store(y_ptr + start + tl.arange(0, BLOCK), v)


def test_reading_back_through_a_name_assigned_more_than_once_is_refused():
    with pytest.raises(tritongrad.NotDifferentiableError, match="it reads `off`, assigned more than once") as e:
        tritongrad.grad(read_back_at_a_moving_offset_kernel)
    assert e.value.line == _line(read_back_at_a_moving_offset_kernel, "refused")


@triton.jit
def read_back_at_a_ticket_kernel(x_ptr, r_ptr, y_ptr, counter_ptr, n, BLOCK: tl.constexpr):
    """Each loop takes its block's address from an atomic counter: the same text, another value each time."""
    for start in range(0, n, BLOCK):
        t = tl.atomic_add(counter_ptr, 1)
        tl.store(x_ptr + t * BLOCK + tl.arange(0, BLOCK), tl.load(r_ptr + start + tl.arange(0, BLOCK)) * 2.0)
    for start in range(0, n, BLOCK):
        t = tl.atomic_add(counter_ptr, 1)
        v = tl.load(x_ptr + t * BLOCK + tl.arange(0, BLOCK))  # refused: another ticket
        tl.store(y_ptr + start + tl.arange(0, BLOCK), v)


def test_reading_back_through_a_value_two_evaluations_may_give_differently_is_refused():
    with pytest.raises(tritongrad.NotDifferentiableError, match="it reads `t`, which two evaluations may give") as e:
        tritongrad.grad(read_back_at_a_ticket_kernel, wrt=("x_ptr", "r_ptr"), outputs=("x_ptr", "y_ptr"))
    assert e.value.line == _line(read_back_at_a_ticket_kernel, "refused")


@triton.jit
def shared_counter_kernel(x_ptr, w_ptr, y_ptr, n, BLOCK: tl.constexpr):
    # every program updates the same elements of x in place (no program id in their address): a program may read
    # another's new values, so the values the backward recomputes (x as it was) need not be those the forward used
    pid = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
    tl.store(x_ptr + offs, x + 1.0, mask=offs < n)
    w = tl.load(w_ptr + pid * n + offs, mask=offs < n, other=0.0)
    tl.store(y_ptr + pid * n + offs, x * w, mask=offs < n)


def test_a_tensor_updated_in_place_by_every_program_is_refused_when_only_others_are_differentiated(device):
    """x gets no gradient and is no output, yet the gradient of w reads x's values: its in-place stores must write
    each element once, as an output's must."""
    bwd = tritongrad.grad(shared_counter_kernel, wrt=("w_ptr",), outputs=("y_ptr",))
    x = torch.randn(13, dtype=DTYPE, device=device)
    w = torch.randn(3, 13, dtype=DTYPE, device=device)
    d_y = torch.randn(3, 13, dtype=DTYPE, device=device)
    with pytest.raises(tritongrad.NotDifferentiableError, match="x_ptr"):
        bwd.gradients((3,), dict(x_ptr=x, w_ptr=w, y_ptr=torch.empty_like(w), n=13, BLOCK=16), {"y_ptr": d_y})
    one = bwd.gradients((1,), dict(x_ptr=x, w_ptr=w[:1], y_ptr=torch.empty_like(w[:1]), n=13, BLOCK=16),
                        {"y_ptr": d_y[:1]})  # one program: each element updated once
    torch.testing.assert_close(one["w_ptr"], d_y[:1] * x)


@tritongrad.op("tgtest_in_place::chained")
def named_chained(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    h = torch.empty_like(x)
    square_kernel[(triton.cdiv(x.numel(), 64),)](x, h, x.numel(), BLOCK=64)
    scale_rows_in_place(h, w)  # overwrites what it read: the saved h is the last launch's, not what this one read
    scale_rows_in_place(h, w)
    return h


def test_a_compiled_named_op_updating_its_own_buffer_in_place(device):
    """torch.compile saves the op's outputs and buffers as its launches left them; a launch that overwrote what it
    (or an earlier one) read cannot recompute against those, so the compiled backward runs the launches again."""
    compiled = torch.compile(lambda x, w: named_chained(x, w).sin(), fullgraph=True, backend="aot_eager")
    x, w = leaves((5, 37), (37,), device=device)
    twins = [t.detach().clone().requires_grad_() for t in (x, w)]
    want = (torch.tanh(torch.tanh(twins[0] ** 2) * twins[1]) * twins[1]).sin()
    assert_grads(compiled(x, w), want, [x, w], twins)



@triton.jit
def chunked_add_layer_norm_kernel(x_ptr, r_ptr, y_ptr, stride, n_cols, eps, BLOCK: tl.constexpr):
    """The sums x + r stored over x by the first loop and read back by the two after it (variance, output)."""
    row = tl.program_id(0)
    total = tl.zeros((BLOCK,), dtype=x_ptr.dtype.element_ty)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < n_cols
        s = tl.load(x_ptr + row * stride + cols, mask=mask, other=0.0) + tl.load(r_ptr + row * stride + cols,
                                                                                  mask=mask, other=0.0)
        tl.store(x_ptr + row * stride + cols, s, mask=mask)
        total += s
    mean = tl.sum(total, axis=0) / n_cols
    squares = tl.zeros((BLOCK,), dtype=x_ptr.dtype.element_ty)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < n_cols
        centred = tl.where(mask, tl.load(x_ptr + row * stride + cols, mask=mask, other=0.0) - mean, 0.0)
        squares += centred * centred
    rstd = 1.0 / tl.sqrt(tl.sum(squares, axis=0) / n_cols + eps)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < n_cols
        s = tl.load(x_ptr + row * stride + cols, mask=mask, other=0.0)
        tl.store(y_ptr + row * stride + cols, (s - mean) * rstd, mask=mask)


@pytest.mark.parametrize("rows, n_cols", [(5, 37), (1, 5)])
def test_sums_read_back_by_two_later_loops(device, rows, n_cols):
    @tritongrad.op
    def add_norm(x, r):
        y = torch.empty_like(x)
        chunked_add_layer_norm_kernel[(x.shape[0],)](x, r, y, x.stride(0), x.shape[1], 1e-5, BLOCK=16)
        return y, x

    x, r = leaves((rows, n_cols), (rows, n_cols), device=device)
    s = x + r
    want = (torch.nn.functional.layer_norm(s, (n_cols,), eps=1e-5), s)
    assert_all_grads(add_norm(x.clone(), r), want, [x, r])


@pytest.mark.parametrize("rows", [4, 1])
def test_a_chunked_add_and_norm_over_one_expanded_row(device, rows):
    """x's rows one row (stride 0, y's too: one stride): every program would store over the same elements, refused
    at the launch naming a store; with one program, accepted."""
    x, r = leaves((1, 37), (rows, 37), device=device)
    (w,) = leaves((37,), device=device)

    @tritongrad.op
    def norm(x, r, w):
        h = (x * 1.0).expand(rows, 37)
        y = torch.empty_like(r)
        chunked_add_rmsnorm_kernel[(rows,)](h, r, w, y, 0, 37, 1e-6, BLOCK=16)
        return y, h

    if rows > 1:
        y, _ = norm(x, r, w)
        with pytest.raises(tritongrad.NotDifferentiableError, match="whose lanes may write the same element"):
            torch.autograd.grad(y, (x, r, w), torch.ones_like(y))
        return
    assert_all_grads(norm(x, r, w), add_rmsnorm_reference(x, r, w), [x, r, w])


def test_an_in_place_update_of_some_columns_of_a_buffer_returned_whole(device):
    """The segment's node takes h too: columns 2:8's gradient goes through the kernel's backward to the view, the
    others' to h's history (a * 1.0 -> a); they were refused before as memory read outside x (more in
    tests/test_in_place_views.py)."""
    @tritongrad.op
    def scale_columns(a, w):
        h = a * 1.0
        scale_rows_in_place_kernel[(h.shape[0],)](h[:, 2:8], w, h.stride(0), 6, BLOCK=8)
        return h

    a, w = leaves((4, 10), (6,), device=device)
    twins = [t.detach().clone().requires_grad_() for t in (a, w)]
    want = torch.cat([twins[0][:, :2], torch.tanh(twins[0][:, 2:8]) * twins[1], twins[0][:, 8:]], dim=1)
    assert_grads(scale_columns(a, w), want, [a, w], twins)


@triton.jit
def flagged_update_kernel(x_ptr, y_ptr, n, STOP: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    if STOP:  # (the update and everything after it dropped by the specialization)
        return
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    tl.store(x_ptr + offs, 2.0 * x, mask=mask)
    tl.store(y_ptr + offs, 3.0 * x, mask=mask)


@pytest.mark.parametrize("stop", [False, True])
def test_an_in_place_tensor_a_specialization_leaves_alone_passes_its_gradient_through(device, stop):
    """x named in both wrt and outputs, its update switched off by a constexpr: its values pass through the launch,
    so the old values' gradient is the new values' (found by the fuzzer's in_place family, seed 4102 kernel 101:
    the gradient came back zero)."""
    from tritongrad.tools.testing import backward_launch

    x = torch.randn(10, dtype=DTYPE, device=device)
    y = torch.zeros(10, dtype=DTYPE, device=device)
    new = x.clone()
    flagged_update_kernel[(1,)](new, y, 10, STOP=stop, BLOCK=16)
    gx, gy = torch.randn(10, dtype=DTYPE, device=device), torch.randn(10, dtype=DTYPE, device=device)
    got = backward_launch(flagged_update_kernel, (1,), (), dict(x_ptr=x.clone(), y_ptr=y, n=10, STOP=stop, BLOCK=16),
                          {"x_ptr": gx, "y_ptr": gy})
    torch.testing.assert_close(got["x_ptr"], gx if stop else 2.0 * gx + 3.0 * gy, rtol=1e-10, atol=1e-10)
