"""The flash-attention example's forward under other block sizes and warps: forward and backward time of each, its
derived backward following, beside SDPA's forward and backward, in one run.

    python -m benchmarks.attention_blocks                       # an H200: the training step's layer and N=8192
    python -m benchmarks.attention_blocks --shapes 4x16x2048x128 --configs 64x64x4x3 128x64x8x3

A config is BMxBNxWARPSxSTAGES; a shape BxHxNxD (causal). Backward time = median(fwd+bwd) - median(fwd), each
from triton.testing.do_bench, bf16.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel

import tritongrad
from tritongrad.examples.flash_attention import flash_attention_kernel, softmax_scale
from tritongrad.examples.launch import compute_type


def op_for(bm: int, bn: int, warps: int, stages: int):
    @tritongrad.op(f"attention_blocks::bm{bm}_bn{bn}_w{warps}_s{stages}")
    def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        n, d = q.shape[-2:]
        o = torch.empty_like(q)
        flash_attention_kernel[(triton.cdiv(n, bm), q.numel() // (n * d))](
            q, k, v, o, n, d, softmax_scale(d), BM=bm, BN=bn, BD=max(16, triton.next_power_of_2(d)), CAUSAL=True,
            COMPUTE=compute_type(q.dtype), num_warps=warps, num_stages=stages)
        return o

    return attention


def timed(fn, q, k, v, g) -> tuple[float, float]:
    fwd = triton.testing.do_bench(lambda: fn(q, k, v), warmup=50, rep=200)

    def step():
        q.grad = k.grad = v.grad = None
        fn(q, k, v).backward(g)

    both = triton.testing.do_bench(step, warmup=50, rep=200)
    return fwd, both - fwd


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shapes", nargs="*", default=["4x16x2048x128", "1x16x8192x128"])
    p.add_argument("--configs", nargs="*", default=["64x64x4x3", "128x64x8x3", "128x64x4x3", "128x32x4x3"])
    a = p.parse_args()
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}, bf16, causal")
    print("| shape | forward | fwd ms | bwd ms | fwd / SDPA | bwd / SDPA | max |dq| err vs SDPA |")
    print("|---|---|---|---|---|---|---|")
    for shape in a.shapes:
        b, h, n, d = map(int, shape.split("x"))
        q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
        g = torch.randn_like(q)
        sdpa = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)  # noqa: E731
        base = timed(sdpa, q, k, v, g)  # (the backend PyTorch picks: cuDNN's on an H200)
        q.grad = None
        sdpa(q, k, v).backward(g)
        want = q.grad.clone()
        print(f"| {shape} | SDPA | {base[0]:.3f} | {base[1]:.3f} | 1 | 1 | |")
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):  # the flash backend, which the target names
            flash = timed(sdpa, q, k, v, g)
        print(f"| {shape} | SDPA flash | {flash[0]:.3f} | {flash[1]:.3f} | {flash[0] / base[0]:.2f} "
              f"| {flash[1] / base[1]:.2f} | |")
        for config in a.configs:
            op = op_for(*map(int, config.split("x")))
            try:
                fwd, bwd = timed(op, q, k, v, g)
                q.grad = None
                op(q, k, v).backward(g)
                err = (q.grad.float() - want.float()).abs().max().item()
                print(f"| {shape} | {config} | {fwd:.3f} | {bwd:.3f} | {fwd / base[0]:.2f} | {bwd / base[1]:.2f} "
                      f"| {err:.1e} |", flush=True)
            except Exception as e:  # noqa: BLE001 (out of shared memory, registers: said, and the next config)
                print(f"| {shape} | {config} | failed: {type(e).__name__}: {str(e)[:120]} | | | | |", flush=True)


if __name__ == "__main__":
    main()
