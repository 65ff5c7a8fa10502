"""Form A of benchmarks/train_step.py: a Llama-style decoder built from the bundled examples, no transformers.

The model is the same for every variant; only the five ops it calls differ (``Ops``): RMSNorm, SwiGLU's gate,
rotary embedding, causal attention and cross-entropy. ``eager``: plain PyTorch; ``tritongrad-named`` and
``tritongrad-bare``: the bundled examples' ops (tritongrad/examples: rmsnorm, swiglu, rotary, flash_attention,
cross_entropy), named as bundled or as bare ``@tritongrad.op`` around the same host functions; ``liger``:
Liger-Kernel's Functions where it has the op (attention stays PyTorch's SDPA: Liger has none).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class Ops:
    """The model's five ops. Shapes: ``rms_norm(x (..., H), w (H,), eps)``; ``swiglu(a, b)``;
    ``rotary(q, k, cos, sin)`` with q, k (batch, heads, seq, head_dim) and cos, sin (1, seq, head_dim);
    ``attention(q, k, v)`` causal, (batch, heads, seq, head_dim); ``cross_entropy(logits (N, V), target (N,))``,
    the mean loss."""

    rms_norm: Callable
    swiglu: Callable
    rotary: Callable
    attention: Callable
    cross_entropy: Callable
    notes: tuple[str, ...] = ()


def _rms_norm(x, w, eps):
    """HF's LlamaRMSNorm: the row normalized in (at least) float32, cast back, times the weight."""
    xf = x.to(torch.promote_types(x.dtype, torch.float32))
    return w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def _rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def _rotary(q, k, cos, sin):
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)  # every batch and head
    return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin


def softmax_scale(head_dim: int) -> float:
    from tritongrad.examples.flash_attention import softmax_scale as scale  # the example's float32-rounded scale

    return scale(head_dim)


def eager_ops() -> Ops:
    return Ops(
        rms_norm=_rms_norm,
        swiglu=lambda a, b: F.silu(a) * b,
        rotary=_rotary,
        attention=lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                                   scale=softmax_scale(q.shape[-1])),
        cross_entropy=lambda logits, target: F.cross_entropy(logits, target))


def _mean(rows):
    """The mean of per-row losses, in at least float32 (half-precision rows are summed in float32)."""
    return rows.to(torch.promote_types(rows.dtype, torch.float32)).mean()


def tritongrad_ops(kind: str) -> Ops:
    """The bundled examples' ops, ``named`` (``@tritongrad.op("tritongrad_examples::...")``, as bundled) or
    ``bare`` (``@tritongrad.op`` around the same host function). The host functions take contiguous tensors (the
    rotary and attention ones copy others inside: done here, outside the op, by PyTorch)."""
    import tritongrad
    from tritongrad import examples

    if kind not in ("named", "bare"):
        raise ValueError(f"--ops takes named or bare, not {kind!r}")
    named = [examples.get(name).op for name in ("rmsnorm", "swiglu", "rotary", "flash_attention", "cross_entropy")]
    norm, gate, rope, attend, loss = named if kind == "named" else [tritongrad.op(op.__wrapped__) for op in named]

    def rms_norm(x, w, eps):
        return norm(x.reshape(-1, x.shape[-1]), w, eps).view(x.shape)

    return Ops(
        rms_norm=rms_norm,
        swiglu=lambda a, b: gate(a.contiguous(), b.contiguous()),
        rotary=lambda q, k, cos, sin: rope(q.contiguous(), k.contiguous(), cos, sin),
        attention=lambda q, k, v: attend(q.contiguous(), k.contiguous(), v.contiguous(), True),
        cross_entropy=lambda logits, target: _mean(loss(logits.contiguous(), target)))


def liger_ops() -> Ops:
    """Liger-Kernel's Functions (its transformers-level entry points where they add nothing else)."""
    from liger_kernel.transformers.functional import liger_cross_entropy

    from tritongrad.tools.bench.competitors import LIGER, liger_adapter

    found = {name: liger_adapter(LIGER, name)[0] for name in ("rmsnorm", "swiglu", "rotary")}
    if None in found.values():
        raise RuntimeError(f"liger_kernel lacks {[n for n, f in found.items() if f is None]}")
    eager = eager_ops()
    return Ops(rms_norm=found["rmsnorm"], swiglu=lambda a, b: found["swiglu"](a.contiguous(), b.contiguous()),
               rotary=found["rotary"], attention=eager.attention,
               cross_entropy=lambda logits, target: liger_cross_entropy(logits, target),
               notes=("attention: PyTorch's SDPA (Liger-Kernel has no attention)",))


def ops_for(variant: str) -> Ops:
    """The ops of a form A variant: eager and compile run PyTorch's; tritongrad-* and compile-tritongrad the
    examples' (compile-tritongrad: named, which torch.compile traces); liger Liger-Kernel's."""
    if variant in ("eager", "compile"):
        return eager_ops()
    if variant == "compile-tritongrad":
        return tritongrad_ops("named")
    if variant.startswith("tritongrad-"):
        return tritongrad_ops(variant.removeprefix("tritongrad-"))
    if variant == "liger":
        return liger_ops()
    raise ValueError(f"form A has no variant {variant!r}")


class Norm(nn.Module):
    def __init__(self, hidden: int, ops: Ops, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden))
        self.ops, self.eps = ops, eps

    def forward(self, x):
        return self.ops.rms_norm(x, self.weight, self.eps)


class Attention(nn.Module):
    def __init__(self, cfg, ops: Ops):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = cfg.heads, cfg.kv_heads, cfg.hidden // cfg.heads
        self.q_proj = nn.Linear(cfg.hidden, cfg.heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(cfg.hidden, cfg.kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(cfg.hidden, cfg.kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(cfg.heads * self.head_dim, cfg.hidden, bias=False)
        self.ops = ops

    def forward(self, x, cos, sin):
        batch, seq, _ = x.shape
        q = self.q_proj(x).view(batch, seq, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(batch, seq, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(batch, seq, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = self.ops.rotary(q, k, cos, sin)
        groups = self.heads // self.kv_heads  # grouped-query attention: each KV head serves `groups` query heads
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        o = self.ops.attention(q, k, v)
        return self.o_proj(o.transpose(1, 2).reshape(batch, seq, -1))


class MLP(nn.Module):
    def __init__(self, cfg, ops: Ops):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden, cfg.ffn, bias=False)
        self.up_proj = nn.Linear(cfg.hidden, cfg.ffn, bias=False)
        self.down_proj = nn.Linear(cfg.ffn, cfg.hidden, bias=False)
        self.ops = ops

    def forward(self, x):
        return self.down_proj(self.ops.swiglu(self.gate_proj(x), self.up_proj(x)))


class Layer(nn.Module):
    def __init__(self, cfg, ops: Ops):
        super().__init__()
        self.input_layernorm = Norm(cfg.hidden, ops)
        self.self_attn = Attention(cfg, ops)
        self.post_attention_layernorm = Norm(cfg.hidden, ops)
        self.mlp = MLP(cfg, ops)

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class Llama(nn.Module):
    """Embedding, ``cfg.layers`` decoder layers, final RMSNorm, lm_head; ``forward(ids, labels)`` is the mean
    cross-entropy loss. Parameter names follow HF's LlamaForCausalLM (the groups of train_step.group_of)."""

    def __init__(self, cfg, ops: Ops):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab, cfg.hidden)
        self.layers = nn.ModuleList(Layer(cfg, ops) for _ in range(cfg.layers))
        self.norm = Norm(cfg.hidden, ops)
        self.lm_head = nn.Linear(cfg.hidden, cfg.vocab, bias=False)
        self.ops = ops
        head_dim = cfg.hidden // cfg.heads
        inv_freq = 1.0 / (10000.0 ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
        angles = torch.arange(cfg.seq, dtype=torch.float64)[:, None] * inv_freq
        angles = torch.cat((angles, angles), dim=-1)[None]  # (1, seq, head_dim), cast with the model's dtype
        self.register_buffer("cos", angles.cos().float(), persistent=False)
        self.register_buffer("sin", angles.sin().float(), persistent=False)

    def forward(self, ids, labels):
        x = self.embed_tokens(ids)
        for layer in self.layers:
            x = layer(x, self.cos, self.sin)
        logits = self.lm_head(self.norm(x))
        return self.ops.cross_entropy(logits.view(-1, logits.shape[-1]), labels.reshape(-1))


def build(cfg, variant: str) -> tuple[nn.Module, Callable, list[str]]:
    """(model, loss function of (model, ids): token ids (batch, seq + 1), predicting each next one; notes) for a form
    A variant."""
    ops = ops_for(variant)
    return Llama(cfg, ops), lambda m, ids: m(ids[:, :-1], ids[:, 1:]), list(ops.notes)


def check_config(cfg) -> None:
    if cfg.hidden % cfg.heads or cfg.heads % cfg.kv_heads or (cfg.hidden // cfg.heads) % 2:
        raise SystemExit(f"hidden {cfg.hidden} must split into {cfg.heads} heads of an even size, and the heads "
                         f"into {cfg.kv_heads} KV groups")
