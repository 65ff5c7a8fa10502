"""Where a wide-row layer norm backward's time goes (development probe): the derived backward kernel that an op
launches (mean and rstd read back, weight and bias summed in partial rows by a persistent loop) alone, at each
num_warps and programs per multiprocessor, with its source changed first, beside a hand-written kernel of the same
structure (Liger's formula: two independent row sums).

    python3 benchmarks/layernorm_rows_probe.py [--dtype float32] [--size 16384x16384] [VARIANT ...]

VARIANT: ``derived`` (as built); ``independent`` (the mean's adjoint summed from the terms of the centred row's
adjoint, ``sum(a + s * xc) = sum(a) + s * sum(xc)``, so that neither row sum waits for the other); ``w-in-loop``
(the weight loaded in every iteration rather than held in registers across the loop); ``both``. Prints µs (do_bench
median), registers and spills, and the largest difference of dx from the hand-written kernel's.
"""

from __future__ import annotations

import sys

import torch
import triton
import triton.language as tl
from triton.testing import do_bench

import tritongrad
from tritongrad.codegen import generate as codegen
from tritongrad.examples import layernorm

INDEPENDENT = (
    ("        d_xc = d_xc_times_rstd * rstd\n",
     "        d_xc = d_xc_times_rstd * rstd\n"
     "        probe_first = tl.sum(tl.where(mask, d_xc, 0.0), axis=0)\n"
     "        probe_xc = tl.sum(xc, axis=0)\n"),
    ("d_mean = tg.unbroadcast(-d_x_minus_mean, mean)",
     "d_mean = -(probe_first + 2.0 * d_sum_xc_times_xc * probe_xc)"),
)
W_LOAD = "    w = tl.load(w_ptr + cols, mask=mask, other=0.0)\n"


def w_in_loop(src: str) -> str:
    head, loop = src.split("    for row in ", 1)
    line, rest = loop.split("\n", 1)
    return head.replace(W_LOAD, "") + "    for row in " + line + "\n    " + W_LOAD + rest


VARIANTS = {
    "derived": lambda src: src,
    "independent": lambda src: _replaced(src, INDEPENDENT),
    "w-in-loop": w_in_loop,
}
VARIANTS["both"] = lambda src: w_in_loop(VARIANTS["independent"](src))


def _replaced(src: str, pairs) -> str:
    for old, new in pairs:
        if old not in src:
            raise SystemExit(f"not in the derived source: {old!r}")
        src = src.replace(old, new)
    return src


@triton.jit
def hand_written(x_ptr, w_ptr, mean_ptr, rstd_ptr, dy_ptr, dx_ptr, dw_ptr, db_ptr, stride, N, rows,
                 BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    dw = tl.zeros([BLOCK], tl.float32)
    db = tl.zeros([BLOCK], tl.float32)
    for row in tl.range(pid, rows, tl.num_programs(0)):
        x = tl.load(x_ptr + row * stride + cols, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + row * stride + cols, mask=mask, other=0.0).to(tl.float32)
        mean = tl.load(mean_ptr + row)
        rstd = tl.load(rstd_ptr + row)
        xhat = tl.where(mask, (x - mean) * rstd, 0.0)
        wdy = w * dy
        c1 = tl.sum(xhat * wdy, axis=0) / N
        c2 = tl.sum(wdy, axis=0) / N
        dx = (wdy - (xhat * c1 + c2)) * rstd
        tl.store(dx_ptr + row * stride + cols, dx.to(dx_ptr.dtype.element_ty), mask=mask)
        dw += dy * xhat
        db += dy
    tl.store(dw_ptr + pid * N + cols, dw, mask=mask)
    tl.store(db_ptr + pid * N + cols, db, mask=mask)


def main() -> None:
    argv = sys.argv[1:]
    dtype, size = torch.bfloat16, (16384, 16384)
    if "--dtype" in argv:
        dtype = getattr(torch, argv.pop(argv.index("--dtype") + 1))
        argv.remove("--dtype")
    if "--size" in argv:
        size = tuple(int(s) for s in argv.pop(argv.index("--size") + 1).split("x"))
        argv.remove("--size")
    variants = argv or list(VARIANTS)
    compiled = {}
    jit_source = codegen.jit_source

    def capture(src, name, scope):
        compiled[name] = (src, scope)
        return jit_source(src, name, scope)

    codegen.jit_source = capture
    bwd = tritongrad.grad(layernorm.layernorm_kernel, ("x_ptr", "w_ptr", "b_ptr"), ("y_ptr",),
                          kept_outputs=("mean_ptr", "rstd_ptr"))
    rows, n = size
    device = "cuda" if torch.cuda.is_available() else "cpu"  # cpu: TRITON_INTERPRET=1, to try the rewrites
    x, w, b = layernorm.make_inputs(size, device=device, dtype=dtype)
    launch = layernorm.layernorm_launch(x, w, b)
    launch()
    mean, rstd = launch.args[4], launch.args[5]
    dy = torch.randn_like(x)
    named = dict(zip(("x_ptr", "w_ptr", "b_ptr", "y_ptr", "mean_ptr", "rstd_ptr", "stride", "N", "eps"), launch.args,
                     strict=True))
    named.update({k: v for k, v in launch.kwargs.items() if k != "num_warps"})
    part = bwd.prepare(named, (rows,), frozenset(), frozenset()).variant.parts[0]
    assert part.persistent, "expected the persistent variant"
    src, scope = compiled[bwd.name]
    assert src == part.src, "the captured source is not the launched part's"
    sms = torch.cuda.get_device_properties(0).multi_processor_count if device == "cuda" else 2
    dx_hand = torch.empty_like(x)
    print(f"layernorm backward {rows}x{n} {dtype}, µs (registers, spilled); {sms} multiprocessors")
    for waves in (1, 2):
        programs = sms * waves
        dw_rows = torch.empty(programs, n, device=device, dtype=torch.float32)
        db_rows = torch.empty_like(dw_rows)
        for warps in (8, 16, 32):
            hand, t_hand = timed(hand_written, (programs,), (x, w, mean, rstd, dy, dx_hand, dw_rows, db_rows, n, n,
                                                              rows), {"BLOCK": named["BLOCK"], "num_warps": warps})
            line = f"waves {waves} warps {warps:2d}: hand-written {t_hand * 1e3:6.1f} ({hand.n_regs}, {hand.n_spills})"
            for variant in variants:
                kernel = jit_source(VARIANTS[variant](src), bwd.name, scope)
                dx = torch.empty_like(x)
                args = {**named, part.shadows["y_ptr"]: dy, part.shadows["x_ptr"]: dx,
                        part.shadows["w_ptr"]: dw_rows, part.shadows["b_ptr"]: db_rows, part.programs: rows,
                        part.rows["w_ptr"]: n, part.rows["b_ptr"]: n, part.stages: 1, "num_warps": warps}
                found, t = timed(kernel, (programs,), (), args)
                differ = (dx.float() - dx_hand.float()).abs().max().item()
                line += f" | {variant} {t * 1e3:6.1f} ({found.n_regs}, {found.n_spills}) diff {differ:.1e}"
            print(line, flush=True)


def timed(kernel, grid: tuple, args: tuple, kwargs: dict):
    """The compiled kernel (its registers and spills) and do_bench's median in ms."""
    compiled = kernel[grid](*args, **kwargs)
    if not torch.cuda.is_available():
        return Interpreted(), 0.0
    return compiled, do_bench(lambda: kernel[grid](*args, **kwargs), warmup=25, rep=150)


class Interpreted:
    n_regs = n_spills = "-"


if __name__ == "__main__":
    main()
