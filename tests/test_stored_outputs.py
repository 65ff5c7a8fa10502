"""A softmax written out is differentiated as one operation (composites.py), and an op's backward reads a
value back from the output the forward stored it in instead of recomputing it (stored_outputs.py), only where
every lane it reads is what the recomputation would have computed and no later launch wrote the output again."""

import pytest
import torch
import triton
import triton.language as tl

import tritongrad
from tritongrad.tools.testing import assert_gradients_match, poison

R, C, BR, BC = 5, 37, 8, 64


@triton.jit
def softmax_1d(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * n + cols, mask=cols < n, other=-float("inf"))
    e = tl.exp(x - tl.max(x, axis=0))
    tl.store(y_ptr + row * n + cols, e / tl.sum(e, axis=0), mask=cols < n)


@triton.jit
def softmax_rows_put_back(x_ptr, y_ptr, r, n, BR: tl.constexpr, BC: tl.constexpr):
    rows = tl.program_id(0) * BR + tl.arange(0, BR)
    cols = tl.arange(0, BC)
    mask = (rows < r)[:, None] & (cols < n)[None, :]
    x = tl.load(x_ptr + rows[:, None] * n + cols[None, :], mask=mask, other=-float("inf"))
    e = tl.exp(x - tl.max(x, axis=1)[:, None])
    s = tl.sum(e, axis=1)[:, None]
    tl.store(y_ptr + rows[:, None] * n + cols[None, :], e / s, mask=mask)


@triton.jit
def softmax_rows_kept_dims(x_ptr, y_ptr, r, n, BR: tl.constexpr, BC: tl.constexpr):
    rows = tl.program_id(0) * BR + tl.arange(0, BR)
    cols = tl.arange(0, BC)
    mask = (rows < r)[:, None] & (cols < n)[None, :]
    x = tl.load(x_ptr + rows[:, None] * n + cols[None, :], mask=mask, other=-float("inf"))
    e = tl.exp(x - tl.max(x, axis=1, keep_dims=True))
    tl.store(y_ptr + rows[:, None] * n + cols[None, :], e / tl.sum(e, 1, keep_dims=True), mask=mask)


@triton.jit
def softmax_columns_expand_dims(x_ptr, y_ptr, r, n, BR: tl.constexpr, BC: tl.constexpr):
    """Normalized down each column (axis 0), the sum put back with tl.expand_dims."""
    rows = tl.arange(0, BR)
    cols = tl.program_id(0) * BC + tl.arange(0, BC)
    mask = (rows < r)[:, None] & (cols < n)[None, :]
    x = tl.load(x_ptr + rows[:, None] * n + cols[None, :], mask=mask, other=-float("inf"))
    e = tl.exp(x - tl.expand_dims(tl.max(x, axis=0), 0))
    tl.store(y_ptr + rows[:, None] * n + cols[None, :], e / tl.expand_dims(tl.sum(e, axis=0), 0), mask=mask)


@triton.jit
def softmax_with_temperature(x_ptr, t_ptr, y_ptr, n, BLOCK: tl.constexpr):
    """The logits scaled by a temperature that has a gradient too (summed over every lane of the row)."""
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * n + cols, mask=cols < n, other=-float("inf")) / tl.load(t_ptr)
    e = tl.exp(x - tl.max(x, axis=0))
    tl.store(y_ptr + row * n + cols, e / tl.sum(e, axis=0), mask=cols < n)


@triton.jit
def triton_softmax(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * n + cols, mask=cols < n, other=-float("inf"))
    tl.store(y_ptr + row * n + cols, tl.softmax(x), mask=cols < n)


WRITTEN_OUT = {  # kernel, grid, meta, the dimension torch.softmax normalizes
    "1d": (softmax_1d, (R,), {"BLOCK": BC}, 1),
    "rows_put_back": (softmax_rows_put_back, (triton.cdiv(R, BR),), {"BR": BR, "BC": BC}, 1),
    "rows_kept_dims": (softmax_rows_kept_dims, (triton.cdiv(R, BR),), {"BR": BR, "BC": BC}, 1),
    "columns_expand_dims": (softmax_columns_expand_dims, (triton.cdiv(C, BC),), {"BR": BR, "BC": BC}, 0),
}


def _code(src):
    """The kernel's body without its comments and docstring (which quote the forward)."""
    body = src.split('"""')[-1]
    return "\n".join(line for line in body.splitlines() if not line.strip().startswith("#"))


def _args(name, x, y):
    return (x, y, C) if name == "1d" else (x, y, R, C)


@pytest.mark.parametrize("name", WRITTEN_OUT)
def test_a_written_out_softmax_is_differentiated_as_one(name):
    kernel, grid, meta, dim = WRITTEN_OUT[name]
    x = 3 * torch.randn(R, C, dtype=torch.float64)
    y = poison(torch.empty(R, C, dtype=torch.float64))
    kernel[grid](*_args(name, x, y), **meta)
    leaf = x.clone().requires_grad_()
    want = torch.softmax(leaf, dim)
    torch.testing.assert_close(y, want.detach(), rtol=1e-12, atol=1e-12)
    assert_gradients_match(kernel, grid, _args(name, x, y), meta, y, want, [leaf], ["x_ptr"])
    src = tritongrad.grad(kernel).src
    assert "tg.softmax_grad(" in src and "sum_grad" not in src, src
    assert "read back" not in src  # grad() alone is not told its output holds the forward's values
    kept = tritongrad.grad(kernel, kept_outputs=("y_ptr",)).src
    code = _code(kept)
    assert "read back from `y_ptr`" in kept and "tl.max(" not in code and "tl.load(x_ptr" not in code, kept


@pytest.fixture
def kept(monkeypatch):
    """The kernels an op's backward derived, with the outputs it was told hold the forward's values."""
    found = []
    grad = tritongrad.runtime.derive.grad

    def spy(kernel, *args, **kwargs):
        found.append((kernel, tuple(kwargs.get("kept_outputs", ()))))
        return grad(kernel, *args, **kwargs)

    monkeypatch.setattr(tritongrad.host.backward, "grad", spy)
    return found


@pytest.mark.parametrize("name", WRITTEN_OUT)
def test_an_op_reads_the_softmax_back_and_its_gradients_match(name, kept):
    kernel, grid, meta, dim = WRITTEN_OUT[name]

    @tritongrad.op
    def softmax(x):
        y = poison(torch.empty_like(x))
        kernel[grid](*_args(name, x, y), **meta)
        return y

    for _ in range(4):  # the checked backward, the one keeping its launches, the kept ones
        x = (3 * torch.randn(R, C, dtype=torch.float64)).requires_grad_()
        g = torch.randn(R, C, dtype=torch.float64)
        (got,) = torch.autograd.grad(softmax(x), x, g)
        (want,) = torch.autograd.grad(torch.softmax(x, dim), x, g)
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    assert kept == [(kernel, ("y_ptr",))]


def test_tl_softmax_and_a_scaled_softmax_have_gradients():
    x = 3 * torch.randn(R, C, dtype=torch.float64)
    t = torch.tensor([0.7], dtype=torch.float64)
    y = poison(torch.empty(R, C, dtype=torch.float64))
    triton_softmax[(R,)](x, y, C, BLOCK=BC)
    leaf = x.clone().requires_grad_()
    want = torch.softmax(leaf, 1)
    assert_gradients_match(triton_softmax, (R,), (x, y, C), {"BLOCK": BC}, y, want, [leaf], ["x_ptr"])

    @tritongrad.op
    def scaled(x, t):
        y = poison(torch.empty_like(x))
        softmax_with_temperature[(R,)](x, t, y, C, BLOCK=BC)
        return y

    for _ in range(3):
        xs, ts = x.clone().requires_grad_(), t.clone().requires_grad_()
        g = torch.randn(R, C, dtype=torch.float64)
        got = torch.autograd.grad(scaled(xs, ts), (xs, ts), g)
        want = torch.autograd.grad(torch.softmax(xs / ts, 1), (xs, ts), g)
        for a, b in zip(got, want, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    # the temperature's gradient reads x anyway: y read back would be a load more, and is not
    assert "read back" not in tritongrad.grad(softmax_with_temperature, kept_outputs=("y_ptr",)).src


@triton.jit
def softmax_stored_narrower(x_ptr, y_ptr, n, m, BLOCK: tl.constexpr):
    """Normalized over n columns, the first m (< n) stored: the others' values are not in memory."""
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * n + cols, mask=cols < n, other=-float("inf"))
    e = tl.exp(x - tl.max(x, axis=0))
    tl.store(y_ptr + row * m + cols, e / tl.sum(e, axis=0), mask=cols < m)


@triton.jit
def softmax_over_zero_padding(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    """Padding loaded as 0 and normalized over with the rest: outside the mask the softmax is not 0."""
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * n + cols, mask=cols < n, other=0.0)
    e = tl.exp(x - tl.max(x, axis=0))
    tl.store(y_ptr + row * n + cols, e / tl.sum(e, axis=0), mask=cols < n)


@triton.jit
def softmax_padded_by_where(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    """Padding loaded as 0, then made -inf by tl.where on the store's mask: 0 after the softmax."""
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * n + cols, mask=cols < n, other=0.0)
    x = tl.where(cols < n, x, -float("inf"))
    e = tl.exp(x - tl.max(x, axis=0))
    tl.store(y_ptr + row * n + cols, e / tl.sum(e, axis=0), mask=cols < n)


def test_a_value_is_read_back_only_where_its_lanes_outside_the_mask_are_known():
    m = C - 9
    narrower = tritongrad.grad(softmax_stored_narrower, kept_outputs=("y_ptr",)).src
    assert "read back" not in narrower and "tl.max(" in _code(narrower)
    assert "read back" not in tritongrad.grad(softmax_over_zero_padding, kept_outputs=("y_ptr",)).src
    assert "read back" in tritongrad.grad(softmax_padded_by_where, kept_outputs=("y_ptr",)).src

    @tritongrad.op
    def over_padding(x):
        y = poison(torch.empty_like(x))
        softmax_over_zero_padding[(R,)](x, y, C, BLOCK=BC)
        return y

    @tritongrad.op
    def where_padded(x):
        y = poison(torch.empty_like(x))
        softmax_padded_by_where[(R,)](x, y, C, BLOCK=BC)
        return y

    for _ in range(3):
        x = (3 * torch.randn(R, C, dtype=torch.float64)).requires_grad_()
        g = torch.randn(R, C, dtype=torch.float64)
        padded = torch.nn.functional.pad(x, (0, BC - C))  # the kernel's row, zeros to the block
        for op, reference in ((over_padding, torch.softmax(padded, 1)[:, :C]), (where_padded, torch.softmax(x, 1))):
            (got,) = torch.autograd.grad(op(x), x, g)
            (want,) = torch.autograd.grad(reference, x, g)
            torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)

    @tritongrad.op
    def narrow(x):
        y = poison(torch.empty(R, m, dtype=x.dtype))
        softmax_stored_narrower[(R,)](x, y, C, m, BLOCK=BC)
        return y

    for _ in range(3):
        x = (3 * torch.randn(R, C, dtype=torch.float64)).requires_grad_()
        g = torch.randn(R, m, dtype=torch.float64)
        (got,) = torch.autograd.grad(narrow(x), x, g)
        (want,) = torch.autograd.grad(torch.softmax(x, 1)[:, :m], x, g)
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


@triton.jit
def scale_in_place(y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.load(y_ptr + offs, mask=offs < n) * 3.0, mask=offs < n)


def test_an_output_a_later_launch_writes_again_is_not_read_back(kept):

    @tritongrad.op
    def softmax_tripled(x):
        y = poison(torch.empty_like(x))
        softmax_1d[(R,)](x, y, C, BLOCK=BC)
        scale_in_place[(triton.cdiv(R * C, 64),)](y, R * C, BLOCK=64)
        return y

    for _ in range(3):
        x = (3 * torch.randn(R, C, dtype=torch.float64)).requires_grad_()
        g = torch.randn(R, C, dtype=torch.float64)
        (got,) = torch.autograd.grad(softmax_tripled(x), x, g)
        (want,) = torch.autograd.grad(3 * torch.softmax(x, 1), x, g)
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    assert (softmax_1d, ()) in kept and not any(k for _, k in kept), kept


def test_changing_an_output_read_back_before_the_backward_raises():
    @tritongrad.op
    def softmax(x):
        y = torch.empty_like(x)
        softmax_1d[(R,)](x, y, C, BLOCK=BC)
        return y

    x = torch.randn(R, C, dtype=torch.float64, requires_grad=True)
    y = softmax(x)
    y.mul_(2)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


def test_a_layer_norm_reads_its_mean_and_rstd_back(kept, device):
    """The example stores each row's mean and rstd, as the Triton tutorial does: the op's backward reads them
    back (no reduction recomputed: rstd = 1 / sqrt(var + eps) is differentiated from rstd alone, composites.py)."""
    from tritongrad.examples import layernorm

    src = _code(tritongrad.grad(layernorm.layernorm_kernel, kept_outputs=("mean_ptr", "rstd_ptr")).src)
    assert "tl.sum(x" not in src and "tl.sum(xc_times_xc" not in src and "tl.sqrt(" not in src, src
    for _ in range(4):
        x, w, b = (t.requires_grad_() for t in layernorm.make_inputs((R, C), device, torch.float64))
        y = layernorm.layernorm(x, w, b)
        g = torch.randn_like(y)
        got = torch.autograd.grad(y, (x, w, b), g)
        want = torch.autograd.grad(layernorm.reference(x, w, b), (x, w, b), g)
        for a, e in zip(got, want, strict=True):
            torch.testing.assert_close(a, e, rtol=1e-10, atol=1e-12)
    assert {k for _, k in kept} == {("mean_ptr", "rstd_ptr")}
    y = layernorm.layernorm(x, w, b)
    y.add_(1.0)  # y is no rule's: not saved, so changing it in place is allowed, as with PyTorch's layer_norm
    y.sum().backward()


@triton.jit
def row_statistics(x_ptr, y_ptr, mean_ptr, n, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * n + cols, mask=cols < n, other=0.0)
    mean = tl.sum(x, axis=0) / n
    tl.store(mean_ptr + row, mean)
    tl.store(y_ptr + row * n + cols, (x - mean) * (x - mean), mask=cols < n)


@pytest.mark.parametrize("stats", [torch.float64, torch.float32, torch.float16])
def test_a_statistic_is_read_back_only_from_an_output_that_holds_it_exactly(stats, kept):
    """A float64 row's mean kept in float64 is read back; in float32 or float16 it would be rounded: recomputed."""
    @tritongrad.op
    def squared_deviation(x):
        y = poison(torch.empty_like(x))
        mean = torch.empty(R, dtype=stats)
        row_statistics[(R,)](x, y, mean, C, BLOCK=BC)
        return y

    for _ in range(3):
        x = (3 * torch.randn(R, C, dtype=torch.float64)).requires_grad_()
        g = torch.randn(R, C, dtype=torch.float64)
        (got,) = torch.autograd.grad(squared_deviation(x), x, g)
        (want,) = torch.autograd.grad((x - x.mean(1, keepdim=True)) ** 2, x, g)
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    assert kept == [(row_statistics, ("mean_ptr",) if stats == torch.float64 else ())]


@pytest.mark.parametrize("example", ["layernorm", "softmax"])
def test_a_compiled_op_reads_back_what_its_compiled_forward_saved(example, device, kept):
    """Under torch.compile the forward saves the op's outputs and the buffers its launches were passed (the
    layer norm's mean and rstd); the compiled backward reads them back from those."""
    from tritongrad import examples

    ex = examples.get(example)
    compiled = torch.compile(lambda *args: ex.op(*args) * 2, fullgraph=True, backend="aot_eager")
    for _ in range(2):
        inputs = [t.requires_grad_() for t in ex.make_inputs((R, C), device, torch.float64)]
        y = compiled(*inputs)
        g = torch.randn_like(y)
        got = torch.autograd.grad(y, inputs, g)
        want = torch.autograd.grad(ex.reference(*inputs) * 2, inputs, g)
        for a, e in zip(got, want, strict=True):
            torch.testing.assert_close(a, e, rtol=1e-10, atol=1e-12)
    assert kept and all(outputs for _, outputs in kept), kept


@triton.jit
def normalize_rows(x_ptr, y_ptr, mean_ptr, rstd_ptr, n, BLOCK: tl.constexpr):
    """Both statistics stored at one offset computed after them: it moves up, once, with the first read back."""
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * n + cols, mask=cols < n, other=0.0)
    mean = tl.sum(x, axis=0) / n
    xc = tl.where(cols < n, x - mean, 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(xc * xc, axis=0) / n + 1e-5)
    at = row * 1
    tl.store(mean_ptr + at, mean)
    tl.store(rstd_ptr + at, rstd)
    tl.store(y_ptr + row * n + cols, xc * rstd, mask=cols < n)


def test_statistics_stored_at_one_offset_are_read_back(kept, device):
    src = _code(tritongrad.grad(normalize_rows, outputs=("y_ptr",), kept_outputs=("mean_ptr", "rstd_ptr")).src)
    assert src.count("at = ") == 1 and "tl.sum(x" not in src, src

    @tritongrad.op
    def normalize(x):
        y = poison(torch.empty_like(x))
        mean, rstd = (torch.empty(R, dtype=x.dtype, device=device) for _ in range(2))
        normalize_rows[(R,)](x, y, mean, rstd, C, BLOCK=BC)
        return y

    for _ in range(3):
        x = (3 * torch.randn(R, C, dtype=torch.float64, device=device)).requires_grad_()
        g = torch.randn(R, C, dtype=torch.float64, device=device)
        (got,) = torch.autograd.grad(normalize(x), x, g)
        want_y = torch.nn.functional.layer_norm(x, (C,), eps=1e-5)
        (want,) = torch.autograd.grad(want_y, x, g)
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    assert kept == [(normalize_rows, ("mean_ptr", "rstd_ptr"))]
