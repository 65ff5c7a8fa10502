"""Hostile inputs: each ends in a clear error or a correct gradient, never a wrong one.

Refusals that are one construct each live in test_refusals.py (a second store to an output,
a load of a stored output, scatter stores, atomic_max, inline calls without rules, sources
that cannot be found); the cases here need a run to show what happens.
"""

import pytest
import torch
import triton
import triton.language as tl

import tritongrad
from tritongrad import NotDifferentiableError
from tritongrad.core.errors import OpError
from tritongrad.tools.testing import backward_launch, poison


@triton.jit
def loop_to_a_loaded_count(x_ptr, n_ptr, y_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    steps = tl.load(n_ptr + tl.program_id(0))
    x = tl.load(x_ptr + tl.program_id(0) * BLOCK + offs)
    acc = tl.zeros([BLOCK], dtype=tl.float64)
    for _ in range(steps):  # the trip count is data: the backward recomputes the same load
        acc += tl.sin(x)
    tl.store(y_ptr + tl.program_id(0) * BLOCK + offs, acc)


def test_trip_count_from_loaded_data_gives_the_right_gradient():
    counts = torch.tensor([3, 0, 5], dtype=torch.int32)
    x = torch.randn(3, 16, dtype=torch.float64)
    y = poison(torch.empty_like(x))
    loop_to_a_loaded_count[(3,)](x, counts, y, BLOCK=16)
    xs = x.clone().requires_grad_()
    want = torch.sin(xs) * counts[:, None].double()
    torch.testing.assert_close(y, want.detach())
    dy = torch.randn_like(x)
    got = backward_launch(loop_to_a_loaded_count, (3,), (x, counts, y), {"BLOCK": 16}, {"y_ptr": dy})
    assert tritongrad.grad(loop_to_a_loaded_count).wrt == ("x_ptr",)  # the count holds no gradient
    torch.testing.assert_close(got["x_ptr"], torch.autograd.grad(want, xs, dy)[0])


@triton.jit
def scale_rows(x_ptr, s_ptr, y_ptr, N, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    row = tl.program_id(0)
    s = tl.load(s_ptr + row)
    x = tl.load(x_ptr + row * N + offs, mask=offs < N, other=0.0)
    tl.store(y_ptr + row * N + offs, x * s, mask=offs < N)


def test_integer_tensor_in_wrt_is_named():
    x = torch.randn(2, 5, dtype=torch.float64)
    s = torch.tensor([2, 3], dtype=torch.int32)
    y = torch.empty_like(x)
    with pytest.raises(TypeError, match="wrt names `s_ptr`, but the tensor passed there is torch.int32"):
        backward_launch(scale_rows, (2,), (x, s, y, 5), {"BLOCK": 8}, {"y_ptr": torch.randn_like(x)},
                        wrt=("x_ptr", "s_ptr"))


@triton.jit
def dropout(x_ptr, y_ptr, n, p, seed, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    keep = tl.rand(seed, offs) > p  # regenerated identically when the backward recomputes the forward
    tl.store(y_ptr + offs, tl.where(keep, x / (1 - p), 0.0), mask=mask)


def test_dropout_mask_is_regenerated_identically():
    n, p, seed = 300, 0.3, 1234
    x = torch.randn(n, dtype=torch.float64).abs() + 0.1  # nonzero, so a dropped element shows as 0
    y = poison(torch.empty_like(x))
    grid = (triton.cdiv(n, 64),)
    dropout[grid](x, y, n, p, seed, BLOCK=64)
    kept = y != 0
    assert 0 < kept.sum() < n
    dy = torch.randn_like(x)
    got = backward_launch(dropout, grid, (x, y, n, p, seed), {"BLOCK": 64}, {"y_ptr": dy})
    torch.testing.assert_close(got["x_ptr"], torch.where(kept, dy / (1 - p), 0.0))


@triton.jit
def reads_back_its_output(x_ptr, y_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs) * 2.0)
    z = tl.load(y_ptr + offs)  # what it stored: forwarded (frontend/forwarding.py)
    tl.store(y_ptr + BLOCK + offs, z)


def test_reading_an_output_after_storing_it_gets_both_stores_gradients():
    x = torch.randn(32, dtype=torch.float64)
    y = poison(torch.empty(64, dtype=torch.float64))
    reads_back_its_output[(1,)](x, y, BLOCK=32)
    torch.testing.assert_close(y, torch.cat([2 * x, 2 * x]))
    dy = torch.randn_like(y)
    got = backward_launch(reads_back_its_output, (1,), (x, y), {"BLOCK": 32}, {"y_ptr": dy})
    torch.testing.assert_close(got["x_ptr"], 2 * (dy[:32] + dy[32:]))


@triton.jit
def inline_asm(x_ptr, y_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs)
    y = tl.inline_asm_elementwise("mov.f32 $0, $1;", "=r,r", [x], dtype=tl.float32, is_pure=True, pack=1)
    tl.store(y_ptr + offs, y)


def test_inline_assembly_is_refused():
    with pytest.raises(NotDifferentiableError, match="inline_asm_elementwise"):
        tritongrad.grad(inline_asm)


def test_op_with_mismatched_devices_is_named():
    if not torch.cuda.is_available():
        pytest.skip("needs a second device type")
    from tritongrad.examples.swiglu import swiglu

    op = tritongrad.op(swiglu)
    a = torch.randn(100, device="cuda", requires_grad=True)
    b = torch.randn(100, device="cpu", requires_grad=True)
    with pytest.raises(Exception, match="CPU tensor|device"):
        op(a, b)


# -- mismatched shapes and dtypes at an op call ----------------------------------------------------
#
# tritongrad cannot know what a host function means, only what its launches did: these show which
# gradient each mismatch gets (that of the launches as they ran) or which error (docs/guarantees.md).


@triton.jit
def rms_rows(x_ptr, w_ptr, y_ptr, N, eps, BLOCK: tl.constexpr):
    """RMSNorm of rows of N contiguous elements, scaled by w[:N]."""
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    x = tl.load(x_ptr + row * N + cols, mask=mask, other=0.0)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / N + eps)
    tl.store(y_ptr + row * N + cols, x * rstd * w, mask=mask)


def rms_unchecked(x, w):
    """Trusts its caller, as host functions often do: rows of x.shape[-1] contiguous elements, w that long."""
    n = x.shape[-1]
    y = poison(torch.empty_like(x))
    rms_rows[(x.numel() // n,)](x, w, y, n, 1e-6, BLOCK=triton.next_power_of_2(n))
    return y


def rms_ref(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w


RMS = {"bare": tritongrad.op(rms_unchecked), "named": tritongrad.op("tghostile::rms")(rms_unchecked)}
KINDS = pytest.mark.parametrize("kind", RMS)


def gradients(op, *inputs, upstream=None):
    """The op's output and each input's gradient, for an upstream gradient (random float64 by default)."""
    inputs = [t.clone().requires_grad_(t.is_floating_point()) for t in inputs]
    y = op(*inputs)
    y.backward(torch.randn(y.shape, dtype=torch.float64) if upstream is None else upstream)
    return y.detach(), *[t.grad for t in inputs]


def assert_matches(op, ref, *inputs, tol=1e-10):
    """Forward and gradients of ``op`` against ``ref`` run in float64 on the same values: each
    gradient in its input's dtype, within ``tol``."""
    want = [t.double() for t in inputs]
    g = torch.randn(ref(*want).shape, dtype=torch.float64)
    got, want = gradients(op, *inputs, upstream=g), gradients(ref, *want, upstream=g)
    for a, b, t in zip(got, want, (got[0], *inputs), strict=True):
        assert a.dtype == t.dtype
        torch.testing.assert_close(a.double(), b, rtol=tol, atol=tol)


@KINDS
@pytest.mark.parametrize("x_dtype, w_dtype", [(torch.float32, torch.float64), (torch.float64, torch.float32),
                                              (torch.float16, torch.float32), (torch.float32, torch.float16)])
def test_inputs_of_mixed_float_dtypes_get_correct_gradients_in_their_dtypes(kind, x_dtype, w_dtype):
    x, w = torch.randn(7, 45, dtype=x_dtype), torch.randn(45, dtype=w_dtype)
    assert_matches(RMS[kind], rms_ref, x, w, tol=2e-2 if torch.float16 in (x_dtype, w_dtype) else 1e-5)


@KINDS
def test_integer_input_where_a_float_is_expected_gives_an_integer_output_without_gradient(kind):
    x, w = torch.randint(-3, 4, (7, 45)), torch.randn(45, dtype=torch.float64, requires_grad=True)
    y = RMS[kind](x, w)  # y = empty_like(x) is an integer tensor: not differentiable, as in PyTorch
    assert y.dtype == x.dtype and not y.requires_grad
    with pytest.raises(RuntimeError, match="does not require grad"):
        y.sum().backward()


@KINDS
def test_integer_input_beside_a_float_one_gets_no_gradient(kind):
    @tritongrad.op if kind == "bare" else tritongrad.op("tghostile::scale_rows")
    def scale(x, s):  # integer counts x, float weights s per row
        y = poison(torch.empty(x.shape, dtype=s.dtype, device=x.device))
        scale_rows[(x.shape[0],)](x, s, y, x.shape[1], BLOCK=triton.next_power_of_2(x.shape[1]))
        return y

    x, s = torch.randint(-3, 4, (7, 45), dtype=torch.int32), torch.randn(7, dtype=torch.float64)
    y, x_grad, s_grad = gradients(scale, x, s, upstream=torch.ones(7, 45, dtype=torch.float64))
    torch.testing.assert_close(y, x * s[:, None])
    assert x_grad is None
    torch.testing.assert_close(s_grad, x.sum(1).double())


@KINDS
def test_upstream_gradient_of_another_dtype_or_layout(kind):
    x, w = torch.randn(7, 45), torch.randn(45)
    ref = lambda x, w: rms_ref(x, w).float()  # noqa: E731 (the op's output is float32)
    assert_matches(lambda x, w: RMS[kind](x, w).double(), lambda x, w: rms_ref(x, w), x, w, tol=1e-5)  # f64 loss
    for g in (torch.randn(7, 45, dtype=torch.float64), torch.randn(45, 7, dtype=torch.float16).t(),
              torch.randn(45).expand(7, 45)):
        got = gradients(RMS[kind], x, w, upstream=g)  # autograd hands the op g in float32, any layout
        want = gradients(ref, x.double(), w.double(), upstream=g.float())
        for a, b in zip(got, want, strict=True):
            torch.testing.assert_close(a.double(), b.double(), rtol=1e-5, atol=1e-5)


@KINDS
@pytest.mark.parametrize("shape", [(45,), (2, 3, 45)])
def test_inputs_of_other_ranks_are_rows_to_this_host(kind, shape):
    assert_matches(RMS[kind], rms_ref, torch.randn(shape, dtype=torch.float64), torch.randn(45, dtype=torch.float64))


@KINDS
def test_weight_longer_than_a_row_gets_zero_gradient_past_it(kind):
    x, w = torch.randn(7, 45, dtype=torch.float64), torch.randn(46, dtype=torch.float64)
    assert_matches(RMS[kind], lambda x, w: rms_ref(x, w[:45]), x, w)  # w[45] is never read: its gradient is 0


@KINDS
@pytest.mark.parametrize("where", ["past its storage", "into the rest of its storage"])
def test_weight_shorter_than_a_row_is_refused_at_backward(kind, where):
    x = torch.randn(7, 45, dtype=torch.float64, requires_grad=True)
    w = torch.randn(44 if where == "past its storage" else 50, dtype=torch.float64, requires_grad=True)
    y = RMS[kind](x, w[:44])  # the launch reads w[44]: memory that is not the op's argument
    with pytest.raises(OpError, match=r"launch #1 \(`rms_rows`\) reads memory outside the elements of the tensor "
                                      r"passed to `w_ptr` \(sizes \(44,\), strides \(1,\)\)"):
        y.backward(torch.randn_like(y))


@KINDS
def test_transposed_input_to_a_host_assuming_contiguity_gets_the_gradient_of_what_ran(kind):
    # the launch reads x's memory in storage order as rows of 45, and writes y = empty_like(x), which has
    # x's strides, in that order: not what the host meant, but every element read is one of x's
    ran = lambda b, w: rms_ref(b.reshape(7, 45), w).reshape(45, 7).t()  # noqa: E731
    assert_matches(lambda b, w: RMS[kind](b.t(), w), ran, torch.randn(45, 7, dtype=torch.float64),
                   torch.randn(45, dtype=torch.float64))


@KINDS
def test_sliced_input_to_a_host_assuming_contiguity_is_refused_at_backward(kind):
    base = torch.randn(7, 52, dtype=torch.float64, requires_grad=True)
    y = RMS[kind](base[:, :45], torch.randn(45, dtype=torch.float64))  # reads base[0, 45:52] as x's row 1...
    with pytest.raises(OpError, match=r"launch #1 \(`rms_rows`\) reads memory outside the elements of the tensor "
                                      r"passed to `x_ptr` \(sizes \(7, 45\), strides \(52, 1\)\)"):
        y.backward(torch.randn_like(y))


@KINDS
def test_transposed_input_whose_row_stride_makes_programs_store_to_one_element(kind):
    from tritongrad.examples.rmsnorm import rmsnorm_fwd

    def rmsnorm_without_its_assert(x, w):  # the bundled launcher asserts x.is_contiguous()
        y = torch.empty_like(x)  # x's strides: row stride 1 for a transposed x, so rows overlap
        rstd = torch.empty(x.shape[0], dtype=x.dtype)
        rmsnorm_fwd[(x.shape[0],)](x, w, y, rstd, x.stride(0), x.shape[1], 1e-6, BLOCK=64)
        return y

    op = (tritongrad.op if kind == "bare" else tritongrad.op("tghostile::rmsnorm_overlapping"))(
        rmsnorm_without_its_assert)
    x, w = torch.randn(45, 7, dtype=torch.float64).t(), torch.randn(45, dtype=torch.float64)
    # rows of 45 elements one apart overlap: the launch checks of lanes.py refuse the backward (each program
    # would take the gradient of elements another program overwrote)
    with pytest.raises(NotDifferentiableError, match="with this launch's strides, sizes and grid, two lanes or "
                                                      "programs reach one element"):
        gradients(op, x, w)
