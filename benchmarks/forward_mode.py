"""Forward mode and second order, measured: the JVP of the flash-attention example against its forward
and PyTorch's options, and Hessian-vector products of rmsnorm and softmax against PyTorch's double backward.

    python -m benchmarks.forward_mode --out forward_mode.md        # a GPU: every part, bfloat16 attention
    python -m benchmarks.forward_mode --parts attention --seqs 1024 --dims 64
    python -m benchmarks.forward_mode --parts hvp --hvp-dtypes float32
    python -m benchmarks.forward_mode --smoke                      # CPU, Triton's interpreter, tiny shapes (a test)

Attention (tritongrad/examples/flash_attention.py), causal and full, (batch, heads, N, d) = (4, 16, N, d) for N in
{1024, 4096}, d in {64, 128}; per shape:

- ``fwd kernel``: the forward kernel launched alone (its Launch made beforehand): the baseline of ``vs fwd``;
- ``fwd op``: the example's named op on plain tensors (its output allocated per call);
- ``jvp kernel``: ``tritongrad.jvp(kernel)`` launched alone, its buffers made beforehand: the output and its tangent
  in one pass (the issue's goal: at most 2x ``fwd kernel``);
- ``func.jvp(op)``: ``torch.func.jvp`` through the named op, the user's path (the forward's launches, then their
  tangent kernels on tangent memory of their own);
- ``sdpa fwd``: ``F.scaled_dot_product_attention`` (PyTorch's fused attention), for scale;
- ``func.jvp(sdpa)``: ``torch.func.jvp`` of it, where PyTorch has a forward-mode formula (else the error, a note);
- ``func.jvp(sdpa math)``: the same under ``sdpa_kernel(SDPBackend.MATH)``, PyTorch's unfused backend (composite:
  forward AD through its parts);
- ``func.jvp(math)``: ``torch.func.jvp`` of attention in plain PyTorch (scores, softmax, product).

The last two are skipped where their score matrices would not fit in the free memory (a note says so).

A peer that fails in bfloat16 (not for memory) is run again in float32 (the dtype column says). Hessian-vector
products of the rmsnorm and softmax examples (named ops) and of their plain-PyTorch references, at 4096x4096 and
16384x4096, bfloat16 and float32: ``hvp`` = ``g = autograd.grad(<f(x), c>, inputs, create_graph=True)``, then
``autograd.grad(g, inputs, v)`` (the gradient of <g, v>), forward included; beside it the first-order forward and
forward+backward.

Timing: ``triton.testing.do_bench`` medians of eager launches (tritongrad/tools/bench/measure.py's
``do_bench_median``), ms. Correctness: every output and tangent (Hessian-vector product) against PyTorch's in
float64 (attention: batch element 0, forward AD of the math reference), as max |error| / max |reference|, ``ok``
within the forward tolerance of ``tritongrad bench`` (bf16 5e-2, float32 1e-2; float64 1e-9).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

PARTS = ("attention", "hvp")
ATTENTION_IMPLS = ("fwd kernel", "fwd op", "jvp kernel", "func.jvp(op)", "sdpa fwd", "func.jvp(sdpa)",
                   "func.jvp(sdpa math)", "func.jvp(math)")
PEERS = ("sdpa fwd", "func.jvp(sdpa)", "func.jvp(sdpa math)", "func.jvp(math)")  # again in float32 where bf16 fails
UNFUSED = ("func.jvp(sdpa math)", "func.jvp(math)")  # score matrices in memory: skipped where they would not fit
HVP_OPS = ("rmsnorm", "softmax")
TOLERANCE = {"float64": 1e-9}  # beside tritongrad bench's FORWARD_TOLERANCE (half types, float32)
SMOKE = dict(batch=1, heads=2, seqs=[20], dims=[12], hvp_sizes=[(7, 45)], dtype="float64", hvp_dtypes=["float64"])


def parse(argv: list[str] | None) -> argparse.Namespace:
    from tritongrad.tools.sizes import parse_size

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--parts", nargs="*", choices=PARTS, default=list(PARTS))
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--seqs", nargs="*", type=int, default=[1024, 4096], help="attention's sequence lengths N")
    p.add_argument("--dims", nargs="*", type=int, default=[64, 128], help="attention's head sizes d")
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"), help="attention's")
    p.add_argument("--hvp-sizes", nargs="*", type=parse_size, default=[(4096, 4096), (16384, 4096)])
    p.add_argument("--hvp-dtypes", nargs="*", default=["bfloat16", "float32"], choices=("bfloat16", "float32"))
    p.add_argument("--out", type=Path, help="also write the tables here (markdown)")
    p.add_argument("--smoke", action="store_true", help="CPU, Triton's interpreter, tiny shapes in float64, a wall "
                   "clock")
    args = p.parse_args(argv)
    if args.smoke:
        vars(args).update(SMOKE)
    if any(not isinstance(s, tuple) or len(s) != 2 for s in args.hvp_sizes):
        p.error("an --hvp-sizes entry is ROWSxCOLS")
    return args


# -- correctness --------------------------------------------------------------------------------------------------


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    """max |got - want| / max |want| over the elements where want is finite (inf where got is not finite there)."""
    got, want = got.detach().to(want.dtype), want.detach()
    finite = torch.isfinite(want)
    if not torch.isfinite(got[finite]).all():
        return float("inf")
    scale = want[finite].abs().max().item() if finite.any() else 1.0
    return (got - want)[finite].abs().max().item() / max(scale, 1e-30)


def tolerance(dtype_name: str) -> float:
    from tritongrad.tools.bench.measure import FORWARD_TOLERANCE

    return {**FORWARD_TOLERANCE, **TOLERANCE}[dtype_name]


# -- attention's JVP ------------------------------------------------------------------------------------------------


def math_attention(q, k, v, causal: bool):
    """Attention in plain PyTorch, the example's scale (SDPA has no forward AD on a CPU, nor everywhere on a GPU)."""
    from tritongrad.examples import flash_attention

    s = q @ k.transpose(-1, -2) * flash_attention.softmax_scale(q.shape[-1])
    if causal:
        n = q.shape[-2]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return torch.softmax(s, -1) @ v


def math_memory(shape: tuple, dtype: torch.dtype) -> int:
    """Bytes forward AD of the math reference holds at its peak, about: scores, probabilities and their tangents,
    masked copies (eight score matrices), at least float32 wide."""
    b, h, n, _ = shape
    return 8 * b * h * n * n * max(torch.empty((), dtype=dtype).element_size(), 4)


def too_big(shape: tuple, dtype: torch.dtype, device: str) -> str | None:
    """Why forward AD of unfused attention is skipped at a shape (None: it fits in the GPU's free memory)."""
    if device != "cuda":
        return None
    need, free = math_memory(shape, dtype), torch.cuda.mem_get_info()[0]
    return f"skipped: needs ~{need / 2**30:.0f} GiB, {free / 2**30:.0f} GiB free" if need > free else None


def attention_impls(causal: bool) -> dict[str, Callable]:
    """name -> make(q, k, v, tq, tk, tv): a call returning (output, its tangent or None), anything that does not
    belong in the time (a launch's buffers, a derived kernel) made by make."""
    import torch.nn.functional as F

    import tritongrad
    from tritongrad.examples import flash_attention

    def fwd_kernel(q, k, v, *_):
        launch = flash_attention.flash_attention_launch(q, k, v, causal)
        return lambda: (launch(), None)

    def jvp_kernel(q, k, v, tq, tk, tv):
        launch = flash_attention.flash_attention_launch(q, k, v, causal)
        kernel = tritongrad.jvp(launch.kernel, wrt=["q_ptr", "k_ptr", "v_ptr"], outputs=["o_ptr"])
        t_o = torch.empty_like(launch.out)
        given = {"q_ptr": tq, "k_ptr": tk, "v_ptr": tv, "o_ptr": t_o}
        tangents = {kernel.tangent_params[p]: t for p, t in given.items()}
        launched = kernel[launch.grid]

        def call():
            launched(*launch.args, **tangents, **launch.kwargs)
            return launch.out, t_o
        return call

    def op(q, k, v):
        return flash_attention.flash_attention(q, k, v, causal)

    def sdpa(q, k, v):
        scale = flash_attention.softmax_scale(q.shape[-1])
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)

    def sdpa_math(q, k, v):
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with sdpa_kernel(SDPBackend.MATH):
            return sdpa(q, k, v)

    def math(q, k, v):
        return math_attention(q, k, v, causal)

    def forward(fn):
        return lambda q, k, v, *_: lambda: (fn(q, k, v), None)

    def jvp(fn):
        return lambda q, k, v, tq, tk, tv: lambda: torch.func.jvp(fn, (q, k, v), (tq, tk, tv))

    return {"fwd kernel": fwd_kernel, "fwd op": forward(op), "jvp kernel": jvp_kernel, "func.jvp(op)": jvp(op),
            "sdpa fwd": forward(sdpa), "func.jvp(sdpa)": jvp(sdpa), "func.jvp(sdpa math)": jvp(sdpa_math),
            "func.jvp(math)": jvp(math)}


def attention_rows(args, device: str, timer: Callable) -> list[dict]:
    rows = []
    for causal in (True, False):
        for n in args.seqs:
            for d in args.dims:
                rows += attention_shape(args, (args.batch, args.heads, n, d), causal, device, timer)
    return rows


def attention_shape(args, shape: tuple, causal: bool, device: str, timer: Callable) -> list[dict]:
    """Every implementation at one shape: its time and its error against float64 forward AD on batch element 0."""
    torch.manual_seed(0)
    dtype = getattr(torch, args.dtype)
    primals = [torch.randn(shape, device=device, dtype=dtype) for _ in range(3)]
    tangents = [torch.randn(shape, device=device, dtype=dtype) for _ in range(3)]
    wide = [t[:1].double() for t in (*primals, *tangents)]
    want = torch.func.jvp(lambda q, k, v: math_attention(q, k, v, causal), tuple(wide[:3]), tuple(wide[3:]))
    del wide
    rows, base = [], None
    for name, make in attention_impls(causal).items():
        row = {"part": "attention", "mask": "causal" if causal else "full", "shape": shape, "impl": name,
               "dtype": args.dtype, "note": ""}
        rows.append(row)
        tried = [args.dtype] + (["float32"] if name in PEERS and args.dtype != "float32" else [])
        for dtype_name in tried:
            row["dtype"] = dtype_name
            width = getattr(torch, dtype_name)
            if name in UNFUSED and (why := too_big(shape, width, device)):
                row["note"] += f"{dtype_name}: {why}; "
                continue
            try:
                call = make(*[t.to(width) for t in (*primals, *tangents)])
                out, tangent = call()  # (compiles, derives)
                row["err"] = max([relative_error(out[:1], want[0]),
                                  *([relative_error(tangent[:1], want[1])] if tangent is not None else [])])
                row["ok"] = row["err"] <= tolerance(dtype_name)
                del out, tangent
                row["ms"] = timer(call, None)
                row.pop("error", None)
                break
            except Exception as e:  # noqa: BLE001 - an implementation that cannot run is a row that says why
                said = "the same" if row.get("error") == _short(e) else _short(e)
                row["error"] = _short(e)
                row["note"] += f"{dtype_name}: {said}; "
                if isinstance(e, torch.cuda.OutOfMemoryError):
                    break  # (not a dtype it lacks: float32 needs more)
            finally:
                call = None
                _empty_cache(device)
        row["note"] = row["note"].rstrip("; ")
        if "ms" not in row:
            row["dtype"] = args.dtype  # (none ran: the note says why in each dtype tried)
        if name == "fwd kernel":
            base = row.get("ms")
        if base and row.get("ms"):
            row["vs fwd"] = row["ms"] / base
    return rows


# -- Hessian-vector products ----------------------------------------------------------------------------------------


def hvp(fn: Callable, inputs: list[torch.Tensor], cotangent: torch.Tensor, directions: list[torch.Tensor]) -> tuple:
    """The Hessian of <fn(*inputs), cotangent> times the directions: the gradient of <its gradient, directions>."""
    grads = torch.autograd.grad(fn(*inputs), inputs, cotangent, create_graph=True)
    found = torch.autograd.grad(grads, inputs, directions, allow_unused=True)
    return tuple(torch.zeros_like(x) if h is None else h for x, h in zip(inputs, found, strict=True))


def hvp_rows(args, device: str, timer: Callable) -> list[dict]:
    from tritongrad.examples import get

    rows = []
    for name in HVP_OPS:
        example = get(name)
        for size in args.hvp_sizes:
            for dtype_name in args.hvp_dtypes:
                rows += hvp_size(example, size, dtype_name, device, timer)
    return rows


def hvp_size(example, size: tuple, dtype_name: str, device: str, timer: Callable) -> list[dict]:
    """The named op and its reference at one size and dtype: forward, forward+backward and Hessian-vector product
    times, and the product's error against float64 PyTorch's double backward of the reference."""
    torch.manual_seed(0)
    dtype = getattr(torch, dtype_name)
    inputs = [t for t in example.make_inputs(size, device, dtype) if isinstance(t, torch.Tensor)]
    cotangent = torch.randn(size, device=device, dtype=dtype)
    directions = [torch.randn_like(x) for x in inputs]
    wide = [x.double().requires_grad_() for x in inputs]
    want = hvp(example.reference, wide, cotangent.double(), [v.double() for v in directions])
    del wide
    rows = []
    for impl, fn in (("tritongrad", example.op), ("reference", example.reference)):
        row = {"part": "hvp", "op": example.name, "size": size, "dtype": dtype_name, "impl": impl, "note": ""}
        rows.append(row)
        leaves = [x.detach().clone().requires_grad_() for x in inputs]
        try:
            got = hvp(fn, leaves, cotangent, directions)  # (compiles; derives the derived kernels)
            row["err"] = max(relative_error(h, w) for h, w in zip(got, want, strict=True))
            row["ok"] = row["err"] <= tolerance(dtype_name)
            del got
            row.update(hvp_times(fn, leaves, cotangent, directions, timer))
        except Exception as e:  # noqa: BLE001
            row["error"] = row["note"] = _short(e)
        _empty_cache(device)
    reference = rows[-1].get("hvp ms")
    for row in rows:
        if reference and row.get("hvp ms"):
            row["hvp vs reference"] = row["hvp ms"] / reference
    return rows


def hvp_times(fn: Callable, leaves: list, cotangent: torch.Tensor, directions: list, timer: Callable) -> dict:
    from tritongrad.tools.bench.measure import backward_ms

    times = {"fwd ms": timer(lambda: fn(*leaves), leaves),
             "fwd+bwd ms": timer(lambda: torch.autograd.backward(fn(*leaves), cotangent), leaves),
             "hvp ms": timer(lambda: hvp(fn, leaves, cotangent, directions), leaves)}
    times["bwd ms"] = backward_ms(times["fwd ms"], times["fwd+bwd ms"])
    times["hvp / fwd+bwd"] = times["hvp ms"] / times["fwd+bwd ms"]
    return times


# -- the tables -------------------------------------------------------------------------------------------------


def _short(e: BaseException) -> str:
    from tritongrad.tools.bench.measure import short_error

    return short_error(e).replace("|", "/")[:160]


def _empty_cache(device: str) -> None:
    if device == "cuda":
        torch.cuda.empty_cache()


def _cell(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "ok" if value else "**FAIL**"
    if isinstance(value, float):
        return f"{value:.1e}" if value != 0 and (abs(value) < 1e-3 or abs(value) >= 1e5) else f"{value:.3f}"
    if isinstance(value, tuple):
        return "x".join(map(str, value))
    return str(value)


def markdown_table(rows: list[dict], columns: list[tuple[str, str]]) -> list[str]:
    lines = ["| " + " | ".join(title for title, _ in columns) + " |", "|" + " --- |" * len(columns)]
    for r in rows:
        lines.append("| " + " | ".join(_cell(r.get(key)) for _, key in columns) + " |")
    return lines


ATTENTION_COLUMNS = [("mask", "mask"), ("B x H x N x d", "shape"), ("implementation", "impl"),
                     ("dtype", "dtype"), ("ms", "ms"), ("vs fwd", "vs fwd"), ("error", "err"), ("ok", "ok"),
                     ("note", "note")]
HVP_COLUMNS = [("op", "op"), ("size", "size"), ("dtype", "dtype"), ("implementation", "impl"),
               ("fwd ms", "fwd ms"), ("fwd+bwd ms", "fwd+bwd ms"), ("bwd ms", "bwd ms"), ("hvp ms", "hvp ms"),
               ("hvp / fwd+bwd", "hvp / fwd+bwd"), ("hvp vs reference", "hvp vs reference"), ("hvp error", "err"),
               ("ok", "ok"), ("note", "note")]


def report(rows: list[dict], device: str, timing: str, argv: list[str]) -> str:
    import triton

    where = torch.cuda.get_device_name() if device == "cuda" else "CPU (Triton's interpreter)"
    command = " ".join(["python -m benchmarks.forward_mode", *argv])
    lines = [f"{where}, torch {torch.__version__}, triton {triton.__version__}; ms: {timing}", "",
             f"    {command}", ""]
    attention = [r for r in rows if r["part"] == "attention"]
    if attention:
        lines += ["JVP of flash attention. vs fwd: ms / the forward kernel's at the shape (the goal for `jvp "
                  "kernel`: at most 2). error: max |error| / max |reference| of the output and its tangent against "
                  "float64 forward AD of the math reference on batch element 0; ok: within the dtype's tolerance.",
                  "", *markdown_table(attention, ATTENTION_COLUMNS), "", *goal_line(attention)]
    hvps = [r for r in rows if r["part"] == "hvp"]
    if hvps:
        lines += ["Hessian-vector products (double backward, forward included) and first-order passes. hvp vs "
                  "reference: hvp ms / the reference's at the size and dtype. hvp error: against float64 PyTorch's "
                  "double backward of the reference.", "", *markdown_table(hvps, HVP_COLUMNS), ""]
    return "\n".join(lines)


def goal_line(rows: list[dict]) -> list[str]:
    """Whether the tangent kernel met the issue's goal (at most 2x the forward kernel), over the shapes timed."""
    ratios = [r["vs fwd"] for r in rows if r["impl"] == "jvp kernel" and r.get("vs fwd")]
    if not ratios:
        return []
    met = sum(ratio <= 2 for ratio in ratios)
    return [f"jvp kernel / fwd kernel: {min(ratios):.2f} to {max(ratios):.2f}; at most 2 at {met} of {len(ratios)} "
            "shapes.", ""]


def wall_once(fn: Callable, grad_to_none: list | None) -> float:
    """The smoke mode's timer: one run on the wall clock, in ms (the interpreter is slow; the numbers mean little)."""
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e3


def main(argv: list[str] | None = None) -> list[dict]:
    args = parse(argv)
    if args.smoke:
        os.environ.setdefault("TRITON_INTERPRET", "1")  # (read when kernels are defined: before the examples' import)
        device, timer, timing = "cpu", wall_once, "wall clock, one run"
    elif not torch.cuda.is_available():
        raise SystemExit("forward_mode.py times on a CUDA GPU; --smoke runs it on a CPU through Triton's interpreter")
    else:
        from tritongrad.tools.bench.measure import do_bench_median

        device, timer, timing = "cuda", do_bench_median, "triton.testing.do_bench median, eager launches"
    rows = []
    if "attention" in args.parts:
        rows += attention_rows(args, device, timer)
    if "hvp" in args.parts:
        rows += hvp_rows(args, device, timer)
    text = report(rows, device, timing, sys.argv[1:] if argv is None else argv)
    print(text, flush=True)
    if args.out:
        args.out.write_text(text)
    return rows


if __name__ == "__main__":
    main()
