"""The derived backward of a Triton tutorial's forward against the backward the tutorial writes by hand.

    python benchmarks/tutorial_backwards.py --tutorials DIR [--only layernorm attention] [--out FILE]

DIR holds the tutorials as Triton ships them, as importable modules: ``layer_norm.py`` (05-layer-norm.py: its
kernels and ``LayerNorm``) and ``fused_attention.py`` (06-fused-attention.py: its kernels and ``_attention``), with
their module-level test and benchmark calls left out. They are not part of tritongrad and are not in the
repository: copy them from the Triton you benchmark.

For each case, three implementations side by side in one run:

- ``derived``: the tutorial's own forward launch code (its autograd Function's ``forward``, given a stand-in
  ``ctx``) wrapped with ``tritongrad.op``; the backward is derived from the forward kernel;
- ``tutorial``: the tutorial's autograd Function, forward and hand-written backward;
- ``torch``: the same function in PyTorch (``F.layer_norm``; ``F.scaled_dot_product_attention``, which takes its
  flash backend here), for scale.

Backward time is ``median(fwd+bwd) - median(fwd)`` for every implementation alike, timed twice: launched eagerly
(``do_bench``) and replayed from a CUDA graph (the GPU's time alone). Before timing, each implementation's
gradients are compared with float32 PyTorch on the same inputs.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import sys
import traceback
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import tritongrad  # noqa: E402
from tritongrad.tools.bench.measure import backward_ms, do_bench_median, graph_median  # noqa: E402


class Context:
    """A stand-in for an autograd Function's ``ctx``: the tutorial's ``forward`` keeps what it saves here."""

    def save_for_backward(self, *tensors):
        self.saved_tensors = tensors


def load(folder: Path, name: str):
    spec = importlib.util.spec_from_file_location(f"tutorial_{name}", folder / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def layer_norm_cases(tutorial, dtype):
    @tritongrad.op
    def derived(x, w, b, eps: float):
        return tutorial.LayerNorm.forward(Context(), x, (x.shape[-1],), w, b, eps)

    def inputs(m, n):
        g = torch.Generator(device="cuda").manual_seed(0)
        x = (-2.3 + 0.5 * torch.randn(m, n, device="cuda", generator=g)).to(dtype)
        w = torch.rand(n, device="cuda", generator=g).to(dtype)
        b = torch.rand(n, device="cuda", generator=g).to(dtype)
        return [x, w, b]

    impls = {
        "derived": lambda x, w, b: derived(x, w, b, 1e-5),
        "tutorial": lambda x, w, b: tutorial.layer_norm(x, (x.shape[-1],), w, b, 1e-5),
        "torch": lambda x, w, b: F.layer_norm(x, (x.shape[-1],), w, b, 1e-5),
    }
    for m, n in [(16384, 4096)]:
        yield f"layer norm {m}x{n}", impls, lambda m=m, n=n: inputs(m, n), 3 * m * n * torch.finfo(dtype).bits // 8


def attention_cases(tutorial, dtype):
    @tritongrad.op
    def derived(q, k, v, causal: bool, sm_scale: float):
        return tutorial._attention.forward(Context(), q, k, v, causal, sm_scale, False)

    def inputs(z, h, n, d):
        g = torch.Generator(device="cuda").manual_seed(0)
        return [torch.randn(z, h, n, d, device="cuda", generator=g).to(dtype) for _ in range(3)]

    for d in (64, 128):
        for causal in (False, True):
            scale = 1 / math.sqrt(d)
            impls = {
                "derived": lambda q, k, v, c=causal, s=scale: derived(q, k, v, c, s),
                "tutorial": lambda q, k, v, c=causal, s=scale: tutorial.attention(q, k, v, c, s, False),
                "torch": lambda q, k, v, c=causal, s=scale: F.scaled_dot_product_attention(q, k, v, is_causal=c,
                                                                                          scale=s),
            }
            yield (f"attention B=4 H=16 N=4096 d={d}{' causal' if causal else ''}", impls,
                   lambda d=d: inputs(4, 16, 4096, d), None)


@triton.jit
def persistent_softmax(out_ptr, in_ptr, in_row_stride, out_row_stride, n_rows, n_cols, BLOCK: tl.constexpr,
                       STAGES: tl.constexpr):
    # the fused-softmax tutorial's kernel shape: a grid-stride loop over rows
    for row in tl.range(tl.program_id(0), n_rows, tl.num_programs(0), num_stages=STAGES):
        cols = tl.arange(0, BLOCK)
        x = tl.load(in_ptr + row * in_row_stride + cols, mask=cols < n_cols, other=-float("inf"))
        z = x - tl.max(x, axis=0)
        e = tl.exp(z)
        tl.store(out_ptr + row * out_row_stride + cols, e / tl.sum(e, axis=0), mask=cols < n_cols)


def softmax_cases(dtype):
    """The backward keeps the forward's grid, so the same kernel launched persistent (a few
    programs per multiprocessor, as the tutorial sizes it) and one program per row measures what persistence
    gives the derived backward."""

    @tritongrad.op
    def derived(x, programs: int):
        y = torch.empty_like(x)
        persistent_softmax[(programs,)](y, x, x.stride(0), y.stride(0), x.shape[0], x.shape[1],
                                        BLOCK=triton.next_power_of_2(x.shape[1]), STAGES=2)
        return y

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for m, n in [(16384, 1024), (16384, 4096)]:
        impls = {"derived": lambda x, m=m: derived(x, min(m, 4 * sms)),  # persistent
                 "tutorial": lambda x, m=m: derived(x, m),  # (the column "tutorial": one program per row)
                 "torch": lambda x: torch.softmax(x, -1)}
        yield (f"softmax {m}x{n}: persistent (derived) / a program per row (tutorial column)", impls,
               lambda m=m, n=n: [torch.randn(m, n, device="cuda").to(dtype)], None)


def check(impls, make_inputs) -> dict[str, float]:
    """Each implementation's gradients against float32 PyTorch's (max |error| / max |reference|)."""
    base = make_inputs()
    ref_in = [t.float().requires_grad_() for t in base]
    ref_out = impls["torch"](*ref_in)
    g = torch.randn(ref_out.shape, device=ref_out.device)  # contiguous, as the tutorial's backward asserts
    want = torch.autograd.grad(ref_out, ref_in, g)
    errors = {}
    for name, fn in impls.items():
        leaves = [t.clone().requires_grad_() for t in base]
        got = torch.autograd.grad(fn(*leaves), leaves, g.to(base[0].dtype))
        errors[name] = max(((a.float() - b).abs().max() / b.abs().max()).item() for a, b in zip(got, want, strict=True))
    return errors


def time_backward(fn, make_inputs, timer) -> float:
    leaves = [t.requires_grad_() for t in make_inputs()]
    out = fn(*leaves)
    g = torch.randn(out.shape, device=out.device, dtype=out.dtype)
    del out

    def forward():
        return fn(*leaves)

    def forward_backward():
        fn(*leaves).backward(g)

    return backward_ms(timer(forward, leaves), timer(forward_backward, leaves))


def profile_case(name: str, impls: dict, make_inputs, ncu: bool = False) -> None:
    """The GPU kernels of one fwd+bwd step of each implementation (derived, tutorial, PyTorch), longest first."""
    from benchmarks.profile_kernels import kernel_table, ncu_step

    for impl in ("derived", "tutorial", "torch"):
        leaves = [t.requires_grad_() for t in make_inputs()]
        out = impls[impl](*leaves)
        g = torch.randn(out.shape, device=out.device, dtype=out.dtype)
        del out

        def step(fn=impls[impl], leaves=leaves, g=g):
            for t in leaves:
                t.grad = None
            fn(*leaves).backward(g)

        rows = kernel_table(step)
        if ncu:
            ncu_step(step)
        print(f"\n{name} · {impl} · GPU kernels per fwd+bwd step")
        for kernel, calls, us in rows[:8]:
            print(f"{us:9.1f} µs  x{calls:<4g} {kernel[:100]}")
        print(f"{sum(r[2] for r in rows):9.1f} µs  in all", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tutorials", type=Path, default=Path(".tutorials"))
    p.add_argument("--only", nargs="*", default=["layernorm", "attention", "softmax"])
    p.add_argument("--out", type=Path)
    p.add_argument("--profile", action="store_true", help="also each case's GPU kernels per fwd+bwd step "
                   "(torch.profiler), each implementation")
    p.add_argument("--cases", help="only the cases whose name contains this text")
    p.add_argument("--eager", action="store_true", help="time eager launches twice, no CUDA graph (a backward "
                   "that fails in capture)")
    p.add_argument("--ncu", action="store_true", help="with --profile: one more step of each implementation between "
                   "cudaProfilerStart and Stop (for `ncu --profile-from-start off`)")
    args = p.parse_args()
    rows = [f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton "
            f"{importlib.import_module('triton').__version__}", "",
            "| case | dtype | derived bwd ms (eager / graph) | tutorial bwd ms | torch bwd ms | tutorial / derived "
            "(eager / graph) | max rel. grad error (derived, tutorial) |", "|" + " --- |" * 7]
    groups = []
    if "layernorm" in args.only:
        groups.append((load(args.tutorials, "layer_norm"), layer_norm_cases, (torch.bfloat16, torch.float16)))
    if "softmax" in args.only:
        groups.append((None, lambda _, dtype: softmax_cases(dtype), (torch.bfloat16,)))
    if "attention" in args.only:
        groups.append((load(args.tutorials, "fused_attention"), attention_cases, (torch.float16,)))
    for module, cases, dtypes in groups:
        for dtype in dtypes:
            for name, impls, make_inputs, _ in cases(module, dtype):
                if args.cases and args.cases not in name:
                    continue
                if args.profile:
                    profile_case(name, impls, make_inputs, args.ncu)
                try:
                    errors = check(impls, make_inputs)
                    timers = (do_bench_median, do_bench_median if args.eager else graph_median)
                    times = {k: [time_backward(fn, make_inputs, t) for t in timers]
                             for k, fn in impls.items()}
                except Exception as e:  # one case's failure is a row of the table, not the end of the run
                    traceback.print_exc()
                    line = f"| {name} | {str(dtype).split('.')[-1]} | failed: {type(e).__name__}: {str(e)[:200]} |"
                else:
                    d, t, r = times["derived"], times["tutorial"], times["torch"]
                    line = (f"| {name} | {str(dtype).split('.')[-1]} | {d[0]:.3f} / {d[1]:.3f} "
                            f"| {t[0]:.3f} / {t[1]:.3f} | {r[0]:.3f} / {r[1]:.3f} "
                            f"| {t[0] / d[0]:.2f} / {t[1] / d[1]:.2f} "
                            f"| {errors['derived']:.1e}, {errors['tutorial']:.1e} |")
                rows.append(line)
                print(line, flush=True)
    text = "\n".join(rows)
    print("\n" + text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
