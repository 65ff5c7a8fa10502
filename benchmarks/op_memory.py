"""A Llama training step's custom ops one at a time, at the step's shapes: what each keeps for its backward, the
peak its backward adds, and its time, for tritongrad (the bundled example's op, and Liger's forward under
``@tritongrad.op``) beside Liger-Kernel's hand-written Function and eager PyTorch.

    python -m benchmarks.op_memory                       # a GPU; Liger where installed
    python -m benchmarks.op_memory --ops rope --layers 8  # one op, called as a model's 8 layers call it
    python -m benchmarks.op_memory --smoke               # CPU, Triton's interpreter, tiny shapes (a test)

Per op and implementation: ``kept`` (tritongrad.kept: memory the call allocated for its backward alone, MiB),
``held`` (arguments and outputs the backward keeps alive), ``fwd+`` (memory allocated after ``--layers`` forward
calls, less the outputs, per call: what a model pays per layer), ``bwd peak`` (the backward's peak above what was
allocated before it, after one fwd+bwd: a kind of call's first backward is checked, host/donation.py),
``fwd``/``bwd`` ms (median(fwd+bwd) - median(fwd), triton.testing.do_bench). Shapes: batch 4 x
2048 tokens, hidden 2048, 16 heads (4 KV heads) of 128, FFN 5632, vocab 32000 (the training step's Llama); bf16.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable

OPS = ("rmsnorm", "swiglu", "rope", "cross_entropy", "attention")


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ops", nargs="*", default=list(OPS))
    p.add_argument("--layers", type=int, default=8, help="forward calls kept at once (a model's layers)")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--smoke", action="store_true", help="CPU, interpreter, tiny shapes")
    p.add_argument("--impls", nargs="*", help="implementations to run (default: all there are)")
    p.add_argument("--profile", action="store_true", help="the GPU kernels of each fwd+bwd (profile_kernels.py)")
    return p.parse_args(argv)


def shapes(smoke: bool) -> dict:
    if smoke:
        return dict(batch=2, seq=24, hidden=32, heads=4, kv_heads=2, head_dim=8, ffn=48, vocab=97)
    return dict(batch=4, seq=2048, hidden=2048, heads=16, kv_heads=4, head_dim=128, ffn=5632, vocab=32000)


def cases(op: str, s: dict, device: str, dtype):
    """(inputs maker, {implementation: callable}) for one op."""
    import torch

    import tritongrad
    from tritongrad.examples import cross_entropy, flash_attention, rmsnorm, rotary, swiglu

    tokens = s["batch"] * s["seq"]
    impls: dict[str, Callable] = {}
    liger = _liger()
    if op == "rmsnorm":
        def make():
            return (torch.randn(tokens, s["hidden"], device=device, dtype=dtype, requires_grad=True),
                    torch.randn(s["hidden"], device=device, dtype=dtype, requires_grad=True))
        impls["tritongrad"] = rmsnorm.rmsnorm
        impls["eager"] = lambda x, w: torch.nn.functional.rms_norm(x, (x.shape[-1],), w, 1e-6)
        if liger:
            from liger_kernel.ops.rms_norm import LigerRMSNormFunction, rms_norm_forward
            impls["liger-fwd"] = _named_op(lambda x, w: rms_norm_forward(x, w, 1e-6, 0.0, "llama", None)[0],
                                           "liger_rms_norm")
            impls["liger"] = lambda x, w: LigerRMSNormFunction.apply(x, w, 1e-6)
    elif op == "swiglu":
        def make():
            return tuple(torch.randn(tokens, s["ffn"], device=device, dtype=dtype, requires_grad=True)
                         for _ in range(2))
        impls["tritongrad"] = swiglu.swiglu
        impls["eager"] = lambda a, b: torch.nn.functional.silu(a) * b
        if liger:
            from liger_kernel.ops.swiglu import LigerSiLUMulFunction, swiglu_forward
            impls["liger-fwd"] = _named_op(lambda a, b: swiglu_forward(a, b)[2], "liger_swiglu")
            impls["liger"] = LigerSiLUMulFunction.apply
    elif op == "rope":
        b, n, d = s["batch"], s["seq"], s["head_dim"]

        def make():  # the projections' outputs (batch, seq, heads * dim), leaves
            angles = torch.rand(1, n, d, device=device, dtype=torch.float32) * 6
            return (torch.randn(b, n, s["heads"] * d, device=device, dtype=dtype, requires_grad=True),
                    torch.randn(b, n, s["kv_heads"] * d, device=device, dtype=dtype, requires_grad=True),
                    angles.cos().to(dtype), angles.sin().to(dtype))

        def as_a_model_calls(f):  # q, k as a model has them, made anew per call (each implementation alike): views
            def call(pq, pk, cos, sin):  # (batch, heads, seq, dim) of a projection's output, which is no leaf
                q = (pq * 1.0).view(b, n, s["heads"], d).transpose(1, 2)  # (updated in place)
                k = (pk * 1.0).view(b, n, s["kv_heads"], d).transpose(1, 2)
                return f(q, k, cos, sin)
            return call
        # (the example reads q and k as contiguous: a named op sees no copy made inside, so the caller makes it)
        impls["tritongrad"] = lambda q, k, cos, sin: rotary.rotary(q.contiguous(), k.contiguous(), cos, sin)
        impls["eager"] = rotary.reference
        if liger:
            from liger_kernel.ops.rope import LigerRopeFunction

            from benchmarks.train_hf import liger_rope, liger_rope_on_clones

            impls["liger-fwd"] = tritongrad.op(liger_rope)  # in place on the views of q and k, as Liger writes it
            impls["liger-fwd-clones"] = tritongrad.op(liger_rope_on_clones)
            impls["liger"] = LigerRopeFunction.apply
        impls = {name: as_a_model_calls(f) for name, f in impls.items()}
    elif op == "cross_entropy":
        def make():
            logits = torch.randn(tokens, s["vocab"], device=device, dtype=dtype, requires_grad=True)
            return logits, torch.randint(0, s["vocab"], (tokens,), device=device)
        impls["tritongrad"] = cross_entropy.cross_entropy
        impls["eager"] = cross_entropy.reference
        if liger:
            from liger_kernel.ops.cross_entropy import LigerCrossEntropyFunction

            from benchmarks.train_hf import liger_cross_entropy_rows

            loss_only = tritongrad.op(liger_cross_entropy_rows)  # its kernel launched loss-only, as written
            impls["liger-fwd"] = lambda x, t: loss_only(x, t, -100)
            impls["liger"] = lambda x, t: LigerCrossEntropyFunction.apply(x, t, None, -100, 0.0, 0.0, "none")[0]
        # each call on logits made anew, no leaf (Liger's kernel writes the gradient into them), each implementation
        impls = {name: _on_a_copy(f) for name, f in impls.items()}  # alike
    elif op == "attention":
        def make():
            b, n, d = s["batch"], s["seq"], s["head_dim"]
            return tuple(torch.randn(b, s["heads"], n, d, device=device, dtype=dtype, requires_grad=True)
                         for _ in range(3))
        impls["tritongrad"] = lambda q, k, v: flash_attention.flash_attention(q, k, v, True)
        impls["eager"] = lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    else:
        raise SystemExit(f"unknown op {op!r} (there are: {', '.join(OPS)})")
    return make, impls


def _on_a_copy(f: Callable) -> Callable:
    return lambda x, t: f(x * 1.0, t)


def _liger() -> bool:
    try:
        import liger_kernel  # noqa: F401
    except ImportError:
        return False
    import torch
    return torch.cuda.is_available()  # (Liger's kernels use libdevice: not the interpreter)


def _named_op(fn, name):
    import tritongrad

    fn.__name__ = fn.__qualname__ = name
    return tritongrad.op(fn)


def _outputs(result) -> list:
    import torch
    from torch.utils._pytree import tree_leaves

    return [t for t in tree_leaves(result) if isinstance(t, torch.Tensor)]


def measure(op: str, impl: Callable, make: Callable, layers: int, device: str, profiled: bool = False) -> dict:
    import torch

    import tritongrad

    row = {}
    inputs = make()
    report = tritongrad.kept(impl, *inputs)
    row["kept"], row["held"] = report.own_bytes / 2**20, report.held_bytes / 2**20
    row["report"] = str(report)
    del report
    cuda = device == "cuda"
    if cuda:  # (a first fwd+bwd: the first backward of a call's kind is checked, guard bands and no donation)
        outs = [t for t in _outputs(impl(*inputs)) if t.requires_grad]
        torch.autograd.backward(outs, [torch.ones_like(t) for t in outs])
        del outs
        for t in inputs:
            t.grad = None
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        before = torch.cuda.memory_allocated()
        outs = [_outputs(impl(*inputs)) for _ in range(layers)]
        torch.cuda.synchronize()
        out_bytes = sum(t.untyped_storage().nbytes() for o in outs for t in {id(t): t for t in o}.values()
                        if t.untyped_storage().data_ptr() not in {x.untyped_storage().data_ptr() for x in inputs})
        row["fwd+"] = (torch.cuda.memory_allocated() - before - out_bytes) / layers / 2**20
        loss = sum((t.float() * torch.randn_like(t, dtype=torch.float32)).sum() for o in outs for t in o
                   if t.requires_grad)
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        loss.backward()
        torch.cuda.synchronize()
        row["bwd peak"] = (torch.cuda.max_memory_allocated() - base) / 2**20
        del outs, loss
        for t in inputs:
            t.grad = None
        import triton.testing

        def fwd():
            return impl(*inputs)

        def fwd_bwd():
            outs = [t for t in _outputs(impl(*inputs)) if t.requires_grad]
            torch.autograd.backward(outs, [torch.ones_like(t) for t in outs])

        grads = [t for t in inputs if t.requires_grad]
        f = triton.testing.do_bench(fwd, grad_to_none=grads, return_mode="median")
        fb = triton.testing.do_bench(fwd_bwd, grad_to_none=grads, return_mode="median")
        row["fwd ms"], row["bwd ms"] = f, fb - f
        if profiled:
            from benchmarks.profile_kernels import kernel_table

            def step():
                for t in grads:
                    t.grad = None
                fwd_bwd()
            row["kernels"] = kernel_table(step)
    else:
        outs = [t for t in _outputs(impl(*inputs)) if t.requires_grad]
        torch.autograd.backward(outs, [torch.ones_like(t) for t in outs])
    return row


def main(argv=None) -> list[dict]:
    args = parse(argv)
    if args.smoke:
        os.environ["TRITON_INTERPRET"] = "1"
    import torch

    device = "cuda" if torch.cuda.is_available() and not args.smoke else "cpu"
    dtype = getattr(torch, "float32" if device == "cpu" else args.dtype)
    s = shapes(args.smoke or device == "cpu")
    rows = []
    for op in args.ops:
        make, impls = cases(op, s, device, dtype)
        for name, impl in impls.items():
            if args.impls and name not in args.impls:
                continue
            try:
                row = measure(op, impl, make, 1 if device == "cpu" else args.layers, device, args.profile)
            except Exception as e:  # noqa: BLE001 - a failing implementation is a row that says why
                row = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"}
            row.update(op=op, impl=name)
            rows.append(row)
            torch.cuda.empty_cache() if device == "cuda" else None
    _print(rows)
    return rows


def _print(rows: list[dict]) -> None:
    cols = ("op", "impl", "kept", "held", "fwd+", "bwd peak", "fwd ms", "bwd ms")
    print(" | ".join(cols))
    for r in rows:
        if "error" in r:
            print(f"{r['op']} | {r['impl']} | {r['error']}")
            continue
        print(" | ".join(f"{r[c]:.3f}" if isinstance(r.get(c), float) else str(r.get(c, "")) for c in cols))
    for r in rows:
        if "report" in r and os.environ.get("OP_MEMORY_DETAIL"):
            print(f"\n{r['op']} / {r['impl']}:\n{r['report']}")
        for kernel, calls, us in r.get("kernels", ()):
            print(f"  {r['op']}/{r['impl']}  {us:9.1f} us  x{calls:g}  {kernel[:110]}")


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
