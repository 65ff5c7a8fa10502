"""Derived backward kernels against PyTorch eager and torch.compile, side by side.

    python benchmarks/backward_speed.py          # on a GPU; prints a table, writes results.csv to $OUT

Each row times the backward of one bundled example at a realistic size: the derived
kernel (including zero-filling its gradient buffers, as the calling convention asks),
Liger-Kernel's hand-written Triton backward where it has one (carried to the GPU as a
wheel; see RESULTS.md), autograd through the plain-PyTorch reference, and autograd
through torch.compile of that reference. Times are medians from triton.testing.do_bench; ratios are against
the derived kernel (above 1: the derived kernel is faster).
"""

from __future__ import annotations

import csv
import os

import torch
import triton

import tritongrad
from tritongrad.examples import get
from tritongrad.testing import bind_launch, shadow_like

# example -> its inputs at benchmark size
CASES = {
    "sin": lambda: (torch.randn(64 * 2**20, device="cuda"),),
    "softplus": lambda: (torch.randn(64 * 2**20, device="cuda"),),
    "swiglu": lambda: (torch.randn(8192, 4096, device="cuda"), torch.randn(8192, 4096, device="cuda")),
    "softmax": lambda: (torch.randn(8192, 4096, device="cuda"),),
    "rmsnorm": lambda: (torch.randn(8192, 4096, device="cuda"), torch.randn(4096, device="cuda")),
}


def derived_backward(example, inputs):
    """The derived backward of the example's forward launch, ready to time."""
    launch = example.launch(*inputs)
    launch()
    bwd = tritongrad.grad(launch.kernel)
    named = bind_launch(launch.kernel, launch.args, launch.kwargs)
    d_out = torch.randn_like(launch.out)
    shadows = {bwd.shadow_params[launch.output]: d_out}
    wrt = {bwd.shadow_params[w]: shadow_like(named[w]) for w in bwd.wrt}

    def run():
        for buffer in wrt.values():
            buffer.zero_()
        bwd[launch.grid](**named, **shadows, **wrt)

    return run, d_out


def hand_written(name):
    """Liger-Kernel's autograd.Function for the example, if installed."""
    try:
        from liger_kernel.ops.rms_norm import LigerRMSNormFunction
        from liger_kernel.ops.softmax import LigerSoftmaxFunction
        from liger_kernel.ops.swiglu import LigerSiLUMulFunction
    except ImportError:
        return None
    return {
        "rmsnorm": lambda x, w: LigerRMSNormFunction.apply(x, w, 1e-6),
        "softmax": LigerSoftmaxFunction.apply,
        "swiglu": LigerSiLUMulFunction.apply,
    }.get(name)


def autograd_backward(reference, inputs, d_out):
    leaves = [t.detach().clone().requires_grad_() for t in inputs]
    out = reference(*leaves)
    return lambda: torch.autograd.grad(out, leaves, d_out, retain_graph=True)


def main() -> None:
    rows = []
    for name, make in CASES.items():
        example, inputs = get(name), make()
        derived, d_out = derived_backward(example, inputs)
        eager = autograd_backward(example.reference, inputs, d_out)
        compiled = autograd_backward(torch.compile(example.reference), inputs, d_out)
        hand = hand_written(name)
        hand = autograd_backward(hand, inputs, d_out) if hand else None
        bench = lambda fn: triton.testing.do_bench(fn, warmup=50, rep=200, return_mode="median") if fn else None
        times = {label: bench(fn) for label, fn in
                 (("derived", derived), ("hand", hand), ("eager", eager), ("compile", compiled))}
        rows.append({"example": name, "shape": "x".join(map(str, inputs[0].shape)), **times})
        torch.cuda.empty_cache()
    print(f"{torch.cuda.get_device_name()}, float32; backward time in ms (median), ratio = other / derived")
    labels = ("derived", "hand", "eager", "compile")
    print(f"{'example':10} {'shape':>11}" + "".join(f"{k:>9}" for k in labels)
          + "".join(f"{k + '/der':>12}" for k in labels[1:]))
    for r in rows:
        cells = "".join(f"{r[k]:9.3f}" if r[k] else f"{'-':>9}" for k in labels)
        ratios = "".join(f"{r[k] / r['derived']:12.2f}" if r[k] else f"{'-':>12}" for k in labels[1:])
        print(f"{r['example']:10} {r['shape']:>11}{cells}{ratios}")
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, "backward_speed.csv"), "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)


if __name__ == "__main__":
    main()
