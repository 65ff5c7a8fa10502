"""Liger-Kernel's Llama kernels as Liger writes them, in kernels of our own written the
same way: a cross-entropy that zeroes an ignored row's logits and returns early, then reads the target logit; rope
updating q and k in place, where q and k are the transposed views HF Llama makes of its projections; a fused add +
RMSNorm writing x + r back into the residual it reads; a fused linear cross-entropy over chunks of rows with
PyTorch matmuls between its launches. Each through a bare @tritongrad.op as a model calls it, its gradients
against PyTorch autograd on plain PyTorch in float64, sizes that are not powers of two."""

import pytest
import torch
import triton
import triton.language as tl
from test_in_place import _line

import tritongrad
from tritongrad.core.errors import OpError

DTYPE = torch.float64
IGNORE = -100
LOG2_E = tl.constexpr(1.4426950408889634)


def close(a, b):
    torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9)  # (GPU reductions sum in other orders)


# -- cross-entropy -------------------------------------------------------------------------------------


@triton.jit
def cross_entropy_kernel(X_ptr, X_stride, Y_ptr, Y_stride, loss_ptr, loss_stride, n_cols, n_non_ignore,
                         ignore_index, label_smoothing: tl.constexpr, reduction: tl.constexpr,
                         BLOCK_SIZE: tl.constexpr, HAS_GRADIENTS: tl.constexpr, COMPUTE: tl.constexpr):
    """Liger's: an ignored row's logits zeroed and the program returns; the others read their target logit, run an
    online softmax over the row and (HAS_GRADIENTS) write the loss's gradient over their logits."""
    program_id = tl.program_id(0).to(tl.int64)
    Y_ptr += program_id * Y_stride
    y = tl.load(Y_ptr)
    X_ptr += program_id * X_stride
    if y == ignore_index:
        for i in range(0, n_cols, BLOCK_SIZE):
            X_offsets = i + tl.arange(0, BLOCK_SIZE)
            tl.store(X_ptr + X_offsets, 0.0, mask=X_offsets < n_cols)
        return
    loss_ptr += program_id * loss_stride
    # Liger's `m = float("-inf")`, `d = 0.0`, `scaled_x_sum = 0.0`, typed: a loop-carried value keeps its type when
    # compiled, and these tests compute in float64
    m = tl.full((), float("-inf"), COMPUTE)
    d = tl.zeros((), COMPUTE)
    ori_X_y = tl.load(X_ptr + y).cast(COMPUTE)  # after the store above, on the path that did not store
    scaled_x_sum = tl.zeros((), COMPUTE)
    eps = label_smoothing / n_cols
    for i in range(0, n_cols, BLOCK_SIZE):
        X_offsets = i + tl.arange(0, BLOCK_SIZE)
        X_block = tl.load(X_ptr + X_offsets, mask=X_offsets < n_cols, other=float("-inf")).cast(COMPUTE)
        block_max = tl.max(X_block)
        if label_smoothing > 0:
            scaled_x_sum += tl.sum(tl.where(X_offsets < n_cols, -eps * X_block, 0.0))
        m_new = tl.maximum(m, block_max)
        d = d * tl.exp2((m - m_new) * LOG2_E) + tl.sum(tl.exp2((X_block - m_new) * LOG2_E))
        m = m_new
    lse = m + tl.log(d)
    if HAS_GRADIENTS:
        for i in range(0, n_cols, BLOCK_SIZE):
            X_offsets = i + tl.arange(0, BLOCK_SIZE)
            X_block = tl.load(X_ptr + X_offsets, mask=X_offsets < n_cols, other=float("-inf")).cast(COMPUTE)
            X_block = tl.exp2((X_block - m) * LOG2_E) / d - eps
            if reduction == "mean":
                X_block = X_block / n_non_ignore
            tl.store(X_ptr + X_offsets, X_block, mask=X_offsets < n_cols)  # the gradient over the logits
        tl.debug_barrier()
        dx_y = tl.exp2((ori_X_y - m) * LOG2_E) / d - eps - (1 - label_smoothing)
        if reduction == "mean":
            dx_y = dx_y / n_non_ignore
        tl.store(X_ptr + y, dx_y)
    tl.debug_barrier()
    loss = lse - ori_X_y
    if label_smoothing > 0:
        loss = loss * (1 - label_smoothing) + scaled_x_sum + label_smoothing * lse
    if reduction == "mean":
        loss = loss / n_non_ignore
    tl.store(loss_ptr, loss)


def cross_entropy_rows(logits, target, loss_1d, n_non_ignore, smoothing=0.0, reduction="mean", has_gradients=False):
    rows, n_cols = logits.shape
    cross_entropy_kernel[(rows,)](logits, logits.stride(-2), target, target.stride(-1), loss_1d, loss_1d.stride(-1),
                                  n_cols, n_non_ignore, IGNORE, label_smoothing=smoothing, reduction=reduction,
                                  BLOCK_SIZE=16, HAS_GRADIENTS=has_gradients, COMPUTE=tl.float64)


def cross_entropy_forward(logits, target, smoothing=0.0, reduction="mean", has_gradients=False):
    """Liger's host function: the loss per row, summed; the logits changed in place (zeroed ignored rows)."""
    loss_1d = torch.zeros(logits.shape[0], dtype=logits.dtype, device=logits.device)
    n_non_ignore = (target != IGNORE).sum().item()
    cross_entropy_rows(logits, target, loss_1d, n_non_ignore, smoothing, reduction, has_gradients)
    return torch.sum(loss_1d)


def targets(rows, n_cols, device, ignored=(1, 4, 5)):
    t = torch.randint(0, n_cols, (rows,), device=device)
    t[list(ignored)] = IGNORE
    return t


@pytest.mark.parametrize("smoothing, reduction", [(0.0, "mean"), (0.1, "mean"), (0.0, "sum")])
def test_a_cross_entropy_returning_early_after_zeroing_an_ignored_rows_logits(device, smoothing, reduction):
    """Launched loss-only (HAS_GRADIENTS=False), as a model's loss: the ignored rows' stores and the other rows'
    loads are in the two branches of the early return's `if`, and the loads read what the stores would have written
    (or the target logit of that row). Refused before: "a load from `X_ptr` after the store to it ... not each
    directly in loops nested alike"."""
    op = tritongrad.op(cross_entropy_forward)
    x = torch.randn(9, 7, dtype=DTYPE, device=device, requires_grad=True)
    w = torch.randn(7, 37, dtype=DTYPE, device=device, requires_grad=True)
    t = targets(9, 37, device)
    for _ in range(2):  # (the second backward unchecked)
        logits = x @ w  # a tensor with a history, its ignored rows zeroed in place by the launch
        loss = op(logits, t, smoothing, reduction)
        want = torch.nn.functional.cross_entropy(x @ w, t, ignore_index=IGNORE, label_smoothing=smoothing,
                                                 reduction=reduction)
        close(loss, want)
        assert (logits[[1, 4, 5]] == 0).all()
        for a, b in zip(torch.autograd.grad(loss, (x, w)), torch.autograd.grad(want, (x, w)), strict=True):
            close(a, b)


def test_the_ignored_rows_new_logits_pass_no_gradient_to_the_old(device):
    """The logits returned too: their ignored rows hold zeros (no gradient reaches the old values there), the other
    rows the values given (theirs passes through, with the loss's)."""
    @tritongrad.op
    def loss_and_logits(logits, target):
        return cross_entropy_forward(logits, target), logits

    x = torch.randn(8, 21, dtype=DTYPE, device=device, requires_grad=True)
    t = targets(8, 21, device)
    loss, logits = loss_and_logits(x * 1.0, t)
    keep = (t != IGNORE)[:, None].to(DTYPE)
    want_logits = x * keep
    want = torch.nn.functional.cross_entropy(x, t, ignore_index=IGNORE)
    close(logits, want_logits)
    g = torch.randn_like(logits)
    close(torch.autograd.grad((loss, logits), x, (torch.tensor(0.7, dtype=DTYPE), g))[0],
          torch.autograd.grad((want, want_logits), x, (torch.tensor(0.7, dtype=DTYPE), g))[0])


def test_a_cross_entropy_writing_its_gradient_over_the_logits_is_refused_saying_why(device):
    """HAS_GRADIENTS=True: the first pass reads the logits, a later pass overwrites them with the gradient. Refused
    at the op's call, naming that store and the way out (launch it loss-only)."""
    op = tritongrad.op(cross_entropy_forward)
    x = torch.randn(6, 21, dtype=DTYPE, device=device, requires_grad=True)
    with pytest.raises(tritongrad.NotDifferentiableError, match=r"a load from `X_ptr` whose values the store on line "
                       rf"{_line(cross_entropy_kernel, '# the gradient over the logits')} overwrites later") as e:
        op(x * 1.0, targets(6, 21, device), has_gradients=True)
    assert "launched loss-only" in e.value.hint
    assert e.value.line == _line(cross_entropy_kernel, "X_block = tl.load(X_ptr + X_offsets")


def test_a_loss_only_cross_entropy_keeps_no_copy_of_the_logits(device, poisoned_empty):
    """The launch stores only into the ignored rows, and no program that stores loads: what the loads read, the
    launch leaves as it was. The backward reads the logits as the launch left them (here a view of a bigger tensor
    with a history, rows apart by its stride), and the op keeps no copy of them; before, a copy of all of them,
    taken before the launch, was the op's own memory."""
    op = tritongrad.op(cross_entropy_forward)
    x = torch.randn(9, 7, dtype=DTYPE, device=device, requires_grad=True)
    w = torch.randn(7, 83, dtype=DTYPE, device=device, requires_grad=True)
    t = targets(9, 37, device)
    report = tritongrad.kept(op, (x @ w)[:, 3:40], t)
    assert [k.whose for k in report.tensors if k.name.endswith(" X_ptr")] == ["argument #0"], str(report)
    assert all(k.whose != "own" or " state tape " in k.name for k in report.tensors), str(report)
    for _ in range(3):  # (the first backward checked, the second keeps its launches, the third launches them)
        big = x @ w
        loss = op(big[:, 3:40], t)
        want = torch.nn.functional.cross_entropy((x @ w)[:, 3:40], t, ignore_index=IGNORE)
        close(loss, want)
        assert (big[[1, 4, 5], 3:40] == 0).all() and (big[:, :3] == (x @ w)[:, :3]).all()
        for a, b in zip(torch.autograd.grad(loss, (x, w)), torch.autograd.grad(want, (x, w)), strict=True):
            close(a, b)


def cross_entropy_per_row(logits, target, n_non_ignore):
    """Liger's host function as the HF step calls it (reduction "none"): one segment, so later calls are replayed."""
    loss_1d = torch.zeros(logits.shape[0], dtype=logits.dtype, device=logits.device)
    cross_entropy_rows(logits, target, loss_1d, n_non_ignore)
    return loss_1d


def test_replayed_loss_only_calls_take_no_copy_of_the_logits(device, monkeypatch, poisoned_empty):
    """A bare op's repeated call runs on its replay (host/replay.py), which took a copy of the logits per call before
    the launch (its pattern's snapshot); now neither the first call nor the replayed ones copy them."""
    from tritongrad.host import launch_record, replay

    copies, fast = [], []
    copy, copy_of, launch = launch_record.LaunchRecord._copy, replay.copy_of, replay.FastRecord.launch
    monkeypatch.setattr(launch_record.LaunchRecord, "_copy", lambda self, v: copies.append(v.shape) or copy(self, v))
    monkeypatch.setattr(replay, "copy_of", lambda v: copies.append(v.shape) or copy_of(v))
    monkeypatch.setattr(replay.FastRecord, "launch", lambda self, *a, **k: fast.append(1) or launch(self, *a, **k))
    op = tritongrad.op(cross_entropy_per_row)
    x = torch.randn(9, 7, dtype=DTYPE, device=device, requires_grad=True)
    w = torch.randn(7, 83, dtype=DTYPE, device=device, requires_grad=True)
    t = targets(9, 37, device)
    n = int((t != IGNORE).sum())
    for _ in range(4):
        rows = op((x @ w)[:, 3:40], t, n)
        want = torch.nn.functional.cross_entropy((x @ w)[:, 3:40], t, ignore_index=IGNORE, reduction="none") / n
        close(rows, want)
        g = torch.randn(9, dtype=DTYPE, device=device)
        for a, b in zip(torch.autograd.grad(rows, (x, w), g), torch.autograd.grad(want, (x, w), g), strict=True):
            close(a, b)
    assert fast and not copies, (len(fast), copies)


def scale_after_the_loss(logits, target, w):
    """The loss summed by PyTorch (its segment closed: the cross-entropy's node saves the logits), then a launch
    scaling the logits in place, in a segment of its own."""
    from test_kept import scale_in_place_kernel

    loss = cross_entropy_forward(logits, target)
    scale_in_place_kernel[(triton.cdiv(logits.numel(), 32),)](logits, w, logits.numel(), BLOCK=32)
    return loss


@pytest.mark.parametrize("by", ["the caller", "a later segment"])
def test_logits_changed_after_the_cross_entropy_are_refused_at_the_backward(device, by):
    """The backward reads the logits as the launch left them: a later in-place change of them (of the tensor they
    are a view of, after the call; by a launch of the op after its segment closed) is refused by autograd's version
    check, as for any tensor an operation saved, rather than read (before, the op's copy was read)."""
    x = torch.randn(9, 7, dtype=DTYPE, device=device, requires_grad=True)
    w = torch.randn(7, 83, dtype=DTYPE, device=device, requires_grad=True)
    big, t = x @ w, targets(9, 37, device)
    if by == "the caller":
        loss = tritongrad.op(cross_entropy_forward)(big[:, 3:40], t)
        big.add_(1.0)
    else:
        loss = tritongrad.op(scale_after_the_loss)(big[:, 3:40].contiguous(), t,
                                                   torch.randn(9 * 37, dtype=DTYPE, device=device))
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        torch.autograd.grad(loss, (x, w))


def loss_then_scale(logits, target, w):
    """A launch after the loss-only cross-entropy scales the logits in place, before any PyTorch operation reads
    what the launches wrote (one segment: the launch record sees both launches)."""
    from test_kept import scale_in_place_kernel

    loss_1d = torch.zeros(logits.shape[0], dtype=logits.dtype, device=logits.device)
    cross_entropy_rows(logits, target, loss_1d, (target != IGNORE).sum().item())
    scale_in_place_kernel[(triton.cdiv(logits.numel(), 32),)](logits, w, logits.numel(), BLOCK=32)
    return torch.sum(loss_1d), logits


def test_logits_a_later_launch_scales_in_place_are_copied_for_the_cross_entropys_backward(device, poisoned_empty):
    """The launch record copies the logits before the later launch overwrites them (as the cross-entropy left them),
    for the cross-entropy's backward, which reads that copy, not the scaled values. (Right before too, from the copy
    taken before the cross-entropy: a guard for the path without it.)"""
    op = tritongrad.op(loss_then_scale)
    x = torch.randn(9, 37, dtype=DTYPE, device=device, requires_grad=True)
    w = torch.randn(9 * 37, dtype=DTYPE, device=device, requires_grad=True)
    t = targets(9, 37, device)
    for _ in range(3):
        loss, logits = op(x * 1.0, t, w)
        want = torch.nn.functional.cross_entropy(x, t, ignore_index=IGNORE)
        want_logits = x * (t != IGNORE)[:, None].to(DTYPE) * w.view(9, 37)
        close((loss, logits), (want, want_logits))
        g = (torch.tensor(0.3, dtype=DTYPE, device=device), torch.randn(9, 37, dtype=DTYPE, device=device))
        for a, b in zip(torch.autograd.grad((loss, logits), (x, w), g),
                        torch.autograd.grad((want, want_logits), (x, w), g), strict=True):
            close(a, b)


CE_CONSTEXPRS = dict(label_smoothing=0.0, reduction="mean", BLOCK_SIZE=16, HAS_GRADIENTS=False, COMPUTE=tl.float64)


def test_the_logits_gradient_is_written_once_and_added_later_not_added_atomically(device, poisoned_empty):
    """The loss-only launch's derived kernel writes the logits' gradient as a plain input's: the row's loads'
    adjoints stored, the target logit's added after the kernel; the ignored rows' gradient zeroed (their new values
    are zeros). Before, both were added atomically (an input updated in place and loaded twice). Where the logits'
    new values have a gradient (the direct `gradients` call passes one), the loads' adjoints add to it: the values
    the loads read are the new values there."""
    bwd = tritongrad.grad(cross_entropy_kernel, wrt=["X_ptr"], outputs=["X_ptr", "loss_ptr"],
                          constexprs=CE_CONSTEXPRS)
    assert "atomic_add" not in bwd.src, bwd.src
    assert "tl.store(d_X_ptr_1 + X_offsets_1, d_load_1, mask=X_offsets_1 < n_cols)" in bwd.src, bwd.src
    assert "tg.add_later(d_load_later, d_load_later_at, d_X_ptr, d_X_ptr_1 + y, d_load, True)" in bwd.src, bwd.src
    x = torch.randn(9, 37, dtype=DTYPE, device=device, requires_grad=True)
    t = targets(9, 37, device)
    logits, loss_1d = x.detach().clone(), torch.zeros(9, dtype=DTYPE, device=device)
    n = int((t != IGNORE).sum())
    named = dict(X_ptr=logits, X_stride=37, Y_ptr=t, Y_stride=1, loss_ptr=loss_1d, loss_stride=1, n_cols=37,
                 n_non_ignore=n, ignore_index=IGNORE, **CE_CONSTEXPRS)
    cross_entropy_kernel[(9,)](**named)
    g_logits, g_loss = torch.randn(9, 37, dtype=DTYPE, device=device), torch.randn(9, dtype=DTYPE, device=device)
    got = bwd.gradients((9,), named, {"X_ptr": g_logits, "loss_ptr": g_loss})["X_ptr"]
    want_loss = torch.nn.functional.cross_entropy(x, t, ignore_index=IGNORE, reduction="none") / n
    want_logits = x * (t != IGNORE)[:, None].to(DTYPE)
    close(got, torch.autograd.grad((want_loss, want_logits), x, (g_loss, g_logits))[0])


def test_the_logits_gradient_is_written_in_their_own_dtype(device):
    """Half-precision logits: each element's gradient is written once (stored, or zeroed; the target logit's added
    after), so the op's buffer for it is in the logits' dtype, not a float32 shadow cast after (before: float32, added
    atomically)."""
    from tritongrad.host import backward as op_backward

    made, shadow = [], op_backward.PlannedBackward._shadow

    def spy(self, shadows, view, *args, **kwargs):
        fresh = view.key not in shadows
        found = shadow(self, shadows, view, *args, **kwargs)
        if fresh:
            made.append((tuple(shadows[view.key].shape), shadows[view.key].dtype))
        return found

    op = tritongrad.op(cross_entropy_forward)
    x = torch.randn(9, 37, device=device, requires_grad=True)
    t = targets(9, 37, device)
    for _ in range(3):
        made.clear()
        loss = op((x * 1.0).half(), t)
        with pytest.MonkeyPatch.context() as m:
            m.setattr(op_backward.PlannedBackward, "_shadow", spy)
            (got,) = torch.autograd.grad(loss, x)
        assert ((9, 37), torch.float16) in made and ((9, 37), torch.float32) not in made, made
        want = torch.nn.functional.cross_entropy(x.double(), t, ignore_index=IGNORE)
        torch.testing.assert_close(got, torch.autograd.grad(want, x)[0].float(), rtol=2e-3, atol=2e-4)


@pytest.mark.gpu
def test_liger_cross_entropy_loss_only_keeps_no_copy_and_writes_bf16_once():
    """Liger's own kernel as the HF step launches it (benchmarks/train_hf.py): no copy of the logits kept (before:
    a copy of all of them), the gradient against PyTorch's on the same bf16 logits, in float32."""
    pytest.importorskip("liger_kernel")
    from benchmarks.train_hf import liger_cross_entropy_rows

    op = tritongrad.op(liger_cross_entropy_rows)
    x = torch.randn(301, 1000, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    t = targets(301, 1000, "cuda", ignored=(1, 4, 5, 300))
    report = tritongrad.kept(op, x * 1.0, t, IGNORE)
    assert [k.whose for k in report.tensors if k.name.endswith(" X_ptr")] == ["argument #0"], str(report)
    assert report.own_bytes < 301 * 1000, str(report)
    for _ in range(3):
        rows = op(x * 1.0, t, IGNORE)
        want = torch.nn.functional.cross_entropy(x.float(), t, ignore_index=IGNORE, reduction="none")
        torch.testing.assert_close(rows.float(), want, rtol=1e-2, atol=1e-2)
        g = torch.randn(rows.shape, device="cuda")
        got, ref = torch.autograd.grad(rows, x, g.bfloat16())[0], torch.autograd.grad(want, x, g)[0]
        torch.testing.assert_close(got.float(), ref.float(), rtol=2e-2, atol=2e-3)


# -- fused linear cross-entropy ------------------------------------------------------------------------


def fused_linear_cross_entropy(x, weight, target, bias=None, chunk_size=4):
    """Liger's host function's shape: rows in chunks, each chunk's logits a PyTorch matmul, the cross-entropy
    kernel launched on them loss-only into a slice of one loss buffer, summed at the end."""
    rows, _ = x.shape
    loss_1d = torch.zeros(rows, dtype=x.dtype, device=x.device)
    n_non_ignore = (target != IGNORE).sum().item()
    for start in range(0, rows, chunk_size):
        end = min(start + chunk_size, rows)
        logits_chunk = x[start:end] @ weight.t()
        if bias is not None:
            logits_chunk = logits_chunk + bias
        logits_chunk = logits_chunk.contiguous()
        cross_entropy_rows(logits_chunk, target[start:end].contiguous(), loss_1d[start:end], n_non_ignore)
    return torch.sum(loss_1d)


@pytest.mark.parametrize("with_bias", [False, True], ids=["no-bias", "bias"])
def test_a_fused_linear_cross_entropy_over_chunks_with_matmuls_between_launches(device, with_bias):
    op = tritongrad.op(fused_linear_cross_entropy)
    x = torch.randn(11, 6, dtype=DTYPE, device=device, requires_grad=True)
    w = torch.randn(23, 6, dtype=DTYPE, device=device, requires_grad=True)
    b = torch.randn(23, dtype=DTYPE, device=device, requires_grad=True) if with_bias else None
    t = targets(11, 23, device, ignored=(2, 9))
    inputs = (x, w, b) if with_bias else (x, w)
    loss = op(x, w, t, b)
    want = torch.nn.functional.cross_entropy(torch.nn.functional.linear(x, w, b), t, ignore_index=IGNORE)
    close(loss, want)
    for a, c in zip(torch.autograd.grad(loss, inputs), torch.autograd.grad(want, inputs), strict=True):
        close(a, c)


# -- rope, in place on views ---------------------------------------------------------------------------


@triton.jit
def rope_kernel(q_ptr, q_row_stride, k_ptr, k_row_stride, cos, cos_row_stride, sin, sin_row_stride, sl,
                cos_bs: tl.constexpr, n_qh: tl.constexpr, n_kh: tl.constexpr, hd: tl.constexpr,
                pad_n_qh: tl.constexpr, pad_n_kh: tl.constexpr, pad_hd: tl.constexpr):
    """Liger's: one program per token, every head of q and k rotated in place (each half loaded, then stored)."""
    pid = tl.program_id(0).to(tl.int64)
    q_ptr = q_ptr + pid * q_row_stride
    k_ptr = k_ptr + pid * k_row_stride
    batch_idx = pid // sl
    cos_row_idx = pid % sl
    cos = cos + tl.where(cos_bs == 1, cos_row_idx * cos_row_stride,
                         batch_idx * (sl * cos_row_stride) + cos_row_idx * cos_row_stride)
    sin = sin + tl.where(cos_bs == 1, cos_row_idx * sin_row_stride,
                         batch_idx * (sl * sin_row_stride) + cos_row_idx * sin_row_stride)
    cos_offsets = tl.arange(0, pad_hd // 2)
    cos_mask = cos_offsets < hd // 2
    cos_row = tl.load(cos + cos_offsets, mask=cos_mask, other=0)
    sin_row = tl.load(sin + cos_offsets, mask=cos_mask, other=0)
    first_half_q_offsets = tl.arange(0, pad_n_qh)[:, None] * hd + tl.arange(0, pad_hd // 2)[None, :]
    first_half_k_offsets = tl.arange(0, pad_n_kh)[:, None] * hd + tl.arange(0, pad_hd // 2)[None, :]
    first_q_mask = (tl.arange(0, pad_n_qh)[:, None] < n_qh) & (tl.arange(0, pad_hd // 2)[None, :] < hd // 2)
    first_k_mask = (tl.arange(0, pad_n_kh)[:, None] < n_kh) & (tl.arange(0, pad_hd // 2)[None, :] < hd // 2)
    q_tile_1 = tl.load(q_ptr + first_half_q_offsets, mask=first_q_mask, other=0).to(sin_row.dtype)
    k_tile_1 = tl.load(k_ptr + first_half_k_offsets, mask=first_k_mask, other=0).to(sin_row.dtype)
    second_half_q_offsets = first_half_q_offsets + (hd // 2)
    second_half_k_offsets = first_half_k_offsets + (hd // 2)
    q_tile_2 = tl.load(q_ptr + second_half_q_offsets, mask=first_q_mask, other=0).to(sin_row.dtype)
    k_tile_2 = tl.load(k_ptr + second_half_k_offsets, mask=first_k_mask, other=0).to(sin_row.dtype)
    tl.store(q_ptr + first_half_q_offsets, q_tile_1 * cos_row - q_tile_2 * sin_row, mask=first_q_mask)
    tl.store(q_ptr + second_half_q_offsets, q_tile_2 * cos_row + q_tile_1 * sin_row, mask=first_q_mask)
    tl.store(k_ptr + first_half_k_offsets, k_tile_1 * cos_row - k_tile_2 * sin_row, mask=first_k_mask)
    tl.store(k_ptr + second_half_k_offsets, k_tile_2 * cos_row + k_tile_1 * sin_row, mask=first_k_mask)


def rope_launch(q, k, cos, sin):
    """q, k (batch, seq, heads, head_dim), each token's heads contiguous: rotated in place."""
    batch, seq, n_q, hd = q.shape
    n_kv = k.shape[2]
    rope_kernel[(batch * seq,)](q, q.stride(1), k, k.stride(1), cos, cos.stride(-2), sin, sin.stride(-2), seq,
                                cos.shape[0], n_q, n_kv, hd, triton.next_power_of_2(n_q),
                                triton.next_power_of_2(n_kv), triton.next_power_of_2(hd))


def rope_forward(q, k, cos, sin):
    """Liger's host function: q, k (batch, heads, seq, head_dim) transposed back to the layout they are stored in,
    made contiguous (nothing to do for HF's), rotated in place, returned as views in the caller's layout."""
    q, k = q.transpose(1, 2).contiguous(), k.transpose(1, 2).contiguous()
    rope_launch(q, k, cos.contiguous(), sin.contiguous())
    return q.transpose(1, 2), k.transpose(1, 2)


def rope_in_place(q, k, cos, sin):
    """The same, returning the very tensors it was given (updated in place, as mark_dirty would)."""
    rope_launch(q.transpose(1, 2), k.transpose(1, 2), cos, sin)
    return q, k


BATCH, SEQ, HEADS, KV_HEADS, HEAD_DIM, HIDDEN = 2, 5, 3, 1, 10, 12


def rope_case(device):
    x = torch.randn(BATCH, SEQ, HIDDEN, dtype=DTYPE, device=device, requires_grad=True)
    wq = torch.randn(HEADS * HEAD_DIM, HIDDEN, dtype=DTYPE, device=device, requires_grad=True)
    wk = torch.randn(KV_HEADS * HEAD_DIM, HIDDEN, dtype=DTYPE, device=device, requires_grad=True)
    inv = 1.0 / (10000 ** (torch.arange(0, HEAD_DIM, 2, dtype=DTYPE, device=device) / HEAD_DIM))
    angles = torch.arange(SEQ, dtype=DTYPE, device=device)[:, None] * inv
    emb = torch.cat([angles, angles], -1)[None]  # (1, seq, head_dim), as HF's rotary embedding gives
    return (x, wq, wk), emb.cos(), emb.sin()


def projections(x, wq, wk):
    """HF Llama's q and k: transposed views of the projections' outputs (batch, heads, seq, head_dim)."""
    q = torch.nn.functional.linear(x, wq).view(BATCH, SEQ, HEADS, HEAD_DIM).transpose(1, 2)
    k = torch.nn.functional.linear(x, wk).view(BATCH, SEQ, KV_HEADS, HEAD_DIM).transpose(1, 2)
    return q, k


def rope_reference(q, k, cos, sin):
    def rotate_half(t):
        return torch.cat([-t[..., HEAD_DIM // 2:], t[..., :HEAD_DIM // 2]], -1)

    c, s = cos[:, None], sin[:, None]
    return q * c + rotate_half(q) * s, k * c + rotate_half(k) * s


@pytest.mark.parametrize("host", [rope_forward, rope_in_place], ids=["views-returned", "same-tensors-returned"])
def test_rope_updating_the_views_of_q_and_k_in_place(device, host):
    """Refused before with a wrong reason: "the argument `q` requires grad, but no kernel launch reads it" (the
    check looked for q's history after the launch had given q a new one)."""
    op = tritongrad.op(host)
    leaves, cos, sin = rope_case(device)
    for _ in range(2):
        q, k = projections(*leaves)
        got = op(q, k, cos, sin)
        if host is rope_in_place:
            assert got[0] is q and got[1] is k
        want = rope_reference(*projections(*leaves), cos, sin)
        close(got, want)
        g = [torch.randn_like(t) for t in want]
        for a, b in zip(torch.autograd.grad(got, leaves, g), torch.autograd.grad(want, leaves, g), strict=True):
            close(a, b)


def test_rope_as_a_named_op_is_refused_naming_the_in_place_write(device):
    op = tritongrad.op("tgtest_liger::rope")(rope_in_place)
    leaves, cos, sin = rope_case(device)
    with pytest.raises(OpError, match=r"writes to `q_ptr`, a tensor that requires grad.*a bare @tritongrad.op may "
                                      "update such a tensor in place"):
        op(*projections(*leaves), cos, sin)


# -- fused add + RMSNorm, the residual updated in place ---------------------------------------------------


@triton.jit
def fused_add_rms_norm_kernel(Y_ptr, Y_row_stride, S_ptr, S_row_stride, X_ptr, X_row_stride, R_ptr, R_row_stride,
                              W_ptr, W_row_stride, RSTD_ptr, RSTD_row_stride, n_cols, eps, offset,
                              BLOCK_SIZE: tl.constexpr):
    """Liger's: S = X + R stored, Y = rmsnorm(S) * (offset + W), the row's rstd kept."""
    row_idx = tl.program_id(0).to(tl.int64)
    col_offsets = tl.arange(0, BLOCK_SIZE)
    mask = col_offsets < n_cols
    Y_ptr += row_idx * Y_row_stride
    S_ptr += row_idx * S_row_stride
    X_ptr += row_idx * X_row_stride
    R_ptr += row_idx * R_row_stride
    RSTD_ptr += row_idx * RSTD_row_stride
    X_row = tl.load(X_ptr + col_offsets, mask=mask, other=0)
    R_row = tl.load(R_ptr + col_offsets, mask=mask, other=0)
    S_row = X_row + R_row
    tl.store(S_ptr + col_offsets, S_row, mask=mask)
    W_row = tl.load(W_ptr + col_offsets, mask=mask, other=0)
    mean_square = tl.sum(S_row * S_row, axis=0) / n_cols
    rstd = tl.rsqrt(mean_square + eps)
    tl.store(RSTD_ptr, rstd)
    S_row = S_row * rstd
    Y_row = S_row * (offset + W_row)
    tl.store(Y_ptr + col_offsets, Y_row, mask=mask)


def fused_add_rms_norm(X, R, W, into):
    """The sum written back into the residual (``into="residual"``: S is R) or into the hidden states (S is X)."""
    n_rows, n_cols = X.shape
    Y = torch.empty_like(X)
    RSTD = torch.empty(n_rows, dtype=X.dtype, device=X.device)
    S = R if into == "residual" else X
    fused_add_rms_norm_kernel[(n_rows,)](Y, Y.stride(0), S, S.stride(0), X, X.stride(0), R, R.stride(0), W,
                                         W.stride(0), RSTD, RSTD.stride(0), n_cols, 1e-6, 0.5,
                                         BLOCK_SIZE=triton.next_power_of_2(n_cols))
    return Y, S


@pytest.mark.parametrize("into", ["residual", "hidden"])
def test_a_fused_add_and_rmsnorm_writing_the_sum_into_its_input(device, into, poisoned_empty):
    """Refused before as a hazard: "overwrites `S_ptr`, memory that launch #1 reads through `R_ptr`"; now the launch
    is that of the kernel's alias view (host/aliases.py), an update of one pointer in place."""
    op = tritongrad.op(fused_add_rms_norm)
    leaves = [torch.randn(*shape, dtype=DTYPE, device=device, requires_grad=True) for shape in ((6, 37), (6, 37),
                                                                                               (37,))]
    x, r, w = leaves
    for _ in range(2):
        hidden, residual = x * 1.0, r * 2.0  # tensors with a history, as a decoder layer's
        y, s = op(hidden, residual, w, into)
        assert s is (residual if into == "residual" else hidden)
        want_s = x * 1.0 + r * 2.0
        want_y = want_s * torch.rsqrt((want_s * want_s).mean(-1, keepdim=True) + 1e-6) * (0.5 + w)
        close((y, s), (want_y, want_s))
        g = [torch.randn_like(t) for t in (y, s)]
        for a, b in zip(torch.autograd.grad((y, s), leaves, g), torch.autograd.grad((want_y, want_s), leaves, g),
                        strict=True):
            close(a, b)
