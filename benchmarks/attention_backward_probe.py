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
    "peeled": {DQ: (("peeled",), {}, None)},
    "peeled_w8": {DQ: (("peeled",), {"num_warps": 8}, None)},
    "peeled_both": {DQ: (("peeled",), {}, None), DKV: (("peeled_kv",), {}, None)},
    "versioned_both": {DQ: (("versioned",), {}, None), DKV: (("versioned_kv",), {}, None)},
    # dQ from the dK/dV kernel (FlashAttention-2's five products, not seven): float32 atomics, no dQ kernel
    "fused_dq": {DQ: ((), {"stash": True}, None), DKV: (("fused_dq",), {"dq32": True}, None)},
    "fused_dq_acq_rel": {DQ: ((), {"stash": True}, None), DKV: (("fused_dq_acq_rel",), {"dq32": True}, None)},
    # exp -> exp2, log2(e) folded into the scale and the max
    "exp2": {DQ: (("exp2",), {}, None), DKV: (("exp2",), {}, None)},
    "exp2_unfolded": {DQ: (("exp2_unfolded",), {}, None), DKV: (("exp2_unfolded",), {}, None)},
    "fused_dq_exp2": {DQ: ((), {"stash": True}, None), DKV: (("fused_dq", "exp2"), {"dq32": True}, None)},
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


def _loop(src: str, pattern: str) -> tuple[int, str, str, str]:
    """The loop whose header matches ``pattern`` (its variable and bound as groups 2 and 3): where it starts,
    its text, its indent and its bound."""
    found = re.search(r"\n( +)" + pattern + r"\n", src)
    assert found, pattern
    indent, at = found.group(1), found.start() + 1
    lines = src[at:].split("\n")
    body = [lines[0]]
    for line in lines[1:]:
        if line.strip() and len(line) - len(line.lstrip()) <= len(indent):
            break
        body.append(line)
    return at, "\n".join(body), indent, found.group(3)


def _unmasked(loop: str) -> str:
    """The loop body with the attention mask dropped: the forward's `where` and the backward's."""
    forward = re.search(r"tl\.where\((\w+), s, float\('-inf'\)\)", loop)
    backward = re.search(r"tl\.where\((\w+), d_s_1, 0\.0\)", loop)
    assert forward and backward and forward.group(1) == backward.group(1), "the mask's two uses"
    return loop.replace(forward.group(0), "s").replace(backward.group(0), "d_s_1")


def peeled(src: str) -> str:
    """dQ: the key blocks whose mask is all true (every key before the block's first query, and inside N) run
    first, in a loop without the mask (the forward's `where` and the backward's dropped); the rest as derived."""
    at, loop, indent, end = _loop(src, r"for (start) in range\(0, (\w+), BN\):")
    causal = "rn[None, :] <= rm[:, None]" in loop
    bound = "(tl.program_id(0) * BM + 1) // BN * BN" if causal else end
    split = f"{indent}split = tl.minimum(tl.minimum({end}, {bound}), N // BN * BN)\n"
    header = f"for start in range(0, {end}, BN):"
    free = _unmasked(loop).replace(header, "for start in range(0, split, BN):", 1)
    rest = loop.replace(header, f"for start in range(split, {end}, BN):", 1)
    return src[:at] + split + free + "\n" + rest + src[at + len(loop):]


def peeled_kv(src: str) -> str:
    """dK/dV: for a key block inside N, the query blocks past its last key (causal; all of them otherwise) run
    in a loop without the mask; the others as derived."""
    if not re.search(r"\n +for (pid_0|program_id_0) in range\(0, programs\):\n", src):
        return src  # the prologue (named after the kernel it feeds)
    at, loop, indent, programs = _loop(src, r"for (pid_0|program_id_0) in range\(0, (programs)\):")
    var = "pid_0" if "for pid_0 " in loop.split("\n")[0] else "program_id_0"
    causal = "rn[None, :] <= rm[:, None]" in loop
    first = "tl.minimum(programs, (start + BN + BM - 2) // BM)" if causal else "0"
    split = f"{indent}split = tl.where(start + BN <= N, {first}, programs)\n"
    header = f"for {var} in range(0, programs):"
    rest = loop.replace(header, f"for {var} in range(0, split):", 1)
    free = _unmasked(loop).replace(header, f"for {var} in range(split, programs):", 1)
    return src[:at] + split + rest + "\n" + free + src[at + len(loop):]


def _versioned(loop: str, indent: str, test: str) -> str:
    """The loop with its body in two versions: without the mask where ``test`` (every lane visible), else as is."""
    header, *body = loop.split("\n")
    inner = indent + "    "
    free = _unmasked(loop).split("\n")[1:]
    shift = lambda lines: ["    " + line if line.strip() else line for line in lines]  # noqa: E731
    return "\n".join([header, f"{inner}if {test}:", *shift(free), f"{inner}else:", *shift(body)])


def versioned(src: str) -> str:
    """dQ: each key block tests whether its mask is all true (a scalar, the same for the whole program) and
    runs a version of the body without it if so."""
    at, loop, indent, _ = _loop(src, r"for (start) in range\(0, (\w+), BN\):")
    causal = "rn[None, :] <= rm[:, None]" in loop
    test = "(start + BN <= N)" + (" & (start + BN - 1 <= tl.program_id(0) * BM)" if causal else "")
    return src[:at] + _versioned(loop, indent, test) + src[at + len(loop):]


def versioned_kv(src: str) -> str:
    """dK/dV: the same test per query block."""
    if not re.search(r"\n +for (pid_0|program_id_0) in range\(0, programs\):\n", src):
        return src
    at, loop, indent, _ = _loop(src, r"for (pid_0|program_id_0) in range\(0, (programs)\):")
    var = "pid_0" if "for pid_0 " in loop.split("\n")[0] else "program_id_0"
    causal = "rn[None, :] <= rm[:, None]" in loop
    test = "(start + BN <= N)" + (f" & (start + BN - 1 <= tl.cast({var}, tl.int32) * BM)" if causal else "")
    return src[:at] + _versioned(loop, indent, test) + src[at + len(loop):]


def fused_dq(src: str, sem: str = "relaxed") -> str:
    """dK/dV: also dQ's term of each (query block, key block) pair, added into a float32 buffer (``dq32_ptr``)."""
    if f"def {DKV}(" not in src:
        return src  # the prologue
    src = src.replace("prologue_slots):", "prologue_slots, dq32_ptr):", 1)
    product = "d_k = tl.dot(d_dot_q.to(q.dtype), q)"
    assert product in src, "the dK product"
    out = []
    for line in src.split("\n"):
        out.append(line)
        if line.strip() == product:
            indent = line[:len(line) - len(line.lstrip())]
            out.append(f"{indent}tl.atomic_add(dq32_ptr + head * N * D + rm[:, None] * D + rd[None, :], "
                       "tl.dot(tl.trans(d_dot_q.to(k.dtype)), k), mask=(rm[:, None] < N) & (rd[None, :] < D), "
                       f"sem='{sem}')")
    return "\n".join(out)


def exp2(src: str) -> str:
    """P = exp2(S * (scale * log2 e) - m * log2 e): one multiply fewer per score than exp's own."""
    log2e = "1.4426950408889634"
    for old, new in ((" = to_dot_q * scale", f" = to_dot_q * (scale * {log2e})"),
                     ("m_new = m_i_final", f"m_new = m_i_final * {log2e}"),
                     ("p = tl.exp(s_1_minus_m_new_b)", "p = tl.exp2(s_1_minus_m_new_b)")):
        if "_prologue(" not in src.split("\n")[1]:
            assert old in src, old
        src = src.replace(old, new)
    return src


def exp2_unfolded(src: str) -> str:
    """P = exp2((S - m) * log2 e): exp's own multiply, written out."""
    return src.replace("p = tl.exp(s_1_minus_m_new_b)", "p = tl.exp2(s_1_minus_m_new_b * 1.4426950408889634)")


EDITS = {"fused_dq": fused_dq, "fused_dq_acq_rel": lambda src: fused_dq(src, "acq_rel"), "exp2": exp2,
         "exp2_unfolded": exp2_unfolded, "no_guard": no_guard, "peeled": peeled, "peeled_kv": peeled_kv,
         "versioned": versioned, "versioned_kv": versioned_kv}


STASH = {}  # fused_dq: the dQ buffer the replay allocated, written from the dK/dV kernel's float32 sums


class Forced:
    """A derived kernel launched with given options (and a key block of its own: BN, grid along axis 0)."""

    def __init__(self, kernel, options, block):
        self.kernel, self.options, self.block = kernel, options, block
        self.arg_names = kernel.arg_names

    def __getitem__(self, grid):
        def launch(**args):
            options = dict(self.options)
            if options.pop("stash", False):  # dQ: the dK/dV kernel writes it (fused_dq)
                STASH["d_q"] = args["d_q_ptr"]
                return None
            if options.pop("dq32", False):
                dq32 = torch.zeros(STASH["d_q"].shape, device=STASH["d_q"].device, dtype=torch.float32)
                done = self.kernel[grid](**args, **options, dq32_ptr=dq32)
                STASH.pop("d_q").copy_(dq32)
                return done
            args = {**args, **options}
            g = grid
            if self.block is not None:
                if self.kernel.fn.__name__ == DKV:
                    g = (triton.cdiv(grid[0] * args["BN"], self.block), *grid[1:])
                args["BN"] = self.block
            return self.kernel[g](**args)
        return launch


def run(variant: str) -> dict:
    from tritongrad.codegen import generate as codegen
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
