"""``tritongrad.op``: gradients of host functions that launch kernels, against torch autograd.

Every check runs the op and a plain-PyTorch twin on the same random float64 inputs
(sizes not powers of two), backpropagates the same fresh random upstream gradients,
and compares. The ``derived`` fixture records which backward kernels ran.
"""

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import triton
import triton.language as tl

import tritongrad
from tritongrad.core.errors import OpError
from tritongrad.examples import EXAMPLES
from tritongrad.host import backward as op_backward
from tritongrad.host import hooks, kernel_roles, planning
from tritongrad.host.backward import PlannedBackward
from tritongrad.runtime import derivation

DEVICE = "cuda" if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1" else "cpu"

BLOCK = 64


def assert_close(got, want, tol=1e-10):
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)


# -- kernels -----------------------------------------------------------------------------------------


@triton.jit
def mul_kernel(a_ptr, b_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    a = tl.load(a_ptr + offs, mask=mask)
    b = tl.load(b_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, a * b, mask=mask)


@triton.jit
def sin_mul_kernel(a_ptr, b_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    a = tl.load(a_ptr + offs, mask=mask)
    b = tl.load(b_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, tl.sin(a) * b, mask=mask)


@triton.jit
def exp_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, tl.exp(x), mask=mask)


@triton.jit
def square_add_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.atomic_add(out_ptr + offs, x * x, mask=mask)


@triton.jit
def rows_kernel(x_ptr, w_ptr, y_ptr, n_cols, stride_xr, stride_xc, stride_yr, stride_yc, BLOCK: tl.constexpr):
    """y[r, c] = tanh(x[r, c]) * w[c], any strides."""
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride_xr + cols * stride_xc, mask=mask)
    w = tl.load(w_ptr + cols, mask=mask)
    t = 2.0 * tl.sigmoid(2.0 * x) - 1.0
    tl.store(y_ptr + row * stride_yr + cols * stride_yc, t * w, mask=mask)


@triton.autotune(configs=[triton.Config({"BLOCK": 32}, num_warps=2)], key=["n"])
@triton.jit
def tuned_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(y_ptr + offs, x * tl.sigmoid(x), mask=mask)


@triton.heuristics({"BLOCK": lambda args: triton.next_power_of_2(args["n"]) // 4})
@triton.jit
def heuristic_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(y_ptr + offs, x * x * x, mask=mask)


def grid(n):
    return (triton.cdiv(n, BLOCK),)


# -- ops ---------------------------------------------------------------------------------------------


@tritongrad.op
def mul(a, b):
    out = torch.empty_like(a)
    mul_kernel[grid(a.numel())](a, b, out, a.numel(), BLOCK=BLOCK)
    return out


@tritongrad.op
def chain(x, w):
    """y = sin(x * w) * x: launch 2 reads the buffer launch 1 wrote."""
    h = torch.empty_like(x)
    mul_kernel[grid(x.numel())](x, w, h, x.numel(), BLOCK=BLOCK)
    y = torch.empty_like(x)
    sin_mul_kernel[grid(x.numel())](h, x, y, x.numel(), BLOCK=BLOCK)
    return y


def chain_ref(x, w):
    return torch.sin(x * w) * x


@tritongrad.op
def chain3(x, w):
    """Three launches, returning the intermediate too: (h, z) with h = x * w, z = exp(sin(h) * w)."""
    n = x.numel()
    h, s, z = torch.empty_like(x), torch.empty_like(x), torch.empty_like(x)
    mul_kernel[grid(n)](x, w, h, n, BLOCK=BLOCK)
    sin_mul_kernel[grid(n)](h, w, s, n, BLOCK=BLOCK)
    exp_kernel[grid(n)](s, z, n, BLOCK=BLOCK)
    return h, z


def chain3_ref(x, w):
    h = x * w
    return h, torch.exp(torch.sin(h) * w)


@tritongrad.op
def rows(x, w):
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    block = triton.next_power_of_2(x.shape[1])
    rows_kernel[(x.shape[0],)](x, w, y, x.shape[1], x.stride(0), x.stride(1), y.stride(0), y.stride(1), BLOCK=block)
    return y


def rows_ref(x, w):
    return torch.tanh(x) * w


def check(op, ref, *inputs, tol=1e-10):
    """Forward and gradients of ``op`` against ``ref``, for fresh random upstream gradients."""
    a = [t.detach().clone().requires_grad_(t.requires_grad) if isinstance(t, torch.Tensor) else t for t in inputs]
    b = [t.detach().clone().requires_grad_(t.requires_grad) if isinstance(t, torch.Tensor) else t for t in inputs]
    got, want = op(*a), ref(*b)
    got, want = (got,) if isinstance(got, torch.Tensor) else got, (want,) if isinstance(want, torch.Tensor) else want
    for g, w in zip(got, want, strict=True):
        assert_close(g.detach(), w.detach(), tol)
    pairs = [(g, w, torch.randn_like(w)) for g, w in zip(got, want, strict=True) if w.requires_grad]
    torch.autograd.backward([g for g, _, _ in pairs], [u for _, _, u in pairs])
    torch.autograd.backward([w for _, w, _ in pairs], [u for _, _, u in pairs])
    for x, y in zip(a, b, strict=True):
        if isinstance(y, torch.Tensor) and y.requires_grad:
            assert_close(x.grad, y.grad, tol)
    return a


def rand(*shape, grad=True):
    return torch.randn(*shape, dtype=torch.float64, requires_grad=grad)


@dataclasses.dataclass
class Derived:
    kernel: str
    wrt: tuple
    outputs: tuple
    grid: tuple
    kwargs: dict


class _Spy:
    """A derived kernel that records its launches (the launch record launches it through ``launch``)."""

    def __init__(self, bwd, calls):
        self.bwd, self.calls = bwd, calls

    def __getattr__(self, name):
        return getattr(self.bwd, name)

    def launch(self, grid, named, *args, **kwargs):
        self.calls.append(Derived(self.bwd.forward.fn.__name__, self.bwd.wrt, self.bwd.outputs, grid, named))
        return self.bwd.launch(grid, named, *args, **kwargs)


@pytest.fixture
def derived(monkeypatch):
    """The backward kernels the launch record launches, in order."""
    calls = []
    real = op_backward.grad
    monkeypatch.setattr(op_backward, "grad", lambda *args, **kwargs: _Spy(real(*args, **kwargs), calls))
    return calls


# -- gradients ---------------------------------------------------------------------------------------


def test_single_launch(derived):
    check(mul, torch.mul, rand(300), rand(300))
    assert [(d.kernel, d.wrt, d.outputs) for d in derived] == [("mul_kernel", ("a_ptr", "b_ptr"), ("out_ptr",))]


def test_two_launches_through_an_intermediate_buffer(derived):
    check(chain, chain_ref, rand(300), rand(300))
    assert [d.kernel for d in derived] == ["sin_mul_kernel", "mul_kernel"]  # reverse launch order


def test_three_launches_returning_the_intermediate_too():
    check(chain3, chain3_ref, rand(211), rand(211))


def test_multidimensional_grad_shapes():
    check(chain, chain_ref, rand(7, 33), rand(7, 33))


def test_views_with_storage_offsets_and_strides():
    base, w = rand(9, 61), rand(40)
    a = check(lambda b, w: rows(b[2:7, 3:43], w), lambda b, w: rows_ref(b[2:7, 3:43], w), base, w)
    assert a[0].grad[:2].abs().sum() == 0 and a[0].grad[:, 43:].abs().sum() == 0
    check(lambda b, w: rows(b.t()[1:30:2], w), lambda b, w: rows_ref(b.t()[1:30:2], w), rand(9, 71), rand(9))


def test_aliasing_inputs_share_a_shadow():
    check(lambda x: mul(x, x), lambda x: x * x, rand(150))
    check(lambda x: mul(x[:-1], x[1:]), lambda x: x[:-1] * x[1:], rand(150))


def test_non_contiguous_input_made_contiguous_inside_the_op():
    @tritongrad.op
    def mul_contiguous(a, b):
        return mul.__wrapped__(a.contiguous(), b.contiguous())

    check(lambda a, b: mul_contiguous(a.t(), b.t()), lambda a, b: a.t() * b.t(), rand(11, 13), rand(11, 13))


def test_tensor_captured_from_outside_gets_its_gradient():
    w = rand(120)

    @tritongrad.op
    def scaled(x):
        out = torch.empty_like(x)
        mul_kernel[grid(x.numel())](x, w, out, x.numel(), BLOCK=BLOCK)
        return out

    x = rand(120)
    y = scaled(x)
    g = torch.randn_like(y)
    y.backward(g)
    assert_close(w.grad, g * x.detach())
    assert_close(x.grad, g * w.detach())


def test_expanded_and_non_contiguous_upstream_gradients():
    check(lambda x, w: chain(x, w).sum(), lambda x, w: chain_ref(x, w).sum(), rand(13, 17), rand(13, 17))
    check(lambda x, w: chain(x, w).t(), lambda x, w: chain_ref(x, w).t(), rand(13, 17), rand(13, 17))


def test_output_views_of_one_buffer():
    @tritongrad.op
    def halves(x, w):
        out = torch.empty(2 * x.numel(), dtype=x.dtype, device=x.device)
        mul_kernel[grid(x.numel())](x, w, out[: x.numel()], x.numel(), BLOCK=BLOCK)
        exp_kernel[grid(x.numel())](x, out[x.numel():], x.numel(), BLOCK=BLOCK)
        return out[: x.numel()], out[x.numel():], out

    check(halves, lambda x, w: (x * w, x.exp(), torch.cat([x * w, x.exp()])), rand(100), rand(100))


@triton.jit
def scale_rows_kernel(x_ptr, out_ptr, c, stride_x, stride_out, N, BLOCK: tl.constexpr):
    row, cols = tl.program_id(0), tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * stride_x + cols, mask=cols < N)
    tl.store(out_ptr + row * stride_out + cols, tl.sin(x) * c, mask=cols < N)


@pytest.mark.parametrize("named", [False, True])
def test_two_launches_writing_the_column_halves_of_one_output(named):
    """``out[:, :N]`` by one launch, ``out[:, N:]`` by another: the two views' address ranges interleave, but no
    element is in both (the overlap test is exact), so nothing is refused and each half gets its gradient."""
    def halves(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        m, n = x.shape
        out = torch.empty(m, 2 * n, dtype=x.dtype, device=x.device)
        left, right = out[:, :n], out[:, n:]
        scale_rows_kernel[(m,)](x, left, 2.0, x.stride(0), left.stride(0), n, BLOCK=32)
        scale_rows_kernel[(m,)](y, right, -3.0, y.stride(0), right.stride(0), n, BLOCK=32)
        return out

    op = tritongrad.op("tgtest::column_halves")(halves) if named else tritongrad.op(halves)
    check(op, lambda x, y: torch.cat([2.0 * x.sin(), -3.0 * y.sin()], dim=1), rand(11, 19), rand(11, 19))


def test_atomic_accumulation_by_two_launches():
    @tritongrad.op
    def sum_of_squares(x, w):
        out = torch.zeros_like(x)
        square_add_kernel[grid(x.numel())](x, out, x.numel(), BLOCK=BLOCK)
        square_add_kernel[grid(x.numel())](w, out, x.numel(), BLOCK=BLOCK)
        return out

    check(sum_of_squares, lambda x, w: x * x + w * w, rand(130), rand(130))


def test_only_inputs_requiring_grad_get_backward_kernels(derived):
    @tritongrad.op
    def two_parts(x, w):
        y, z = torch.empty_like(x), torch.empty_like(w)
        exp_kernel[grid(x.numel())](x, y, x.numel(), BLOCK=BLOCK)
        exp_kernel[grid(w.numel())](w, z, w.numel(), BLOCK=BLOCK)
        return y, z

    check(two_parts, lambda x, w: (x.exp(), w.exp()), rand(90), rand(70, grad=False))
    assert [(d.wrt, d.grid) for d in derived] == [(("x_ptr",), grid(90))]  # w's launch is never differentiated
    derived.clear()
    check(mul, torch.mul, rand(90, grad=False), rand(90))
    assert [d.wrt for d in derived] == [("b_ptr",)]
    derived.clear()
    check(chain, chain_ref, rand(90, grad=False), rand(90))
    assert [(d.kernel, d.wrt) for d in derived] == [("sin_mul_kernel", ("a_ptr",)), ("mul_kernel", ("b_ptr",))]


def test_unused_output_gets_no_backward(derived):
    x, w = rand(90), rand(90)
    h, z = chain3(x, w)
    h.sum().backward()  # z unused: the exp and sin launches are not recomputed
    assert [d.kernel for d in derived] == ["mul_kernel"]
    assert_close(x.grad, w.detach())


def test_autotuned_and_heuristic_kernels_backwards_take_the_chosen_config(derived):
    @tritongrad.op
    def tuned(x):
        y, z = torch.empty_like(x), torch.empty_like(x)
        n = x.numel()
        tuned_kernel[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](x, y, n)
        heuristic_kernel[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](y, z, n)
        return z

    check(tuned, lambda x: (x * torch.sigmoid(x)) ** 3, rand(100))
    assert [(d.kernel, d.grid, d.kwargs["BLOCK"]) for d in derived] == [
        ("heuristic_kernel", (4,), 32), ("tuned_kernel", (4,), 32)]
    assert derived[1].kwargs["num_warps"] == 2


def test_module_forward_and_no_grad():
    class Scale(torch.nn.Module):
        def __init__(self, n):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(n, dtype=torch.float64))

        def forward(self, x):
            return chain(x, self.w)

    m = Scale(50)
    x = rand(50)
    m(x).sum().backward()
    want_x, want_w = x.detach().requires_grad_(), m.w.detach().requires_grad_()
    chain_ref(want_x, want_w).sum().backward()
    assert_close(m.w.grad, want_w.grad)
    assert_close(x.grad, want_x.grad)
    with torch.no_grad():
        y = m(x)
    assert y.grad_fn is None and not y.requires_grad
    assert chain(x, m.w).grad_fn.name() == "ChainBackward"


def test_half_precision_accumulates_in_float32():
    @tritongrad.op
    def cube_ish(x, w):  # (x * w) * x, through an intermediate half buffer
        return mul(mul(x, w), x)

    x, w = torch.randn(300, dtype=torch.float16), torch.randn(300, dtype=torch.float16)
    xs, ws = x.clone().requires_grad_(), w.clone().requires_grad_()
    y = cube_ish(xs, ws)
    g = torch.randn(300, dtype=torch.float16)
    y.backward(g)
    assert xs.grad.dtype == torch.float16
    x64, w64 = x.double().requires_grad_(), w.double().requires_grad_()
    (x64 * w64 * x64).backward(g.double())
    torch.testing.assert_close(xs.grad.double(), x64.grad, rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(ws.grad.double(), w64.grad, rtol=2e-2, atol=2e-2)


def test_nested_ops_are_one_launch_record(derived):
    @tritongrad.op
    def outer(x, w):
        return mul(chain(x, w), w)

    check(outer, lambda x, w: chain_ref(x, w) * w, rand(80), rand(80))
    assert [d.kernel for d in derived] == ["mul_kernel", "sin_mul_kernel", "mul_kernel"]


def test_saves_only_what_kernels_read():
    x, w = rand(60), rand(60)
    y = chain(x, w)
    saved = {t.data_ptr() for t in y.grad_fn.saved_tensors}
    assert len(saved) == 3 and {x.data_ptr(), w.data_ptr()} < saved and y.data_ptr() not in saved  # x, w and h


def test_repeated_calls_do_no_ast_work(monkeypatch):
    x, w = rand(60), rand(60)
    chain(x, w).sum().backward()  # first call: kernels analysed, backward kernels derived

    def fail(*args, **kwargs):
        raise AssertionError("AST work on a repeated call")

    monkeypatch.setattr(kernel_roles, "_analyse", fail)
    monkeypatch.setattr(derivation.Derivation, "__init__", fail)
    chain(x, w).sum().backward()


def test_launches_outside_ops_are_not_recorded():
    x = torch.randn(100, dtype=torch.float64)
    y = torch.empty_like(x)
    exp_kernel[grid(100)](x, y, 100, BLOCK=BLOCK)
    assert_close(y, x.exp())
    assert not hooks.active()


@pytest.mark.parametrize("example", EXAMPLES.values(), ids=lambda e: e.name)
def test_bundled_examples_are_registered_operators(example):
    """Each example's op is `torch.ops.tritongrad_examples.<name>`, with the derived backward."""
    size = example.sizes[0]
    dtype = torch.float64 if torch.float64 in example.dtypes else torch.float32
    inputs = [t.requires_grad_(t.is_floating_point()) if isinstance(t, torch.Tensor) else t
              for t in example.make_inputs(size, device=DEVICE, dtype=dtype)]
    registered = getattr(torch.ops.tritongrad_examples, example.name)
    check(registered, example.reference, *inputs, tol=1e-9 if dtype == torch.float64 else 1e-4)


# -- seed 000 ----------------------------------------------------------------------------------------


def test_custom_linear_trains_like_its_pytorch_twin():
    from tritongrad.examples.linear import CustomLinear

    class Twin(torch.nn.Module):
        def __init__(self, weights):
            super().__init__()
            self.weights = torch.nn.Parameter(weights.detach().clone())

        def forward(self, x):
            return self.weights @ x

    lin = CustomLinear(23, 37).double()
    twin, start = Twin(lin.weights), lin.weights.detach().clone()
    opt, opt_twin = torch.optim.SGD(lin.parameters(), lr=0.1), torch.optim.SGD(twin.parameters(), lr=0.1)
    for _ in range(4):
        x, target = torch.randn(23, dtype=torch.float64), torch.randn(37, dtype=torch.float64)
        for model, o in ((lin, opt), (twin, opt_twin)):
            o.zero_grad()
            loss = ((torch.tanh(model(x)) - target) ** 2).mean()
            loss.backward()
            o.step()
        assert_close(lin.weights, twin.weights)
    assert not torch.allclose(lin.weights, start)


# -- errors ------------------------------------------------------------------------------------------


def test_reusing_a_buffer_one_launch_wrote_and_another_read_is_refused():
    @tritongrad.op
    def reuse(x, w):
        n = x.numel()
        tmp, y = torch.empty_like(x), torch.empty_like(x)
        mul_kernel[grid(n)](x, w, tmp, n, BLOCK=BLOCK)
        sin_mul_kernel[grid(n)](tmp, w, y, n, BLOCK=BLOCK)
        exp_kernel[grid(n)](x, tmp, n, BLOCK=BLOCK)  # launch 2's read is copied; launch 1's write is lost
        return y, tmp

    with pytest.raises(OpError, match=r"launch #3 \(`exp_kernel`\) overwrites `out_ptr`, memory that launch #1 "
                                      r"\(`mul_kernel`\) writes through `out_ptr`"):
        reuse(rand(50), rand(50))


def test_overwriting_what_an_earlier_launch_wrote_is_refused():
    @tritongrad.op
    def twice(x, w):
        y = torch.empty_like(x)
        mul_kernel[grid(x.numel())](x, w, y, x.numel(), BLOCK=BLOCK)
        exp_kernel[grid(x.numel())](w, y, x.numel(), BLOCK=BLOCK)
        return y

    with pytest.raises(OpError, match=r"launch #2 \(`exp_kernel`\) overwrites `out_ptr`, memory that launch #1 "
                                      r"\(`mul_kernel`\) writes"):
        twice(rand(50), rand(50))


def test_a_kernel_reading_and_writing_an_intermediate_through_two_names_updates_it_in_place():
    """y passed as both `a_ptr` (loaded) and `out_ptr` (stored): the launch is its alias view's, y = y * w in place
    (host/aliases.py); it was refused as a launch overwriting what it reads."""
    @tritongrad.op
    def in_place(x, w):
        y = torch.empty_like(x)
        exp_kernel[grid(x.numel())](x, y, x.numel(), BLOCK=BLOCK)
        mul_kernel[grid(x.numel())](y, w, y, x.numel(), BLOCK=BLOCK)
        return y

    x, w = rand(50), rand(50)
    got = in_place(x, w)
    x2, w2 = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    want = torch.exp(x2) * w2
    assert_close(got, want)
    g = torch.randn(50, dtype=torch.float64)
    for a, b in zip(torch.autograd.grad(got, (x, w), g), torch.autograd.grad(want, (x2, w2), g), strict=True):
        assert_close(a, b)


def test_writing_to_an_input_that_requires_grad_is_refused():
    @tritongrad.op
    def clobber(x, w):
        mul_kernel[grid(x.numel())](w, w, x, x.numel(), BLOCK=BLOCK)
        return torch.empty(0)

    with pytest.raises(OpError, match="writes to `out_ptr`, a tensor that requires grad"):
        clobber(rand(50), rand(50))


@pytest.mark.parametrize("modified", ["input", "input without grad", "intermediate output"])
def test_saved_tensor_modified_in_place_before_backward_raises(modified):
    x, w = rand(60), rand(60, grad=modified != "input without grad")
    h, z = chain3(x, w)
    with torch.no_grad():
        (h if modified == "intermediate output" else w).mul_(2)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        z.sum().backward()


@pytest.mark.parametrize("name", ["chain", "tgtest::chain"])
def test_double_backward_through_an_intermediate_sees_how_it_was_made(name):
    """Two launches, the second reading what the first wrote (h = x * w): the backward reads h, whose dependence on
    x and w autograd does not see; the launch that made it runs again inside the recorded backward (host/remake.py),
    so the second derivative has that dependence (without it, x's and w's would miss the terms through h)."""
    op = chain if name == "chain" else named_chain
    x, w = rand(60), rand(60)
    g = torch.randn(60, dtype=torch.float64)
    (gx,) = torch.autograd.grad(op(x, w), x, g, create_graph=True)
    xr, wr = x.detach().requires_grad_(), w.detach().requires_grad_()
    (gr,) = torch.autograd.grad(chain_ref(xr, wr), xr, g, create_graph=True)
    torch.testing.assert_close(gx, gr)
    v = torch.randn(60, dtype=torch.float64)
    torch.testing.assert_close(torch.autograd.grad(gx, (x, w), v), torch.autograd.grad(gr, (xr, wr), v))


def test_a_named_op_returning_an_input_or_a_view_of_one_is_refused():
    @tritongrad.op("tgtest::identity")
    def identity(x):
        exp_kernel[grid(x.numel())](x, torch.empty_like(x), x.numel(), BLOCK=BLOCK)
        return x[1:]

    with pytest.raises(OpError, match="output #0 shares memory with the argument `x`"):
        identity(rand(50))


def test_a_named_op_refuses_an_output_computed_by_pytorch_with_the_way_out():
    @tritongrad.op("tgtest::torch_after")
    def torch_after(x, w):
        return mul.__wrapped__(x, w) * 2

    with pytest.raises(OpError, match=r"output #0 was not written by any kernel launch.*a bare @tritongrad.op"):
        torch_after(rand(50), rand(50))


def test_non_tensor_for_a_pointer_is_refused():
    with pytest.raises(TypeError, match=r"launch #1 \(`mul_kernel`\) passes float 2.0 to `b_ptr`, which the kernel "
                                        r"uses as a pointer"):
        mul(rand(50), 2.0)


def test_tensors_on_different_devices_are_refused():
    with pytest.raises(OpError, match=r"passes a tensor on meta to `b_ptr`, but the op's tensors are on"):
        mul(rand(50), torch.empty(50, dtype=torch.float64, device="meta"))


def test_cpu_tensor_outside_the_interpreter_is_refused(monkeypatch):
    info = kernel_roles.kernel_info(mul_kernel)  # on a GPU machine the kernel is compiled already
    monkeypatch.setitem(kernel_roles.kernel_infos, mul_kernel.fn, dataclasses.replace(info, interpreted=False))
    x, w = (torch.randn(50, dtype=torch.float64, device="cpu", requires_grad=True) for _ in range(2))
    with pytest.raises(OpError, match=r"launch #1 \(`mul_kernel`\) passes a CPU tensor to `a_ptr`"):
        mul(x, w)


# -- named ops ---------------------------------------------------------------------------------------


chain_launches = []


@tritongrad.op("tgtest::chain")
def named_chain(x, w, scale: float = 1.0):
    chain_launches.append(1)
    return chain.__wrapped__(x, w * scale if scale != 1.0 else w)


@tritongrad.op("tgtest::halves")
def named_halves(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return chain3.__wrapped__(x, w)


def test_named_op_eager_backward_uses_its_launch_record():
    chain_launches.clear()
    check(named_chain, chain_ref, rand(70), rand(70))
    assert len(chain_launches) == 1  # no recomputation in eager mode
    check(named_halves, chain3_ref, rand(70), rand(70, grad=False))


def test_named_op_eager_skips_the_dispatcher_only_where_nothing_watches_it():
    x, w = rand(70), rand(70)
    fast = named_chain(x, w)
    assert fast.grad_fn.name() == "NamedChainBackward"  # the bare op's autograd.Function
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:  # names the op
        profiled = named_chain(x, w)
    assert any(e.name == "tgtest::chain" for e in prof.events())
    assert profiled.grad_fn.name() != fast.grad_fn.name()
    g = torch.randn_like(fast)
    assert_close(torch.autograd.grad(fast, (x, w), g), torch.autograd.grad(profiled, (x, w), g))


def test_named_op_called_through_torch_ops_recomputes():
    chain_launches.clear()
    check(torch.ops.tgtest.chain, chain_ref, rand(70), rand(70))
    assert len(chain_launches) == 2


def test_named_op_opcheck():
    torch.library.opcheck(named_chain.op, (rand(70), rand(70)))
    torch.library.opcheck(named_chain.op, (rand(70), rand(70, grad=False), 1.0))
    torch.library.opcheck(named_halves.op, (rand(3, 50), rand(3, 50)))
    torch.library.opcheck(named_chain.saving_op, (rand(70), rand(70)))  # what torch.compile calls
    torch.library.opcheck(named_halves.saving_op, (rand(3, 50), rand(3, 50, grad=False)))


def test_named_op_compiles_fullgraph():
    compiled = torch.compile(lambda x, w: named_chain(x, w).sin() * 2, fullgraph=True, backend="aot_eager")
    check(compiled, lambda x, w: chain_ref(x, w).sin() * 2, rand(70), rand(70))


@tritongrad.op("tgtest::tuned_chain")
def named_tuned_chain(x, w):
    h, y = torch.empty_like(x), torch.empty_like(x)
    mul_kernel[grid(x.numel())](x, w, h, x.numel(), BLOCK=BLOCK)
    tuned_kernel[lambda meta: (triton.cdiv(x.numel(), meta["BLOCK"]),)](h, y, x.numel())
    return y


@tritongrad.op("tgtest::viewed_chain")
def named_viewed_chain(x, w):
    n = x.numel()
    buffer = torch.empty(2 * n, dtype=x.dtype, device=x.device)  # the buffer launches share is a view
    h, y = buffer[:n], torch.empty_like(x)
    mul_kernel[grid(n)](x, w, h, n, BLOCK=BLOCK)
    sin_mul_kernel[grid(n)](h, x, y, n, BLOCK=BLOCK)
    return y


@pytest.fixture
def executed(monkeypatch):
    """The names of the kernels the interpreter runs, in order."""
    from triton.runtime.interpreter import GridExecutor

    names, call = [], GridExecutor.__call__

    def counted(self, *args, **kwargs):
        names.append(self.fn.__name__)
        return call(self, *args, **kwargs)

    monkeypatch.setattr(GridExecutor, "__call__", counted)
    return names


def test_named_op_registration_and_fallback_choice():
    interpreted = os.environ.get("TRITON_INTERPRET") == "1"
    assert named_chain.opaque == interpreted  # wrap_triton cannot take the interpreter's kernels
    assert named_chain.saving_op is not None
    schema = str(named_chain.saving_op._opoverload._schema)
    assert schema.startswith("tgtest::chain_saving(Tensor x, Tensor w, float scale=1.") and schema.endswith("Tensor[]")


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="counts the interpreter's kernel runs")
def test_saving_op_called_eagerly(executed):
    """The saving op outside torch.compile: outputs, then the buffer; its backward recomputes derived kernels only."""
    check(lambda x, w: named_chain.saving_op(x, w)[0], chain_ref, rand(70), rand(70))
    check(lambda x, w: tuple(named_halves.saving_op(x, w)[:2]), chain3_ref, rand(3, 50), rand(3, 50))
    x, w = rand(70), rand(70)
    y, h = named_chain.saving_op(x, w)
    assert_close(h, x.detach() * w.detach())  # the buffer launch 2 reads
    executed.clear()
    y.backward(torch.randn_like(y))
    assert executed == ["sin_mul_kernel_bwd", "mul_kernel_bwd"]


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="counts the interpreter's kernel runs")
@pytest.mark.parametrize("op", ["chain", "tuned_chain", "viewed_chain"])
def test_compiled_backward_reads_saved_buffers(op, executed):
    """The compiled forward saves the buffer launch 2 reads; its backward runs derived kernels only, but
    where the saved buffers cannot stand in (an autotuned launch, a buffer that is a view): it re-runs them."""
    named = {"chain": named_chain, "tuned_chain": named_tuned_chain, "viewed_chain": named_viewed_chain}[op]
    ref = {"tuned_chain": lambda x, w: torch.sigmoid(x * w) * x * w}.get(op, chain_ref)
    compiled = torch.compile(lambda x, w: named(x, w).tanh(), fullgraph=True, backend="aot_eager")
    x, w = rand(70), rand(70)
    y = compiled(x, w)
    want = ref(x, w).tanh()
    assert_close(y, want)
    forward_kernels = {"mul_kernel", "sin_mul_kernel", "tuned_kernel"}
    assert set(executed) <= forward_kernels
    executed.clear()
    g = torch.randn_like(y)
    gx, gw = torch.autograd.grad(y, (x, w), g)
    rx, rw = torch.autograd.grad(want, (x, w), g)
    assert_close(gx, rx)
    assert_close(gw, rw)
    launched = {"tuned_chain": ["mul_kernel", "tuned_kernel"]}.get(op, ["mul_kernel", "sin_mul_kernel"])
    assert [k for k in executed if k in forward_kernels] == ([] if op == "chain" else launched)
    assert [k for k in executed if k not in forward_kernels] == [k + "_bwd" for k in reversed(launched)]


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="counts the interpreter's kernel runs")
@pytest.mark.parametrize("name", ["flash_attention", "cross_entropy"])
def test_compiled_forward_keeps_the_state_tapes_eager_keeps(name, executed):
    """A loop's running max and sum, kept by the compiled forward as by the eager one (its augmented kernel), so
    the compiled backward launches the eager backward's kernels: no pass of its own over the loop, and attention's
    dK/dV in a kernel of their own with dQ stored."""
    example = EXAMPLES[name]
    inputs = example.make_inputs(dtype=torch.float64)
    grads = [i for i, a in enumerate(inputs) if isinstance(a, torch.Tensor) and a.dtype.is_floating_point]
    kernels = {}
    for path in ("eager", "compiled"):
        fn = example.op if path == "eager" else torch.compile(example.op, fullgraph=True, backend="aot_eager")
        args = [a.detach().clone().requires_grad_(i in grads) if isinstance(a, torch.Tensor) else a
                for i, a in enumerate(inputs)]
        executed.clear()
        y = fn(*args)
        forward = list(executed)
        g = torch.randn_like(y)
        executed.clear()
        got = torch.autograd.grad(y, [args[i] for i in grads], g)
        kernels[path] = forward, list(executed)
        ref_args = [a.detach().clone().requires_grad_(i in grads) if isinstance(a, torch.Tensor) else a
                    for i, a in enumerate(inputs)]
        want = torch.autograd.grad(example.reference(*ref_args), [ref_args[i] for i in grads], g)
        for a, b in zip(got, want, strict=True):
            assert_close(a, b, tol=1e-9)
    assert kernels["compiled"] == kernels["eager"]
    assert kernels["eager"][0] == [name + "_kernel_augmented"]


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="aot_eager on the interpreter's kernels")
def test_a_compiled_forward_keeping_its_tapes_takes_one_tensor_for_keys_and_values():
    """The compiled forward's tapes with one tensor passed as keys and values: its gradient, the sum of both
    parts, is PyTorch's."""
    example = EXAMPLES["flash_attention"]
    q, kv, _, causal = example.make_inputs(dtype=torch.float64)
    q, kv = q.requires_grad_(), kv.requires_grad_()
    y = torch.compile(example.op, fullgraph=True, backend="aot_eager")(q, kv, kv, causal)
    g = torch.randn_like(y)
    got = torch.autograd.grad(y, (q, kv), g)
    want = torch.autograd.grad(example.reference(q, kv, kv, causal), (q, kv), g)
    for a, b in zip(got, want, strict=True):
        assert_close(a, b, tol=1e-9)


def test_named_op_refuses_tensors_made_by_pytorch_inside():
    @tritongrad.op("tgtest::contiguous_mul")
    def contiguous_mul(a, b):
        return mul.__wrapped__(a.contiguous(), b)

    with pytest.raises(OpError, match=r"launch #1 \(`mul_kernel`\) reads `a_ptr`, a tensor that is neither an "
                                      r"argument of the op nor written by an earlier launch"):
        contiguous_mul(rand(7, 9).t(), rand(9, 7))


# -- aten overrides ----------------------------------------------------------------------------------


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="CPU kernels need the interpreter")
@pytest.mark.parametrize("backward", ["aten", "derived"])
def test_override_aten_sin_on_cpu(backward):
    from tritongrad.examples.sin import triton_sin

    calls = []

    def counted_sin(x):
        calls.append(1)
        return triton_sin(x)

    x = rand(3, 250)
    with tritongrad.override("aten::sin", counted_sin, device="cpu", backward=backward):
        y = torch.sin(x)
        assert calls and y.grad_fn.name() == ("SinBackward0" if backward == "aten" else "CountedSinBackward")
        g = torch.randn_like(y)
        y.backward(g)
    assert_close(y.detach(), x.detach().sin())
    assert_close(x.grad, g * x.detach().cos())
    n = len(calls)
    torch.sin(x)
    assert len(calls) == n  # restored


def test_expanded_input_gets_its_gradient_once():
    check(lambda b, w: rows(b.expand(5, 40), w), lambda b, w: rows_ref(b.expand(5, 40), w), rand(40), rand(40))
    windows = lambda x: x[2:].as_strided((31, 10), (1, 1))  # overlapping sliding windows
    check(lambda x, w: rows(windows(x), w), lambda x, w: rows_ref(windows(x), w), rand(45), rand(10))


# -- plans: what a call with a known layout skips ------------------------------------------------------


def test_repeated_calls_reuse_the_plan(monkeypatch):
    planned = []
    real = planning.Planner.plan
    monkeypatch.setattr(planning.Planner, "plan", lambda self, *a: planned.append(1) or real(self, *a))
    x, w = rand(61), rand(61)
    check(chain, chain_ref, x, w)
    n = len(planned)
    check(chain, chain_ref, x, w)
    check(chain, chain_ref, rand(61), rand(61))  # other tensors, same layouts
    assert len(planned) == n
    check(chain, chain_ref, rand(62), rand(62))  # a new layout is checked
    assert len(planned) == n + 1


def test_stray_gradients_are_looked_for_in_the_first_backward_of_a_layout_only(monkeypatch):
    @tritongrad.op
    def chain_once(x, w):
        return chain.__wrapped__(x, w)

    checks = []
    real = PlannedBackward._check_strays
    monkeypatch.setattr(PlannedBackward, "_check_strays", lambda self, *a: checks.append(1) or real(self, *a))
    x, w = rand(61), rand(61)
    inputs = check(chain_once, chain_ref, x, w)
    assert len(checks) == 2 and inputs[0].grad._base is None  # one per launch recomputed; not views of padded buffers
    check(chain_once, chain_ref, x, w)
    assert len(checks) == 2  # the same layout and the same gradients needed: checked already


def test_each_new_layout_is_checked():
    @tritongrad.op
    def shifted(x, shift: int):
        n = x.numel()
        buf = torch.empty(2 * n, dtype=x.dtype, device=x.device)
        exp_kernel[grid(n)](x, buf[:n], n, BLOCK=BLOCK)
        exp_kernel[grid(n)](buf[:n], buf[shift:shift + n], n, BLOCK=BLOCK)
        return buf[shift:shift + n]

    check(lambda x: shifted(x, 40), lambda x: x.exp().exp(), rand(40))
    with pytest.raises(OpError, match=r"launch #2 \(`exp_kernel`\) overwrites `out_ptr`, memory that launch #2 "
                                      r"\(`exp_kernel`\) reads through `x_ptr`"):
        shifted(rand(40), 20)  # same kernels and shapes, overlapping views


def test_writing_to_an_input_is_refused_once_it_requires_grad():
    @tritongrad.op
    def clobber(x, w):
        out = torch.empty_like(w)
        mul_kernel[grid(w.numel())](w, w, x, w.numel(), BLOCK=BLOCK)
        exp_kernel[grid(w.numel())](w, out, w.numel(), BLOCK=BLOCK)
        return out

    clobber(rand(50, grad=False), rand(50))
    with pytest.raises(OpError, match="writes to `out_ptr`, a tensor that requires grad"):
        clobber(rand(50), rand(50))


def test_incoming_gradients_are_not_modified():
    x, w = rand(70), rand(70)
    h, z = chain3(x, w)  # h is read by launch 2: its shadow accumulates; z's is the incoming gradient itself
    gh, gz = torch.randn_like(h), torch.randn_like(z)
    before = gh.clone(), gz.clone()
    torch.autograd.backward([h, z], [gh, gz])
    assert_close(gh, before[0])
    assert_close(gz, before[1])
    want_x, want_w = x.detach().requires_grad_(), w.detach().requires_grad_()
    torch.autograd.backward(chain3_ref(want_x, want_w), [gh, gz])
    assert_close(x.grad, want_x.grad)
    assert_close(w.grad, want_w.grad)


@triton.jit
def rows_sin_mul_kernel(a_ptr, b_ptr, c_ptr, stride, n_cols, BLOCK: tl.constexpr, COMPUTE: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)  # a program per row, as Liger's SwiGLU forward
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    a = tl.load(a_ptr + row * stride + cols, mask=mask, other=0.0)
    b = tl.load(b_ptr + row * stride + cols, mask=mask, other=0.0)
    tl.store(c_ptr + row * stride + cols, tl.sin(a.to(COMPUTE)) * b, mask=mask)


def rows_sin_mul(a, b):
    """Rows of the flattened inputs, the output returned in the inputs' shape: a view of the buffer the launch
    wrote as rows."""
    shape = a.shape
    a, b = a.reshape(-1, shape[-1]), b.reshape(-1, shape[-1])
    c = torch.empty_like(a)
    rows_sin_mul_kernel[(a.shape[0],)](a, b, c, c.stride(0), shape[-1], BLOCK=64,
                                       COMPUTE=tl.float64 if a.dtype == torch.float64 else tl.float32)
    return c.view(*shape)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16])
@pytest.mark.parametrize("named", [False, True], ids=["bare", "named"])
def test_inputs_and_an_output_reshaped_by_the_host_function_get_buffers_of_their_own_dtype_uncopied(
        named, dtype, monkeypatch, poisoned_empty):
    """Liger's SwiGLU forward as the Llama step calls it: 3-D inputs launched as rows (`a.view(-1, n)`), the output
    `c.view(*shape)` of the buffer the launch wrote as rows. The output's incoming gradient serves as its buffer's
    shadow as it is (viewed flat): no buffer zero-filled and added into; each input's gradient buffer is left unfilled
    (the kernel writes all of it) and in the input's own dtype, not a float32 buffer cast after. On an H200 those
    copies, and the derived kernel reading float32, made the SwiGLU backward node 4.7x Liger's. Gradients as
    PyTorch's on every call (the later ones by the kept backward's own code); the incoming gradient unchanged; a
    gradient that is not contiguous still added."""
    from tritongrad.host import backward as op_backward

    op = tritongrad.op("test_op::rows_sin_mul_" + str(dtype)[6:])(rows_sin_mul) if named else \
        tritongrad.op(rows_sin_mul)
    made, shadow = [], op_backward.PlannedBackward._shadow

    def spy(self, shadows, view, *args, **kwargs):
        fresh = view.key not in shadows
        found = shadow(self, shadows, view, *args, **kwargs)
        if fresh:
            made.append(shadows[view.key].dtype)
        return found

    monkeypatch.setattr(op_backward.PlannedBackward, "_shadow", spy)
    tol = {} if dtype == torch.float64 else {"rtol": 2e-2, "atol": 2e-2}
    for call in range(4):
        a, b = (torch.randn(3, 5, 37, dtype=dtype, requires_grad=True) for _ in range(2))
        made.clear()
        c = op(a, b)
        g = torch.randn(3, 5, 37, dtype=dtype)
        if call == 3:
            g = torch.randn(37, dtype=dtype).expand(3, 5, 37)  # (not contiguous: added into a buffer)
        before = g.clone()
        got = torch.autograd.grad(c, (a, b), g)
        wide = [t.detach().double().requires_grad_() for t in (a, b)]
        want = torch.autograd.grad(torch.sin(wide[0]) * wide[1], wide, g.double())
        torch.testing.assert_close([t.double() for t in got], list(want), **({"rtol": 1e-12, "atol": 1e-12} | tol))
        assert_close(g, before)
        if call == 0:  # (the first backward's buffers: later ones are made by the kept backward's own code)
            assert made == [dtype, dtype], made  # the inputs' gradients', in their dtype; the output's: none


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="counts the interpreter's kernel runs")
def test_compiled_two_outputs_and_scalars_read_saved_buffers(executed):
    """An output a later launch reads (h of chain3) is saved as the output; a scalar argument by keyword;
    an input without grad."""
    def both(x, w):
        h, z = named_halves(x, w)
        return h.sin() + z * named_chain(x, w, scale=1.0)

    def reference(x, w):
        h, z = chain3_ref(x, w)
        return h.sin() + z * chain_ref(x, w)

    compiled = torch.compile(both, fullgraph=True, backend="aot_eager")
    for grad_w in (True, False):
        x, w = rand(3, 41), rand(3, 41, grad=grad_w)
        y = compiled(x, w)
        want = reference(x, w)
        assert_close(y, want)
        executed.clear()
        g = torch.randn_like(y)
        got = torch.autograd.grad(y, [t for t in (x, w) if t.requires_grad], g)
        ref = torch.autograd.grad(want, [t for t in (x, w) if t.requires_grad], g)
        for a, b in zip(got, ref, strict=True):
            assert_close(a, b)
        assert executed and all(k.endswith("_bwd") for k in executed), executed


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="counts the interpreter's kernel runs")
def test_opaque_env_gives_the_previous_registration(monkeypatch, executed):
    monkeypatch.setenv("TRITONGRAD_OPAQUE_OPS", "1")
    legacy = tritongrad.op("tgtest::legacy_chain")(chain.__wrapped__)
    assert legacy.opaque and legacy.saving_op is None
    compiled = torch.compile(lambda x, w: legacy(x, w) * 2, fullgraph=True, backend="aot_eager")
    x, w = rand(70), rand(70)
    y = compiled(x, w)
    executed.clear()
    g = torch.randn_like(y)
    got = torch.autograd.grad(y, (x, w), g)
    want = torch.autograd.grad(chain_ref(x, w) * 2, (x, w), g)
    for a, b in zip(got, want, strict=True):
        assert_close(a, b)
    assert executed[:2] == ["mul_kernel", "sin_mul_kernel"]  # its backward re-runs the forward launches


TRACED_SCRIPT = '''
import torch, triton, triton.language as tl
from torch._dynamo.backends.common import aot_autograd
import tritongrad

@triton.jit
def mul_kernel(a_ptr, b_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(a_ptr + offs, mask=mask) * tl.load(b_ptr + offs, mask=mask), mask=mask)

@triton.jit
def sin_kernel(a_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.sin(tl.load(a_ptr + offs, mask=mask)), mask=mask)

@tritongrad.op("tgtraced::chain")
def chain(x, w):
    h, y = torch.empty_like(x), torch.empty_like(x)
    mul_kernel[(triton.cdiv(x.numel(), 32),)](x, w, h, x.numel(), BLOCK=32)
    sin_kernel[(triton.cdiv(x.numel(), 32),)](h, y, x.numel(), BLOCK=32)
    return y

def stand_in(name):  # no GPU here: the compiled graphs are kept, and run as zeros of their outputs' metadata
    def compiler(gm, _):
        print(f"== {name}\\n{gm.code}")
        vals = [n.meta["val"] for n in gm.graph.output_node().args[0]]
        return lambda *a: [torch.zeros(v.shape, dtype=v.dtype) if isinstance(v, torch.Tensor) else v for v in vals]
    return compiler

print("opaque", chain.opaque)
f = torch.compile(lambda x, w: chain(x, w).sin(), fullgraph=True,
                  backend=aot_autograd(fw_compiler=stand_in("forward"), bw_compiler=stand_in("backward")))
x, w = torch.randn(70, requires_grad=True), torch.randn(70, requires_grad=True)
f(x, w).sum().backward()

@tritongrad.op("tgtraced::ctas")
def ctas(x):
    y = torch.empty_like(x)
    sin_kernel[(3,)](x, y, x.numel(), BLOCK=32, num_ctas=1)  # wrap_triton refuses num_ctas at a launch
    return y

try:
    torch.compile(lambda x: ctas(x) * 2, fullgraph=True, backend=aot_autograd(fw_compiler=stand_in("ctas")))(x)
except Exception as e:
    print("refused:", " ".join(str(e).split()))

@triton.autotune(configs=[triton.Config({"BLOCK": 32}), triton.Config({"BLOCK": 64})], key=["n"])
@triton.jit
def tuned_sin_kernel(a_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.sin(tl.load(a_ptr + offs, mask=mask)), mask=mask)

@tritongrad.op("tgtraced::tuned")
def tuned(x):
    y = torch.empty_like(x)
    tuned_sin_kernel[lambda meta: (triton.cdiv(x.numel(), meta["BLOCK"]),)](x, y, x.numel())
    return y

f = torch.compile(lambda x: tuned(x).sin(), fullgraph=True,
                  backend=aot_autograd(fw_compiler=stand_in("tuned forward"), bw_compiler=stand_in("tuned backward")))
f(x).sum().backward()
'''


@pytest.mark.slow  # (about 5 s: a compile in a process of its own)
def test_compiled_graph_traces_into_the_forward_kernels(tmp_path):
    """Without the interpreter (CPU: the graphs are traced, not run): the forward graph holds the two
    launches as triton_kernel_wrapper nodes, the backward one the two derived kernels' launches (Inductor
    schedules them) and no forward launch; an autotuned forward (its config is chosen when the graph runs)
    keeps the opaque saved-buffer backward."""
    script = tmp_path / "traced.py"
    script.write_text(TRACED_SCRIPT)
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "TRITONGRAD_OPAQUE_OPS")}
    env["PYTHONPATH"] = os.pathsep.join([str(Path(tritongrad.__file__).parents[1]), env.get("PYTHONPATH", "")])
    out = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "opaque False" in out.stdout
    forward, backward = out.stdout.split("== forward")[1].split("== backward")
    backward = backward.split("refused:")[0]
    assert forward.count("triton_kernel_wrapper_functional(") == 2 and "tgtraced" not in forward
    assert backward.count("triton_kernel_wrapper_functional(") == 2 and "tgtraced" not in backward
    assert "'d_out_ptr': mul" in backward  # the first derived kernel takes the incoming gradient (of y.sin())
    tuned = out.stdout.split("== tuned backward")[1]
    assert "tgtraced.tuned_saved_backward" in tuned and "triton_kernel_wrapper" not in tuned
    assert ("tritongrad.op `tgtraced::ctas`: torch.compile cannot trace the launch of `sin_kernel` through "
            "torch.library.wrap_triton") in out.stdout
    assert '@tritongrad.op("tgtraced::ctas", opaque=True)' in out.stdout
