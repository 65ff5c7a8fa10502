"""The ``tritongrad`` command: show a derived backward kernel, run the demo.

    tritongrad show FILE.py:KERNEL [--wrt a,b] [--outputs y]
    tritongrad check EXAMPLE... | FILE.py:OP [--dtype D...] [--sizes S...]
    tritongrad demo
    tritongrad bench EXAMPLE... [--dtype D] [--sizes S...] [--mode M...] [--impl I...] [--graphs] [--out DIR]

Without a GPU, show and demo switch Triton to its interpreter (CPU tensors) before any
kernel is defined. A mistake on the command line (a file, kernel or parameter that is not
there, something that is not a kernel) is one line on stderr and exit status 1.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path


def _version() -> str:
    from .. import __version__  # the one place it is written (pyproject.toml reads it too)

    return __version__


def use_interpreter_without_gpu() -> str:
    """Pick the device; without CUDA, run kernels through Triton's interpreter."""
    import torch

    if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
        return "cuda"
    os.environ["TRITON_INTERPRET"] = "1"
    return "cpu"


def load_kernel(spec: str):
    """``path/to/file.py:kernel_name`` -> the kernel object defined there (SystemExit with one line if not)."""
    from ..core.source import import_file, unwrap

    path, _, name = spec.rpartition(":")
    if not path or not name:
        raise SystemExit(f"error: expected FILE.py:KERNEL, got {spec!r}")
    file = Path(path).resolve()
    if not file.exists():
        raise SystemExit(f"error: no such file: {path}")
    try:
        module = import_file(file)
    except Exception as e:  # the user's file: say what went wrong where, in one line
        raise SystemExit(f"error: importing {path} failed: {type(e).__name__}: {e}") from None
    kernels = [k for k, v in vars(module).items() if _defined_in(v, file, unwrap)]
    listed = f"; its kernels: {', '.join(kernels)}" if kernels else "; it defines no @triton.jit kernel"
    if not hasattr(module, name):
        raise SystemExit(f"error: {path} defines no `{name}`{listed}")
    kernel = getattr(module, name)
    try:
        unwrap(kernel)
    except TypeError:
        raise SystemExit(f"error: `{name}` in {path} is not a Triton kernel (it is a {type(kernel).__name__})"
                         f"{listed}") from None
    return kernel


def _defined_in(obj, file: Path, unwrap) -> bool:
    """Whether ``obj`` is a Triton kernel (jit function, autotuned or heuristics-driven) written in ``file``."""
    try:
        return Path(unwrap(obj).fn.__code__.co_filename).resolve() == file
    except (TypeError, AttributeError):
        return False


def _name_list(text: str | None) -> tuple[str, ...] | None:
    return tuple(x.strip() for x in text.split(",") if x.strip()) if text else None


def show(args: argparse.Namespace) -> int:
    use_interpreter_without_gpu()
    from .. import NotDifferentiableError, grad
    from ..analysis.stored_outputs import stored_values
    from ..codegen.generate import HEADER
    from ..core.source import unwrap
    from ..runtime.augment import augmented

    kernel = load_kernel(args.kernel)
    try:
        bwd = grad(kernel, wrt=_name_list(args.wrt), outputs=_name_list(args.outputs))
    except (NotDifferentiableError, ValueError) as e:  # ValueError: --wrt / --outputs naming no such pointer
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(HEADER)
    print(bwd.src, end="")
    notes = bwd.launch_notes()
    if notes:
        print("\n" + notes, end="")
    readable = sorted({k.param for k in stored_values(bwd.program, bwd.analysis.stores).values()})
    kept = grad(kernel, wrt=_name_list(args.wrt), outputs=_name_list(args.outputs), kept_outputs=readable) if readable \
        else bwd
    if kept.src != bwd.src:
        print(f"\n\n# Through a tritongrad.op, which saves {', '.join(f'`{p}`' for p in readable)} for the backward, "
              f"it reads back what the forward stored there (stored_outputs.py):\n\n{kept.src}", end="")
    found = augmented(unwrap(kernel), {})
    best = bwd.saved_writes.best()
    if found is not None and bwd.saved_tapes() == found.tapes:
        print(f"\n\n# Through a tritongrad.op, the forward keeps what the backward reads of its loops (augment.py): it "
              f"launches\n\n{found.src}\n# and the backward reads them:\n\n{bwd.variant(best, saved=True).src}", end="")
    return 0


def check(args: argparse.Namespace) -> int:
    device = use_interpreter_without_gpu()
    import torch
    from rich.console import Console

    from .check import check as run_check
    from .check import default_dtypes, load_subject, table

    try:  # a mistake in what to check is a usage error: exit status 2, as argparse's (1: a check failed)
        subjects = [load_subject(spec) for spec in args.subjects]
    except SystemExit as e:
        print(e, file=sys.stderr)
        return 2
    for s in subjects:
        if not s.sizes and not args.sizes:
            print(f"error: {s.name} has no SIZES; pass --sizes", file=sys.stderr)
            return 2
    dtypes = tuple(getattr(torch, d) for d in args.dtype) if args.dtype else default_dtypes(device)
    rows = [row for s in subjects for row in run_check(s, device, dtypes, args.sizes)]
    if not rows:
        print(f"error: none of {', '.join(s.name for s in subjects)} takes "
              f"{', '.join(str(d).removeprefix('torch.') for d in dtypes)}", file=sys.stderr)
        return 2
    console = Console()
    console.print(table(rows))
    failed = sum(not r.ok for r in rows)
    console.print(f"[red]{failed} of {len(rows)} failed" if failed else f"[green]all {len(rows)} ok")
    return 1 if failed else 0


def demo(args: argparse.Namespace) -> int:
    device = use_interpreter_without_gpu()
    from .demo import run

    return run(device)


def bench(args: argparse.Namespace) -> int:
    from .bench import main as run_bench

    return run_bench(args)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tritongrad", description="Reverse-mode AD of Triton kernels.")
    parser.add_argument("--version", action="version", version=f"tritongrad {_version()}")
    commands = parser.add_subparsers(dest="command", required=True)
    p = commands.add_parser("show", help="print the derived backward kernel of FILE.py:KERNEL")
    p.add_argument("kernel", metavar="FILE.py:KERNEL")
    p.add_argument("--wrt", help="pointer parameters to differentiate, comma-separated")
    p.add_argument("--outputs", help="pointer parameters whose stores are differentiated, comma-separated")
    p.set_defaults(func=show)
    p = commands.add_parser("check", help="an op's forward and gradients against its PyTorch reference")
    p.add_argument("subjects", nargs="+", metavar="EXAMPLE|FILE.py:OP")
    p.add_argument("--dtype", nargs="+", choices=("float64", "float32", "bfloat16", "float16"),
                   help="default: float64 on a CPU, bfloat16 and float32 on a GPU")
    from .sizes import parse_size

    p.add_argument("--sizes", nargs="+", type=parse_size, help="N or AxB...; default: the example's SIZES")
    p.set_defaults(func=check)
    p = commands.add_parser("demo", help="derive, print and check the backward of the bundled examples")
    p.set_defaults(func=demo)
    p = commands.add_parser("bench", help="time the examples against eager PyTorch, torch.compile and Liger-Kernel "
                            "(GPU; --replot DIR redraws plots from CSVs anywhere)")
    from .bench import add_arguments

    add_arguments(p)
    p.set_defaults(func=bench)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
