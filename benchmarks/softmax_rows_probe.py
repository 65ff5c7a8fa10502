"""Where a wide-row softmax backward's time goes (development probe): the derived backward kernel alone at each
num_warps (µs, registers, spills) beside a hand-written one that reads the saved output y instead of replaying it,
bf16, at 16384x16384 and 16384x4096.

    python3 benchmarks/softmax_rows_probe.py [VARIANT]

VARIANT: ``derived`` (the kernel ``grad`` derives alone), ``kept`` (the one an op derives: its output saved, ``y``
read back, stored_outputs.py); older ones changed the replaying source before it is compiled (to see what its
arithmetic cost; ``no-exp`` computes a wrong gradient, to bound the exponential's share): ``reciprocal`` (the
adjoints' divisions by the row's sum as products with its reciprocal), ``reciprocal-all`` (the replayed ``y``
too), ``no-exp``. ``--dtype float32`` for float32 rows (bf16 by default).
"""

from __future__ import annotations

import sys

import torch
import triton
import triton.language as tl
from triton.testing import do_bench

import tritongrad
from tritongrad.codegen import generate as codegen
from tritongrad.examples import softmax

REWRITES = {
    "derived": (),
    "kept": (),
    "reciprocal": (("d_y / denominator", "d_y * (1.0 / denominator)"),
                   ("-d_y * y / denominator", "-d_y * y * (1.0 / denominator)")),
    "no-exp": (("tg.exp(z)", "z"),),
}
REWRITES["reciprocal-all"] = (*REWRITES["reciprocal"],
                              ("y = numerator / denominator", "y = numerator * (1.0 / denominator)"))


@triton.jit
def backward_reading_y(y_ptr, dy_ptr, dx_ptr, stride, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    y = tl.load(y_ptr + row * stride + cols, mask=mask, other=0.0).to(tl.float32)
    dy = tl.load(dy_ptr + row * stride + cols, mask=mask, other=0.0).to(tl.float32)
    dot = tl.sum(y * dy, axis=0)
    tl.store(dx_ptr + row * stride + cols, y * (dy - dot), mask=mask)


def main() -> None:
    variant = sys.argv[1] if len(sys.argv) > 1 else "derived"
    jit_source = codegen.jit_source

    def rewritten(src, name, scope):
        for old, new in REWRITES[variant]:
            src = src.replace(old, new)
        return jit_source(src, name, scope)

    codegen.jit_source = rewritten
    dtype = torch.float32 if "--dtype" in sys.argv and sys.argv[sys.argv.index("--dtype") + 1] == "float32" \
        else torch.bfloat16
    bwd = tritongrad.grad(softmax.softmax_kernel, kept_outputs=("y_ptr",) if variant == "kept" else ())
    for rows, cols in ((16384, 16384), (16384, 4096)):
        x = torch.randn(rows, cols, device="cuda", dtype=dtype)
        y, dy, dx = torch.softmax(x.float(), -1).to(dtype), torch.randn_like(x), torch.empty_like(x)
        block = triton.next_power_of_2(cols)
        named = {"x_ptr": x, "y_ptr": y, "stride": cols, "n_cols": cols, "BLOCK": block, "COMPUTE": tl.float32}
        part = bwd.prepare(named, (rows,), frozenset(), frozenset()).variant.parts[0]
        args = {**named, part.shadows["y_ptr"]: dy, part.shadows["x_ptr"]: dx}
        for warps in (4, 8, 16, 32):
            derived, t = timed(part.kernel, (rows,), (), {**args, "num_warps": warps})
            derived_dx = dx.clone()
            hand, t_hand = timed(backward_reading_y, (rows,), (y, dy, dx, cols, cols),
                                 {"BLOCK": block, "num_warps": warps})
            differ = (derived_dx.float() - dx.float()).abs().max().item()
            print(f"{variant} {dtype} {rows}x{cols} warps {warps:2d}: derived {t * 1e3:6.1f} µs ({derived.n_regs} "
                  f"registers, {derived.n_spills} spilled) | reading y {t_hand * 1e3:6.1f} µs ({hand.n_regs} "
                  f"registers) | largest difference {differ:.2e}")


def timed(kernel, grid: tuple, args: tuple, kwargs: dict):
    """The compiled kernel (its registers and spills) and do_bench's median in ms."""
    compiled = kernel[grid](*args, **kwargs)
    return compiled, do_bench(lambda: kernel[grid](*args, **kwargs), warmup=50, rep=300)

if __name__ == "__main__":
    main()
