"""Is a step host-bound? Per implementation of an example: the host's time to queue one forward+backward,
the GPU's time to run it (queued behind a long sleep, so the host's pace cannot show), and do_bench's median.

    python3 benchmarks/host_gpu_split.py rmsnorm 16384x4096 bfloat16 [tritongrad liger compile ...]

A step is host-bound where the host's time exceeds the GPU's; do_bench then times the host.
"""

import sys
import time

import torch
import triton.testing

from tritongrad import examples
from tritongrad.tools.bench.competitors import implementations
from tritongrad.tools.sizes import parse_size

STEPS = 50


def training_step(fn, master: list):
    """One forward+backward of ``fn`` on fresh leaves copied from ``master`` with random output gradients, the
    leaves' .grad reset to None first (as do_bench's grad_to_none)."""
    leaves = [t.detach().clone().requires_grad_(t.is_floating_point()) if isinstance(t, torch.Tensor) else t
              for t in master]
    outs = fn(*leaves)
    grads = [torch.randn_like(o) for o in (outs if isinstance(outs, tuple) else (outs,))]
    tensors = [t for t in leaves if isinstance(t, torch.Tensor) and t.requires_grad]

    def step():
        for t in tensors:
            t.grad = None
        outs = fn(*leaves)
        torch.autograd.backward(list(outs) if isinstance(outs, tuple) else [outs], grads)

    step.leaves, step.grads = leaves, grads  # for a caller timing pieces of the step on the same tensors
    return step


def split(step):
    """(host µs, GPU µs, do_bench µs) per forward+backward step."""
    for _ in range(10):
        step()
    torch.cuda.synchronize()
    host = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(STEPS):
            step()
        host.append((time.perf_counter() - start) / STEPS * 1e6)
        torch.cuda.synchronize()
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    gpu = []
    for _ in range(5):
        torch.cuda._sleep(2_000_000_000)  # ~1 s of GPU clock cycles: every step is queued before it runs
        begin.record()
        for _ in range(STEPS):
            step()
        end.record()
        torch.cuda.synchronize()
        gpu.append(begin.elapsed_time(end) / STEPS * 1e3)
    bench_us = triton.testing.do_bench(step, warmup=50, rep=200, return_mode="median") * 1e3
    return sorted(host)[2], sorted(gpu)[2], bench_us


def main() -> None:
    name, size, dtype_name = sys.argv[1], parse_size(sys.argv[2]), sys.argv[3]
    requested = sys.argv[4:] or ["tritongrad", "liger", "compile"]
    example = examples.get(name)
    master = example.make_inputs(size, device="cuda", dtype=getattr(torch, dtype_name))
    print(f"{name} {sys.argv[2]} {dtype_name}: µs per forward+backward step (median of 5 runs of {STEPS})")
    print(f"{'impl':12} {'host':>8} {'gpu':>8} {'do_bench':>9}")
    for impl in implementations(example, requested, dtype_name):
        if impl.make is None:
            print(f"{impl.name:12} unavailable: {impl.note}")
            continue
        host, gpu, bench_us = split(training_step(impl.make(), master))
        print(f"{impl.name:12} {host:8.1f} {gpu:8.1f} {bench_us:9.1f}" + ("   host-bound" if host > gpu else ""))


if __name__ == "__main__":
    main()
