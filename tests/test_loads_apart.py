"""Several loads of one input at addresses apart from one another (the two halves of a row, as rotary embeddings
read them): each load's adjoint is stored where it is computed, as a hand-written backward writes it, rather than
added atomically or kept per program and added after the kernel (writes/input_facts.py's ``_together``: the loads
read as one with a coordinate more, which load, shown apart as two stores of one output are). For an input updated
in place, that store replaces the new values' gradient once every thread has read it, with no zeros stored first
(reverse/memory.py). Where the loads meet at a launch (a row stride shorter than the row, halves that overlap), the
earlier ways: one load stored and the others' adjoints added after the kernel, or atomics. Checked in float64
against PyTorch autograd, sizes that are not powers of two, unfilled buffers poisoned."""

import pytest
import torch
import triton
import triton.language as tl

import tritongrad
from tritongrad.runtime import derive
from tritongrad.tools.testing import assert_gradients_match, bind_launch, poison
from tritongrad.writes.strategies import Mode

F64 = torch.float64


@triton.jit
def rope_heads_in_place(q_ptr, k_ptr, cos_ptr, sin_ptr, q_stride, k_stride, n_qh, n_kh, half,
                        QH: tl.constexpr, KH: tl.constexpr, HALF: tl.constexpr):
    """One program per token: all its heads of q and of k rotated in place, each as a (heads, half) tile of first
    halves and one of second halves, read, then overwritten (the way Liger-Kernel's rope is laid out)."""
    tok = tl.program_id(0)
    cols = tl.arange(0, HALF)
    cos = tl.load(cos_ptr + tok * half + cols, mask=cols < half, other=0.0)[None, :]
    sin = tl.load(sin_ptr + tok * half + cols, mask=cols < half, other=0.0)[None, :]
    qh = tl.arange(0, QH)[:, None]
    q_at = q_ptr + tok * q_stride + qh * (2 * half) + cols[None, :]
    q_mask = (qh < n_qh) & (cols[None, :] < half)
    q1 = tl.load(q_at, mask=q_mask, other=0.0)
    q2 = tl.load(q_at + half, mask=q_mask, other=0.0)
    tl.store(q_at, q1 * cos - q2 * sin, mask=q_mask)
    tl.store(q_at + half, q2 * cos + q1 * sin, mask=q_mask)
    kh = tl.arange(0, KH)[:, None]
    k_at = k_ptr + tok * k_stride + kh * (2 * half) + cols[None, :]
    k_mask = (kh < n_kh) & (cols[None, :] < half)
    k1 = tl.load(k_at, mask=k_mask, other=0.0)
    k2 = tl.load(k_at + half, mask=k_mask, other=0.0)
    tl.store(k_at, k1 * cos - k2 * sin, mask=k_mask)
    tl.store(k_at + half, k2 * cos + k1 * sin, mask=k_mask)


def rope_heads(q, k, cos, sin, n_qh, n_kh):
    """q: (tokens, n_qh * 2 * half), k: (tokens, n_kh * 2 * half), rotated in place; cos, sin: (tokens, half)."""
    half = cos.shape[1]
    rope_heads_in_place[(q.shape[0],)](q, k, cos, sin, q.stride(0), k.stride(0), n_qh, n_kh, half,
                                       QH=triton.next_power_of_2(n_qh), KH=triton.next_power_of_2(n_kh),
                                       HALF=triton.next_power_of_2(half))


def rotated(x, cos, sin, heads):
    """The same in PyTorch, out of place."""
    t = x.reshape(x.shape[0], heads, 2, -1)
    x1, x2 = t[:, :, 0], t[:, :, 1]
    c, s = cos[:, None], sin[:, None]
    return torch.stack([x1 * c - x2 * s, x2 * c + x1 * s], dim=2).reshape(x.shape)


@pytest.fixture
def choices(monkeypatch):
    """The write strategy each derived launch took, in launch order: one dict (input -> Choice) per launch."""
    seen = []
    real = derive.BackwardKernel.launch

    def spy(self, grid, named, output_grads, buffers, prepared, *args, **kwargs):
        seen.append(dict(prepared.choices))
        return real(self, grid, named, output_grads, buffers, prepared, *args, **kwargs)

    monkeypatch.setattr(derive.BackwardKernel, "launch", spy)
    return seen


def test_rope_in_place_on_q_and_k_stores_each_half(choices, device):
    """Before: both halves of q and of k were added atomically into zeros stored over the new values' gradient."""
    tokens, dim, n_qh, n_kh, half = 7, 6, 3, 2, 5

    @tritongrad.op
    def attention_inputs(x, wq, wk, cos, sin):
        q, k = x @ wq, x @ wk  # tensors with a history, rotated in place by the kernel
        rope_heads(q, k, cos, sin, n_qh, n_kh)
        return q, k

    leaves = [torch.randn(*s, dtype=F64, device=device, requires_grad=True)
              for s in ((tokens, dim), (dim, n_qh * 2 * half), (dim, n_kh * 2 * half), (tokens, half), (tokens, half))]
    twins = [t.detach().clone().requires_grad_() for t in leaves]
    x, wq, wk, cos, sin = twins
    want = (rotated(x @ wq, cos, sin, n_qh), rotated(x @ wk, cos, sin, n_kh))
    got = attention_inputs(*leaves)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-12)
    grads = [torch.randn_like(w) for w in want]
    for a, b in zip(torch.autograd.grad(got, leaves, grads), torch.autograd.grad(want, twins, grads), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)
    (launched,) = choices
    assert {p: c.mode for p, c in launched.items()} == {"q_ptr": Mode.STORE, "k_ptr": Mode.STORE,
                                                        "cos_ptr": Mode.STORE, "sin_ptr": Mode.STORE}


def test_the_derived_rope_writes_each_gradient_once_with_plain_stores(device):
    """The text is the point here: what the GPU runs. A hand-written rope backward reads each incoming gradient
    once and stores each input gradient once; a tl.atomic_add, or zeros stored before adding, would double the
    traffic and serialize the writes, though the gradient would be the same (checked after, and above).
    Before: four tl.atomic_add and four zero stores."""
    bwd = tritongrad.grad(rope_heads_in_place, wrt=("q_ptr", "k_ptr"), outputs=("q_ptr", "k_ptr"))
    assert "atomic_add" not in bwd.src and ", 0.0, mask" not in bwd.src
    for p in ("q", "k"):
        assert f"tl.store(d_{p}_at + half, d_{p}2, mask={p}_mask)" in bwd.src
        assert f"tl.store(d_{p}_at, d_{p}1, mask={p}_mask)" in bwd.src
    assert sum(line.strip().startswith("tl.store(") for line in bwd.src.splitlines()) == 4
    for p in ("q", "k"):  # every thread has read the new values' gradient before the first store replaces it
        read, write = bwd.src.rindex(f"tl.load(d_{p}_at"), bwd.src.index(f"tl.store(d_{p}_at")
        assert "tl.debug_barrier()" in bwd.src[read:write]
    assert bwd.src.count("tl.debug_barrier()") == 2  # one per input: its reads, a barrier, its stores
    tokens, n_qh, n_kh, half = 6, 3, 2, 5
    q, k = (torch.randn(tokens, n * 2 * half, dtype=F64, device=device) for n in (n_qh, n_kh))
    cos, sin = (torch.randn(tokens, half, dtype=F64, device=device) for _ in range(2))
    gq, gk = torch.randn_like(q), torch.randn_like(k)
    named = bind_launch(rope_heads_in_place, (q.clone(), k.clone(), cos, sin, q.stride(0), k.stride(0), n_qh, n_kh,
                                              half), {"QH": 4, "KH": 2, "HALF": 8})
    got = bwd.gradients((tokens,), named, {"q_ptr": gq, "k_ptr": gk})
    twins = [q.clone().requires_grad_(), k.clone().requires_grad_()]
    want = torch.autograd.grad((rotated(twins[0], cos, sin, n_qh), rotated(twins[1], cos, sin, n_kh)), twins,
                               (gq, gk))
    torch.testing.assert_close((got["q_ptr"], got["k_ptr"]), want, rtol=1e-10, atol=1e-10)


def test_the_rotary_example_stores_both_halves_into_an_unfilled_buffer(choices, poisoned_empty, device):
    """Before: x's first half stored, its second half's adjoint kept per program and added by index_add_ after
    the kernel, into a zero-filled buffer."""
    from tritongrad.examples.rotary import make_inputs, reference, rotary

    q, k, cos, sin = make_inputs((2, 3, 5, 14), device=device, dtype=F64)  # halves of 7 in blocks of 8
    leaves = [q.requires_grad_(), k.requires_grad_()]
    twins = [t.detach().clone().requires_grad_() for t in leaves]
    got, want = rotary(*leaves, cos, sin), reference(*twins, cos, sin)
    grads = [torch.randn_like(w) for w in want]
    for a, b in zip(torch.autograd.grad(got, leaves, grads), torch.autograd.grad(want, twins, grads), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)
    assert [(c["x_ptr"].mode, c["x_ptr"].covers, c["x_ptr"].later) for c in choices] == [(Mode.STORE, True, ())] * 2


@triton.jit
def rotate_windows(x_ptr, cos_ptr, sin_ptr, out_ptr, x_stride, shift, half, HALF: tl.constexpr):
    """Row p of out: x's elements from p * x_stride rotated, its second half read ``shift`` past its first. Rows of x
    overlap where x_stride < shift + half, its halves where shift < half: the launch's business."""
    row = tl.program_id(0)
    cols = tl.arange(0, HALF)
    mask = cols < half
    x1 = tl.load(x_ptr + row * x_stride + cols, mask=mask, other=0.0)
    x2 = tl.load(x_ptr + row * x_stride + shift + cols, mask=mask, other=0.0)
    c = tl.load(cos_ptr + row * half + cols, mask=mask, other=0.0)
    s = tl.load(sin_ptr + row * half + cols, mask=mask, other=0.0)
    tl.store(out_ptr + row * (2 * half) + cols, x1 * c - x2 * s, mask=mask)
    tl.store(out_ptr + row * (2 * half) + half + cols, x2 * c + x1 * s, mask=mask)


@triton.jit
def rotate_windows_looped(x_ptr, cos_ptr, sin_ptr, out_ptr, x_stride, shift, half, BLOCK: tl.constexpr):
    """As rotate_windows, a row's halves in blocks of columns: both loads of x in one loop."""
    row = tl.program_id(0)
    for start in range(0, half, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < half
        x1 = tl.load(x_ptr + row * x_stride + cols, mask=mask, other=0.0)
        x2 = tl.load(x_ptr + row * x_stride + shift + cols, mask=mask, other=0.0)
        c = tl.load(cos_ptr + row * half + cols, mask=mask, other=0.0)
        s = tl.load(sin_ptr + row * half + cols, mask=mask, other=0.0)
        tl.store(out_ptr + row * (2 * half) + cols, x1 * c - x2 * s, mask=mask)
        tl.store(out_ptr + row * (2 * half) + half + cols, x2 * c + x1 * s, mask=mask)


ROWS, HALF = 6, 5
WINDOWS = {  # (x_stride, shift) -> what x's gradient gets, without a loop and with one
    (2 * HALF, HALF): ((Mode.STORE, True, False), (Mode.STORE, True, False)),  # rows of x, apart and covering it
    (2 * HALF + 3, HALF): ((Mode.STORE, False, False), (Mode.STORE, False, False)),  # apart, with gaps: zero-filled
    (2 * HALF, HALF // 2): ((Mode.STORE, False, True), (Mode.ATOMIC, False, False)),  # halves overlap (D // 4)
    (HALF, HALF): ((Mode.STORE, False, True), (Mode.ATOMIC, False, False)),  # a row's second half is the next's first
}


@pytest.mark.parametrize("looped", [False, True])
@pytest.mark.parametrize("x_stride, shift", list(WINDOWS))
def test_loads_apart_at_one_launch_and_meeting_at_another(x_stride, shift, looped, poisoned_empty, device):
    """Written once where the launch's strides keep the loads apart; where they meet, one so and the other's adjoints
    added after the kernel (no loop), or atomics (both loads in a loop). Before: never both stored (later adds, or
    atomics in the loop)."""
    kernel, kwargs = (rotate_windows_looped, {"BLOCK": 2}) if looped else (rotate_windows, {"HALF": 8})
    base = torch.randn((ROWS - 1) * x_stride + shift + HALF, dtype=F64, device=device)
    cos, sin = (torch.randn(ROWS, HALF, dtype=F64, device=device) for _ in range(2))
    out = poison(torch.empty(ROWS, 2 * HALF, dtype=F64, device=device))
    args = (base, cos, sin, out, x_stride, shift, HALF)
    kernel[(ROWS,)](*args, **kwargs)
    leaf = base.clone().requires_grad_()
    x1, x2 = (leaf.as_strided((ROWS, HALF), (x_stride, 1), at) for at in (0, shift))
    want = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=1)
    torch.testing.assert_close(out, want.detach(), rtol=1e-12, atol=1e-12)
    assert_gradients_match(kernel, (ROWS,), args, kwargs, out, want, [leaf], ["x_ptr"])
    choice = tritongrad.grad(kernel).choose(bind_launch(kernel, args, kwargs), (ROWS,))["x_ptr"]
    assert (choice.mode, choice.covers, bool(choice.later)) == WINDOWS[(x_stride, shift)][looped]


@pytest.mark.gpu
def test_rope_in_place_in_half_precision_on_a_gpu(choices):
    """Compiled, the backward's launch setting is tuned by trial launches; each reads and replaces the new values'
    gradient in the buffer, which must be restored before the real launch (runtime/launching.py)."""
    tokens, dim, n_qh, n_kh, half = 37, 64, 5, 3, 33
    for dtype in (torch.float32, torch.bfloat16):

        @tritongrad.op
        def attention_inputs(x, wq, wk, cos, sin):
            q, k = x @ wq, x @ wk
            rope_heads(q, k, cos, sin, n_qh, n_kh)
            return q, k

        shapes = ((tokens, dim), (dim, n_qh * 2 * half), (dim, n_kh * 2 * half), (tokens, half), (tokens, half))
        leaves = [torch.randn(*s, device="cuda").to(dtype).requires_grad_() for s in shapes]
        twins = [t.detach().double().requires_grad_() for t in leaves]
        x, wq, wk, cos, sin = twins
        want = (rotated(x @ wq, cos, sin, n_qh), rotated(x @ wk, cos, sin, n_kh))
        got = attention_inputs(*leaves)
        grads = [torch.randn_like(w) for w in want]
        tol = 1e-4 if dtype == torch.float32 else 5e-2
        for a, b in zip(torch.autograd.grad(got, leaves, [g.to(dtype) for g in grads]),
                        torch.autograd.grad(want, twins, grads), strict=True):
            torch.testing.assert_close(a.double(), b, rtol=tol, atol=tol * b.abs().max().item())
        assert choices[-1]["q_ptr"].mode == choices[-1]["k_ptr"].mode == Mode.STORE


@triton.jit
def softmax_first_half_in_place(x_ptr, half, BLOCK: tl.constexpr):
    """Each row's first half replaced by its softmax, stabilized by the max of its second half, which is cleared:
    the second half's load reaches the output only through that max, whose gradient is exactly zero."""
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < half
    x1 = tl.load(x_ptr + row * 2 * half + cols, mask=mask, other=-float("inf"))
    x2 = tl.load(x_ptr + row * 2 * half + half + cols, mask=mask, other=-float("inf"))
    e = tl.exp(x1 - tl.max(x2, axis=0))
    tl.store(x_ptr + row * 2 * half + cols, e / tl.sum(e, axis=0), mask=mask)
    tl.store(x_ptr + row * 2 * half + half + cols, tl.zeros_like(x2), mask=mask)


def test_an_in_place_load_no_adjoint_reaches_stores_zeros_in_place_of_its_stores(device):
    """The store over the second half leaves its zeros to the load's adjoint (each half stored once), but no
    adjoint reaches that load (a stabilizer's max): its adjoint is written as zeros, else the new values' gradient
    would stay there. Fails with reverse/sweep.py's call of store_zero_adjoint taken out."""
    bwd = tritongrad.grad(softmax_first_half_in_place)
    assert "atomic_add" not in bwd.src
    assert bwd.src.count("tl.store(d_x_ptr + row * 2 * half + half + cols, 0.0, mask=mask)") == 1
    rows, half = 4, 5
    x, g = (torch.randn(rows, 2 * half, dtype=F64, device=device) for _ in range(2))
    named = dict(x_ptr=x.clone(), half=half, BLOCK=8)
    got = bwd.gradients((rows,), named, {"x_ptr": g})["x_ptr"]
    leaf = x.clone().requires_grad_()
    want = torch.cat([torch.softmax(leaf[:, :half], 1), torch.zeros(rows, half, dtype=F64, device=device)], 1)
    torch.testing.assert_close(got, torch.autograd.grad(want, leaf, g)[0], rtol=1e-10, atol=1e-10)
