"""How the forward's tiles change the derived attention backward: the flash_attention op at 16x4096x64 bf16
under (BM, BN) = (64, 64), (128, 64), (64, 128), (128, 128), causal and not. Step times through the op
(host included), backward = fwd+bwd - fwd, triton.testing.do_bench medians.

    PYTHONPATH=$PWD python3 benchmarks/attention_tiles_probe.py
"""

import torch
import triton

from tritongrad.examples import flash_attention as fa


def backward_ms(causal: bool, tiles: tuple[int, int]) -> tuple[float, float]:
    """(forward, forward+backward) ms of the op with the example's launch taking ``tiles``."""
    fa.blocks_for = lambda n: tiles  # the example's launch asks this for its tiles
    q, k, v = (torch.randn(1, 16, 4096, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    g = torch.randn_like(q)

    def forward():
        return fa.flash_attention(q, k, v, causal)

    def step():
        torch.autograd.backward(forward(), g)

    step()
    return triton.testing.do_bench(forward, warmup=50, rep=300), triton.testing.do_bench(step, warmup=50, rep=300)


torch.manual_seed(0)
for causal in (True, False):
    for tiles in ((64, 64), (128, 64), (64, 128), (128, 128)):
        fwd, both = backward_ms(causal, tiles)
        print(f"causal={causal} tiles={tiles}: fwd {fwd:.3f} ms, fwd+bwd {both:.3f}, bwd {both - fwd:.3f}", flush=True)
