"""Variable-length softmax over `cu_seqlens` as people write it: one program per sequence, or per
(sequence, block of rows), its bounds loaded (`start = tl.load(cu_seqlens + pid)`, `end = tl.load(cu_seqlens + pid +
1)`), elements or rows `start + offs` masked by `< end`, in one block or in a loop over `range(start, end, BLOCK)`.
The stores' addresses come from loaded offsets: each launch reads them (analysis/index_ranges.py's RangesApart, a
loop's trip count per program included) and the backward runs where the sequences are disjoint and within the
output; overlapping sequences, or one past the tensor, are refused at the launch.

Float64 against PyTorch's softmax per segment, lengths not powers of two with an empty sequence and sequences longer
than a block, bare and named ops, the kernel alone (`tritongrad.grad`), NaN-poisoned outputs and buffers.
"""

import pytest
import torch
import triton
import triton.language as tl
from conftest import DEVICE

import tritongrad
from tritongrad import NotDifferentiableError
from tritongrad.tools.testing import assert_gradients_match, backward_launch, poison

D = torch.float64
LENGTHS = [5, 0, 13, 7, 21]  # an empty sequence; 13 and 21 longer than the loops' BLOCK of 8
COLUMNS = 11


@triton.jit
def softmax_one_block(x_ptr, y_ptr, cu_seqlens, BLOCK: tl.constexpr):
    # one program per sequence, the whole sequence in one block
    seq = tl.program_id(0)
    start = tl.load(cu_seqlens + seq)
    end = tl.load(cu_seqlens + seq + 1)
    offs = start + tl.arange(0, BLOCK)
    mask = offs < end
    x = tl.load(x_ptr + offs, mask=mask, other=-float("inf"))
    e = tl.exp(x - tl.max(x, 0))
    tl.store(y_ptr + offs, e / tl.sum(e, 0), mask=mask)


@triton.jit
def softmax_online(x_ptr, y_ptr, cu_seqlens, BLOCK: tl.constexpr):
    # one program per sequence, in blocks: an online max and sum, then the normalized values
    seq = tl.program_id(0)
    start = tl.load(cu_seqlens + seq)
    end = tl.load(cu_seqlens + seq + 1)
    m = tl.full((), -float("inf"), x_ptr.dtype.element_ty)
    total = tl.zeros((), x_ptr.dtype.element_ty)
    for off in range(start, end, BLOCK):
        offs = off + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + offs, mask=offs < end, other=-float("inf"))
        m_new = tl.maximum(m, tl.max(x, 0))
        total = total * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new), 0)
        m = m_new
    for off in range(start, end, BLOCK):
        offs = off + tl.arange(0, BLOCK)
        mask = offs < end
        x = tl.load(x_ptr + offs, mask=mask, other=-float("inf"))
        tl.store(y_ptr + offs, tl.exp(x - m) / total, mask=mask)


@triton.jit
def softmax_three_passes(x_ptr, y_ptr, cu_seqlens, BLOCK: tl.constexpr):
    # one program per sequence, in blocks: a lane-wise running max (a nonlinear loop), the sum, the values
    seq = tl.program_id(0)
    start = tl.load(cu_seqlens + seq)
    end = tl.load(cu_seqlens + seq + 1)
    m = tl.full((BLOCK,), -float("inf"), x_ptr.dtype.element_ty)
    for off in range(start, end, BLOCK):
        offs = off + tl.arange(0, BLOCK)
        m = tl.maximum(m, tl.load(x_ptr + offs, mask=offs < end, other=-float("inf")))
    row_max = tl.max(m, 0)
    s = tl.zeros((BLOCK,), x_ptr.dtype.element_ty)
    for off in range(start, end, BLOCK):
        offs = off + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + offs, mask=offs < end, other=-float("inf"))
        s += tl.exp(x - row_max)
    total = tl.sum(s, 0)
    for off in range(start, end, BLOCK):
        offs = off + tl.arange(0, BLOCK)
        mask = offs < end
        x = tl.load(x_ptr + offs, mask=mask, other=-float("inf"))
        tl.store(y_ptr + offs, tl.exp(x - row_max) / total, mask=mask)


@triton.jit
def row_softmax_blocks(x_ptr, y_ptr, cu_seqlens, stride_x, stride_y, n_cols, BLOCK_M: tl.constexpr,
                       BLOCK_N: tl.constexpr):
    # a packed (tokens, n_cols) tensor: one program per (sequence, block of its rows), softmax over each row
    seq = tl.program_id(0)
    block = tl.program_id(1)
    start = tl.load(cu_seqlens + seq)
    end = tl.load(cu_seqlens + seq + 1)
    rows = start + block * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    mask = (rows[:, None] < end) & (cols[None, :] < n_cols)
    x = tl.load(x_ptr + rows[:, None] * stride_x + cols[None, :], mask=mask, other=-float("inf"))
    e = tl.exp(x - tl.max(x, 1)[:, None])
    tl.store(y_ptr + rows[:, None] * stride_y + cols[None, :], e / tl.sum(e, 1)[:, None], mask=mask)


@triton.jit
def row_softmax_loop(x_ptr, y_ptr, cu_seqlens, stride_x, stride_y, n_cols, BLOCK_M: tl.constexpr,
                     BLOCK_N: tl.constexpr):
    # a packed (tokens, n_cols) tensor: one program per sequence, looping over blocks of its rows
    seq = tl.program_id(0)
    start = tl.load(cu_seqlens + seq)
    end = tl.load(cu_seqlens + seq + 1)
    cols = tl.arange(0, BLOCK_N)
    for row0 in range(start, end, BLOCK_M):
        rows = row0 + tl.arange(0, BLOCK_M)
        mask = (rows[:, None] < end) & (cols[None, :] < n_cols)
        x = tl.load(x_ptr + rows[:, None] * stride_x + cols[None, :], mask=mask, other=-float("inf"))
        e = tl.exp(x - tl.max(x, 1)[:, None])
        tl.store(y_ptr + rows[:, None] * stride_y + cols[None, :], e / tl.sum(e, 1)[:, None], mask=mask)


@triton.jit
def row_softmax_tokens(x_ptr, y_ptr, cu_seqlens, stride_x, stride_y, n_cols, BLOCK_N: tl.constexpr):
    # a packed (tokens, n_cols) tensor: one program per sequence, one row per iteration (no mask on the rows)
    seq = tl.program_id(0)
    start = tl.load(cu_seqlens + seq)
    end = tl.load(cu_seqlens + seq + 1)
    cols = tl.arange(0, BLOCK_N)
    for row in range(start, end):
        x = tl.load(x_ptr + row * stride_x + cols, mask=cols < n_cols, other=-float("inf"))
        e = tl.exp(x - tl.max(x, 0))
        tl.store(y_ptr + row * stride_y + cols, e / tl.sum(e, 0), mask=cols < n_cols)


SEQUENCE_KERNELS = {"one_block": (softmax_one_block, 32), "online": (softmax_online, 8),
                    "three_passes": (softmax_three_passes, 8)}
ROW_KERNELS = {"blocks": row_softmax_blocks, "loop": row_softmax_loop, "tokens": row_softmax_tokens}


def launch(kind: str, x: torch.Tensor, y: torch.Tensor, cu: torch.Tensor) -> tuple:
    """The kernel, grid, arguments and constexprs of one launch over the packed `x` (1-D: softmax per sequence;
    2-D: per row)."""
    seqs = cu.numel() - 1
    if kind in SEQUENCE_KERNELS:
        kernel, block = SEQUENCE_KERNELS[kind]
        return kernel, (seqs,), (x, y, cu), {"BLOCK": block}
    kernel = ROW_KERNELS[kind]
    args = (x, y, cu, x.stride(0), y.stride(0), x.shape[1])
    if kind == "blocks":
        longest = int((cu[1:] - cu[:-1]).max())
        return kernel, (seqs, max(1, triton.cdiv(longest, 4))), args, {"BLOCK_M": 4, "BLOCK_N": 16}
    if kind == "loop":
        return kernel, (seqs,), args, {"BLOCK_M": 4, "BLOCK_N": 16}
    return kernel, (seqs,), args, {"BLOCK_N": 16}


def run(kind: str, x: torch.Tensor, cu: torch.Tensor) -> torch.Tensor:
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    kernel, grid, args, meta = launch(kind, x, y, cu)
    kernel[grid](*args, **meta)
    return y


KINDS = [*SEQUENCE_KERNELS, *ROW_KERNELS]
OPS = {(kind, form): tritongrad.op(lambda x, cu, kind=kind: run(kind, x, cu)) if form == "bare" else
       tritongrad.op(f"tgtest::varlen_softmax_{kind}")(lambda x, cu, kind=kind: run(kind, x, cu))
       for kind in KINDS for form in ("bare", "named")}


def cu_seqlens(lengths, dtype=torch.int32) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=dtype, device=DEVICE)


def inputs(kind: str, lengths) -> torch.Tensor:
    """Fresh random packed inputs; the row kernels' a view of a wider tensor (rows further apart than they are
    long)."""
    tokens = sum(lengths)
    if kind in SEQUENCE_KERNELS:
        return torch.randn(tokens, dtype=D, device=DEVICE)
    return torch.randn(tokens, COLUMNS + 5, dtype=D, device=DEVICE)[:, :COLUMNS]


def reference(kind: str, x: torch.Tensor, lengths) -> torch.Tensor:
    """Softmax over each sequence (the 1-D kernels) or each row of the packed batch, in plain PyTorch."""
    if kind in SEQUENCE_KERNELS:
        return torch.cat([torch.softmax(part, 0) for part in torch.split(x, lengths)])
    return torch.cat([torch.softmax(part, 1) for part in torch.split(x, lengths)])


@pytest.mark.parametrize("form", ["bare", "named"])
@pytest.mark.parametrize("kind", KINDS)
def test_an_op_gets_pytorchs_gradients(kind, form, poisoned_empty):
    x = inputs(kind, LENGTHS).requires_grad_()
    cu = cu_seqlens(LENGTHS)
    y = OPS[(kind, form)](x, cu)
    want = reference(kind, x, LENGTHS)
    torch.testing.assert_close(y, want)
    g = torch.randn_like(want)
    torch.testing.assert_close(torch.autograd.grad(y, x, g)[0], torch.autograd.grad(want, x, g)[0])


@pytest.mark.parametrize("lengths", [[3, 17, 0], [0, 9], [1]])
@pytest.mark.parametrize("kind", KINDS)
def test_the_kernel_alone_gets_pytorchs_gradients(kind, lengths):
    """`tritongrad.grad` on the kernel, launched as the forward was; the forward's output poisoned first. The empty
    sequence first and last: its program stores nothing, and its bounds lie at the tensor's ends."""
    x = inputs(kind, lengths)
    cu = cu_seqlens(lengths, torch.int64)
    y = poison(torch.empty(x.shape, dtype=D, device=DEVICE))
    kernel, grid, args, meta = launch(kind, x, y, cu)
    kernel[grid](*args, **meta)
    xs = x.clone().requires_grad_()
    want = reference(kind, xs, lengths)
    torch.testing.assert_close(y, want.detach())
    assert_gradients_match(kernel, grid, args, meta, y, want, [xs], ["x_ptr"])


@pytest.mark.parametrize("kind", ["online", "loop"])
def test_the_derived_kernel_adds_into_the_callers_buffer(kind):
    """`bwd[grid](...)` with a gradient buffer holding gradient already: the kernel's adds to it."""
    x = inputs(kind, LENGTHS)
    cu = cu_seqlens(LENGTHS)
    y = torch.empty(x.shape, dtype=D, device=DEVICE)
    kernel, grid, args, meta = launch(kind, x, y, cu)
    kernel[grid](*args, **meta)
    xs = x.clone().requires_grad_()
    d_y, before = torch.randn_like(y), torch.randn_like(x)
    d_x = torch.empty_strided(x.shape, x.stride(), dtype=D, device=DEVICE).copy_(before)  # (laid out as x)
    tritongrad.grad(kernel)[grid](*args, **meta, d_y_ptr=d_y, d_x_ptr=d_x)
    want = torch.autograd.grad(reference(kind, xs, LENGTHS), xs, d_y)[0]
    torch.testing.assert_close(d_x, before + want)


def test_the_loops_bounds_are_read_per_program_at_the_launch():
    """The check names what it reads: each sequence's bounds, through which each loop's trip count is known."""
    notes = tritongrad.grad(softmax_online).launch_notes()
    assert "programs p along axis 0 write disjoint ranges of `y_ptr`" in notes
    assert "`end` = cu_seqlens[1 + p], `start` = cu_seqlens[p]" in notes


OVERLAPPING = [0, 9, 4, 20, 26]  # the third sequence, 4..19, starts inside the first, 0..8; the second is empty


@pytest.mark.parametrize("kind", KINDS)
def test_overlapping_sequences_are_refused_at_the_launch(kind):
    cu = torch.tensor(OVERLAPPING, dtype=torch.int32, device=DEVICE)
    x = inputs(kind, [26])
    y = torch.zeros(x.shape, dtype=D, device=DEVICE)
    kernel, grid, args, meta = launch(kind, x, y, cu)
    with pytest.raises(NotDifferentiableError, match=r"programs 0 and 2 \(along axis 0\) write overlapping elements "
                       r"of `y_ptr`.*`start` = cu_seqlens\[0\] = 0 and cu_seqlens\[2\] = 4"):
        backward_launch(kernel, grid, args, meta, {"y_ptr": torch.randn_like(y)})


@pytest.mark.parametrize("form", ["bare", "named"])
@pytest.mark.parametrize("kind", ["online", "loop", "tokens"])
def test_overlapping_sequences_in_an_op_are_refused_when_it_runs_backward(kind, form):
    x = inputs(kind, [26]).requires_grad_()
    y = OPS[(kind, form)](x, torch.tensor(OVERLAPPING, dtype=torch.int32, device=DEVICE))
    with pytest.raises(NotDifferentiableError, match="programs 0 and 2"):
        y.backward(torch.randn_like(y))


@pytest.mark.parametrize("kind", ["one_block", "online", "blocks", "tokens"])
def test_a_sequence_past_the_output_is_refused_at_the_launch(kind):
    """cu_seqlens changed after the forward so the last sequence ends past the tensor: apart, but the backward would
    read and write the gradients past their buffers. (Through an op, autograd refuses cu_seqlens changed in place.)"""
    x = inputs(kind, LENGTHS)
    cu = cu_seqlens(LENGTHS)
    y = torch.empty(x.shape, dtype=D, device=DEVICE)
    kernel, grid, args, meta = launch(kind, x, y, cu)
    kernel[grid](*args, **meta)
    cu[-1] += 3
    with pytest.raises(NotDifferentiableError, match=r"program 4 \(along axis 0\) writes elements .* of `y_ptr`, "
                       r"outside its elements 0\.\.\d+: .*`start` = cu_seqlens\[4\] = 25"):
        backward_launch(kernel, grid, args, meta, {"y_ptr": torch.randn_like(y)})


def in_place(kind: str):
    def softmax_(x, cu):
        kernel, grid, args, meta = launch(kind, x, x, cu)
        kernel[grid](*args, **meta)
        return x

    return tritongrad.op(softmax_)


@pytest.mark.parametrize("kind", ["one_block", "blocks", "loop", "tokens"])
def test_an_op_updating_its_input_in_place_gets_pytorchs_gradients(kind):
    """The same tensor as x and y: each lane stores over what it loaded, in its block."""
    xs = inputs(kind, LENGTHS).requires_grad_()
    cu = cu_seqlens(LENGTHS)
    y = in_place(kind)(xs.clone(), cu)
    want = reference(kind, xs, LENGTHS)
    torch.testing.assert_close(y, want)
    g = torch.randn_like(want)
    torch.testing.assert_close(torch.autograd.grad(y, xs, g)[0], torch.autograd.grad(want, xs, g)[0])


def test_an_online_softmax_in_place_is_refused_naming_its_first_pass():
    """Its second loop stores over what the first loop read: not an update of what each lane loaded."""
    x = inputs("online", LENGTHS).requires_grad_()
    with pytest.raises(NotDifferentiableError, match="a load from `x_ptr` whose values the store on line"):
        in_place("online")(x.clone(), cu_seqlens(LENGTHS)).sum().backward()
