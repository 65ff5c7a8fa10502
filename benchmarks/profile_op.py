"""Where an op's host time goes: cProfile of repeated forward+backward calls.

    python -m benchmarks.profile_op          # on a GPU
    python -m benchmarks.profile_op --cpu    # launches stubbed out (see benchmarks/op_overhead_cpu.py)
"""

import cProfile
import pstats
import sys

if "--cpu" in sys.argv:
    import benchmarks.op_overhead_cpu  # noqa: F401  (stubs Triton's launch before the op is defined)

import torch  # noqa: E402

from benchmarks.op_overhead import op_sin  # noqa: E402

device = "cpu" if "--cpu" in sys.argv else "cuda"
x = torch.randn(1000, device=device, requires_grad=True)
dy = torch.randn(1000, device=device)
for _ in range(50):
    torch.autograd.grad(op_sin(x), x, dy)
if device == "cuda":
    torch.cuda.synchronize()
profile = cProfile.Profile()
profile.enable()
for _ in range(500):
    torch.autograd.grad(op_sin(x), x, dy)
if device == "cuda":
    torch.cuda.synchronize()
profile.disable()
pstats.Stats(profile).sort_stats("tottime").print_stats(30)
