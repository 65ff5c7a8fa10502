"""Layer norm at long rows: a forward that reads each row in blocks (mean, variance, then the output: three loops,
as Triton's tutorial writes it) derived by tritongrad, against the bundled one-block example and Liger-Kernel's
hand-written Function (the target: layer norm at 16384 columns no slower than Liger).

    PYTHONPATH=/tmp/site:$PWD python benchmarks/layernorm_chunked.py [--sizes 16384x16384 16384x4096]

The derived backward writes each element of dx once: the three loads' adjoints are summed in one loop
(reverse/rereads.py). Backward ms as ``median(fwd+bwd) - median(fwd)``, eager and from a CUDA graph, every
implementation alike, each first checked against float32 PyTorch.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import traceback
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import tritongrad  # noqa: E402
from benchmarks.tutorial_backwards import check, time_backward  # noqa: E402
from tritongrad.examples.layernorm import layernorm as one_block  # noqa: E402
from tritongrad.tools.bench.measure import do_bench_median, graph_median  # noqa: E402


@triton.jit
def layer_norm_in_blocks(x_ptr, w_ptr, b_ptr, y_ptr, mean_ptr, rstd_ptr, stride, n, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    x_row, y_row = x_ptr + row * stride, y_ptr + row * stride
    total = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, n, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        total += tl.load(x_row + cols, mask=cols < n, other=0.0).to(tl.float32)
    mean = tl.sum(total, axis=0) / n
    squares = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, n, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        centred = tl.where(cols < n, tl.load(x_row + cols, mask=cols < n, other=0.0).to(tl.float32) - mean, 0.0)
        squares += centred * centred
    rstd = 1.0 / tl.sqrt(tl.sum(squares, axis=0) / n + eps)
    tl.store(mean_ptr + row, mean)
    tl.store(rstd_ptr + row, rstd)
    for start in range(0, n, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < n
        x = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + cols, mask=mask)
        b = tl.load(b_ptr + cols, mask=mask)
        tl.store(y_row + cols, (x - mean) * rstd * w + b, mask=mask)


def in_blocks(block: int, warps: int):
    @tritongrad.op
    def layer_norm(x, w, b):
        y = torch.empty_like(x)
        mean = torch.empty(x.shape[0], device=x.device, dtype=torch.float32)
        rstd = torch.empty_like(mean)
        layer_norm_in_blocks[(x.shape[0],)](x, w, b, y, mean, rstd, x.stride(0), x.shape[1], 1e-5, BLOCK=block,
                                            num_warps=warps)
        return y

    return layer_norm


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", nargs="*", default=["16384x16384", "16384x4096"])
    p.add_argument("--blocks", nargs="*", type=int, default=[1024, 2048, 4096])
    args = p.parse_args()
    impls = {f"blocks of {b}": in_blocks(b, 8 if b >= 2048 else 4) for b in args.blocks}
    impls["one block (bundled)"] = lambda x, w, b: one_block(x, w, b, 1e-5)
    try:
        liger = importlib.import_module("liger_kernel.ops.layer_norm").LigerLayerNormFunction
        impls["liger"] = lambda x, w, b: liger.apply(x, w, b, 1e-5)
    except ImportError as e:
        print(f"no Liger: {e}")
    impls["torch"] = lambda x, w, b: F.layer_norm(x, x.shape[-1:], w, b, 1e-5)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}")
    print("| size | dtype | " + " | ".join(impls) + " |")
    print("|" + " --- |" * (len(impls) + 2))
    for size in args.sizes:
        m, n = map(int, size.split("x"))
        for dtype in (torch.bfloat16, torch.float32):
            def make_inputs(m=m, n=n, dtype=dtype):
                g = torch.Generator(device="cuda").manual_seed(0)
                return [(0.5 + torch.randn(m, n, device="cuda", generator=g)).to(dtype),
                        torch.rand(n, device="cuda", generator=g).to(dtype),
                        torch.rand(n, device="cuda", generator=g).to(dtype)]
            errors, cells = {}, []
            for name, fn in impls.items():  # every check first: a failed graph capture cannot spoil another's
                try:
                    errors[name] = check({"torch": impls["torch"], name: fn}, make_inputs)[name]
                except Exception as e:
                    traceback.print_exc()
                    errors[name] = f"failed: {type(e).__name__}"
            for name, fn in impls.items():
                if isinstance(errors[name], str):
                    cells.append(errors[name])
                    continue
                try:
                    eager, graph = (time_backward(fn, make_inputs, t) for t in (do_bench_median, graph_median))
                    cells.append(f"{eager:.3f} / {graph:.3f} ({errors[name]:.0e})")
                except Exception as e:  # one failure is a cell, not the end of the run
                    traceback.print_exc()
                    cells.append(f"failed: {type(e).__name__}")
            print(f"| {size} | {str(dtype).split('.')[-1]} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
