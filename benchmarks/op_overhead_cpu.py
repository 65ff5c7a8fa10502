"""Host overhead of @tritongrad.op's own machinery, on the CPU: kernel launches are stubbed out.

    python -m benchmarks.op_overhead_cpu [EXAMPLE ...]

The same comparison as ``benchmarks/op_overhead.py`` (seed 003's sin kernel, its derived
backward, a hand-written ``torch.autograd.Function`` launching the same kernels), but
Triton's launch is replaced by a function that returns at once, before tritongrad wraps
it. Both sides pay the same (stubbed) launches, so the difference is what the launch record adds:
recording, ``LaunchRecord.close``, the autograd node, shadow memory and the backward's bookkeeping.

A shared CPU is noisy: the two sides are timed in alternation, in short runs, and each
figure is the fastest run's time per call. With example names (``softmax rmsnorm``): each example's op
(at 64x256, float32) forward and forward+backward, the backward's graph built anew each step as in training.
"""

from __future__ import annotations

import os
import sys
import time

os.environ["TRITON_INTERPRET"] = "1"  # CPU tensors: kernels are InterpretedFunctions (set before any is defined)

from triton.runtime.interpreter import InterpretedFunction  # noqa: E402


def _no_launch(self, *args, grid, warmup, **kwargs):
    return None


InterpretedFunction.run = _no_launch  # before tritongrad.install wraps it: the launch record records, nothing runs

import torch  # noqa: E402

from benchmarks.op_overhead import HandSin, N, op_sin, print_table  # noqa: E402

CALLS, RUNS = 200, 60


def fastest_us(*fns) -> list[float]:
    """Per function: the fastest of RUNS runs of CALLS calls, in microseconds per call."""
    best = [float("inf")] * len(fns)
    for fn in fns:
        for _ in range(CALLS):
            fn()
    for _ in range(RUNS):
        for i, fn in enumerate(fns):
            start = time.perf_counter()
            for _ in range(CALLS):
                fn()
            best[i] = min(best[i], (time.perf_counter() - start) / CALLS * 1e6)
    return best


def fastest_backward_us(x: torch.Tensor, dy: torch.Tensor, *forwards) -> list[float]:
    """Per forward: the fastest run of CALLS backwards alone (the graphs are built beforehand)."""
    best = [float("inf")] * len(forwards)
    for _ in range(RUNS):
        for i, forward in enumerate(forwards):
            outputs = [forward() for _ in range(CALLS)]
            start = time.perf_counter()
            for y in outputs:
                torch.autograd.grad(y, x, dy)
            best[i] = min(best[i], (time.perf_counter() - start) / CALLS * 1e6)
    return best


def examples_us(names: list[str]) -> None:
    from tritongrad import examples

    rows = []
    for name in names:
        example = examples.get(name)
        inputs = [t.requires_grad_() if t.is_floating_point() else t for t in example.make_inputs((64, 256))]
        first = example.op(*inputs)
        outputs = list(first) if isinstance(first, (tuple, list)) else [first]
        grads = [torch.randn_like(o) for o in outputs]

        def step(op=example.op, inputs=inputs, grads=grads):
            out = op(*inputs)
            torch.autograd.backward(list(out) if isinstance(out, (tuple, list)) else [out], grads)

        rows.append((name, *fastest_us(lambda op=example.op, inputs=inputs: op(*inputs), step)))
    print("CPU, launches stubbed: host time per call of each example's op, microseconds (64x256 float32)")
    print("| example | forward | forward + backward |\n| --- | --- | --- |")
    for name, forward, both in rows:
        print(f"| {name} | {forward:.1f} | {both:.1f} |")


def main() -> None:
    if len(sys.argv) > 1:
        return examples_us(sys.argv[1:])
    x = torch.randn(N, requires_grad=True)
    dy = torch.randn(N)
    rows = []
    with torch.no_grad():
        rows.append(("forward, no grad", *fastest_us(lambda: HandSin.apply(x), lambda: op_sin(x))))
    rows.append(("forward, recording", *fastest_us(lambda: HandSin.apply(x), lambda: op_sin(x))))
    rows.append(("forward + backward", *fastest_us(lambda: torch.autograd.grad(HandSin.apply(x), x, dy),
                                                   lambda: torch.autograd.grad(op_sin(x), x, dy))))
    rows.append(("backward", *fastest_backward_us(x, dy, lambda: HandSin.apply(x), lambda: op_sin(x))))
    print_table(f"CPU, launches stubbed: host time per call, microseconds (tensor of {N} floats)", rows)


if __name__ == "__main__":
    main()
