"""Stores as production kernels write them: several stores to one output at disjoint
addresses, stores through addresses computed from loaded indices, and `//` / `%` digit splits of
lane indices. Each is accepted with a correct gradient where its addresses are provably apart
(at derivation, or checked on each launch's arguments), and refused, naming the line, where not.

Gradients against torch autograd on plain-PyTorch references in float64, random inputs, sizes
that are not powers of two, NaN-poisoned outputs.
"""

import pytest
import torch
import triton
import triton.language as tl
from test_refusals import marked_line

import tritongrad
from tritongrad import NotDifferentiableError
from tritongrad.tools.testing import assert_gradients_match, backward_launch, poison

# -- several stores to one output ------------------------------------------------------------------------


@triton.jit
def rotary(x_ptr, cos_ptr, sin_ptr, out_ptr, stride, half, BLOCK: tl.constexpr):
    """Rotary embedding, out of place: each row's two halves rotated, stored in two halves."""
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < half
    x1 = tl.load(x_ptr + row * stride + cols, mask=mask, other=0.0)
    x2 = tl.load(x_ptr + row * stride + half + cols, mask=mask, other=0.0)
    c = tl.load(cos_ptr + row * half + cols, mask=mask, other=0.0)
    s = tl.load(sin_ptr + row * half + cols, mask=mask, other=0.0)
    tl.store(out_ptr + row * stride + cols, x1 * c - x2 * s, mask=mask)
    tl.store(out_ptr + row * stride + half + cols, x2 * c + x1 * s, mask=mask)  # refused


def rotary_inputs(rows=7, half=11):
    x = torch.randn(rows, 2 * half, dtype=torch.float64)
    cos, sin = torch.randn(rows, half, dtype=torch.float64), torch.randn(rows, half, dtype=torch.float64)
    return x, cos, sin


def test_rotary_embedding_stores_its_two_halves():
    rows, half = 7, 11
    x, cos, sin = rotary_inputs(rows, half)
    out = poison(torch.empty_like(x))
    args = (x, cos, sin, out, 2 * half, half)
    rotary[(rows,)](*args, BLOCK=16)
    xs, cs, ss = (t.clone().requires_grad_() for t in (x, cos, sin))
    x1, x2 = xs[:, :half], xs[:, half:]
    want = torch.cat([x1 * cs - x2 * ss, x2 * cs + x1 * ss], 1)
    torch.testing.assert_close(out, want.detach())
    assert_gradients_match(rotary, (rows,), args, {"BLOCK": 16}, out, want, [xs, cs, ss],
                           ["x_ptr", "cos_ptr", "sin_ptr"])
    assert "which store (stride half, 2 values)" in tritongrad.grad(rotary).launch_notes()


def test_rotary_halves_that_overlap_at_this_launch_are_refused_there():
    """Rows of `half` elements: the second half of a row is the first half of the next one."""
    rows, half = 7, 11
    x, cos, sin = rotary_inputs(rows, half)
    out = torch.zeros(rows, 2 * half, dtype=torch.float64)
    with pytest.raises(NotDifferentiableError, match="a second tl.store to `out_ptr`.*both may write one element") \
            as info:
        backward_launch(rotary, (rows,), (x, cos, sin, out, half, half), {"BLOCK": 16},
                        {"out_ptr": torch.randn_like(out)})
    assert info.value.line == marked_line(rotary)


@triton.jit
def row_statistics(x_ptr, stats_ptr, N, BLOCK: tl.constexpr):
    """Mean, variance and maximum of each row, stored side by side."""
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    x = tl.load(x_ptr + row * N + cols, mask=mask, other=0.0)
    mean = tl.sum(x, axis=0) / N
    diff = tl.where(mask, x - mean, 0.0)
    var = tl.sum(diff * diff, axis=0) / N
    tl.store(stats_ptr + row * 3 + 0, mean)
    tl.store(stats_ptr + row * 3 + 1, var)
    tl.store(stats_ptr + row * 3 + 2, tl.max(tl.where(mask, x, -float("inf")), axis=0))


def test_three_row_statistics_stored_side_by_side():
    rows, n = 9, 13
    x = torch.randn(rows, n, dtype=torch.float64)
    stats = poison(torch.empty(rows, 3, dtype=torch.float64))
    row_statistics[(rows,)](x, stats, n, BLOCK=16)
    xs = x.clone().requires_grad_()
    want = torch.stack([xs.mean(1), xs.var(1, unbiased=False), xs.amax(1)], 1)
    torch.testing.assert_close(stats, want.detach())
    assert_gradients_match(row_statistics, (rows,), (x, stats, n), {"BLOCK": 16}, stats, want, [xs], ["x_ptr"])


@triton.jit
def halves_overlap(x_ptr, y_ptr):
    offs = tl.arange(0, 16)
    x = tl.load(x_ptr + offs)
    tl.store(y_ptr + offs, x)
    tl.store(y_ptr + 8 + offs, x * 2.0)  # refused


@triton.jit
def halves_move_differently(x_ptr, y_ptr, N, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs)
    tl.store(y_ptr + offs, x)
    tl.store(y_ptr + N + offs * 2, x * 2.0)  # refused


@triton.jit
def shift_from_loaded_data(x_ptr, n_ptr, y_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs)
    n = tl.load(n_ptr)
    tl.store(y_ptr + offs, x)
    tl.store(y_ptr + n + offs, x * 2.0)  # refused


@triton.jit
def one_store_in_a_loop(x_ptr, y_ptr, T, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs)
    for t in range(T):
        tl.store(y_ptr + (t + 1) * BLOCK + offs, x * t)
    tl.store(y_ptr + offs, x)  # refused


@pytest.mark.parametrize("kernel, construct", [
    (halves_overlap, "both write one element"),
    (halves_move_differently, "whose addresses move differently"),
    (shift_from_loaded_data, "computed from loaded data"),
    (one_store_in_a_loop, "whose addresses move differently along lanes, programs or loops"),
])
def test_stores_that_cannot_be_shown_apart_are_refused(kernel, construct):
    with pytest.raises(NotDifferentiableError) as info:
        tritongrad.grad(kernel)
    assert construct in info.value.construct, str(info.value)
    assert "a tl.store to" in info.value.construct or "a second tl.store" in info.value.construct
    assert info.value.line == marked_line(kernel)


# -- `//` and `%` of lane indices: a mixed-radix digit split ---------------------------------------------


@triton.jit
def conv1x1_nchw(x_ptr, w_ptr, y_ptr, M, HW, CIN, COUT, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    """A 1x1 convolution as an implicit GEMM: rows are (batch, pixel) pairs of NCHW tensors."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_m = pid_m * BM + tl.arange(0, BM)
    n = offs_m // HW
    hw = offs_m % HW
    offs_n = pid_n * BN + tl.arange(0, BN)
    acc = tl.zeros((BM, BN), dtype=tl.float64)
    for k in range(0, CIN, BK):
        offs_k = k + tl.arange(0, BK)
        a = tl.load(x_ptr + n[:, None] * CIN * HW + offs_k[None, :] * HW + hw[:, None],
                    mask=(offs_m[:, None] < M) & (offs_k[None, :] < CIN), other=0.0)
        b = tl.load(w_ptr + offs_n[None, :] * CIN + offs_k[:, None],
                    mask=(offs_n[None, :] < COUT) & (offs_k[:, None] < CIN), other=0.0)
        acc += tl.dot(a, b)
    tl.store(y_ptr + n[:, None] * COUT * HW + offs_n[None, :] * HW + hw[:, None], acc,
             mask=(offs_m[:, None] < M) & (offs_n[None, :] < COUT))


def test_nchw_convolution_stores_through_a_digit_split():
    batch, cin, cout, h, w = 3, 5, 7, 3, 5
    x = torch.randn(batch, cin, h, w, dtype=torch.float64)
    weight = torch.randn(cout, cin, dtype=torch.float64)
    y = poison(torch.empty(batch, cout, h, w, dtype=torch.float64))
    m = batch * h * w
    grid = (triton.cdiv(m, 16), triton.cdiv(cout, 16))
    args, meta = (x, weight, y, m, h * w, cin, cout), {"BM": 16, "BN": 16, "BK": 16}
    conv1x1_nchw[grid](*args, **meta)
    xs, ws = x.clone().requires_grad_(), weight.clone().requires_grad_()
    want = torch.nn.functional.conv2d(xs, ws[:, :, None, None])
    torch.testing.assert_close(y, want.detach())
    assert_gradients_match(conv1x1_nchw, grid, args, meta, y, want, [xs, ws], ["x_ptr", "w_ptr"])


@triton.jit
def nhwc_to_nchw(x_ptr, bias_ptr, y_ptr, NHW, HW, C, BLOCK: tl.constexpr):
    """y[n, c, hw] = gelu-ish(x[n, hw, c] + bias[c]): a flat index split into batch and pixel."""
    pid = tl.program_id(0)
    c = tl.program_id(1)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < NHW
    x = tl.load(x_ptr + offs * C + c, mask=mask, other=0.0)
    v = x + tl.load(bias_ptr + c)
    n = offs // HW
    hw = offs % HW
    tl.store(y_ptr + n * C * HW + c * HW + hw, v * tl.sigmoid(v), mask=mask)  # refused


def nhwc_inputs(batch=3, h=5, w=3, c=6):
    return torch.randn(batch, h, w, c, dtype=torch.float64), torch.randn(c, dtype=torch.float64)


def test_a_flat_index_split_into_batch_and_pixel():
    batch, h, w, c = 3, 5, 3, 6
    x, bias = nhwc_inputs(batch, h, w, c)
    y = poison(torch.empty(batch, c, h, w, dtype=torch.float64))
    grid = (triton.cdiv(batch * h * w, 16), c)
    args = (x, bias, y, batch * h * w, h * w, c)
    nhwc_to_nchw[grid](*args, BLOCK=16)
    xs, bs = x.clone().requires_grad_(), bias.clone().requires_grad_()
    v = (xs + bs).permute(0, 3, 1, 2)
    want = v * torch.sigmoid(v)
    torch.testing.assert_close(y, want.detach())
    assert_gradients_match(nhwc_to_nchw, grid, args, {"BLOCK": 16}, y, want, [xs, bs], ["x_ptr", "bias_ptr"])


def test_a_digit_split_whose_digits_overlap_at_this_launch_is_refused_there():
    """Channels C passed smaller than the grid's: channel c's pixels run into channel c + 1's."""
    batch, h, w, c = 3, 5, 3, 6
    x, bias = nhwc_inputs(batch, h, w, c)
    y = torch.zeros(batch, c, h, w, dtype=torch.float64)
    grid = (triton.cdiv(batch * h * w, 16), c)
    with pytest.raises(NotDifferentiableError, match="two lanes or programs reach one element") as info:
        backward_launch(nhwc_to_nchw, grid, (x, bias, y, batch * h * w, h * w, c - 1), {"BLOCK": 16},
                        {"y_ptr": torch.randn_like(y)})
    assert info.value.line == marked_line(nhwc_to_nchw)


@triton.jit
def quotient_only(x_ptr, y_ptr, HW, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs)
    tl.store(y_ptr + (offs // HW) * HW, x)  # refused


@triton.jit
def remainder_only(x_ptr, y_ptr, HW, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs)
    tl.store(y_ptr + offs % HW, x)  # refused


@triton.jit
def digits_of_a_shifted_index(x_ptr, y_ptr, start, HW, BLOCK: tl.constexpr):
    offs = start + tl.arange(0, BLOCK)  # may be negative: its digits are not known to count from zero
    x = tl.load(x_ptr + offs)
    tl.store(y_ptr + (offs // HW) * 2 * HW + offs % HW, x)  # refused


@triton.jit
def digits_with_a_negative_stride(x_ptr, y_ptr, HW, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK) * -1  # counts down from zero
    x = tl.load(x_ptr - offs)
    tl.store(y_ptr + (offs // HW) * HW + offs % HW, x)  # refused


@pytest.mark.parametrize("kernel, construct", [
    (quotient_only, "without the other digit"),
    (remainder_only, "without the other digit"),
    (digits_of_a_shifted_index, "through `//`, `%`"),
    (digits_with_a_negative_stride, "negative stride"),
])
def test_digit_splits_that_cannot_be_shown_apart_are_refused(kernel, construct):
    with pytest.raises(NotDifferentiableError) as info:
        tritongrad.grad(kernel)
    assert construct in info.value.construct, str(info.value)
    assert info.value.line == marked_line(kernel)


# -- stores at addresses computed from loaded indices ------------------------------------------------------


@triton.jit
def moe_scatter(x_ptr, score_ptr, perm_ptr, out_ptr, N, stride, BLOCK: tl.constexpr):
    """Mixture of experts: token `row`, weighted by its routing score, goes to row `perm[row]` of its
    expert's buffer; column blocks along the second grid axis."""
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < N
    dst = tl.load(perm_ptr + row)
    x = tl.load(x_ptr + row * stride + cols, mask=mask, other=0.0)
    score = tl.load(score_ptr + row)
    tl.store(out_ptr + dst * stride + cols, x * score, mask=mask)  # refused


def moe_inputs(rows=9, n=21):
    return torch.randn(rows, n, dtype=torch.float64), torch.rand(rows, dtype=torch.float64) + 0.5


def test_permutation_scatter_of_a_mixture_of_experts():
    rows, n = 9, 21
    x, score = moe_inputs(rows, n)
    perm = torch.randperm(rows).to(torch.int32)
    out = poison(torch.empty_like(x))
    grid = (rows, triton.cdiv(n, 8))
    args = (x, score, perm, out, n, n)
    moe_scatter[grid](*args, BLOCK=8)
    xs, ss = x.clone().requires_grad_(), score.clone().requires_grad_()
    want = torch.zeros_like(xs).index_copy(0, perm.long(), xs * ss[:, None])
    torch.testing.assert_close(out, want.detach())
    assert_gradients_match(moe_scatter, grid, args, {"BLOCK": 8}, out, want, [xs, ss], ["x_ptr", "score_ptr"])


def test_a_colliding_permutation_index_is_refused_at_launch_naming_it():
    rows, n = 9, 21
    x, score = moe_inputs(rows, n)
    perm = torch.randperm(rows).to(torch.int32)
    perm[6] = perm[2]
    out = torch.zeros_like(x)
    with pytest.raises(NotDifferentiableError, match=rf"programs 2 and 6 .*`dst` = perm_ptr\[2\] = {int(perm[2])} "
                       rf"and perm_ptr\[6\] = {int(perm[2])}") as info:
        backward_launch(moe_scatter, (rows, 3), (x, score, perm, out, n, n), {"BLOCK": 8},
                        {"out_ptr": torch.randn_like(out)})
    assert info.value.line == marked_line(moe_scatter)


def test_the_index_check_runs_on_every_launch_not_cached():
    """The same tensor object, its contents changed in place: checked again."""
    rows, n = 9, 21
    x, score = moe_inputs(rows, n)
    perm = torch.randperm(rows).to(torch.int32)
    out, d_out = torch.zeros_like(x), torch.randn_like(x)
    args, meta = (x, score, perm, out, n, n), {"BLOCK": 8}
    backward_launch(moe_scatter, (rows, 3), args, meta, {"out_ptr": d_out})
    perm[0] = perm[1]
    with pytest.raises(NotDifferentiableError, match="programs 0 and 1"):
        backward_launch(moe_scatter, (rows, 3), args, meta, {"out_ptr": d_out})


def test_a_colliding_index_in_an_op_is_refused_when_it_runs_backward():
    @tritongrad.op
    def scatter(x, score, perm):
        out = torch.zeros_like(x)
        moe_scatter[(x.shape[0], triton.cdiv(x.shape[1], 8))](x, score, perm, out, x.shape[1], x.stride(0), BLOCK=8)
        return out

    x, score = (t.requires_grad_() for t in moe_inputs())
    perm = torch.randperm(x.shape[0]).to(torch.int32)
    scatter(x, score, perm).sum().backward()
    torch.testing.assert_close(x.grad, score.detach()[:, None].expand_as(x))
    perm[4] = perm[5]
    with pytest.raises(NotDifferentiableError, match="programs 4 and 5"):
        scatter(x, score, perm).sum().backward()


@triton.jit
def permute_column_blocks(x_ptr, perm_ptr, y_ptr, M, N, BM: tl.constexpr, BN: tl.constexpr):
    """Blocks of columns moved where `perm` says: each program's elements interleave with the others' rows."""
    pid = tl.program_id(0)
    dst = tl.load(perm_ptr + pid)
    rows = tl.arange(0, BM)
    cols = tl.arange(0, BN)
    mask = (rows[:, None] < M) & (cols[None, :] < BN)
    x = tl.load(x_ptr + rows[:, None] * N + pid * BN + cols[None, :], mask=mask, other=0.0)
    tl.store(y_ptr + rows[:, None] * N + dst * BN + cols[None, :], tl.sin(x), mask=mask)


def test_permuted_column_blocks_interleave_but_distinct_indices_keep_them_apart():
    m, block, programs = 5, 4, 6
    n = block * programs
    x = torch.randn(m, n, dtype=torch.float64)
    perm = torch.randperm(programs)
    y = poison(torch.empty_like(x))
    args, meta = (x, perm, y, m, n), {"BM": 8, "BN": block}
    permute_column_blocks[(programs,)](*args, **meta)
    xs = x.clone().requires_grad_()
    want = torch.empty_like(xs).view(m, programs, block).index_copy(1, perm, torch.sin(xs).view(m, programs, block))
    want = want.view(m, n)
    torch.testing.assert_close(y, want.detach())
    assert_gradients_match(permute_column_blocks, (programs,), args, meta, y, want, [xs], ["x_ptr"])
    perm[4] = perm[1]
    with pytest.raises(NotDifferentiableError, match=rf"programs 1 and 4 .*`dst` = perm_ptr\[1\] = {int(perm[1])}"):
        backward_launch(permute_column_blocks, (programs,), args, meta, {"y_ptr": torch.randn_like(y)})


@triton.jit
def varlen_softmax(x_ptr, cu_seqlens_ptr, y_ptr, BLOCK: tl.constexpr):
    """Softmax of each sequence of a packed batch: sequence `pid` is x[cu_seqlens[pid]:cu_seqlens[pid + 1]]."""
    pid = tl.program_id(0)
    start = tl.load(cu_seqlens_ptr + pid)
    end = tl.load(cu_seqlens_ptr + pid + 1)
    offs = tl.arange(0, BLOCK)
    mask = offs < end - start
    x = tl.load(x_ptr + start + offs, mask=mask, other=-float("inf"))
    e = tl.exp(x - tl.max(x, axis=0))
    tl.store(y_ptr + start + offs, e / tl.sum(e, axis=0), mask=mask)  # refused


LENGTHS = [5, 1, 13, 7, 16]


def cu_seqlens(lengths):
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)


def test_variable_length_softmax_stores_each_sequence_in_place_in_the_packed_batch():
    cu = cu_seqlens(LENGTHS)
    x = torch.randn(sum(LENGTHS), dtype=torch.float64)
    y = poison(torch.empty_like(x))
    grid = (len(LENGTHS),)
    varlen_softmax[grid](x, cu, y, BLOCK=16)
    xs = x.clone().requires_grad_()
    want = torch.cat([torch.softmax(s, 0) for s in xs.split(LENGTHS)])
    torch.testing.assert_close(y, want.detach())
    assert_gradients_match(varlen_softmax, grid, (x, cu, y), {"BLOCK": 16}, y, want, [xs], ["x_ptr"])


def test_overlapping_sequences_are_refused_at_launch_naming_them():
    cu = cu_seqlens(LENGTHS)
    cu[2] = 3  # sequence 1 is x[5:3], sequence 2 x[3:19]: it starts inside sequence 0
    x = torch.randn(sum(LENGTHS), dtype=torch.float64)
    y = torch.zeros_like(x)
    with pytest.raises(NotDifferentiableError, match=r"programs 0 and 2 .*\(0\.\.4 and 3\.\.18\).*`start` = "
                       r"cu_seqlens_ptr\[0\] = 0 and cu_seqlens_ptr\[2\] = 3") as info:
        backward_launch(varlen_softmax, (len(LENGTHS),), (x, cu, y), {"BLOCK": 16}, {"y_ptr": torch.randn_like(y)})
    assert info.value.line == marked_line(varlen_softmax)


@triton.jit
def index_scales_the_lanes(x_ptr, k_ptr, y_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    k = tl.load(k_ptr)  # one stride for every program, but from memory
    tl.store(y_ptr + offs * k, tl.load(x_ptr + offs))  # refused


@triton.jit
def index_of_an_index(x_ptr, a_ptr, b_ptr, y_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    dst = tl.load(b_ptr + tl.load(a_ptr + tl.program_id(0)))
    tl.store(y_ptr + dst * BLOCK + offs, tl.load(x_ptr + offs))  # refused


@triton.jit
def masked_index(x_ptr, idx_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    pid = tl.program_id(0)
    dst = tl.load(idx_ptr + pid, mask=pid < n, other=0)
    tl.store(y_ptr + dst * BLOCK + offs, tl.load(x_ptr + offs))  # refused


@triton.jit
def index_through_division(x_ptr, idx_ptr, y_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    dst = tl.load(idx_ptr + tl.program_id(0)) // 2
    tl.store(y_ptr + dst * BLOCK + offs, tl.load(x_ptr + offs))  # refused


@triton.jit
def indices_per_lane(x_ptr, idx_ptr, y_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(y_ptr + tl.load(idx_ptr + offs), tl.load(x_ptr + offs))  # refused


@pytest.mark.parametrize("kernel, construct", [
    (index_scales_the_lanes, "scaled by loaded data"),
    (index_of_an_index, "is not one index per program"),
    (masked_index, "is not one index per program"),
    (index_through_division, "is not one index per program"),
    (indices_per_lane, "computed from loaded data"),
])
def test_scatters_the_launch_cannot_check_are_refused(kernel, construct):
    with pytest.raises(NotDifferentiableError) as info:
        tritongrad.grad(kernel)
    assert construct in info.value.construct, str(info.value)
    assert info.value.line == marked_line(kernel)


# -- program ids the address loses (found while writing these checks: silently wrong before) ---------------


@triton.jit
def rows_clamped(x_ptr, y_ptr, LAST, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + pid * BLOCK + offs)
    row = tl.minimum(pid, LAST)  # programs past LAST share its row: a launch with such programs is
    tl.store(y_ptr + row * BLOCK + offs, x * 2.0)  # refused


@triton.jit
def rows_from_a_range_of_the_program(x_ptr, y_ptr, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    for i in range(pid % 2, 2):  # program 1 runs i = 1 only, as program 0 does last
        x = tl.load(x_ptr + (pid * 2 + i) * BLOCK + offs)
        tl.store(y_ptr + i * BLOCK + offs, x * 2.0)  # refused


def test_a_row_the_programs_compute_is_checked_over_the_grid_at_launch():
    """``tl.minimum(pid, LAST)`` is a value each program computes (a swizzle): evaluated over the grid at each
    launch (refused at derivation before), where two programs computing one row are refused by name."""
    x, y = torch.randn(5, 4, dtype=torch.float64), torch.zeros(5, 4, dtype=torch.float64)
    d_y = torch.randn_like(y)
    got = backward_launch(rows_clamped, (5,), (x, y, 4), {"BLOCK": 4}, {"y_ptr": d_y})
    torch.testing.assert_close(got["x_ptr"], 2.0 * d_y)
    with pytest.raises(NotDifferentiableError, match=r"programs \(2, 0, 0\) and \(3, 0, 0\) compute the same") as info:
        backward_launch(rows_clamped, (5,), (x, y, 2), {"BLOCK": 4}, {"y_ptr": d_y})
    assert info.value.line == marked_line(rows_clamped)


def test_a_loop_whose_range_the_programs_compute_is_checked_per_program_and_iteration_at_launch():
    """The row ``i`` each program's loop visits, evaluated over the grid and the iterations each program runs (the
    index a persistent kernel swizzles): one program alone writes each row once; two write row 1 both."""
    x, y = torch.randn(4, 4, dtype=torch.float64), poison(torch.empty(2, 4, dtype=torch.float64))
    d_y = torch.randn_like(y)
    got = backward_launch(rows_from_a_range_of_the_program, (1,), (x, y), {"BLOCK": 4}, {"y_ptr": d_y})
    torch.testing.assert_close(got["x_ptr"][:2], 2.0 * d_y)
    with pytest.raises(NotDifferentiableError, match=r"program \(0, 0, 0\) at i = 1 and program \(1, 0, 0\) at i = 1 "
                       "compute the same") as info:
        backward_launch(rows_from_a_range_of_the_program, (2,), (x, y), {"BLOCK": 4}, {"y_ptr": d_y})
    assert info.value.line == marked_line(rows_from_a_range_of_the_program)


@triton.jit
def windows_of_the_program(x_ptr, y_ptr, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    for i in range(pid, pid + 2):  # programs p and p + 1 both write row p + 1
        x = tl.load(x_ptr + (pid * 2 + i - pid) * BLOCK + offs)
        tl.store(y_ptr + i * BLOCK + offs, x * 2.0)  # refused


def test_ranges_that_move_with_the_program_are_checked_across_programs():
    x, y = torch.randn(4, 4, dtype=torch.float64), torch.zeros(3, 4, dtype=torch.float64)
    with pytest.raises(NotDifferentiableError, match="two lanes or programs reach one element") as info:
        backward_launch(windows_of_the_program, (2,), (x, y), {"BLOCK": 4}, {"y_ptr": torch.randn_like(y)})
    assert info.value.line == marked_line(windows_of_the_program)
    d_y = torch.randn_like(y)  # one program: its two rows
    got = backward_launch(windows_of_the_program, (1,), (x, y), {"BLOCK": 4}, {"y_ptr": d_y})
    torch.testing.assert_close(got["x_ptr"][:2], 2.0 * d_y[:2])
