"""Which GPU kernels each implementation's forward+backward runs, and how long each takes:
torch.profiler around `tritongrad bench`'s own measurement step (same inputs, output gradients and
implementations), so a backward that misses its target can be taken apart kernel by kernel.

    PYTHONPATH=/tmp/site:$PWD python3 benchmarks/profile_kernels.py rmsnorm softmax \
        --size 16384x4096 --dtype bfloat16 [--impl tritongrad liger]
    ncu --clock-control none --profile-from-start off --section SpeedOfLight --section Occupancy \
        python3 benchmarks/profile_kernels.py layernorm --size 16384x16384 --dtype float32 --ncu

``--ncu``: after the profiled steps, one more step between cudaProfilerStart and Stop, for Nsight Compute to read
each kernel of a warm step (``--profile-from-start off``), none of the tuning's.
"""

from __future__ import annotations

import argparse

import torch
from torch.profiler import ProfilerActivity, profile

from tritongrad.tools.bench import DTYPES, resolve
from tritongrad.tools.bench.competitors import implementations
from tritongrad.tools.bench.measure import measure_size
from tritongrad.tools.sizes import parse_size

STEPS = 10  # profiled forward+backward steps, after as many warm-up steps


def kernel_table(fn) -> list[tuple[str, float, float]]:
    """(kernel, calls per step, µs per step) of the GPU kernels `fn` runs, longest first."""
    for _ in range(STEPS):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(STEPS):
            fn()
        torch.cuda.synchronize()
    rows = []
    for event in prof.key_averages():
        us = getattr(event, "device_time_total", None) or getattr(event, "cuda_time_total", 0)
        if us > 0:
            rows.append((event.key, event.count / STEPS, us / STEPS))
    return sorted(rows, key=lambda r: -r[2])


def ncu_step(step) -> None:
    """One more run of ``step`` between cudaProfilerStart and Stop: what ``ncu --profile-from-start off`` reads."""
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    step()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("examples", nargs="+")
    p.add_argument("--size", default="16384x4096")
    p.add_argument("--dtype", default="bfloat16", choices=DTYPES)
    p.add_argument("--impl", nargs="*", help="implementations (default: all the example has)")
    p.add_argument("--ncu", action="store_true", help="one more step between cudaProfilerStart and Stop")
    args = p.parse_args()
    size = parse_size(args.size)
    current = {}  # the example and implementation being measured (measure_size's `started`)

    def profiled(fn, grad_to_none):
        def step():  # as do_bench times it: gradients start at None (else autograd adds into the last step's)
            for t in grad_to_none or ():
                t.grad = None
            fn()

        total = 0.0
        print(f"\n{current['example']} {args.size} {args.dtype} · {current['impl']} · forward+backward per step")
        for name, calls, us in kernel_table(step):
            print(f"  {us:9.1f} µs  x{calls:<4g} {name[:110]}")
            total += us
        print(f"  {total:9.1f} µs  GPU time per step")
        if args.ncu:
            ncu_step(step)
        return total / 1e3

    for example in resolve(args.examples):
        impls = implementations(example, args.impl, args.dtype)
        current["example"] = example.name
        measure_size(example, size, impls, dtype_name=args.dtype, device="cuda", modes=["fwd+bwd"],
                     timer=profiled, started=lambda impl: current.update(impl=impl))


if __name__ == "__main__":
    main()
