"""Form B of benchmarks/train_step.py: HF transformers' LlamaForCausalLM (random weights, SDPA attention).

``eager``: the model as HF writes it. ``liger``: ``apply_liger_kernel_to_llama(rope, rms_norm, swiglu, and
cross_entropy or fused_linear_cross_entropy)``, before the model is made; with ``--fused-add-norm`` each decoder
layer's post-attention residual add and RMSNorm are one Liger Function (HF's Llama has no such call: the layer's
forward is replaced). ``tritongrad``: the same, then each Liger Function named in ``--swap`` replaced, where the
patched code calls it, by a tritongrad op around Liger's own forward host function (``rms_norm_forward``,
``swiglu_forward``, ``rope_forward``, ``cross_entropy_forward``, ``fused_linear_cross_entropy_forward``,
``fused_add_rms_norm_forward``): its backward is the derived one. Each swap is probed first on the run's shapes
against Liger's Function (outputs and gradients); one tritongrad refuses or gets wrong falls back to the next
candidate (rope: the op on clones of q and k), finally to Liger's Function, and the notes say which and why.

The losses are launched loss-only (``HAS_GRADIENTS=False``; Liger's forward writes the logits' gradient into them
otherwise, which the derived backward does itself), and their per-row losses reduced outside the op.

No ``from __future__ import annotations`` here: the named ops' schemas are read from these annotations.
"""

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

import torch

SWAPS = ("rms_norm", "swiglu", "rope", "cross_entropy", "fused_linear_cross_entropy", "fused_add_rms_norm")
IGNORE_INDEX = -100
FUSED_ADD_RMS_NORM = [None]  # what the fused decoder layer calls: Liger's Function, or its swap


# --- the host functions the ops wrap: Liger's forward functions, their extra results dropped -------------------

def liger_rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    from liger_kernel.ops.rms_norm import rms_norm_forward

    return rms_norm_forward(x, w, eps, 0.0, "llama", None)[0]


def liger_swiglu(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    from liger_kernel.ops.swiglu import swiglu_forward

    return swiglu_forward(a, b)[2]


def liger_rope(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor,
               sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """In place on q and k, as Liger writes it (HF's q and k: transposed views of the projections)."""
    from liger_kernel.ops.rope import rope_forward

    q, k = rope_forward(q, k, cos, sin)[:2]
    return q, k


def liger_rope_on_clones(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor,
                         sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The workaround: the same kernel in place on copies of q and k (the copies keep their strides)."""
    from liger_kernel.ops.rope import rope_forward

    q, k = rope_forward(q.clone(), k.clone(), cos, sin)[:2]
    return q, k


class _LossOnly:
    """``kernel[grid]`` launched with ``HAS_GRADIENTS=False``."""

    def __init__(self, kernel):
        self.kernel = kernel

    def __getitem__(self, grid):
        launch = self.kernel[grid]
        return lambda *args, **kwargs: launch(*args, **{**kwargs, "HAS_GRADIENTS": False})


_LOSS_ONLY: dict[int, _LossOnly] = {}  # id(kernel) -> its stand-in


@contextlib.contextmanager
def _loss_only(module):
    """``module.liger_cross_entropy_kernel`` launched with ``HAS_GRADIENTS=False`` (its forward functions pass the
    input's ``requires_grad``) while the block runs. (One stand-in per kernel, not a class a call: this harness's
    time counts against the op's host time.)"""
    kernel = module.liger_cross_entropy_kernel
    if id(kernel) not in _LOSS_ONLY:
        _LOSS_ONLY[id(kernel)] = _LossOnly(kernel)
    module.liger_cross_entropy_kernel = _LOSS_ONLY[id(kernel)]
    try:
        yield
    finally:
        module.liger_cross_entropy_kernel = kernel



def liger_cross_entropy_rows(logits: torch.Tensor, target: torch.Tensor, ignore_index: int) -> torch.Tensor:
    from liger_kernel.ops import cross_entropy

    with _loss_only(cross_entropy):
        return cross_entropy.cross_entropy_forward(logits, target, None, ignore_index, 0.0, 0.0, "none", None,
                                                   False)[0]


def liger_fused_linear_cross_entropy_rows(x: torch.Tensor, w: torch.Tensor, target: torch.Tensor,
                                          ignore_index: int) -> torch.Tensor:
    from liger_kernel.ops.fused_linear_cross_entropy import fused_linear_cross_entropy_forward

    return fused_linear_cross_entropy_forward(x, w, target, ignore_index=ignore_index, reduction="none",
                                              compute_gradients=False, weight_requires_grad=False)[0]


def liger_fused_add_rms_norm(x: torch.Tensor, r: torch.Tensor, w: torch.Tensor,
                             eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    from liger_kernel.ops.fused_add_rms_norm import fused_add_rms_norm_forward

    y, s = fused_add_rms_norm_forward(x, r, w, eps, 0.0, "llama")[:2]
    return y, s


_OPS: dict = {}


def tritongrad_op(host: Callable, kind: str) -> Callable:
    """``host`` as a bare op, or a named one (``train_step::<host name>``, registered once per process)."""
    import tritongrad

    key = (host.__name__, kind)
    if key not in _OPS:
        _OPS[key] = tritongrad.op(host) if kind == "bare" else tritongrad.op(f"train_step::{host.__name__}")(host)
    return _OPS[key]


def _reduce(rows: torch.Tensor, target: torch.Tensor, ignore_index: int, reduction: str) -> torch.Tensor:
    if reduction == "none":
        return rows
    total = rows.sum()
    return total if reduction == "sum" else total / (target != ignore_index).sum()


# --- where each Liger Function is called, and what stands there instead ----------------------------------------

class _Function:
    """Stands where a Liger autograd.Function was: ``apply`` is the swap's."""

    def __init__(self, apply: Callable, like):
        self.apply = apply
        self.supports_inner_impl_dispatch = getattr(like, "supports_inner_impl_dispatch", False)


@dataclass
class Site:
    """Where the patched model calls one Liger Function: ``get``/``put`` its entry point there, ``call`` it there
    with the probe's inputs, ``inputs(cfg)``: (arguments, the leaves whose gradients the probe compares)."""

    get: Callable
    put: Callable
    call: Callable
    inputs: Callable


def _sites() -> dict:
    import liger_kernel.transformers.functional as functional
    import liger_kernel.transformers.rms_norm as rms_norm
    import liger_kernel.transformers.swiglu as swiglu
    from transformers.loss import loss_utils
    from transformers.models.llama import modeling_llama

    def attr(owner, name):
        return (lambda: getattr(owner, name)), (lambda value: setattr(owner, name, value))

    return {
        "rms_norm": Site(*attr(rms_norm, "LigerRMSNormFunction"),
                         lambda x, w: rms_norm.LigerRMSNormFunction.apply(x, w, 1e-6, 0.0, "llama", True, None),
                         lambda cfg: _leaves(cfg, (cfg.batch, cfg.seq, cfg.hidden), (cfg.hidden,))),
        "swiglu": Site(*attr(swiglu, "LigerSiLUMulFunction"),
                       lambda a, b: swiglu.LigerSiLUMulFunction.apply(a, b, 1.0, 1.0),
                       lambda cfg: _leaves(cfg, *[(cfg.batch, cfg.seq, cfg.ffn)] * 2)),
        "rope": Site(*attr(modeling_llama, "apply_rotary_pos_emb"),
                     lambda q, k, cos, sin: modeling_llama.apply_rotary_pos_emb(q, k, cos, sin), _rope_inputs),
        "cross_entropy": Site(*attr(loss_utils.nn.functional, "cross_entropy"),
                              lambda logits, target: loss_utils.nn.functional.cross_entropy(
                                  logits * 1, target, ignore_index=IGNORE_INDEX),  # HF passes logits.float()
                              lambda cfg: _with_target(_leaves(cfg, (cfg.batch * cfg.seq, cfg.vocab), dtype="float32"),
                                                       cfg)),
        "fused_linear_cross_entropy": Site(
            *attr(functional, "LigerFusedLinearCrossEntropyFunction"),
            lambda x, w, target: functional.liger_fused_linear_cross_entropy(x, w, target),
            lambda cfg: _with_target(_leaves(cfg, (cfg.batch * cfg.seq, cfg.hidden), (cfg.vocab, cfg.hidden)), cfg)),
        "fused_add_rms_norm": Site(lambda: FUSED_ADD_RMS_NORM[0], lambda f: FUSED_ADD_RMS_NORM.__setitem__(0, f),
                                   lambda x, r, w: FUSED_ADD_RMS_NORM[0](x, r, w, 1e-6),
                                   lambda cfg: _leaves(cfg, *[(cfg.batch, cfg.seq, cfg.hidden)] * 2,
                                                       (cfg.hidden,))),
    }


def _leaves(cfg, *shapes, dtype: str | None = None) -> tuple[list, list]:
    """Fresh random leaves on the run's device (the same values on every call: one seed), gradients required."""
    gen = torch.Generator(cfg.device).manual_seed(1)
    dtype = getattr(torch, dtype or cfg.dtype)
    found = [torch.randn(s, generator=gen, device=cfg.device).to(dtype).requires_grad_() for s in shapes]
    return found, list(found)


def _with_target(leaves: tuple[list, list], cfg) -> tuple[list, list]:
    args, found = leaves
    gen = torch.Generator(args[0].device).manual_seed(2)
    target = torch.randint(0, cfg.vocab, (cfg.batch * cfg.seq,), generator=gen, device=args[0].device)
    target[cfg.seq - 1::cfg.seq] = IGNORE_INDEX  # HF's shifted labels: each sequence's last position ignored
    return [*args, target], found


def _rope_inputs(cfg) -> tuple[list, list]:
    """q and k as HF passes them: transposed views of the projections; cos and sin (batch, seq, head_dim)."""
    head_dim = cfg.hidden // cfg.heads
    (pq, pk), found = _leaves(cfg, (cfg.batch, cfg.seq, cfg.heads * head_dim),
                              (cfg.batch, cfg.seq, cfg.kv_heads * head_dim))
    q = (pq * 1).view(cfg.batch, cfg.seq, cfg.heads, head_dim).transpose(1, 2)
    k = (pk * 1).view(cfg.batch, cfg.seq, cfg.kv_heads, head_dim).transpose(1, 2)
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, head_dim, 2, device=pq.device).float() / head_dim))
    angles = torch.arange(cfg.seq, device=pq.device).float()[:, None] * inv_freq
    angles = torch.cat((angles, angles), dim=-1).expand(cfg.batch, -1, -1)
    return [q, k, angles.cos().to(q.dtype), angles.sin().to(q.dtype)], found


def _candidates(name: str, kind: str) -> list[tuple[str, Callable]]:
    """(what it is, the entry point) per candidate for a swap, best first; Liger's Function comes after them."""
    op = lambda host, k=kind: tritongrad_op(host, k)  # noqa: E731
    if name == "rms_norm":
        def rms(x, w, eps, offset=0.0, casting_mode="llama", in_place=True, row_mode=None):
            assert offset == 0.0 and casting_mode == "llama", (offset, casting_mode)
            return op(liger_rms_norm)(x.contiguous(), w, eps)
        return [(f"{kind} op around rms_norm_forward", _Function(rms, None))]
    if name == "swiglu":
        def silu_mul(a, b, gate_multiplier=1.0, down_multiplier=1.0):
            assert gate_multiplier == down_multiplier == 1.0
            return op(liger_swiglu)(a.contiguous(), b.contiguous())
        return [(f"{kind} op around swiglu_forward", _Function(silu_mul, None))]
    if name == "rope":
        def rope(host, k):
            return lambda q, kk, cos, sin, *rest, **kwargs: tritongrad_op(host, k)(q, kk, cos, sin)
        return [(f"{kind} op around rope_forward, in place on the views of q and k", rope(liger_rope, kind)),
                ("bare op around rope_forward on clones of q and k", rope(liger_rope_on_clones, "bare"))]
    if name == "cross_entropy":
        def ce(input, target, weight=None, size_average=None, ignore_index=IGNORE_INDEX, reduce=None,
               reduction="mean", label_smoothing=0.0, **kwargs):
            assert weight is None and label_smoothing == 0.0 and not kwargs, "only plain cross-entropy is swapped"
            rows = op(liger_cross_entropy_rows)(input.contiguous(), target.contiguous(), ignore_index)
            return _reduce(rows, target, ignore_index, reduction)
        return [(f"{kind} op around cross_entropy_forward, loss only", ce)]
    if name == "fused_linear_cross_entropy":
        def flce(x, w, target, bias=None, ce_weight=None, ignore_index=IGNORE_INDEX, lse_square_scale=0.0,
                 label_smoothing=0.0, reduction="mean", softcap=None, *flags):
            assert bias is None and ce_weight is None and not lse_square_scale and not label_smoothing \
                and softcap is None and not any(f is True for f in flags), "only plain cross-entropy is swapped"
            rows = tritongrad_op(liger_fused_linear_cross_entropy_rows, "bare")(x.contiguous(), w, target,
                                                                                 ignore_index)
            return _reduce(rows, target, ignore_index, reduction), None, None, None
        from liger_kernel.ops import LigerFusedLinearCrossEntropyFunction as liger

        # bare only: its host function computes the logits with PyTorch matmuls between the launches
        return [("bare op around fused_linear_cross_entropy_forward, loss only", _Function(flce, liger))]
    if name == "fused_add_rms_norm":
        return [(f"{kind} op around fused_add_rms_norm_forward",
                 lambda x, r, w, eps: op(liger_fused_add_rms_norm)(x.contiguous(), r.contiguous(), w, eps))]
    raise ValueError(f"no swap {name!r} (there are: {', '.join(SWAPS)})")


def _outputs_and_grads(site: Site, cfg, entry) -> list:
    """The site's outputs and its leaves' gradients with ``entry`` in place (fixed random output gradients)."""
    site.put(entry)
    args, leaves = site.inputs(cfg)
    out = site.call(*args)
    outs = [o for o in (out if isinstance(out, (tuple, list)) else (out,))
            if isinstance(o, torch.Tensor) and o.is_floating_point()]
    gen = torch.Generator(outs[0].device).manual_seed(3)
    grads = [torch.randn(o.shape, generator=gen, device=o.device).to(o.dtype) for o in outs]
    torch.autograd.backward(outs, grads)
    return [o.detach() for o in outs] + [leaf.grad for leaf in leaves]


def _probe(name: str, site: Site, cfg, kind: str) -> str:
    """The first candidate that runs and agrees with Liger's Function on the run's shapes put in place (else
    Liger's Function); the note says which, and why the ones before it were not."""
    from tritongrad.tools.check import TOLERANCE, relative_errors

    liger = site.get()
    want = _outputs_and_grads(site, cfg, liger)
    why, tried = [], _candidates(name, kind)
    if kind == "named":  # each named op refused: the bare op next (it may update its inputs in place)
        paired = [c for pair in zip(tried, _candidates(name, "bare"), strict=True) for c in pair]
        tried = [c for i, c in enumerate(paired) if c[0] not in {p[0] for p in paired[:i]}]
    for how, entry in tried:
        try:
            got = _outputs_and_grads(site, cfg, entry)
            for g, w in zip(got, want, strict=True):
                error = relative_errors(g, w)[1]
                if w is not None and error > TOLERANCE[w.dtype]:
                    raise AssertionError(f"max |error| / max |Liger's| {error:.1e} on the run's shapes")
        except Exception as e:  # noqa: BLE001 (a refusal or a wrong result: the next candidate, and the note says)
            why.append(f"{how}: {type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:300]}")
            continue
        site.put(entry)
        return f"{name}: tritongrad {how}" + (f" (not {'; not '.join(why)})" if why else "")
    site.put(liger)
    return f"{name}: Liger's Function (not {'; not '.join(why)})"


def default_swaps(cfg) -> list[str]:
    found = ["rms_norm", "swiglu", "rope", "cross_entropy" if cfg.loss == "ce" else "fused_linear_cross_entropy"]
    return found + (["fused_add_rms_norm"] if cfg.fused_add_norm else [])


def swap(cfg) -> list[str]:
    """Each Liger Function in ``--swap`` (default: every one the patched model calls) replaced; a note per swap."""
    names = [n.strip() for n in cfg.swap.split(",") if n.strip()] or default_swaps(cfg)
    calls = default_swaps(cfg)
    for name in names:
        if name not in SWAPS:
            raise SystemExit(f"--swap: no {name!r} (there are: {', '.join(SWAPS)})")
        if name not in calls:
            raise SystemExit(f"--swap {name}: the patched model does not call it (--loss, --fused-add-norm)")
    sites = _sites()
    notes = [_probe(name, sites[name], cfg, cfg.ops) for name in names]
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return notes + [f"{name}: Liger's Function (not in --swap)" for name in calls if name not in names]


def _fused_layer_forward(self, hidden_states, *args, **kwargs):
    """LlamaDecoderLayer's forward with the post-attention residual add and RMSNorm as one call."""
    if args:
        raise TypeError("the fused decoder layer takes its arguments by name, as LlamaModel passes them")
    residual = hidden_states
    hidden_states, _ = self.self_attn(hidden_states=self.input_layernorm(hidden_states), **kwargs)
    norm = self.post_attention_layernorm
    hidden_states, residual = FUSED_ADD_RMS_NORM[0](hidden_states, residual, norm.weight, norm.variance_epsilon)
    return residual + self.mlp(hidden_states)


def _fuse_add_norm(modeling_llama) -> None:
    from liger_kernel.ops import LigerFusedAddRMSNormFunction

    FUSED_ADD_RMS_NORM[0] = lambda x, r, w, eps: LigerFusedAddRMSNormFunction.apply(x, r, w, eps, 0.0, "llama")
    modeling_llama.LlamaDecoderLayer.forward = _fused_layer_forward


def build(cfg, variant: str):
    """(model, loss_fn(model, ids), notes) for a form B variant; the model in float32 on the device (the caller
    casts it and sets its weights). ``ids``: (batch, seq + 1) token ids, of which the first seq are the input and,
    as HF shifts them, the labels."""
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.models.llama import modeling_llama

    if variant not in ("eager", "liger", "tritongrad"):
        raise ValueError(f"form B has no variant {variant!r}")
    notes = []
    if variant != "eager":
        from liger_kernel.transformers import apply_liger_kernel_to_llama

        apply_liger_kernel_to_llama(rope=True, rms_norm=True, swiglu=True, cross_entropy=cfg.loss == "ce",
                                    fused_linear_cross_entropy=cfg.loss == "flce")
        if cfg.fused_add_norm:
            _fuse_add_norm(modeling_llama)
    if variant == "tritongrad":
        notes = swap(cfg)
    config = LlamaConfig(vocab_size=cfg.vocab, hidden_size=cfg.hidden, intermediate_size=cfg.ffn,
                         num_hidden_layers=cfg.layers, num_attention_heads=cfg.heads,
                         num_key_value_heads=cfg.kv_heads, max_position_embeddings=cfg.seq, rms_norm_eps=1e-6,
                         tie_word_embeddings=False, use_cache=False, attn_implementation="sdpa")
    with torch.device(cfg.device):
        model = LlamaForCausalLM(config)
    model.train()

    def loss_fn(m, ids):
        x = ids[:, :-1]
        return m(input_ids=x, labels=x).loss

    return model, loss_fn, notes
