"""Host overhead of @tritongrad.op over a hand-written torch.autograd.Function.

    python benchmarks/op_overhead.py        # on a GPU

Both launch the same kernels (seed 003's sin forward, its derived backward) on a tiny
tensor, so the time per call is host time: what the op machinery adds is the
difference. Each figure is the median over repeats of a loop of calls, per call; the
"backward" row times backwards alone, on graphs built beforehand.
``benchmarks/op_overhead_cpu.py`` measures the same without a GPU (launches stubbed out).
"""

from __future__ import annotations

import statistics
import time

import torch
import triton

import tritongrad
from tritongrad.examples.sin import BLOCK_SIZE, _sin

N = 1000
GRID = (triton.cdiv(N, BLOCK_SIZE),)
backward_kernel = tritongrad.grad(_sin)


class HandSin(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        y = torch.empty_like(x)
        _sin[GRID](x, y, x.numel(), BLOCK_SIZE=BLOCK_SIZE)
        ctx.save_for_backward(x, y)
        return y

    @staticmethod
    def backward(ctx, dy):
        x, y = ctx.saved_tensors
        dx = torch.zeros_like(x)
        backward_kernel[GRID](x, y, x.numel(), dy.contiguous(), dx, BLOCK_SIZE=BLOCK_SIZE)
        return dx


@tritongrad.op
def op_sin(x):
    y = torch.empty_like(x)
    _sin[GRID](x, y, x.numel(), BLOCK_SIZE=BLOCK_SIZE)
    return y


def per_call_us(fn, calls=2000, repeats=7) -> float:
    for _ in range(200):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        samples.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(samples)


def backward_us(forward, dy, x, calls=2000, repeats=7) -> float:
    """Per call of the backward alone: the graphs are built beforehand."""
    samples = []
    for _ in range(repeats + 1):
        outputs = [forward() for _ in range(calls)]
        torch.cuda.synchronize()
        start = time.perf_counter()
        for y in outputs:
            torch.autograd.grad(y, x, dy)
        torch.cuda.synchronize()
        samples.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(samples[1:])  # the first run warms up


def print_table(title: str, rows: list[tuple[str, float, float]]) -> None:
    """``rows``: (label, hand-written µs, op µs)."""
    print(title)
    print(f"{'':22}{'autograd.Function':>18}{'tritongrad.op':>15}{'overhead':>10}")
    for label, hand, ours in rows:
        print(f"{label:22}{hand:18.1f}{ours:15.1f}{ours - hand:10.1f}")


def main() -> None:
    x = torch.randn(N, device="cuda", requires_grad=True)
    dy = torch.randn(N, device="cuda")
    (ours,) = torch.autograd.grad(op_sin(x), x, dy)
    (hand,) = torch.autograd.grad(HandSin.apply(x), x, dy)
    torch.testing.assert_close(ours, hand)
    rows = []
    with torch.no_grad():
        rows.append(("forward, no grad", per_call_us(lambda: HandSin.apply(x)), per_call_us(lambda: op_sin(x))))
    rows.append(("forward, recording", per_call_us(lambda: HandSin.apply(x)), per_call_us(lambda: op_sin(x))))
    rows.append(("forward + backward", per_call_us(lambda: torch.autograd.grad(HandSin.apply(x), x, dy)),
                 per_call_us(lambda: torch.autograd.grad(op_sin(x), x, dy))))
    rows.append(("backward", backward_us(lambda: HandSin.apply(x), dy, x), backward_us(lambda: op_sin(x), dy, x)))
    print_table(f"{torch.cuda.get_device_name()}: host time per call, microseconds (tensor of {N} floats)", rows)


if __name__ == "__main__":
    main()
