"""Whether an example op's forward+backward waits for the device, and where: torch's sync debug mode
raises at the first synchronizing operation after a few warm-up steps; its stack is printed.

    python3 benchmarks/sync_probe.py cross_entropy 8192x32768 bfloat16
"""

import sys
import traceback

import torch

from tritongrad import examples
from tritongrad.tools.sizes import parse_size

name, size, dtype = sys.argv[1], parse_size(sys.argv[2]), getattr(torch, sys.argv[3])
example = examples.get(name)
inputs = [t.requires_grad_(t.is_floating_point()) if isinstance(t, torch.Tensor) else t
          for t in example.make_inputs(size, device="cuda", dtype=dtype)]


def step():
    out = example.op(*inputs)
    outs = list(out) if isinstance(out, tuple) else [out]
    torch.autograd.backward(outs, [torch.ones_like(o) for o in outs])
    for t in inputs:
        if isinstance(t, torch.Tensor):
            t.grad = None


for _ in range(5):
    step()
torch.cuda.synchronize()
torch.cuda.set_sync_debug_mode("error")
try:
    step()
    print(f"{name} {sys.argv[2]} {sys.argv[3]}: no synchronizing operation in a forward+backward")
except RuntimeError:
    print(f"{name} {sys.argv[2]} {sys.argv[3]}: a forward+backward waits for the device here:")
    traceback.print_exc()
finally:
    torch.cuda.set_sync_debug_mode(0)
