"""Where the host time of an example op's forward+backward goes on a GPU: wall time per step of the
named op (torch.library) and of the same host function under the bare @tritongrad.op
(autograd.Function), beside Liger-Kernel's (where installed) and eager PyTorch's, then cProfile's
top entries for the two ops.

    python3 benchmarks/host_profile.py rmsnorm 8192x4096 bfloat16 [tottime]
"""

import cProfile
import pstats
import sys
import time

import torch

import tritongrad
from tritongrad import examples
from tritongrad.tools.bench.competitors import implementations
from tritongrad.tools.sizes import parse_size

name, size, dtype = sys.argv[1], parse_size(sys.argv[2]), getattr(torch, sys.argv[3])
example = examples.get(name)
inputs = [t.requires_grad_(t.is_floating_point()) if isinstance(t, torch.Tensor) else t
          for t in example.make_inputs(size, device="cuda", dtype=dtype)]
outs = example.op(*inputs)
grads = [torch.randn_like(o) for o in (outs if isinstance(outs, tuple) else (outs,))]


def step(op=example.op):
    out = op(*inputs)
    torch.autograd.backward(list(out) if isinstance(out, tuple) else [out], grads)


bare = tritongrad.op(example.op.__wrapped__)
others = [(i.name, i.make()) for i in implementations(example, ["liger", "eager"], sys.argv[3]) if i.make]
for label, op in (("named op", example.op), ("bare op", bare), ("named op", example.op), *others):
    for _ in range(20):
        step(op)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(100):
        step(op)
    queued = time.perf_counter()  # the host's part: the device runs behind (its queue holds 100 steps)
    torch.cuda.synchronize()
    print(f"{name} {sys.argv[2]} {sys.argv[3]}, {label}: {(time.perf_counter() - start) * 1e4:.1f} µs per "
          f"forward+backward (wall), {(queued - start) * 1e4:.1f} µs of it on the host")
for label, op in (("named op", example.op), ("bare op", bare)):
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(100):
        step(op)
    torch.cuda.synchronize()
    profile.disable()
    print(f"-- cProfile, {label}, 100 steps")
    pstats.Stats(profile).sort_stats(sys.argv[4] if len(sys.argv) > 4 else "cumulative").print_stats(30)
