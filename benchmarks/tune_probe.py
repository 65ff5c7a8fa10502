"""Which launch settings make a derived backward kernel fast (development probe for backward tuning):
the derived kernels of Liger-Kernel's forwards, timed alone (do_bench median) across num_warps and, for
persistent kernels, programs per multiprocessor.

    PYTHONPATH=/tmp/site:$PWD python3 benchmarks/tune_probe.py
"""

from __future__ import annotations

import os

import torch
import triton

from benchmarks.probe_lowering import CASES, inputs
from tritongrad.runtime import derive


def capture(name, dtype):
    """The derived kernel launches of one backward, with their arguments."""
    op = CASES[name][0]
    args = [a.requires_grad_() for a in inputs(name, 16384, 4096, dtype)]
    g = torch.randn(16384, 4096, device="cuda", dtype=dtype)
    launches = []
    real = derive.BackwardKernel.launch

    def spy(self, grid, named, output_grads, buffers, prepared, written=frozenset(), pad=0):
        launches.append((self, grid, dict(named), dict(output_grads), dict(buffers), prepared, written))
        return real(self, grid, named, output_grads, buffers, prepared, written, pad)

    derive.BackwardKernel.launch = spy
    try:
        for _ in range(2):
            op(*args).backward(g)
    finally:
        derive.BackwardKernel.launch = real
    return launches[-1]


def main():
    os.environ["TRITONGRAD_TUNE"] = "0"  # the settings below, not the tuned one
    print(torch.cuda.get_device_name())
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for name in ("rmsnorm", "layernorm", "softmax", "swiglu"):
        for dtype in (torch.bfloat16, torch.float32):
            bwd, grid, named, outs, bufs, prepared, written = capture(name, dtype)
            persistent = prepared.variant.axis is not None
            results = []
            for warps in (4, 8, 16):
                for waves in ((1, 2, 4, 8) if persistent else (1,)):
                    derive._persistent_programs = lambda n, d, w=waves: min(n, sms * w)
                    launch = (grid, {**named, "num_warps": warps}, outs, bufs, prepared, written)

                    def run(bwd=bwd, launch=launch):
                        bwd.launch(*launch)

                    try:
                        ms = triton.testing.do_bench(run, warmup=10, rep=50, return_mode="median")
                    except Exception as e:  # noqa: BLE001
                        ms = float("nan")
                        print("   ", warps, waves, type(e).__name__, str(e)[:80])
                    results.append((ms, warps, waves))
            results.sort()
            print(f"{name:10} {str(dtype)[6:]:9} forward warps {named.get('num_warps')}: " +
                  "  ".join(f"{ms * 1000:6.1f}us w{w} x{v}" for ms, w, v in results[:6]), flush=True)
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
