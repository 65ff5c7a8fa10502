"""One-head attention, flash style: each program takes a block of queries and runs an online
softmax over blocks of keys, never holding the whole score matrix. Sequence lengths need not
be multiples of the blocks. Its backward rebuilds the running max and sums for each reverse
iteration (the loop's state is nonlinear), as ``tritongrad show`` says in the derived kernel.
"""

import math

import torch
import triton
import triton.language as tl

from .launch import Launch


@triton.jit
def flash_attention_kernel(q_ptr, k_ptr, v_ptr, o_ptr, M, N, D, scale, BM: tl.constexpr, BN: tl.constexpr,
                           BD: tl.constexpr):
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    rd = tl.arange(0, BD)
    q = tl.load(q_ptr + rm[:, None] * D + rd[None, :], mask=(rm[:, None] < M) & (rd[None, :] < D), other=0.0)
    m_i = tl.full([BM], float("-inf"), q.dtype)
    l_i = tl.zeros([BM], dtype=q.dtype)
    acc = tl.zeros([BM, BD], dtype=q.dtype)
    for start in range(0, N, BN):
        rn = start + tl.arange(0, BN)
        kv_mask = (rn[:, None] < N) & (rd[None, :] < D)
        k = tl.load(k_ptr + rn[:, None] * D + rd[None, :], mask=kv_mask, other=0.0)
        v = tl.load(v_ptr + rn[:, None] * D + rd[None, :], mask=kv_mask, other=0.0)
        s = tl.dot(q, tl.trans(k)) * scale
        s = tl.where(rn[None, :] < N, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p, v)
        m_i = m_new
    o = acc / l_i[:, None]
    tl.store(o_ptr + rm[:, None] * D + rd[None, :], o, mask=(rm[:, None] < M) & (rd[None, :] < D))


BM = BN = 16


def flash_attention_launch(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> Launch:
    assert q.is_contiguous() and k.is_contiguous() and v.is_contiguous()
    (m, d), (n, _) = q.shape, k.shape
    o = torch.empty_like(q)
    args = (q, k, v, o, m, n, d, softmax_scale(d))
    meta = {"BM": BM, "BN": BN, "BD": max(16, triton.next_power_of_2(d))}
    return Launch(flash_attention_kernel, (triton.cdiv(m, BM),), args, meta, "o_ptr", o)


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return flash_attention_launch(q, k, v)()


def softmax_scale(d: int) -> float:
    """1 / sqrt(d), rounded to float32: a compiled kernel receives a Python float as float32."""
    return torch.tensor(1.0 / math.sqrt(d), dtype=torch.float32).item()


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return torch.softmax(q @ k.T * softmax_scale(q.shape[1]), dim=1) @ v


def make_inputs(device="cpu", dtype=torch.float32) -> tuple[torch.Tensor, ...]:
    m, n, d = 37, 45, 12  # two partial blocks of queries and of keys, a head size below the block
    return tuple(torch.randn(rows, d, device=device, dtype=dtype) for rows in (m, n, n))
