"""The partial rows' sum, two ways: torch (``sum(0)`` then a cast copy into a half-precision gradient, or
``sum(out=)`` into a float32 one) against one Triton kernel summing the rows in a fixed order and storing
the gradient in its dtype. GPU µs (CUDA-graph replays of 50 sums, per sum) and host µs per call (the Triton
kernel launched as a backward launches it, past Triton's binding).

    python3 benchmarks/row_sums_probe.py
"""
import time

import torch
import triton
import triton.language as tl

from tritongrad.runtime.relaunch import Relauncher


@triton.jit
def sum_rows(rows_ptr, out_ptr, programs, span, row_stride, BLOCK: tl.constexpr, ROWS: tl.constexpr):
    cols = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < span
    acc = tl.zeros([BLOCK], rows_ptr.dtype.element_ty)
    for r in range(0, programs, ROWS):
        rr = r + tl.arange(0, ROWS)
        tile = tl.load(rows_ptr + rr[:, None] * row_stride + cols[None, :],
                       mask=(rr[:, None] < programs) & mask[None, :], other=0.0)
        acc += tl.sum(tile, axis=0)
    tl.store(out_ptr + cols, acc.to(out_ptr.dtype.element_ty), mask=mask)


def torch_sum(rows, out):
    if out.dtype == rows.dtype:
        torch.sum(rows, 0, out=out)
    else:
        out.copy_(rows.sum(0))


def triton_sum(block, nrows, warps):
    def run(rows, out):
        span = rows.shape[1]
        sum_rows[(triton.cdiv(span, block),)](rows, out, rows.shape[0], span, rows.stride(0), BLOCK=block,
                                              ROWS=nrows, num_warps=warps)
    return run


def relaunched(block, nrows, warps):
    """As the backward would launch it: past Triton's binding (relaunch.py)."""
    kept = {}

    def run(rows, out):
        span = rows.shape[1]
        grid = (triton.cdiv(span, block),)
        launcher = kept.get(grid) or kept.setdefault(grid, Relauncher(sum_rows, grid))
        launcher({"rows_ptr": rows, "out_ptr": out, "programs": rows.shape[0], "span": span,
                  "row_stride": rows.stride(0), "BLOCK": block, "ROWS": nrows, "num_warps": warps})
    return run


def gpu_us(fn, rows, out, n=50):
    for _ in range(3):
        fn(rows, out)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(n):
            fn(rows, out)
    return triton.testing.do_bench(g.replay, return_mode="median") * 1e3 / n


def host_us(fn, rows, out, reps=2000):
    best = 1e9
    for _ in range(5):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(reps):
            fn(rows, out)
        best = min(best, (time.perf_counter() - start) / reps * 1e6)
    return best


sms = torch.cuda.get_device_properties(0).multi_processor_count
configs = [(b, r, w) for b in (32, 64, 128, 256) for r in (4, 8, 16) for w in (1, 2, 4)]
print(f"{torch.cuda.get_device_name()}, {sms} SMs; GPU µs per sum (host µs per call)")
print("| programs | span | out | torch | best Triton (block, rows, warps) | Triton at the rule |")
print("| --- | --- | --- | --- | --- | --- |")
for waves in (1, 2, 4, 8):
    for span in (1024, 4096, 16384):
        for dtype in (torch.bfloat16, torch.float32):
            rows = torch.randn(sms * waves, span, device="cuda")
            out = torch.empty(span, device="cuda", dtype=dtype)
            want = rows.sum(0).to(dtype)
            t_torch = gpu_us(torch_sum, rows, out)
            found = []
            for c in configs:
                fn = triton_sum(*c)
                fn(rows, out)
                torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-4)  # another order of summing
                found.append((gpu_us(fn, rows, out), c))
            best, c = min(found)
            rule = (64 if span <= 4096 else 128, 8, 2)
            t_rule = dict((cc, t) for t, cc in found)[rule]
            h_torch, h_rule = host_us(torch_sum, rows, out), host_us(relaunched(*rule), rows, out)
            print(f"| {sms * waves} | {span} | {str(dtype)[6:]} | {t_torch:.1f} ({h_torch:.1f}) | {best:.1f} {c} | "
                  f"{t_rule:.1f} ({h_rule:.1f}) |")
