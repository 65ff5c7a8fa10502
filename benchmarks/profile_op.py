"""Where an op's host time goes: cProfile of repeated forward+backward calls (on a GPU).

    python benchmarks/profile_op.py
"""

import cProfile
import pstats

import torch

from benchmarks.op_overhead import op_sin

x = torch.randn(1000, device="cuda", requires_grad=True)
dy = torch.randn(1000, device="cuda")
for _ in range(50):
    torch.autograd.grad(op_sin(x), x, dy)
torch.cuda.synchronize()
profile = cProfile.Profile()
profile.enable()
for _ in range(500):
    torch.autograd.grad(op_sin(x), x, dy)
torch.cuda.synchronize()
profile.disable()
pstats.Stats(profile).sort_stats("tottime").print_stats(30)
