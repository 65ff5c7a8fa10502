"""A bare op that updates views of a buffer with a history in place and returns views of that buffer (Liger's rope on
HF Llama's q and k: `q.transpose(1, 2)` rotated in place, returned transposed back). The op's node marks the buffer
dirty and gives the returned views out as outputs of its own (segments.py), so their history is the node itself, not
an `AsStridedBackward0` of the buffer's, which filled a buffer-sized tensor and copied each view's gradient into it in
every backward. Gradients through the returned views, through the buffer used after the op, through the caller's
own views of it, and the region of the buffer outside the views, against PyTorch autograd on plain PyTorch in
float64; sizes that are not powers of two; each op called three times (the later calls replayed)."""

from collections import Counter

import pytest
import torch
from test_liger_style import rope_forward, rope_launch
from torch.utils._python_dispatch import TorchDispatchMode

import tritongrad
from tritongrad.core.errors import OpError

DTYPE = torch.float64
BATCH, SEQ, HEADS, KV_HEADS, HEAD_DIM, HIDDEN = 2, 5, 3, 1, 10, 12
Q, KV = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM


def close(a, b):
    torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9)


def angles(device):
    inv = 1.0 / (10000 ** (torch.arange(0, HEAD_DIM, 2, dtype=DTYPE, device=device) / HEAD_DIM))
    emb = torch.arange(SEQ, dtype=DTYPE, device=device)[:, None] * inv
    emb = torch.cat([emb, emb], -1)[None]  # (1, seq, head_dim), as HF's rotary embedding gives it
    return emb.cos(), emb.sin()


def rotated(t, cos, sin):
    """HF's apply_rotary_pos_emb on one of q, k (batch, heads, seq, head_dim)."""
    half = torch.cat([-t[..., HEAD_DIM // 2:], t[..., :HEAD_DIM // 2]], -1)
    return t * cos[:, None] + half * sin[:, None]


def heads(t, n):
    """(batch, seq, n * head_dim) -> HF's (batch, n, seq, head_dim), a transposed view."""
    return t.view(BATCH, SEQ, n, HEAD_DIM).transpose(1, 2)


def unheads(t):
    return t.transpose(1, 2).reshape(BATCH, SEQ, -1)


def fused_rope(q, k, cos, sin):
    """Rope in place on two views of one storage (a fused qkv projection's q and k columns), returned as views."""
    q, k = q.transpose(1, 2), k.transpose(1, 2)  # (no .contiguous(): the kernel takes each token's row stride)
    rope_launch(q, k, cos, sin)
    return q.transpose(1, 2), k.transpose(1, 2)


def test_the_views_returned_have_the_op_as_their_history(device):
    """Before, the returned q and k came out as `AsStridedBackward0` of the projections' outputs (autograd made
    their history again from the buffer's), whose backward filled a buffer and copied their gradient into it."""
    op = tritongrad.op(rope_forward)
    x = torch.randn(BATCH, SEQ, HIDDEN, dtype=DTYPE, device=device, requires_grad=True)
    wq, wk = (torch.randn(n, HIDDEN, dtype=DTYPE, device=device, requires_grad=True) for n in (Q, KV))
    cos, sin = angles(device)
    for _ in range(3):
        pq, pk = x @ wq.T, x @ wk.T
        q, k = heads(pq, HEADS), heads(pk, KV_HEADS)
        got = op(q, k, cos, sin)
        for t, out, base in zip((q, k), got, (pq, pk), strict=True):
            assert type(out.grad_fn).__name__ == "RopeForwardBackward"
            assert out._base is base and out.grad_fn is base.grad_fn  # the node's, one of its outputs
            assert type(t.grad_fn).__name__ == "AsStridedBackward0"  # the caller's view: made again from its base's
            assert t.grad_fn.next_functions[0][0] is out.grad_fn
        close(got[0], q)
        close(got[1], k)


class _Fills(TorchDispatchMode):
    """Counts the zero-filled tensors PyTorch makes or fills (of at least ``numel`` elements)."""

    FILLS = ("aten.zeros", "aten.new_zeros", "aten.zero_", "aten.fill_", "aten.zeros_like")

    def __init__(self, numel: int):
        super().__init__()
        self.numel, self.found = numel, Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if str(func).startswith(self.FILLS) and isinstance(out, torch.Tensor) and out.numel() >= self.numel:
            self.found[str(func)] += 1
        return out


def test_a_repeated_backward_fills_no_buffer_for_the_returned_views(device):
    """Before, each returned view's `AsStridedBackward0` made a zero-filled tensor of its buffer's size (then copied
    the view's gradient into it, and the op's backward copied that into its shadow): now the view's gradient is
    copied once into the shadow, which nothing fills."""
    op = tritongrad.op(rope_forward)
    x = torch.randn(BATCH, SEQ, HIDDEN, dtype=DTYPE, device=device, requires_grad=True)
    wq, wk = (torch.randn(n, HIDDEN, dtype=DTYPE, device=device, requires_grad=True) for n in (Q, KV))
    cos, sin = angles(device)
    for _ in range(3):  # (the first backward is checked: guard bands are filled)
        got = op(heads(x @ wq.T, HEADS), heads(x @ wk.T, KV_HEADS), cos, sin)
        g = [torch.randn_like(t) for t in got]
        with _Fills(BATCH * SEQ * KV) as fills:
            torch.autograd.backward(got, g)
    assert not fills.found


@pytest.mark.parametrize("given", ["returned", "returned+buffer", "buffer", "caller's-views"])
def test_views_of_one_buffer_rotated_in_place(device, given):
    """A fused projection (batch, seq, q | k | v columns), q and k its transposed views at two offsets, rotated in
    place by one launch, returned as views; the buffer read after the op (v's columns kept as they were, q's and
    k's rotated), or the caller's own q and k, which see the new values."""
    op = tritongrad.op(fused_rope)
    x = torch.randn(BATCH, SEQ, HIDDEN, dtype=DTYPE, device=device, requires_grad=True)
    w = torch.randn(Q + 2 * KV, HIDDEN, dtype=DTYPE, device=device, requires_grad=True)
    cos, sin = angles(device)
    twins = [t.detach().clone().requires_grad_() for t in (x, w)]
    for _ in range(3):
        qkv = x @ w.T
        q, k = heads(qkv[..., :Q], HEADS), heads(qkv[..., Q:Q + KV], KV_HEADS)
        got_q, got_k = op(q, k, cos, sin)
        want_qkv = twins[0] @ twins[1].T
        want_q = rotated(heads(want_qkv[..., :Q], HEADS), cos, sin)
        want_k = rotated(heads(want_qkv[..., Q:Q + KV], KV_HEADS), cos, sin)
        want_buffer = torch.cat([unheads(want_q), unheads(want_k), want_qkv[..., Q + KV:]], -1)
        got, want = {
            "returned": ([got_q, got_k], [want_q, want_k]),
            "returned+buffer": ([got_q, got_k, qkv], [want_q, want_k, want_buffer]),
            "buffer": ([qkv], [want_buffer]),
            "caller's-views": ([q, k, got_k], [want_q, want_k, want_k]),
        }[given]
        for a, b in zip(got, want, strict=True):
            close(a, b)
        g = [torch.randn_like(t) for t in want]
        for a, b in zip(torch.autograd.grad(got, (x, w), g), torch.autograd.grad(want, twins, g), strict=True):
            close(a, b)


def test_a_returned_view_updated_in_place_by_pytorch_afterwards(device):
    """The returned view is an ordinary view of the buffer: PyTorch's in-place update of it rebases the buffer's
    history over the op's node (CopySlices), not refused as a custom Function's view would be."""
    op = tritongrad.op(rope_forward)
    x = torch.randn(BATCH, SEQ, HIDDEN, dtype=DTYPE, device=device, requires_grad=True)
    wq, wk = (torch.randn(n, HIDDEN, dtype=DTYPE, device=device, requires_grad=True) for n in (Q, KV))
    cos, sin = angles(device)
    leaves = (x, wq, wk)
    twins = [t.detach().clone().requires_grad_() for t in leaves]
    for _ in range(2):
        got_q, got_k = op(heads(x @ wq.T, HEADS), heads(x @ wk.T, KV_HEADS), cos, sin)
        got_q.mul_(torch.linspace(0.5, 2.0, HEAD_DIM, dtype=DTYPE, device=device))
        want_q = rotated(heads(twins[0] @ twins[1].T, HEADS), cos, sin)
        want_q = want_q * torch.linspace(0.5, 2.0, HEAD_DIM, dtype=DTYPE, device=device)
        want_k = rotated(heads(twins[0] @ twins[2].T, KV_HEADS), cos, sin)
        close(got_q, want_q)
        g = [torch.randn_like(t) for t in (want_q, want_k)]
        got = torch.autograd.grad((got_q, got_k), leaves, g)
        for a, b in zip(got, torch.autograd.grad((want_q, want_k), twins, g), strict=True):
            close(a, b)


def test_one_view_returned_twice_and_a_gradient_of_the_gradient(device):
    """The same view twice among the outputs (its gradients summed), and create_graph=True: the first gradients the
    same, the second derivative of a loss quadratic in the rotated q against PyTorch's."""
    def rope_q_twice(q, k, cos, sin):
        q, k = rope_forward(q, k, cos, sin)
        return q, q, k

    op = tritongrad.op(rope_q_twice)
    x = torch.randn(BATCH, SEQ, HIDDEN, dtype=DTYPE, device=device, requires_grad=True)
    wq, wk = (torch.randn(n, HIDDEN, dtype=DTYPE, device=device, requires_grad=True) for n in (Q, KV))
    cos, sin = angles(device)
    twins = [t.detach().clone().requires_grad_() for t in (x, wq, wk)]
    for _ in range(2):
        a, b, c = op(heads(x @ wq.T, HEADS), heads(x @ wk.T, KV_HEADS), cos, sin)
        assert a is b
        want_q = rotated(heads(twins[0] @ twins[1].T, HEADS), cos, sin)
        want_k = rotated(heads(twins[0] @ twins[2].T, KV_HEADS), cos, sin)
        g = [torch.randn_like(t) for t in (want_q, want_q, want_k)]
        loss, want_loss = ((a * b).sum() + (c * g[2]).sum(), (want_q * want_q).sum() + (want_k * g[2]).sum())
        got = torch.autograd.grad(loss, (x, wq), create_graph=True)
        want = torch.autograd.grad(want_loss, twins[:2], create_graph=True)
        for u, v in zip(got, want, strict=True):
            close(u, v)
        close(torch.autograd.grad((got[0] * g[0][0, 0, :, 0, None]).sum(), wq)[0],
              torch.autograd.grad((want[0] * g[0][0, 0, :, 0, None]).sum(), twins[1])[0])


def test_one_view_passed_as_q_and_k_is_refused_naming_the_overwrite(device):
    """q and k the very same view: the launch rotates its elements twice, reading through one pointer what it
    writes through the other, which the backward cannot recompute."""
    op = tritongrad.op(fused_rope)
    x = torch.randn(BATCH, SEQ, HIDDEN, dtype=DTYPE, device=device, requires_grad=True)
    w = torch.randn(Q, HIDDEN, dtype=DTYPE, device=device, requires_grad=True)
    q = heads(x @ w.T, HEADS)
    with pytest.raises(OpError, match=r"overwrites `[qk]_ptr`, memory that .* reads through `[qk]_ptr`"):
        op(q, q, *angles(device))


def test_an_op_returning_nothing_of_what_it_updated_in_place(device):
    """The host function rotates q and k in place and returns nothing: the caller's q and k carry the op's history.
    Before, the call was refused as if no launch read q ("requires grad, but no kernel launch reads it"): the check
    looked for q's old history from the outputs, of which there are none."""
    def rope_nothing_returned(q, k, cos, sin):
        rope_launch(q.transpose(1, 2), k.transpose(1, 2), cos, sin)

    op = tritongrad.op(rope_nothing_returned)
    x = torch.randn(BATCH, SEQ, HIDDEN, dtype=DTYPE, device=device, requires_grad=True)
    wq, wk = (torch.randn(n, HIDDEN, dtype=DTYPE, device=device, requires_grad=True) for n in (Q, KV))
    cos, sin = angles(device)
    leaves = (x, wq, wk)
    twins = [t.detach().clone().requires_grad_() for t in leaves]
    for _ in range(2):
        q, k = heads(x @ wq.T, HEADS), heads(x @ wk.T, KV_HEADS)
        assert op(q, k, cos, sin) is None
        want = (rotated(heads(twins[0] @ twins[1].T, HEADS), cos, sin),
                rotated(heads(twins[0] @ twins[2].T, KV_HEADS), cos, sin))
        close(q, want[0])
        g = [torch.randn_like(t) for t in want]
        for a, b in zip(torch.autograd.grad((q, k), leaves, g), torch.autograd.grad(want, twins, g), strict=True):
            close(a, b)


def test_a_named_rope_updating_its_arguments_is_refused_naming_why(device):
    """A named op is a torch.library operator, whose autograd formula PyTorch registers for functional operators
    only: rope in place on the caller's q and k is refused as a named op, saying so and pointing to the bare op
    (which the tests above differentiate)."""
    op = tritongrad.op("tg_tests::rope_in_place")(rope_forward)
    x = torch.randn(BATCH, SEQ, HIDDEN, dtype=DTYPE, device=device, requires_grad=True)
    wq, wk = (torch.randn(n, HIDDEN, dtype=DTYPE, device=device, requires_grad=True) for n in (Q, KV))
    q, k = heads(x @ wq.T, HEADS), heads(x @ wk.T, KV_HEADS)
    with pytest.raises(OpError, match=r"writes to `q_ptr`, a tensor that requires grad .*torch\.library registers "
                                      r"autograd for functional operators only.*a bare @tritongrad\.op may update"):
        op(q, k, *angles(device))
