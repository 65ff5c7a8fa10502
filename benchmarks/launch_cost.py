"""Host cost of one Triton launch by argument count and by keyword or position, and of the torch operations
a backward adds around its kernels (GPU): the floor under an op's host time.

    python3 benchmarks/launch_cost.py
"""
import time

import torch
import triton
import triton.language as tl


@triton.jit
def k5(a, b, c, n, BLOCK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    tl.store(b + i, tl.load(a + i, mask=i < n), mask=i < n)


@triton.jit
def k25(a, b, c, d, e, f, g, h, s1, s2, s3, s4, s5, s6, s7, s8, n1, n2, n3, n4, n5, n6, n7, n,
        BLOCK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    tl.store(b + i, tl.load(a + i, mask=i < n), mask=i < n)


def per_call(fn, reps=2000):
    for _ in range(100):
        fn()
    torch.cuda.synchronize()
    best = 1e9
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(reps):
            fn()
        best = min(best, (time.perf_counter() - start) / reps * 1e6)
        torch.cuda.synchronize()
    return best


x = torch.randn(1 << 20, device="cuda")
ts = [torch.empty(1024, device="cuda") for _ in range(8)]
ints = [4096, 1, 4096, 1, 128, 1, 64, 1, 3, 5, 7, 9, 11, 13, 15]
names = list(k25.arg_names)
kw = dict(zip(names, [*ts, *ints, 1000], strict=False))
print(f"5 args positional   {per_call(lambda: k5[(1,)](ts[0], ts[1], ts[2], 1000, BLOCK=1024)):6.1f} µs")
print(f"25 args positional  {per_call(lambda: k25[(1,)](*ts, *ints, 1000, BLOCK=1024)):6.1f} µs")
print(f"25 args keyword     {per_call(lambda: k25[(1,)](**kw, BLOCK=1024)):6.1f} µs")
print(f"torch.empty         {per_call(lambda: torch.empty(4096, device='cuda')):6.1f} µs")
print(f"torch.zeros         {per_call(lambda: torch.zeros(4096, device='cuda')):6.1f} µs")
print(f"x.sum(0)            {per_call(lambda: x.view(256, -1).sum(0)):6.1f} µs")
print(f"add_                {per_call(lambda: ts[0].add_(ts[1])):6.1f} µs")
