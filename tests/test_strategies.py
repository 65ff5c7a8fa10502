"""How each input's gradient reaches memory (writes/strategies.py), one kernel per strategy, each checked
against PyTorch autograd on a plain-PyTorch reference (float64, sizes that are not powers of two)."""

import pytest
import torch
import triton
import triton.language as tl
from fuzz.bounds import checked  # every address inside the launch's tensors (the interpreter's accesses)

import tritongrad
from tritongrad import NotDifferentiableError
from tritongrad.runtime import backward_kernel, derive, launching, variants
from tritongrad.tools.testing import assert_gradients_match, bind_launch, poison
from tritongrad.writes.strategies import Mode

F64 = torch.float64


@triton.jit
def norm_rows(x_ptr, w_ptr, b_ptr, y_ptr, stride, N, BLOCK: tl.constexpr):
    """A layer norm: each program normalizes one row; every program reads the weight and the bias."""
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    x = tl.load(x_ptr + row * stride + cols, mask=mask, other=0.0)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0)
    b = tl.load(b_ptr + cols, mask=mask, other=0.0)
    mean = tl.sum(x, axis=0) / N
    xc = tl.where(mask, x - mean, 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(xc * xc, axis=0) / N + 1e-5)
    tl.store(y_ptr + row * stride + cols, xc * rstd * w + b, mask=mask)


def norm_reference(x, w, b):
    return torch.nn.functional.layer_norm(x, (x.shape[1],), w, b, 1e-5)


@triton.jit
def norm_columns_looped(x_ptr, w_ptr, y_ptr, stride, N, BLOCK: tl.constexpr):
    """An RMS norm over a row in blocks of columns: the weight's load moves with the loop (a partial row
    per program, not registers)."""
    row = tl.program_id(0)
    acc = tl.zeros((BLOCK,), dtype=tl.float64)
    for start in range(0, N, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + row * stride + cols, mask=cols < N, other=0.0)
        acc += x * x
    rstd = 1.0 / tl.sqrt(tl.sum(acc, axis=0) / N + 1e-6)
    for start in range(0, N, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + row * stride + cols, mask=cols < N, other=0.0)
        w = tl.load(w_ptr + cols, mask=cols < N, other=0.0)
        tl.store(y_ptr + row * stride + cols, x * rstd * w, mask=cols < N)


@triton.jit
def windows(x_ptr, y_ptr, STEP, N, W: tl.constexpr):
    """Program p sums the window x[p * STEP : p * STEP + W] (windows overlap when STEP < W)."""
    pid = tl.program_id(0)
    offs = pid * STEP + tl.arange(0, W)
    x = tl.load(x_ptr + offs, mask=offs < N, other=0.0)
    tl.store(y_ptr + pid, tl.sum(x * x, axis=0))


@triton.jit
def gather_rows(idx_ptr, table_ptr, y_ptr, D, BLOCK: tl.constexpr):
    """An embedding lookup: row p of y is row idx[p] of the table (indices may repeat)."""
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    i = tl.load(idx_ptr + pid)
    t = tl.load(table_ptr + i * D + cols, mask=cols < D, other=0.0)
    tl.store(y_ptr + pid * D + cols, tl.sin(t), mask=cols < D)


@triton.jit
def head(x_ptr, y_ptr, stride, HALF, BLOCK: tl.constexpr):
    """Reads only the first HALF columns of each row: its loads do not cover x."""
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * stride + cols, mask=cols < HALF, other=0.0)
    tl.store(y_ptr + row * HALF + cols, tl.exp(x), mask=cols < HALF)


def choices_of(kernel, grid, args, kwargs, **grad_kwargs):
    bwd = tritongrad.grad(kernel, **grad_kwargs)
    named = bind_launch(kernel, args, kwargs)
    return {p: (c.mode, c.covers) for p, c in bwd.choose(named, grid).items()}


def check_norm_rows(rows: int, n: int) -> tuple[tuple, dict]:
    """norm_rows's gradients against autograd on fresh float64 rows of n columns; its launch's arguments."""
    x, w, b = torch.randn(rows, n, dtype=F64), torch.randn(n, dtype=F64), torch.randn(n, dtype=F64)
    y = poison(torch.empty(rows, n, dtype=F64))
    args, kwargs = (x, w, b, y, n, n), {"BLOCK": 64}
    norm_rows[(rows,)](*args, **kwargs)
    leaves = [t.clone().requires_grad_() for t in (x, w, b)]
    assert_gradients_match(norm_rows, (rows,), args, kwargs, y, norm_reference(*leaves), leaves,
                           ["x_ptr", "w_ptr", "b_ptr"])
    return args, kwargs


def test_rows_are_written_once_and_a_shared_weight_and_bias_summed_in_registers(poisoned_empty, monkeypatch):
    """The weight's and bias's loads cover them: each program stores its whole partial row (left unfilled)."""
    monkeypatch.setenv("TRITONGRAD_TUNE", "0")  # (a tuner's trials reset their buffers: not the launch's own)
    filled = []
    for module in (backward_kernel, variants, launching):  # (every place a buffer is made)
        monkeypatch.setattr(module, "zeros_strided", lambda *a, **k: filled.append(a))
    rows, n = 9, 45
    args, kwargs = check_norm_rows(rows, n)
    assert choices_of(norm_rows, (rows,), args, kwargs) == {
        "x_ptr": (Mode.STORE, True), "w_ptr": (Mode.REGISTERS, True), "b_ptr": (Mode.REGISTERS, True)}
    assert filled == []  # neither the gradients nor the partial rows are zero-filled
    src = tritongrad.grad(norm_rows).src
    assert "atomic" not in src.split('"""')[2]  # no atomics in the kernel's body
    assert "for row in tl.range(tl.program_id(0), programs, tl.num_programs(0), num_stages=STAGES):" in src
    assert "d_w_sum += d_w.to(d_w_sum.dtype)" in src and "tl.store(d_w_ptr + cols, d_w_sum, mask=mask)" in src


@pytest.mark.parametrize("held", [True, False])
def test_a_persistent_kernel_holds_the_weight_across_its_loop_or_loads_it_for_each_row(held, poisoned_empty,
                                                                                       monkeypatch):
    """Whether the weight and bias are held in registers across the loop over rows is a launch setting (tuning's
    ``held``): the gradients are the same either way."""
    from tritongrad.runtime import tuning

    monkeypatch.setattr(tuning, "DEFAULT", tuning.Setting(held=held))  # what an untuned launch runs with
    monkeypatch.setenv("TRITONGRAD_TUNE", "0")  # (on a GPU tuning's trials would launch both settings)
    monkeypatch.setattr(launching, "persistent_programs", lambda programs, device, waves=1: 2)  # rows per program
    launched, launch = [], variants.PartLaunch.launch
    monkeypatch.setattr(variants.PartLaunch, "launch", lambda self, args, *a, **k: (
        launched.append(args.get(self.part.held)), launch(self, args, *a, **k))[1])
    check_norm_rows(7 if held else 13, 45)  # (a launch of its own: a prepared launch keeps its first settings)
    assert launched and set(launched) == {held}  # the backward ran with that setting
    src = tritongrad.grad(norm_rows).src
    held_before, loop = src.split("    for row in ")
    assert "    if HELD:\n        w = tl.load(w_ptr + cols, mask=mask, other=0.0)" in held_before
    assert "        if not HELD:\n            w = tl.load(w_ptr + cols, mask=mask, other=0.0)" in loop


def test_partial_rows_of_a_weight_its_loads_do_not_cover_are_zero_filled(poisoned_empty):
    """A weight longer than the rows: the programs store only its first N elements of their partial rows."""
    rows, n = 9, 45
    x, w, b = torch.randn(rows, n, dtype=F64), torch.randn(n + 6, dtype=F64), torch.randn(n, dtype=F64)
    y = poison(torch.empty(rows, n, dtype=F64))
    args, kwargs = (x, w, b, y, n, n), {"BLOCK": 64}
    norm_rows[(rows,)](*args, **kwargs)
    leaves = [t.clone().requires_grad_() for t in (x, w, b)]
    want = norm_reference(leaves[0], leaves[1][:n], leaves[2])
    assert choices_of(norm_rows, (rows,), args, kwargs)["w_ptr"] == (Mode.REGISTERS, False)
    assert_gradients_match(norm_rows, (rows,), args, kwargs, y, want, leaves, ["x_ptr", "w_ptr", "b_ptr"])


def test_one_program_along_the_weights_axis_stores_it():
    n = 45
    x, w, b = torch.randn(1, n, dtype=F64), torch.randn(n, dtype=F64), torch.randn(n, dtype=F64)
    args, kwargs = (x, w, b, torch.empty(1, n, dtype=F64), n, n), {"BLOCK": 64}
    assert choices_of(norm_rows, (1,), args, kwargs)["w_ptr"] == (Mode.STORE, True)


def test_a_weight_loaded_in_a_loop_is_summed_in_a_float32_row_per_program():
    rows, n = 7, 70
    x, w = torch.randn(rows, n, dtype=F64), torch.randn(n, dtype=F64)
    y = poison(torch.empty(rows, n, dtype=F64))
    args, kwargs = (x, w, y, n, n), {"BLOCK": 32}
    norm_columns_looped[(rows,)](*args, **kwargs)
    xl, wl = x.clone().requires_grad_(), w.clone().requires_grad_()
    want = xl * torch.rsqrt(xl.pow(2).mean(1, keepdim=True) + 1e-6) * wl
    assert_gradients_match(norm_columns_looped, (rows,), args, kwargs, y, want, [xl, wl], ["x_ptr", "w_ptr"])
    assert choices_of(norm_columns_looped, (rows,), args, kwargs)["w_ptr"][0] == Mode.ROW


@pytest.mark.parametrize("step", [12, 5])
def test_windows_apart_are_written_once_overlapping_ones_added_atomically(step):
    w, programs = 8, 9
    n = (programs - 1) * step + w
    x = torch.randn(n, dtype=F64)
    y = poison(torch.empty(programs, dtype=F64))
    windows[(programs,)](x, y, step, n, W=w)
    xl = x.clone().requires_grad_()
    want = (xl.unfold(0, w, step) ** 2).sum(1)
    assert_gradients_match(windows, (programs,), (x, y, step, n), {"W": w}, y, want, [xl], ["x_ptr"])
    mode, _ = choices_of(windows, (programs,), (x, y, step, n), {"W": w})["x_ptr"]
    assert mode == (Mode.STORE if step >= w else Mode.ATOMIC)


@triton.jit
def exp_rows(x_ptr, y_ptr, x_stride, N, BLOCK: tl.constexpr):
    """Row p of y (rows of N) is exp of N elements of x from p * x_stride: rows of x overlap when
    x_stride < N, and that is the launch's business, not the kernel's."""
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * x_stride + cols, mask=cols < N, other=0.0)
    tl.store(y_ptr + row * N + cols, tl.exp(x), mask=cols < N)


@pytest.mark.parametrize("overlap", [False, True])
def test_a_row_stride_shorter_than_the_row_is_decided_at_launch(overlap):
    rows, n = 5, 24
    stride = n // 2 if overlap else n
    base = torch.randn((rows - 1) * stride + n, dtype=F64)
    y = poison(torch.empty(rows, n, dtype=F64))
    args, kwargs = (base, y, stride, n), {"BLOCK": 32}
    exp_rows[(rows,)](*args, **kwargs)
    leaf = base.clone().requires_grad_()
    want = torch.exp(leaf.as_strided((rows, n), (stride, 1)))
    assert_gradients_match(exp_rows, (rows,), args, kwargs, y, want, [leaf], ["x_ptr"])
    want_choice = (Mode.ATOMIC, False) if overlap else (Mode.STORE, True)
    assert choices_of(exp_rows, (rows,), args, kwargs)["x_ptr"] == want_choice


def test_a_gather_with_repeats_is_added_atomically_and_refused_when_deterministic():
    rows, d, vocab = 11, 21, 5
    idx = torch.tensor([0, 3, 3, 1, 4, 3, 0, 2, 2, 4, 1])
    table = torch.randn(vocab, d, dtype=F64)
    y = poison(torch.empty(rows, d, dtype=F64))
    args, kwargs = (idx, table, y, d), {"BLOCK": 32}
    gather_rows[(rows,)](*args, **kwargs)
    leaf = table.clone().requires_grad_()
    assert_gradients_match(gather_rows, (rows,), args, kwargs, y, torch.sin(leaf[idx]), [leaf], ["table_ptr"])
    assert choices_of(gather_rows, (rows,), args, kwargs)["table_ptr"][0] == Mode.ATOMIC
    assert "sem='relaxed')" in tritongrad.grad(gather_rows).src  # (nothing in the kernel reads the sums)
    with pytest.raises(NotDifferentiableError, match=r"`table_ptr` with deterministic=True: its gradient can only "
                                                     r"be added atomically here \(its addresses are computed from "
                                                     r"loaded data\)"):
        tritongrad.grad(gather_rows, deterministic=True)


def test_loads_that_do_not_cover_the_tensor_keep_the_zero_fill():
    rows, n, half = 6, 40, 17
    x = torch.randn(rows, n, dtype=F64)
    y = poison(torch.empty(rows, half, dtype=F64))
    args, kwargs = (x, y, n, half), {"BLOCK": 32}
    head[(rows,)](*args, **kwargs)
    assert choices_of(head, (rows,), args, kwargs)["x_ptr"] == (Mode.STORE, False)
    leaf = x.clone().requires_grad_()
    assert_gradients_match(head, (rows,), args, kwargs, y, torch.exp(leaf[:, :half]), [leaf], ["x_ptr"])
    whole = torch.randn(rows, half, dtype=F64)  # rows of exactly HALF columns: covered
    assert choices_of(head, (rows,), (whole, y, half, half), kwargs)["x_ptr"] == (Mode.STORE, True)


def test_deterministic_gradients_are_identical_bit_for_bit():
    rows, n = 13, 45
    x, w, b = torch.randn(rows, n, dtype=torch.float32), torch.randn(n), torch.randn(n)
    y = torch.empty(rows, n)
    args, kwargs = (x, w, b, y, n, n), {"BLOCK": 64}
    from tritongrad.tools.testing import backward_launch

    g = torch.randn(rows, n)
    runs = [backward_launch(norm_rows, (rows,), args, kwargs, {"y_ptr": g}, deterministic=True) for _ in range(3)]
    for name in ("x_ptr", "w_ptr", "b_ptr"):
        assert all(torch.equal(r[name], runs[0][name]) for r in runs[1:])


def test_the_adding_contract_of_a_launch_with_buffers():
    """bwd[grid](...) adds to the buffers it is given (owned inputs without atomics, weights from partial
    rows), so a caller can accumulate several launches' gradients in one buffer."""
    rows, n = 9, 45
    x, w, b = torch.randn(rows, n, dtype=F64), torch.randn(n, dtype=F64), torch.randn(n, dtype=F64)
    y = torch.empty(rows, n, dtype=F64)
    bwd = tritongrad.grad(norm_rows)
    g = torch.randn(rows, n, dtype=F64)
    start = [torch.randn_like(t) for t in (x, w, b)]
    buffers = [s.clone() for s in start]
    bwd[(rows,)](x, w, b, y, n, n, g, *buffers, BLOCK=64)
    leaves = [t.clone().requires_grad_() for t in (x, w, b)]
    want = torch.autograd.grad(norm_reference(*leaves), leaves, g)
    for got, s, ref in zip(buffers, start, want, strict=True):
        torch.testing.assert_close(got, s + ref, rtol=1e-12, atol=1e-12)
    named = bind_launch(norm_rows, (x, w, b, y, n, n), {"BLOCK": 64})
    assert bwd.choose(named, (rows,), written=frozenset(bwd.wrt))["x_ptr"].mode == Mode.ADD


@triton.jit
def scale_kernel(x_ptr, y_ptr, s, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
    tl.store(y_ptr + offs, x * s, mask=offs < n)


@tritongrad.op
def two_readers(x):
    """Two launches read x: in the backward the later one (differentiated first) stores x's gradient, the earlier
    adds to it."""
    n = x.numel()
    a, b = torch.empty_like(x), torch.empty_like(x)
    scale_kernel[(triton.cdiv(n, 32),)](x, a, 2.0, n, BLOCK=32)
    scale_kernel[(triton.cdiv(n, 32),)](x, b, 3.0, n, BLOCK=32)
    return a, b


def test_two_launches_writing_one_storage_store_then_add(monkeypatch):
    from tritongrad.runtime import derive

    seen = []
    real = derive.BackwardKernel.launch

    def spy(self, grid, named, output_grads, buffers, prepared, written=frozenset(), pad=0, saved=None,
            **kwargs):
        seen.append((prepared.choices["x_ptr"].mode, "x_ptr" in written))
        return real(self, grid, named, output_grads, buffers, prepared, written, pad, saved, **kwargs)

    monkeypatch.setattr(derive.BackwardKernel, "launch", spy)
    x = torch.randn(77, dtype=F64, requires_grad=True)
    a, b = two_readers(x)
    ga, gb = torch.randn_like(a), torch.randn_like(b)
    torch.autograd.backward([a, b], [ga, gb])
    torch.testing.assert_close(x.grad, 2.0 * ga + 3.0 * gb, rtol=1e-12, atol=1e-12)
    assert seen == [(Mode.STORE, False), (Mode.ADD, True)]


@tritongrad.op
def norm_twice(x1, x2, w, b):
    """Two launches reading one weight and bias: the second's partial rows are added to the first's sums."""
    (r1, n), r2 = x1.shape, x2.shape[0]
    y1, y2 = torch.empty_like(x1), torch.empty_like(x2)
    norm_rows[(r1,)](x1, w, b, y1, n, n, BLOCK=64)
    norm_rows[(r2,)](x2, w, b, y2, n, n, BLOCK=64)
    return y1, y2


@tritongrad.op
def norm_once(x, w, b):
    y = torch.empty_like(x)
    norm_rows[(x.shape[0],)](x, w, b, y, x.shape[1], x.shape[1], BLOCK=64)
    return y


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_partial_rows_are_summed_into_the_gradient_in_its_dtype_or_added_to_it(dtype, monkeypatch, device,
                                                                               poisoned_empty):
    """The partial rows' sum: stored in a half-precision gradient's own dtype, where it is the only gradient its
    storage gets; added, where an earlier launch's backward put gradient there first."""
    monkeypatch.setenv("TRITONGRAD_TUNE", "0")
    seen = []
    real = derive.BackwardKernel.launch

    def spy(self, grid, named, output_grads, buffers, prepared, written=frozenset(), *args, **kwargs):
        seen.append((prepared.choices["w_ptr"].mode, buffers["w_ptr"].dtype, "w_ptr" in written))
        return real(self, grid, named, output_grads, buffers, prepared, written, *args, **kwargs)

    monkeypatch.setattr(derive.BackwardKernel, "launch", spy)
    n = 45
    x1, x2 = torch.randn(9, n, device=device, dtype=dtype), torch.randn(7, n, device=device, dtype=dtype)
    w, b = torch.randn(n, device=device, dtype=dtype), torch.randn(n, device=device, dtype=dtype)
    leaves = [t.clone().requires_grad_() for t in (x1, x2, w, b)]
    wide = [t.detach().to(F64).requires_grad_() for t in leaves]
    tol = {"rtol": 1e-4, "atol": 1e-4} if dtype == torch.float32 else {"rtol": 2e-2, "atol": 2e-2}

    if dtype == torch.float16:  # one launch: the weight's gradient is its own storage's only one, kept in float16
        out, want = norm_once(leaves[0], *leaves[2:]), norm_reference(wide[0], *wide[2:])
        torch.testing.assert_close(out.detach().to(F64), want.detach(), **tol)
        g = torch.randn_like(out)
        torch.autograd.backward([out], [g])
        torch.autograd.backward([want], [g.to(F64)])
        for got, ref in ((leaves[0], wide[0]), (leaves[2], wide[2]), (leaves[3], wide[3])):
            torch.testing.assert_close(got.grad.to(F64), ref.grad, **tol)
        assert seen == [(Mode.REGISTERS, torch.float16, False)]
        return
    outs = norm_twice(*leaves)
    wants = (norm_reference(wide[0], *wide[2:]), norm_reference(wide[1], *wide[2:]))
    for out, want in zip(outs, wants, strict=True):
        torch.testing.assert_close(out.detach().to(F64), want.detach(), **tol)
    grads = [torch.randn_like(o) for o in outs]
    torch.autograd.backward(list(outs), grads)
    torch.autograd.backward(list(wants), [g.to(F64) for g in grads])
    for got, ref in zip(leaves, wide, strict=True):
        torch.testing.assert_close(got.grad.to(F64), ref.grad, **tol)
    assert seen == [(Mode.REGISTERS, dtype, False), (Mode.REGISTERS, dtype, True)]  # the later launch's backward first


@tritongrad.op(deterministic=True)
def deterministic_norm(x, w, b):
    rows, n = x.shape
    y = torch.empty_like(x)
    norm_rows[(rows,)](x, w, b, y, n, n, BLOCK=64)
    return y


@tritongrad.op(deterministic=True)
def deterministic_gather(idx, table):
    y = torch.empty(idx.numel(), table.shape[1], dtype=table.dtype, device=table.device)
    gather_rows[(idx.numel(),)](idx, table, y, table.shape[1], BLOCK=32)
    return y


def test_a_deterministic_op_gives_identical_bits_and_refuses_a_gather_by_name(device):
    x = torch.randn(13, 45, device=device)
    w, b, g = torch.randn(45, device=device), torch.randn(45, device=device), torch.randn(13, 45, device=device)
    grads = []
    for _ in range(3):
        leaves = [t.clone().requires_grad_() for t in (x, w, b)]
        deterministic_norm(*leaves).backward(g)
        grads.append([t.grad for t in leaves])
    assert all(torch.equal(a, b) for run in grads[1:] for a, b in zip(run, grads[0], strict=True))
    table = torch.randn(5, 21, device=device, requires_grad=True)
    with pytest.raises(NotDifferentiableError, match="`table_ptr` with deterministic=True"):  # at the call
        deterministic_gather(torch.tensor([0, 3, 3, 1], device=device), table)


@triton.jit
def logsumexp_minus_target(x_ptr, t_ptr, y_ptr, V, stride, BLOCK: tl.constexpr):
    """A cross-entropy's shape: each row read block by block, then its target's logit read again by
    index; rows whose target is negative return early."""
    row = tl.program_id(0)
    target = tl.load(t_ptr + row)
    if target < 0:
        tl.store(y_ptr + row, 0.0)
        return
    acc = tl.zeros((BLOCK,), dtype=tl.float64)
    for start in range(0, V, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        acc += tl.exp(tl.load(x_ptr + row * stride + cols, mask=cols < V, other=float("-inf")))
    picked = tl.load(x_ptr + row * stride + target)
    tl.store(y_ptr + row, tl.log(tl.sum(acc)) - picked)


def _logsumexp_minus_target_launch(rows=9, vocab=70):
    x = torch.randn(rows, vocab, dtype=F64)
    t = torch.randint(0, vocab, (rows,))
    t[2::4] = -1
    y = poison(torch.empty(rows, dtype=F64))
    args, kwargs = (x, t, y, vocab, vocab), {"BLOCK": 32}
    logsumexp_minus_target[(rows,)](*args, **kwargs)
    leaf = x.clone().requires_grad_()
    kept = (t >= 0).to(F64)
    want = (torch.logsumexp(leaf, 1) - leaf.gather(1, t.clamp(min=0)[:, None])[:, 0]) * kept
    return args, kwargs, y, want, leaf


def test_an_input_loaded_again_by_index_is_written_once_and_the_index_load_added_after(poisoned_empty):
    rows = 9
    args, kwargs, y, want, leaf = _logsumexp_minus_target_launch(rows)
    with checked():
        assert_gradients_match(logsumexp_minus_target, (rows,), args, kwargs, y, want, [leaf], ["x_ptr"])
    assert choices_of(logsumexp_minus_target, (rows,), args, kwargs)["x_ptr"] == (Mode.STORE, True)
    body = tritongrad.grad(logsumexp_minus_target).src.split('"""')[2]
    assert "atomic" not in body
    assert ("    if target < 0:\n"  # rows that return store zeros where the others store gradient: no zero-fill
            "        for start in range(0, V, BLOCK):\n"
            "            cols = start + tl.arange(0, BLOCK)\n"
            "            tl.store(d_x_ptr + row * stride + cols, 0.0, mask=cols < V)\n    else:\n") in body
    assert "tg.add_later(d_picked_later, d_picked_later_at, d_x_ptr, d_x_ptr + row * stride + target" in body


def test_later_adds_are_deterministic():
    rows = 9
    args, kwargs, y, _, _ = _logsumexp_minus_target_launch(rows)
    from tritongrad.tools.testing import backward_launch

    g = torch.randn(rows, dtype=F64)
    runs = [backward_launch(logsumexp_minus_target, (rows,), args, kwargs, {"y_ptr": g}, deterministic=True)
            for _ in range(3)]
    assert all(torch.equal(r["x_ptr"], runs[0]["x_ptr"]) for r in runs[1:])


@triton.jit
def rows_times_neighbours(x_ptr, y_ptr, R, N, BLOCK: tl.constexpr):
    """Each row times the next row's first element (another program's) and the sum of its own first three:
    loads beside the row's own, one of them in another program's part of x, one a masked tile."""
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * N + cols, mask=cols < N)
    following = tl.load(x_ptr + ((row + 1) % R) * N)
    first = tl.load(x_ptr + row * N + tl.arange(0, 4), mask=tl.arange(0, 4) < 3, other=0.0)
    tl.store(y_ptr + row * N + cols, x * following + tl.sum(first), mask=cols < N)


def test_later_adds_reach_other_programs_elements_after_every_store(poisoned_empty):
    rows, n = 7, 45
    x = torch.randn(rows, n, dtype=F64)
    y = poison(torch.empty(rows, n, dtype=F64))
    args, kwargs = (x, y, rows, n), {"BLOCK": 64}
    rows_times_neighbours[(rows,)](*args, **kwargs)
    leaf = x.clone().requires_grad_()
    want = leaf * leaf.roll(-1, 0)[:, :1] + leaf[:, :3].sum(1, keepdim=True)
    assert choices_of(rows_times_neighbours, (rows,), args, kwargs)["x_ptr"] == (Mode.STORE, True)  # no zero-fill
    assert_gradients_match(rows_times_neighbours, (rows,), args, kwargs, y, want, [leaf], ["x_ptr"])


@triton.jit
def scaled_rows_plus_first(x_ptr, w_ptr, y_ptr, N, BLOCK: tl.constexpr):
    """A weight every row reads (partial sums in a persistent kernel) beside a row loaded twice."""
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * N + cols, mask=cols < N)
    w = tl.load(w_ptr + cols, mask=cols < N)
    tl.store(y_ptr + row * N + cols, x * w + tl.load(x_ptr + row * N), mask=cols < N)


def test_later_adds_give_way_to_a_persistent_kernel(poisoned_empty):
    """A persistent kernel's programs are not the forward's: the input loaded twice is added atomically."""
    rows, n = 9, 45
    x, w = torch.randn(rows, n, dtype=F64), torch.randn(n, dtype=F64)
    y = poison(torch.empty(rows, n, dtype=F64))
    args, kwargs = (x, w, y, n), {"BLOCK": 64}
    scaled_rows_plus_first[(rows,)](*args, **kwargs)
    leaves = [x.clone().requires_grad_(), w.clone().requires_grad_()]
    want = leaves[0] * leaves[1] + leaves[0][:, :1]
    assert choices_of(scaled_rows_plus_first, (rows,), args, kwargs) == {
        "x_ptr": (Mode.ATOMIC, False), "w_ptr": (Mode.REGISTERS, True)}
    assert_gradients_match(scaled_rows_plus_first, (rows,), args, kwargs, y, want, leaves, ["x_ptr", "w_ptr"])


@triton.jit
def guarded_rows(x_ptr, y_ptr, R, N, BLOCK: tl.constexpr):
    """Programs past the last row return: the usual guard of a grid rounded up."""
    row = tl.program_id(0)
    if row >= R:
        return
    cols = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * N + cols, mask=cols < N)
    tl.store(y_ptr + row * N + cols, tl.exp(x), mask=cols < N)


@pytest.mark.parametrize("spare", [0, 3])
def test_a_returning_branch_stores_zeros_only_where_the_loads_cover_the_tensor(spare, poisoned_empty):
    """With programs to spare the guard keeps them off memory past x: their branch must not store zeros
    there (the loads then do not cover x as if every program ran them: the zero-fill stays)."""
    rows, n = 7, 45
    x = torch.randn(rows, n, dtype=F64)
    y = poison(torch.empty(rows, n, dtype=F64))
    grid = (rows + spare,)
    args, kwargs = (x, y, rows, n), {"BLOCK": 64}
    guarded_rows[grid](*args, **kwargs)
    assert choices_of(guarded_rows, grid, args, kwargs)["x_ptr"] == (Mode.STORE, spare == 0)
    leaf = x.clone().requires_grad_()
    with checked():
        assert_gradients_match(guarded_rows, grid, args, kwargs, y, torch.exp(leaf), [leaf], ["x_ptr"])


@triton.jit
def guarded_scaled_rows(x_ptr, w_ptr, y_ptr, R, N, BLOCK: tl.constexpr):
    """A shared weight in a kernel whose programs past the last row return."""
    row = tl.program_id(0)
    if row >= R:
        return
    cols = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * N + cols, mask=cols < N)
    w = tl.load(w_ptr + cols, mask=cols < N)
    tl.store(y_ptr + row * N + cols, x * w, mask=cols < N)


@pytest.mark.parametrize("spare", [0, 3])
def test_a_weight_read_past_a_returning_branch_is_summed_in_zero_filled_rows(spare, poisoned_empty):
    """Partial rows are left unfilled only where each program stores its whole row after its loop; a load
    past a `return` is summed into its row where it runs, so the rows stay zero-filled."""
    rows, n = 4, 45
    x, w = torch.randn(rows, n, dtype=F64), torch.randn(n, dtype=F64)
    y = poison(torch.empty(rows, n, dtype=F64))
    grid = (rows + spare,)
    args, kwargs = (x, w, y, rows, n), {"BLOCK": 64}
    guarded_scaled_rows[grid](*args, **kwargs)
    assert choices_of(guarded_scaled_rows, grid, args, kwargs)["w_ptr"] == (Mode.ROW, False)
    leaves = [x.clone().requires_grad_(), w.clone().requires_grad_()]
    with checked():
        assert_gradients_match(guarded_scaled_rows, grid, args, kwargs, y, leaves[0] * leaves[1], leaves,
                               ["x_ptr", "w_ptr"])


@triton.jit
def rows_reversed_by_count(x_ptr, w_ptr, y_ptr, N, BLOCK: tl.constexpr):
    """Rows scaled by a shared weight, stored in reverse order: the row index from ``tl.num_programs(0)``."""
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * N + cols, mask=cols < N)
    w = tl.load(w_ptr + cols, mask=cols < N)
    tl.store(y_ptr + (tl.num_programs(0) - 1 - row) * N + cols, x * w, mask=cols < N)


def test_num_programs_in_a_persistent_kernel_is_the_forwards(poisoned_empty):
    """The persistent kernel runs fewer programs than the forward: its ``tl.num_programs(0)``, computed once
    before its loop over the forward's programs, must still be the forward's count."""
    rows, n = 9, 45
    x, w = torch.randn(rows, n, dtype=F64), torch.randn(n, dtype=F64)
    y = poison(torch.empty(rows, n, dtype=F64))
    args, kwargs = (x, w, y, n), {"BLOCK": 64}
    rows_reversed_by_count[(rows,)](*args, **kwargs)
    assert choices_of(rows_reversed_by_count, (rows,), args, kwargs)["w_ptr"] == (Mode.REGISTERS, True)
    leaves = [x.clone().requires_grad_(), w.clone().requires_grad_()]
    want = (leaves[0] * leaves[1]).flip(0)
    assert_gradients_match(rows_reversed_by_count, (rows,), args, kwargs, y, want, leaves, ["x_ptr", "w_ptr"])


@triton.jit
def row_times_zero_plus_first(x_ptr, y_ptr, N, BLOCK: tl.constexpr):
    """The row's own load reaches y only through its maximum times zero (no adjoint reaches it: a maximum's
    ties aside, the derivative of a constant); its first element, loaded again, does."""
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * N + cols, mask=cols < N)
    first = tl.load(x_ptr + row * N)
    top = tl.max(tl.where(cols < N, x, -float("inf")))
    tl.store(y_ptr + row * N + cols, 0.0 * top + first, mask=cols < N)


def test_later_adds_alone_get_a_zero_filled_buffer(poisoned_empty):
    """Found by the fuzzer (seed 2070 kernel 2947): where the stored load writes nothing, the later adds
    must not count as its writes (the buffer was left unset, the stores covering it never run)."""
    rows, n = 7, 45
    x = torch.randn(rows, n, dtype=F64)
    y = poison(torch.empty(rows, n, dtype=F64))
    args, kwargs = (x, y, n), {"BLOCK": 64}
    row_times_zero_plus_first[(rows,)](*args, **kwargs)
    leaf = x.clone().requires_grad_()
    want = (0.0 * leaf.amax(1, keepdim=True) + leaf[:, :1]).expand(rows, n)
    assert_gradients_match(row_times_zero_plus_first, (rows,), args, kwargs, y, want, [leaf], ["x_ptr"])


def test_partial_rows_over_their_budget_are_added_atomically_instead(monkeypatch):
    """Rows as long as the tensor per persistent program (an attention's keys) past the memory budget: the
    launch adds atomically rather than allocate them (or overflow their 32-bit offsets)."""
    from tritongrad.runtime import backward_kernel

    rows, n = 7, 70
    x, w = torch.randn(rows, n, dtype=F64), torch.randn(n, dtype=F64)
    y = poison(torch.empty(rows, n, dtype=F64))
    args, kwargs = (x, w, y, n, n), {"BLOCK": 32}
    norm_columns_looped[(rows,)](*args, **kwargs)
    tritongrad.grad(norm_columns_looped)._chosen.clear()  # choices are kept per launch (the budget is fixed)
    monkeypatch.setattr(backward_kernel, "scratch_budget", lambda device: 7 * n * 8 - 1)  # a byte less than 7 rows take
    assert choices_of(norm_columns_looped, (rows,), args, kwargs)["w_ptr"][0] == Mode.ATOMIC
    xl, wl = x.clone().requires_grad_(), w.clone().requires_grad_()
    want = xl * torch.rsqrt(xl.pow(2).mean(1, keepdim=True) + 1e-6) * wl
    assert_gradients_match(norm_columns_looped, (rows,), args, kwargs, y, want, [xl, wl], ["x_ptr", "w_ptr"])
    tritongrad.grad(norm_columns_looped)._chosen.clear()
    monkeypatch.setattr(backward_kernel, "scratch_budget", lambda device: 7 * n * 8)
    assert choices_of(norm_columns_looped, (rows,), args, kwargs)["w_ptr"][0] == Mode.ROW


@triton.jit
def scaled_by_weight_norm(x_ptr, w_ptr, y_ptr, n, BLOCK: tl.constexpr):
    """y[i] = x[i] * sum(w * w): every program reads all of w (as every query block reads all keys)."""
    pid = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    w = tl.load(w_ptr + offs, mask=offs < n, other=0.0)
    tl.store(y_ptr + pid, tl.load(x_ptr + pid) * tl.sum(w * w))


def test_partial_rows_larger_than_the_launchs_tensors_are_added_atomically_instead(monkeypatch):
    """Within the memory budget, but each program's row as long as w while each reads one element of x: the rows
    would move several times the kernel's memory, so w's gradient is added atomically."""
    from tritongrad.runtime import backward_kernel

    programs, n = 7, 70
    x, w = torch.randn(programs, dtype=F64), torch.randn(n, dtype=F64)
    y = poison(torch.empty(programs, dtype=F64))
    args, kwargs = (x, w, y, n), {"BLOCK": 128}
    scaled_by_weight_norm[(programs,)](*args, **kwargs)
    monkeypatch.setattr(backward_kernel, "scratch_budget", lambda device: 1 << 40)
    tritongrad.grad(scaled_by_weight_norm)._chosen.clear()
    assert choices_of(scaled_by_weight_norm, (programs,), args, kwargs)["w_ptr"][0] == Mode.ATOMIC
    xl, wl = x.clone().requires_grad_(), w.clone().requires_grad_()
    assert_gradients_match(scaled_by_weight_norm, (programs,), args, kwargs, y, xl * (wl * wl).sum(), [xl, wl],
                           ["x_ptr", "w_ptr"])
    tritongrad.grad(scaled_by_weight_norm)._chosen.clear()
    args = (torch.randn(1000, dtype=F64), w, y, n)  # the same launch with a larger x: the rows are the smaller
    assert choices_of(scaled_by_weight_norm, (programs,), args, kwargs)["w_ptr"][0] == Mode.REGISTERS
