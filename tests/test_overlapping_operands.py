"""Operands of dot kernels bound to overlapping memory: K and V as shifted views of one tensor
(`attn(q, x[:, :-1], x[:, 1:])`), K and V one view, Q, K and V from one tensor, a product of two shifted views.
The interchanged dK/dV (dA/dB) kernel then writes into buffers of its own, added after: they were laid out
contiguously (`zeros_like` of a view with gaps) while the kernel indexed them with the view's strides, so it wrote
past their end (`free(): invalid next size`, on a GPU out of bounds) and the gradients came out wrong. Before the
fix every case here failed, most by aborting the process. Float64 against PyTorch autograd."""

import pytest
import torch
import triton
import triton.language as tl

import tritongrad
from tritongrad.examples import matmul

D = torch.float64
SCALE = 0.25


@triton.jit
def _attention(q_ptr, k_ptr, v_ptr, o_ptr, sqb, sqn, skb, skn, svb, svn, sob, son, N, scale,
               HEAD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    # as the tutorials write it: pointers and strides, an online softmax over key blocks, tl.dot
    start_m = tl.program_id(0)
    b = tl.program_id(1)
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD)
    q = tl.load(q_ptr + b * sqb + offs_m[:, None] * sqn + offs_d[None, :], mask=offs_m[:, None] < N, other=0.0)
    m_i = tl.zeros([BLOCK_M], dtype=tl.float64) - float("inf")
    l_i = tl.zeros([BLOCK_M], dtype=tl.float64)
    acc = tl.zeros([BLOCK_M, HEAD], dtype=tl.float64)
    hi = N
    if CAUSAL:
        hi = tl.minimum((start_m + 1) * BLOCK_M, N)
    for start_n in range(0, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        k = tl.load(k_ptr + b * skb + offs_n[:, None] * skn + offs_d[None, :], mask=offs_n[:, None] < N, other=0.0)
        v = tl.load(v_ptr + b * svb + offs_n[:, None] * svn + offs_d[None, :], mask=offs_n[:, None] < N, other=0.0)
        qk = tl.dot(q, tl.trans(k)) * scale
        visible = offs_n[None, :] < N
        if CAUSAL:
            visible = visible & (offs_m[:, None] >= offs_n[None, :])
        qk = tl.where(visible, qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(qk - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p, v)
        m_i = m_new
    tl.store(o_ptr + b * sob + offs_m[:, None] * son + offs_d[None, :], acc / l_i[:, None], mask=offs_m[:, None] < N)


def _attention_op(causal: bool):
    @tritongrad.op
    def attention(q, k, v):
        batch, n, head = q.shape
        o = torch.empty_like(q)
        _attention[(triton.cdiv(n, 16), batch)](q, k, v, o, q.stride(0), q.stride(1), k.stride(0), k.stride(1),
                                               v.stride(0), v.stride(1), o.stride(0), o.stride(1), n, SCALE,
                                               HEAD=head, BLOCK_M=16, BLOCK_N=16, CAUSAL=causal)
        return o

    return attention


ATTENTION = {causal: _attention_op(causal) for causal in (False, True)}


def _reference(q, k, v, causal):
    scores = q @ k.transpose(-1, -2) * SCALE
    if causal:
        n = q.shape[1]
        scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return torch.softmax(scores, -1) @ v


def _gradients(fn, leaves, build):
    copies = [x.detach().clone().requires_grad_() for x in leaves]
    y = fn(*build(*copies))
    g = torch.randn(y.shape, dtype=y.dtype, device=y.device,
                    generator=torch.Generator(device=y.device).manual_seed(1))
    return torch.autograd.grad(y, copies, g)


BINDINGS = {  # leaves (batch 2, 21 positions of head size 16; x has 22) -> the op's q, k, v
    "K and V shifted views": (2, lambda q, x: (q, x[:, :-1], x[:, 1:])),
    "K and V one strided view": (2, lambda q, x: (q, x[:, :-1], x[:, :-1])),
    "Q, K and V one strided view": (1, lambda x: (x[:, :-1], x[:, :-1], x[:, :-1])),
    "Q and K shifted views": (2, lambda v, x: (x[:, 1:], x[:, :-1], v)),
    "Q, K and V three shifted views": (1, lambda x: (x[:, 1:-1], x[:, :-2], x[:, 2:])),
}


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("binding", BINDINGS)
def test_attention_on_overlapping_views_gets_pytorchs_gradients(binding, causal, poisoned_empty):
    count, build = BINDINGS[binding]
    positions = 23 if binding.startswith("Q, K and V three") else 22
    leaves = [torch.randn(2, positions if i == count - 1 else 21, 16, dtype=D) for i in range(count)]
    got = _gradients(ATTENTION[causal], leaves, build)
    want = _gradients(lambda q, k, v: _reference(q, k, v, causal), leaves, build)
    for name, g, w in zip("abc", got, want, strict=False):
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-10, msg=lambda m, n=name: f"leaf {n}: {m}")


@pytest.mark.parametrize("transpose_a, transpose_b", [(False, False), (True, False), (False, True)])
def test_a_product_of_two_shifted_views_of_one_tensor(transpose_a, transpose_b, poisoned_empty):
    """dA and dB (kernels of their own) of `x[:, :-1] @ x[:, 1:]`, operands transposed or not."""
    build = lambda x: (x[:, :-1], x[:, 1:], transpose_a, transpose_b)  # noqa: E731
    leaves = [torch.randn(37, 38, dtype=D)]
    got = _gradients(matmul.matmul, leaves, build)
    want = _gradients(matmul.reference, leaves, build)
    torch.testing.assert_close(got[0], want[0], rtol=1e-10, atol=1e-10)
