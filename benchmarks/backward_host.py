"""Where the host time of a derived backward goes on a GPU, at a size whose GPU work is negligible: the
softmax op's forward and backward against a minimal hand-written autograd.Function (one launch each way),
the backward alone (graphs built beforehand), the time inside tritongrad's replay and inside Triton's launch
of the derived kernel, and that launch three ways: by keyword through Triton (as the replay launches it),
positional, and through the compiled kernel's own launcher; and Triton's binding of the arguments alone.

    PYTHONPATH=$PWD python3 benchmarks/backward_host.py

Prints µs of host time per call.
"""

import time

import torch

from benchmarks.host_anatomy import HandWritten
from tritongrad.examples import softmax
from tritongrad.ops import backward as op_backward
from tritongrad.runtime import derive

CALLS = 300


def host_us(fn, calls=CALLS) -> float:
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - start) / calls * 1e6)
        torch.cuda.synchronize()
    return round(best, 1)


def backward_us(forward, x, g) -> float:
    """The backward alone: graphs built beforehand, then each one's backward queued."""
    best = float("inf")
    for _ in range(5):
        outs = [forward(x) for _ in range(CALLS)]
        torch.cuda.synchronize()
        start = time.perf_counter()
        for y in outs:
            torch.autograd.backward([y], [g])
        best = min(best, (time.perf_counter() - start) / CALLS * 1e6)
        torch.cuda.synchronize()
        x.grad = None
    return round(best, 1)


def main() -> None:
    x = torch.randn(64, 4096, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    g = torch.randn_like(x)

    def step(op):
        def run():
            x.grad = None
            torch.autograd.backward([op(x)], [g])
        return run

    rows = []
    for label, op in (("hand-written Function", HandWritten.apply), ("tritongrad op", softmax.softmax)):
        fwd = host_us(lambda op=op: op(x))
        both = host_us(step(op))
        rows.append((label, fwd, both, backward_us(op, x, g)))
    print("softmax 64x4096 bf16, µs of host per call: forward / forward+backward / backward alone")
    for row in rows:
        print(f"  {row[0]:24} {row[1]:8} {row[2]:8} {row[3]:8}")

    # inside tritongrad's backward: the replay, and the launch of the derived kernel
    spent = {"replay": 0.0, "launch": 0.0}
    captured = {}
    run, launch_run = op_backward.OpBackward.run, derive.BackwardKernel._run_part

    def timed_replay(self, *args, **kwargs):
        start = time.perf_counter()
        try:
            return run(self, *args, **kwargs)
        finally:
            spent["replay"] += time.perf_counter() - start

    def timed_launch(self, part, grid, args, *rest, **kwargs):
        start = time.perf_counter()
        try:
            return launch_run(self, part, grid, args, *rest, **kwargs)
        finally:
            spent["launch"] += time.perf_counter() - start
            captured.update(kernel=part.kernel, grid=grid, kwargs=dict(args))

    op_backward.OpBackward.run, derive.BackwardKernel._run_part = timed_replay, timed_launch
    spent.update(replay=0.0, launch=0.0)
    backward_us(softmax.softmax, x, g)  # 5 x CALLS backwards
    op_backward.OpBackward.run, derive.BackwardKernel._run_part = run, launch_run
    n = 5 * CALLS
    print(f"  in the backward: OpBackward.run {spent['replay'] / n * 1e6:.1f} µs, of it the launch of the derived "
          f"kernel (BackwardKernel._run_part) {spent['launch'] / n * 1e6:.1f}")

    kernel, kwargs, grid = captured["kernel"], captured["kwargs"], captured["grid"]
    options = {k: kwargs.pop(k) for k in ("num_warps", "num_stages") if k in kwargs}
    params = [p.name for p in kernel.params]
    positional = [kwargs[p] for p in params]
    compiled = kernel[grid](**kwargs, **options)
    device = torch.cuda.current_device()
    binder = kernel.device_caches[device][-1]
    bound = list(binder(**kwargs, **options)[0].values())
    stream = torch.cuda.current_stream().cuda_stream
    g3 = (*grid, 1, 1)[:3]

    def direct():
        compiled.run(g3[0], g3[1], g3[2], stream, compiled.function, compiled.packed_metadata,
                     compiled.launch_metadata(grid, stream, *bound), None, None, *bound)

    print(f"derived kernel `{kernel.fn.__name__}` ({len(params)} parameters), µs per launch:")
    print("  by keyword                  ", host_us(lambda: kernel[grid](**kwargs, **options), 2000))
    print("  positional                  ", host_us(lambda: kernel[grid](*positional, **options), 2000))
    print("  the compiled kernel's run   ", host_us(direct, 2000))
    print("  Triton's binder alone       ", host_us(lambda: binder(**kwargs, **options), 2000))
    print("  torch.empty_like            ", host_us(lambda: torch.empty_like(x), 2000))


if __name__ == "__main__":
    main()
