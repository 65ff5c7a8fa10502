"""Attention, flash style: each program takes a block of queries of one head and runs an online
softmax over blocks of keys (running max ``m_i``, sum ``l_i``, accumulator ``acc``, in float32:
``COMPUTE``, float64 for float64 inputs), never holding the whole score matrix. ``CAUSAL``: a query
sees the keys up to its own position; the loop stops at the query block's last row. Sequence lengths
need not be multiples of the blocks. The derived backward says in its source how it reverses the loop.
"""

import math
import struct

import torch
import triton
import triton.language as tl

import tritongrad

from .launch import Launch, compute_type, itemsize


@triton.jit
def flash_attention_kernel(q_ptr, k_ptr, v_ptr, o_ptr, N, D, scale, BM: tl.constexpr, BN: tl.constexpr,
                           BD: tl.constexpr, CAUSAL: tl.constexpr, COMPUTE: tl.constexpr = tl.float32):
    head = tl.program_id(1)
    q_ptr += head * N * D  # (batch * heads, N, D), contiguous
    k_ptr += head * N * D
    v_ptr += head * N * D
    o_ptr += head * N * D
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    rd = tl.arange(0, BD)
    q = tl.load(q_ptr + rm[:, None] * D + rd[None, :], mask=(rm[:, None] < N) & (rd[None, :] < D), other=0.0)
    m_i = tl.full([BM], float("-inf"), COMPUTE)
    l_i = tl.zeros([BM], dtype=COMPUTE)
    acc = tl.zeros([BM, BD], dtype=COMPUTE)
    end = N
    if CAUSAL:
        end = tl.minimum((tl.program_id(0) + 1) * BM, N)
    for start in range(0, end, BN):
        rn = start + tl.arange(0, BN)
        kv_mask = (rn[:, None] < N) & (rd[None, :] < D)
        k = tl.load(k_ptr + rn[:, None] * D + rd[None, :], mask=kv_mask, other=0.0)
        v = tl.load(v_ptr + rn[:, None] * D + rd[None, :], mask=kv_mask, other=0.0)
        s = (tl.dot(q, tl.trans(k)).to(COMPUTE) * scale).to(COMPUTE)  # (torch.compile passes a float as float64)
        visible = rn[None, :] < N
        if CAUSAL:
            visible = visible & (rn[None, :] <= rm[:, None])
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v).to(COMPUTE)
        m_i = m_new
    o = acc / l_i[:, None]
    tl.store(o_ptr + rm[:, None] * D + rd[None, :], o, mask=(rm[:, None] < N) & (rd[None, :] < D))


def blocks_for(n: int) -> tuple[int, int]:
    """(BM, BN): 64 x 64 on a GPU's sizes, 16 x 16 on the small ones checked on a CPU."""
    return (64, 64) if n >= 512 else (16, 16)


def flash_attention_launch(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True) -> Launch:
    """q, k, v: (batch, heads, N, D) or (heads, N, D), contiguous, one sequence length for all."""
    assert q.shape == k.shape == v.shape and q.is_contiguous() and k.is_contiguous() and v.is_contiguous()
    n, d = q.shape[-2:]
    heads = math.prod(q.shape[:-2])
    o = torch.empty_like(q)
    bm, bn = blocks_for(n)
    args = (q, k, v, o, n, d, softmax_scale(d))
    meta = {"BM": bm, "BN": bn, "BD": max(16, triton.next_power_of_2(d)), "CAUSAL": causal,
            "COMPUTE": compute_type(q.dtype)}
    return Launch(flash_attention_kernel, (triton.cdiv(n, bm), heads), args, meta, "o_ptr", o)


@tritongrad.op("tritongrad_examples::flash_attention")
def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True) -> torch.Tensor:
    return flash_attention_launch(q.contiguous(), k.contiguous(), v.contiguous(), causal)()


def softmax_scale(d: int) -> float:
    """1 / sqrt(d), rounded to float32: a compiled kernel receives a Python float as float32. (Rounded on the host:
    a tensor made for it would be made on the default device, and reading it back would wait for the GPU, which a
    CUDA graph being captured refuses.)"""
    return struct.unpack("f", struct.pack("f", 1.0 / math.sqrt(d)))[0]


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True) -> torch.Tensor:
    """PyTorch's scaled_dot_product_attention (its flash backend on a GPU in half precision)."""
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal,
                                                            scale=softmax_scale(q.shape[-1]))


def make_inputs(size=(2, 45, 12), device="cpu", dtype=torch.float32) -> tuple:
    """``size`` is (heads, N, D), or (heads, N, D, causal); q, k, v are (1, heads, N, D), the layout
    PyTorch's flash backend takes."""
    heads, n, d, *causal = size
    q, k, v = (torch.randn(1, heads, n, d, device=device, dtype=dtype) for _ in range(3))
    return q, k, v, bool(causal[0]) if causal else True


# two partial blocks of queries and of keys, a head size below the block; causal and not
SIZES = ((2, 45, 12), (1, 37, 16, 0))
BENCH_SIZES = ((16, 1024, 64), (16, 4096, 64))
DTYPES = (torch.float64, torch.float32, torch.bfloat16, torch.float16)


def traffic(size, dtype) -> dict[str, int]:
    heads, n, d = size[:3]
    tensor = heads * n * d * itemsize(dtype)
    return {"fwd": 4 * tensor, "bwd": 8 * tensor}  # q, k, v read, o written; q, k, v, o, do read, dq, dk, dv written


def flops(size) -> dict[str, int]:
    heads, n, d, *causal = size
    full = 4 * heads * n * n * d  # two matrix products of n x n x d
    forward = full // 2 if (not causal or causal[0]) else full
    return {"fwd": forward, "bwd": int(2.5 * forward)}
