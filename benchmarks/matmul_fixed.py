"""The backward of a matmul whose forward is launched with a fixed config, against cuBLAS's (the target: at most
1.25x cuBLAS).

    python benchmarks/matmul_fixed.py                          # a GPU: bfloat16, 4096^3 and 8192^3
    python benchmarks/matmul_fixed.py --sizes 4096 8192x8192x4096 --graphs --out matmul_fixed.md
    python benchmarks/matmul_fixed.py --sizes 4096 8192 --impls fixed declared tiles cuBLAS --graphs
    python benchmarks/matmul_fixed.py --sizes 8192 --impls declared cuBLAS --profile   # kernels, torch.profiler
    ncu --clock-control none --profile-from-start off --section SpeedOfLight \\
        python benchmarks/matmul_fixed.py --sizes 8192 --impls declared cuBLAS --ncu     # one step each, ncu
    python benchmarks/matmul_fixed.py --smoke                  # CPU, Triton's interpreter, 45x37x70 (a test)

The forward is tritongrad/examples/matmul.py's kernel launched with one config, ``FIXED`` (128 x 256 x 64 tiles,
3 stages, 8 warps), by its op ``matmul_fixed``. Implementations:

- ``fixed``: the kernel without a declaration (``declared=False``): its derived backward runs under the forward's
  config;
- ``declared``: the kernel with ``tritongrad.backward_configs(BACKWARD_CONFIGS)`` (the autotuner's configs and a
  few for the backward's products): its backward runs under whichever of them, or the forward's, is fastest at the
  size (timed on its first backward);
- ``tiles``: the kernel naming its block sizes tile sizes (``tritongrad.backward_configs(tiles=("BLOCK_M",
  "BLOCK_N", "BLOCK_K"))``): its backward runs under the fastest of the configs made around the forward's (each tile
  halved, kept or doubled up to 256, their product within 2x of the forward's; host/configs.py's ``around``), no
  list written;
- ``cuBLAS``: ``torch.matmul`` under autograd;
- ``compile``: ``torch.compile`` of the example's reference (``a @ b``).

bwd = median(fwd+bwd) - median(fwd), each a ``triton.testing.do_bench`` median of eager launches (``--graphs``: also
of CUDA-graph replays, the GPU's time alone); each implementation on its own copies of the inputs, its gradients
first compared with float32 PyTorch's (max |error| / max |reference|). The table gives each backward's ratio to
cuBLAS's, and the configs the declared and the tiles kernels' backwards chose.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

IMPLS = ("fixed", "declared", "tiles", "cuBLAS", "compile")
SMOKE_SIZE = (45, 37, 70)  # (M, N, K): ragged tiles on the interpreter's 16 x 16 x 16


def parse(argv: list[str] | None) -> argparse.Namespace:
    from tritongrad.tools.sizes import parse_size

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--sizes", nargs="*", type=parse_size, default=[4096, 8192],
                   help="N (an N x N x N product) or MxNxK; default: 4096 8192")
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    p.add_argument("--impls", nargs="*", choices=IMPLS, default=list(IMPLS))
    p.add_argument("--graphs", action="store_true", help="also time CUDA-graph replays")
    p.add_argument("--out", type=Path, help="also write the table here")
    p.add_argument("--profile", action="store_true", help="also each implementation's GPU kernels per fwd+bwd step "
                   "(torch.profiler)")
    p.add_argument("--ncu", action="store_true", help="after the timings, one fwd+bwd step of each implementation "
                   "between cudaProfilerStart and Stop (for `ncu --profile-from-start off`)")
    p.add_argument("--smoke", action="store_true", help="CPU, Triton's interpreter: 45x37x70 in float64, a wall clock")
    args = p.parse_args(argv)
    args.sizes = [s if isinstance(s, tuple) else (s, s, s) for s in args.sizes]
    if any(len(s) != 3 for s in args.sizes):
        p.error("a size is N or MxNxK")
    if args.smoke:
        args.sizes, args.dtype, args.graphs = [SMOKE_SIZE], "float64", False
        args.impls = [i for i in args.impls if i != "compile"]  # (Inductor on a CPU compiles C++: not a smoke test)
    return args


def wall_median(fn, grad_to_none) -> float:
    """The smoke mode's timer: the median of a few runs on the wall clock, in ms."""
    times = []
    for _ in range(3):
        for t in grad_to_none or ():
            t.grad = None
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def implementations(matmul, names) -> dict:
    made = {"fixed": lambda: lambda a, b: matmul.matmul_fixed(a, b, declared=False),
            "declared": lambda: lambda a, b: matmul.matmul_fixed(a, b),
            "tiles": lambda: lambda a, b: matmul.matmul_fixed(a, b, named_tiles=True),
            "cuBLAS": lambda: torch.matmul,
            "compile": lambda: torch.compile(matmul.reference)}
    return {k: make() for k, make in made.items() if k in names}


def grad_error(fn, a, b, g) -> float:
    """max |error| / max |reference| of fn's gradients against float32 (float64) PyTorch's."""
    wide = torch.float64 if a.dtype == torch.float64 else torch.float32
    leaves = [t.detach().clone().requires_grad_() for t in (a, b)]
    got = torch.autograd.grad(fn(*leaves), leaves, g)
    ref = [t.detach().to(wide).requires_grad_() for t in (a, b)]
    want = torch.autograd.grad(ref[0] @ ref[1], ref, g.to(wide))
    return max(((x.to(wide) - y).abs().max() / y.abs().max()).item() for x, y in zip(got, want, strict=True))


def time_backward(fn, a, b, g, timer) -> tuple[float, float]:
    """(fwd ms, bwd ms): bwd = median(fwd+bwd) - median(fwd)."""
    from tritongrad.tools.bench.measure import backward_ms

    leaves = [t.detach().clone().requires_grad_() for t in (a, b)]
    fwd = timer(lambda: fn(*leaves), leaves)
    fwd_bwd = timer(lambda: fn(*leaves).backward(g), leaves)
    return fwd, backward_ms(fwd, fwd_bwd)


def profile(name, fn, a, b, g) -> None:
    """The GPU kernels of one fwd+bwd step of ``fn``, longest first, with each one's TFLOP/s at a product's count."""
    from benchmarks.profile_kernels import kernel_table

    leaves = [t.detach().clone().requires_grad_() for t in (a, b)]
    (m, k), n = a.shape, b.shape[1]

    def step():
        for t in leaves:
            t.grad = None
        fn(*leaves).backward(g)

    print(f"\n{m}x{n}x{k} · {name} · GPU kernels per fwd+bwd step (TFLOP/s at one product's 2MNK)")
    for kernel, calls, us in kernel_table(step)[:8]:
        print(f"{us:9.1f} µs  x{calls:<4g} {2 * m * n * k * calls / (us * 1e-6) / 1e12:6.0f}  {kernel[:90]}")


def chosen_configs(tuning, matmul) -> str:
    """The configs runtime/tuning.py chose for backwards, per kernel (declared, tiles), as BLOCK_MxNxK/stages/warps
    (a config that does not set the stages or warps: the forward's, 3 and 8)."""
    kernels = {id(matmul.matmul_fixed_kernel): "declared", id(matmul.matmul_tiles_kernel): "tiles"}
    found = []
    for key, config in tuning._configs.items():
        c = {**{k: v for k, v in matmul.FIXED.items() if k.startswith("num_")}, **dict(config)}
        if config:
            found.append(f"{kernels.get(key[0], '?')} {c.get('BLOCK_M')}x{c.get('BLOCK_N')}x{c.get('BLOCK_K')}/"
                         f"{c.get('num_stages')}s/{c.get('num_warps')}w")
    return ", ".join(found) or "the forward's"


def main(argv: list[str] | None = None) -> list[dict]:
    args = parse(argv)
    if args.smoke:
        os.environ.setdefault("TRITON_INTERPRET", "1")  # (read when kernels are defined: before the example's import)
        device, timers = "cpu", {"eager": wall_median}
    elif not torch.cuda.is_available():
        raise SystemExit("matmul_fixed.py times on a CUDA GPU; --smoke runs it on a CPU through Triton's interpreter")
    else:
        from tritongrad.tools.bench.measure import do_bench_median, graph_median

        device, timers = "cuda", {"eager": do_bench_median, **({"graph": graph_median} if args.graphs else {})}
    import triton

    from tritongrad.examples import matmul
    from tritongrad.runtime import tuning

    dtype = getattr(torch, args.dtype)
    impls = implementations(matmul, args.impls)
    where = torch.cuda.get_device_name() if device == "cuda" else "CPU (Triton's interpreter)"
    lines = [f"{where}, torch {torch.__version__}, triton {triton.__version__}; forward config {matmul.FIXED}", "",
             "| M x N x K | dtype | implementation | timer | fwd ms | bwd ms | bwd / cuBLAS | bwd TFLOP/s "
             "| grad error |", "|" + " --- |" * 9]
    print("\n".join(lines), flush=True)
    rows = []
    for m, n, k in args.sizes:
        torch.manual_seed(0)
        a = torch.randn(m, k, device=device, dtype=dtype)
        b = torch.randn(k, n, device=device, dtype=dtype)
        g = torch.randn(m, n, device=device, dtype=dtype)
        row = {"size": (m, n, k)}
        for name, fn in impls.items():
            row[name] = {"error": grad_error(fn, a, b, g)}
            for timer_name, timer in timers.items():
                row[name][timer_name] = time_backward(fn, a, b, g, timer)
            if args.profile and device == "cuda":
                profile(name, fn, a, b, g)
            if args.ncu and device == "cuda":
                from benchmarks.profile_kernels import ncu_step

                leaves = [t.detach().clone().requires_grad_() for t in (a, b)]
                ncu_step(lambda fn=fn, leaves=leaves, g=g: fn(*leaves).backward(g))
        for timer_name in timers:
            base = row["cuBLAS"][timer_name][1] if "cuBLAS" in row else None
            for name in impls:
                fwd, bwd = row[name][timer_name]
                ratio = f"{bwd / base:.2f}" if base else "-"
                line = (f"| {m}x{n}x{k} | {args.dtype} | {name} | {timer_name} | {fwd:.3f} | {bwd:.3f} | {ratio} "
                        f"| {4 * m * n * k / (bwd * 1e-3) / 1e12:.1f} | {row[name]['error']:.1e} |")
                lines.append(line)
                print(line, flush=True)
        rows.append(row)
    lines += ["", f"backward configs chosen (per kernel, shape and step): {chosen_configs(tuning, matmul)}"]
    print(lines[-1])
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")
    return rows


if __name__ == "__main__":
    main()
