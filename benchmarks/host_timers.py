"""Where an op's host time goes, without a profiler's own cost: the functions named below are wrapped
with timers (inclusive time, about a microsecond each), and one forward+backward step is run many times.

    python3 benchmarks/host_timers.py rmsnorm 16384x4096 bfloat16

Prints microseconds per step for each timed function (inclusive: nested ones are counted in their callers).
"""

import sys
import time
from collections import defaultdict

import torch
import triton

from tritongrad import examples
from tritongrad.host import launch_record
from tritongrad.host.backward import PlannedBackward
from tritongrad.runtime import derive, launching, variants
from tritongrad.tools.sizes import parse_size

STEPS = 200
spent: dict[str, float] = defaultdict(float)


def timed(owner, attribute: str, label: str) -> None:
    fn = getattr(owner, attribute)

    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            kernel = getattr(args[0], "__name__", "") if label.startswith("JIT") else ""
            spent[f"{label} {kernel}"] += time.perf_counter() - start

    setattr(owner, attribute, wrapper)


def main() -> None:
    name, size, dtype_name = sys.argv[1], parse_size(sys.argv[2]), sys.argv[3]
    example = examples.get(name)
    inputs = [t.requires_grad_(t.is_floating_point()) if isinstance(t, torch.Tensor) else t
              for t in example.make_inputs(size, device="cuda", dtype=getattr(torch, dtype_name))]
    outs = example.op(*inputs)
    grads = [torch.randn_like(o) for o in (outs if isinstance(outs, tuple) else (outs,))]
    tensors = [t for t in inputs if isinstance(t, torch.Tensor) and t.requires_grad]

    def step():
        for t in tensors:
            t.grad = None
        out = example.op(*inputs)
        torch.autograd.backward(list(out) if isinstance(out, tuple) else [out], grads)

    def forward():
        for t in tensors:
            t.grad = None
        return example.op(*inputs)

    for _ in range(20):
        step()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(STEPS):
        forward()
    print(f"forward alone (recording): {(time.perf_counter() - start) / STEPS * 1e6:.1f} µs host")
    torch.cuda.synchronize()
    for owner, attribute, label in (
            (launch_record.LaunchRecord, "record", "LaunchRecord.record"),
            (launch_record.LaunchRecord, "close", "LaunchRecord.close"),
            (triton.runtime.jit.JITFunction, "run", "JITFunction.run"),
            (PlannedBackward, "run", "PlannedBackward.run (backward)"),
            (PlannedBackward, "_shadow", "PlannedBackward._shadow"),
            (derive.BackwardKernel, "launch", "BackwardKernel.launch"),
            (launching.Launches, "run_part", "Launches.run_part"),
            (PlannedBackward, "_input_grads", "_input_grads"),
            (launching, "persistent_programs", "persistent_programs"),
            (variants.Part, "scratch_args", "Part.scratch_args"), (variants.Part, "add_later", "Part.add_later"),
            (torch, "zeros", "torch.zeros"), (torch, "empty", "torch.empty"), (torch.Tensor, "sum", "Tensor.sum"),
            (torch.Tensor, "copy_", "Tensor.copy_"), (torch.Tensor, "add_", "Tensor.add_"),
            (PlannedBackward, "_run_step", "PlannedBackward._run_step"),
            (PlannedBackward, "_launch", "PlannedBackward._launch"),
            (launching.Launches, "run_interchanged", "Launches.run_interchanged")):
        if hasattr(owner, attribute):
            timed(owner, attribute, label)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(STEPS):
        step()
    total = time.perf_counter() - start
    torch.cuda.synchronize()
    print(f"{name} {sys.argv[2]} {dtype_name}: {total / STEPS * 1e6:.1f} µs host per forward+backward step")
    for label, seconds in spent.items():
        print(f"  {label:28} {seconds / STEPS * 1e6:8.1f}")


if __name__ == "__main__":
    main()
