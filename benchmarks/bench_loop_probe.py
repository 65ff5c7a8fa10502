"""Why a step times longer under do_bench than its host and GPU times add up to (development probe): per
implementation, the step timed by events in do_bench's own loop (a 256 MB cache clear before each step) and in
the same loop without the clear, then the CUDA runtime calls one such step makes (torch.profiler): a call that
waits for the device (a synchronize, a cudaFree, a blocking copy) puts the GPU's time on the host's.

    PYTHONPATH=/tmp/site:$PWD python3 benchmarks/bench_loop_probe.py rmsnorm 16384x4096 bfloat16 [tritongrad liger]
"""

from __future__ import annotations

import sys
import time

import torch
import triton.testing
from torch.profiler import ProfilerActivity, profile

from benchmarks.host_gpu_split import training_step
from tritongrad import examples
from tritongrad.tools.bench.competitors import implementations
from tritongrad.tools.sizes import parse_size

STEPS = 40


def timed_loop(step, clear: torch.Tensor | None) -> tuple[float, float]:
    """(median µs between the events around a step, host µs per iteration), as do_bench's loop times."""
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(STEPS)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(STEPS)]
    torch.cuda.synchronize()
    begin = time.perf_counter()
    for start, end in zip(starts, ends, strict=True):
        if clear is not None:
            clear.zero_()
        start.record()
        step()
        end.record()
    host = (time.perf_counter() - begin) / STEPS * 1e6
    torch.cuda.synchronize()
    times = sorted(s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends, strict=True))
    return times[len(times) // 2], host


def main() -> None:
    name, size, dtype_name = sys.argv[1], parse_size(sys.argv[2]), sys.argv[3]
    example = examples.get(name)
    master = example.make_inputs(size, device="cuda", dtype=getattr(torch, dtype_name))
    clear = torch.empty(256 * 1024 * 1024, dtype=torch.int8, device="cuda")
    for impl in implementations(example, sys.argv[4:] or ["tritongrad", "liger"], dtype_name):
        if impl.make is None:
            continue
        step = training_step(impl.make(), master)
        for _ in range(20):
            step()
        cleared, cleared_host = timed_loop(step, clear)
        plain, plain_host = timed_loop(step, None)
        bench_us = triton.testing.do_bench(step, warmup=25, rep=100, return_mode="median") * 1e3
        print(f"{impl.name}: events around a step, µs: after a cache clear {cleared:.1f} (host {cleared_host:.1f} "
              f"per iteration), without {plain:.1f} (host {plain_host:.1f}); do_bench {bench_us:.1f}")
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(10):
                clear.zero_()
                step()
            torch.cuda.synchronize()
        calls = [e for e in prof.key_averages() if e.key.startswith(("cuda", "cu")) and e.count]
        for e in sorted(calls, key=lambda e: -e.cpu_time_total):
            print(f"    {e.key:40} {e.count / 10:5.1f} per step, {e.cpu_time_total / 10:8.1f} µs per step")


if __name__ == "__main__":
    main()
