"""What would make the derived attention backward faster, measured before building it: the flash_attention op
at 16x4096x64 bf16 with its derived kernels edited as text (each variant below), their launch settings forced
per kernel. Per variant: the GPU time of each backward kernel per step (torch.profiler), the op's backward
(fwd+bwd - fwd, do_bench medians), and the gradients' largest error against SDPA in float32 (an edit that
breaks them shows).

    PYTHONPATH=$PWD python3 benchmarks/attention_backward_probe.py [VARIANT ...]
"""

import json
import os
import re
import subprocess
import sys

import torch
import triton

DQ, DKV = "flash_attention_kernel_bwd_q_ptr", "flash_attention_kernel_bwd_k_ptr_v_ptr"

# variant -> {kernel name: (edits, launch options, key block)}; edits name functions below
VARIANTS = {
    "derived": {},
    "tuned": {},  # the tuner's setting (one for all the kernels)
    "w8s2": {DQ: ((), {"num_warps": 8, "num_stages": 2}, None), DKV: ((), {"num_warps": 8, "num_stages": 2}, None)},
    "w4s2": {DQ: ((), {"num_warps": 4, "num_stages": 2}, None), DKV: ((), {"num_warps": 4, "num_stages": 2}, None)},
    "no_guard": {DKV: (("no_guard",), {}, None)},
    "kv128": {DKV: ((), {"num_warps": 8}, 128)},
    "kv128_no_guard": {DKV: (("no_guard",), {"num_warps": 8}, 128)},
    "kv128_w4": {DKV: (("no_guard",), {"num_warps": 4}, 128)},
    "q128": {DQ: ((), {"num_warps": 8}, 128)},
    "q128_w4": {DQ: ((), {"num_warps": 4}, 128)},
}


def no_guard(src: str) -> str:
    """Causal: loop over the query blocks from the first that reaches the key block (no guard inside)."""
    head = "for pid_0 in range(0, programs):"
    if "if start_iteration < start_trips:" not in src:
        return src
    assert src.count(head) == 1
    lines = src.split("\n")
    out, inside = [], None
    for line in lines:
        if line.strip() == "if start_iteration < start_trips:":
            inside = len(line) - len(line.lstrip())
            continue
        if inside is not None and line.strip() and len(line) - len(line.lstrip()) <= inside:
            inside = None
        out.append(line[4:] if inside is not None and line.strip() else line)
    src = "\n".join(out)
    return src.replace(head, "for pid_0 in range(start_iteration * BN // BM if CAUSAL else 0, programs):")


EDITS = {"no_guard": no_guard}


class Forced:
    """A derived kernel launched with given options (and a key block of its own: BN, grid along axis 0)."""

    def __init__(self, kernel, options, block):
        self.kernel, self.options, self.block = kernel, options, block
        self.arg_names = kernel.arg_names

    def __getitem__(self, grid):
        def launch(**args):
            args = {**args, **self.options}
            g = grid
            if self.block is not None:
                if self.kernel.fn.__name__ == DKV:
                    g = (triton.cdiv(grid[0] * args["BN"], self.block), *grid[1:])
                args["BN"] = self.block
            return self.kernel[g](**args)
        return launch


def run(variant: str) -> dict:
    from tritongrad import codegen
    from tritongrad.examples import flash_attention as fa

    plan = VARIANTS[variant]
    real = codegen.compile_kernel

    def compile_kernel(src, name, program):
        base = name.removesuffix("_prologue")
        edits, options, block = plan.get(base, ((), {}, None))
        for e in edits:
            src = EDITS[e](src)
        kernel = real(src, name, program)
        return kernel if name.endswith("_prologue") or base not in plan else Forced(kernel, options, block)

    codegen.compile_kernel = compile_kernel
    return {f"causal={causal}": measure(fa, causal) for causal in (True, False)}


def measure(fa, causal: bool) -> dict:
    from torch.profiler import ProfilerActivity, profile

    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 16, 4096, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    g = torch.randn_like(q)
    leaves = [t.detach().float().requires_grad_() for t in (q, k, v)]
    want = torch.autograd.grad(fa.reference(*leaves, causal), leaves, g.float())
    got = torch.autograd.grad(fa.flash_attention(q, k, v, causal), (q, k, v), g)
    err = max(((a.float() - b).abs().max() / b.abs().max()).item() for a, b in zip(got, want, strict=True))

    def forward():
        return fa.flash_attention(q, k, v, causal)

    def step():
        torch.autograd.backward(forward(), g)
        q.grad = k.grad = v.grad = None

    step()
    fwd = triton.testing.do_bench(forward, warmup=50, rep=300)
    both = triton.testing.do_bench(step, warmup=50, rep=300)
    for _ in range(5):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(10):
            step()
        torch.cuda.synchronize()
    kernels = {e.key[:60]: round(getattr(e, "device_time_total", 0) / 10, 1) for e in prof.key_averages()
               if "flash_attention_kernel_bwd" in e.key}
    return {"bwd_ms": round(both - fwd, 3), "rel_err": float(f"{err:.2e}"), **kernels}


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--one":
        print("RESULT " + json.dumps(run(sys.argv[2])), flush=True)
        sys.exit(0)
    for variant in sys.argv[1:] or list(VARIANTS):
        env = {**os.environ, "TRITONGRAD_TUNE": "1" if variant == "tuned" else "0"}
        done = subprocess.run([sys.executable, __file__, "--one", variant], capture_output=True, text=True, env=env)
        line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT ")), None)
        if line is None:
            print(f"{variant}: FAILED\n{done.stderr[-2500:]}", flush=True)
            continue
        for mode, row in json.loads(line[7:]).items():
            short = {re.sub(r"flash_attention_kernel_bwd_?", "", k) or "dq?": us for k, us in row.items()}
            print(f"{variant:14s} {mode:12s} {short}", flush=True)
