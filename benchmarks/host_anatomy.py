"""What one step of an op costs the host, layer by layer, at sizes whose GPU work is negligible (so the GPU
never holds the host back): a bare Triton launch of the softmax kernel, the example's launch helper, the
named op without and with recording, its forward+backward, a minimal hand-written autograd.Function of one
launch each way (the floor any op's step pays on this host), and the flash attention op's forward and step.

    PYTHONPATH=$PWD python3 benchmarks/host_anatomy.py

Prints µs of host time per call (300 calls queued, after 20 warm-up calls).
"""

import gc
import threading
import time

import torch
import triton.language as tl

from tritongrad.examples import flash_attention, softmax
from tritongrad.host import backward as op_backward

CALLS = 300


def host_us(fn) -> float:
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(CALLS):
        fn()
    spent = (time.perf_counter() - start) / CALLS * 1e6
    torch.cuda.synchronize()
    return round(spent, 1)


def launch(src: torch.Tensor, dst: torch.Tensor) -> None:
    """The softmax kernel over 64 rows of 4096."""
    softmax.softmax_kernel[(64,)](src, dst, 4096, 4096, BLOCK=4096, COMPUTE=tl.float32)


class HandWritten(torch.autograd.Function):
    """A minimal hand-written op of one launch each way (the backward launches the same kernel: its cost, not its
    gradient, is the point)."""

    @staticmethod
    def forward(ctx, t):
        out = torch.empty_like(t)
        launch(t, out)
        return out

    @staticmethod
    def backward(ctx, d):
        dx = torch.empty_like(d)
        launch(d, dx)
        return dx


def main() -> None:
    x = torch.randn(64, 4096, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    y, g = torch.empty_like(x), torch.randn_like(x)

    def no_grad():
        with torch.no_grad():
            softmax.softmax(x)

    def step(op):
        def run():
            x.grad = None
            torch.autograd.backward([op(x)], [g])
        return run

    print("softmax 64x4096 bf16, µs of host per call:")
    print("  Triton launch                     ", host_us(lambda: launch(x, y)))
    print("  the example's launch helper       ", host_us(lambda: softmax.softmax_launch(x.detach())()))
    print("  op forward, no grad               ", host_us(no_grad))
    print("  op forward, recording             ", host_us(lambda: softmax.softmax(x)))
    print("  op forward+backward               ", host_us(step(softmax.softmax)))
    print("  autograd.Function, one launch each", host_us(step(HandWritten.apply)))
    threads = set()
    run = op_backward.PlannedBackward.run

    def spy(self, *args, **kwargs):
        threads.add(threading.get_ident())
        return run(self, *args, **kwargs)

    op_backward.PlannedBackward.run = spy
    step(softmax.softmax)()
    op_backward.PlannedBackward.run = run
    print("  the backward runs on the calling thread:", threads == {threading.get_ident()})

    q, k, v = (torch.randn(1, 2, 256, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    d_o = torch.randn_like(q)

    def attention_forward():
        q.grad = k.grad = v.grad = None
        flash_attention.flash_attention(q, k, v, True)

    def attention_step():
        q.grad = k.grad = v.grad = None
        torch.autograd.backward([flash_attention.flash_attention(q, k, v, True)], [d_o])

    print("flash attention 1x2x256x64 causal bf16:")
    print("  forward (recording)               ", host_us(attention_forward))
    print("  forward+backward                  ", host_us(attention_step))
    gc.disable()
    print("  forward+backward, gc off          ", host_us(attention_step))
    gc.enable()


if __name__ == "__main__":
    main()
