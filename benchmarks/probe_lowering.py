"""A quick GPU probe of the lowering (development tool; `tritongrad bench` is the benchmark):
gradients of Liger-Kernel's own forward launchers wrapped with @tritongrad.op against autograd on the
PyTorch reference (fp32 and bf16), then backward times (median(fwd+bwd) - median(fwd)) against Liger's
hand-written backward and torch.compile, side by side.

    PYTHONPATH=/tmp/site:$PWD python3 benchmarks/probe_lowering.py
"""

from __future__ import annotations

import os
import sys

import torch
import triton
from liger_kernel.ops.layer_norm import LigerLayerNormFunction, layer_norm_forward
from liger_kernel.ops.rms_norm import LigerRMSNormFunction, rms_norm_forward
from liger_kernel.ops.softmax import LigerSoftmaxFunction, _softmax_forward
from liger_kernel.ops.swiglu import LigerSiLUMulFunction, swiglu_forward

import tritongrad

EPS = 1e-6


@tritongrad.op
def derived_rmsnorm(x, w):
    return rms_norm_forward(x, w, EPS, 0.0, "llama", False)[0]


@tritongrad.op
def derived_layernorm(x, w, b):
    return layer_norm_forward(x, w, b, EPS)[0]


@tritongrad.op
def derived_swiglu(a, b):
    return swiglu_forward(a, b)[2]


@tritongrad.op
def derived_softmax(x):
    return _softmax_forward(x)[0]


def ref_rmsnorm(x, w):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS)).to(x.dtype) * w


def ref_layernorm(x, w, b):
    return torch.nn.functional.layer_norm(x, (x.shape[-1],), w, b, EPS)


def ref_swiglu(a, b):
    return torch.nn.functional.silu(a) * b


def ref_softmax(x):
    return torch.softmax(x, -1)


CASES = {
    "rmsnorm": (derived_rmsnorm, lambda x, w: LigerRMSNormFunction.apply(x, w, EPS), ref_rmsnorm, 2),
    "layernorm": (derived_layernorm, lambda x, w, b: LigerLayerNormFunction.apply(x, w, b, EPS), ref_layernorm, 3),
    "swiglu": (derived_swiglu, LigerSiLUMulFunction.apply, ref_swiglu, 2),
    "softmax": (derived_softmax, LigerSoftmaxFunction.apply, ref_softmax, 1),
}


def inputs(name, rows, cols, dtype):
    x = torch.randn(rows, cols, device="cuda", dtype=dtype)
    if name == "rmsnorm":
        return x, torch.randn(cols, device="cuda", dtype=dtype)
    if name == "layernorm":
        return x, torch.randn(cols, device="cuda", dtype=dtype), torch.randn(cols, device="cuda", dtype=dtype)
    if name == "swiglu":
        return x, torch.randn(rows, cols, device="cuda", dtype=dtype)
    return (x,)


def grads(fn, args, g):
    leaves = [a.detach().clone().requires_grad_() for a in args]
    out = fn(*leaves)
    out.backward(g)
    return out, [t.grad for t in leaves]


def check(name, dtype):
    op, _, ref, _ = CASES[name]
    args = inputs(name, 1000, 1500, dtype)
    g = torch.randn(1000, 1500, device="cuda", dtype=dtype)
    out, got = grads(op, args, g)
    want_out, want = grads(ref, [a.double() for a in args], g.double())
    errs = [((a.double() - b).abs().max() / b.abs().max()).item() for a, b in zip([out, *got], [want_out, *want],
                                                                                  strict=True)]
    return errs


def time_backward(fn, args, g):
    leaves = [a.detach().clone().requires_grad_() for a in args]

    def fwd():
        return fn(*leaves)

    def fwd_bwd():
        fn(*leaves).backward(g)

    t_fwd = triton.testing.do_bench(fwd, warmup=25, rep=100, grad_to_none=leaves, return_mode="median")
    t_all = triton.testing.do_bench(fwd_bwd, warmup=25, rep=100, grad_to_none=leaves, return_mode="median")
    return t_all - t_fwd, t_all


def profile():
    """Kernel by kernel: what one forward+backward of each derived op launches, and how long each takes."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    for name in ("rmsnorm", "swiglu", "softmax"):
        for dtype in (torch.float32, torch.bfloat16):
            op = CASES[name][0]
            args = [a.requires_grad_() for a in inputs(name, 16384, 4096, dtype)]
            g = torch.randn(16384, 4096, device="cuda", dtype=dtype)
            for _ in range(3):
                op(*args).backward(g)
            torch.cuda.synchronize()
            with torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                for _ in range(5):
                    for a in args:
                        a.grad = None
                    op(*args).backward(g)
                torch.cuda.synchronize()
            table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=14, max_name_column_width=60)
            with open(os.path.join(os.environ.get("OUT", "."), "profile.txt"), "a") as f:
                f.write(f"== {name} {dtype}\n{table}\n")


def debug():
    """How often tuning runs, what it chose, and a backward timed with events (rmsnorm, bf16)."""
    from tritongrad.runtime import tuning

    calls = []
    real = tuning.best

    def counted(key, *a, **k):
        hit = key in tuning._best
        calls.append(hit)
        return real(key, *a, **k)

    tuning.best = counted
    op = CASES["rmsnorm"][0]
    args = [a.requires_grad_() for a in inputs("rmsnorm", 16384, 4096, torch.bfloat16)]
    g = torch.randn(16384, 4096, device="cuda", dtype=torch.bfloat16)
    times = []
    for _ in range(30):
        for a in args:
            a.grad = None
        y = op(*args)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        y.backward(g)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    import cProfile
    import pstats
    import time

    for label, fn in (("derived", op), ("liger", CASES["rmsnorm"][1])):
        small = [a.detach()[:64, :256].clone().requires_grad_() for a in args[:1]] + [
            args[1].detach()[:256].clone().requires_grad_()]
        gs = g[:64, :256].clone()
        ys = [fn(*small) for _ in range(200)]
        torch.cuda.synchronize()
        start = time.perf_counter()
        for y in ys:
            y.backward(gs)
        torch.cuda.synchronize()
        print(f"host time per backward, {label}: {(time.perf_counter() - start) / len(ys) * 1e6:.1f} us")
    ys = [op(*args) for _ in range(30)]
    torch.cuda.synchronize()
    profiler = cProfile.Profile()
    profiler.enable()
    for y in ys:
        y.backward(g)
    torch.cuda.synchronize()
    profiler.disable()
    pstats.Stats(profiler).sort_stats("tottime").print_stats(22)
    print("tuning calls (True: cached)", calls)
    print("chosen", {k[1:3]: v for k, v in tuning._best.items()})
    print("backward ms", " ".join(f"{t:.3f}" for t in times))


def main():
    print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)
    if "--debug" in sys.argv:
        return debug()
    if "--profile" in sys.argv:
        profile()
    for name in CASES:
        for dtype in (torch.float32, torch.bfloat16):
            errs = check(name, dtype)
            print(f"check {name:10} {str(dtype):15} rel err out/grads: " + " ".join(f"{e:.1e}" for e in errs),
                  flush=True)
    sizes = [(16384, 4096)] + ([(16384, 1024), (4096, 16384)] if "--all" in sys.argv else [])
    print("backward ms (fwd+bwd ms): derived | liger | compile")
    for rows, cols in sizes:
        for dtype in (torch.bfloat16, torch.float32):
            for name, (op, liger, ref, _) in CASES.items():
                args = inputs(name, rows, cols, dtype)
                g = torch.randn(rows, cols, device="cuda", dtype=dtype)
                cells = []
                for fn in (op, liger, torch.compile(ref)):
                    try:
                        bwd, total = time_backward(fn, args, g)
                        cells.append(f"{bwd:7.3f} ({total:6.3f})")
                    except Exception as e:  # noqa: BLE001
                        cells.append(f"error {type(e).__name__}: {str(e)[:60]}")
                print(f"{name:10} {rows}x{cols} {str(dtype)[6:]:9} " + " | ".join(cells), flush=True)
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
