"""The ``tritongrad`` command: show a derived backward kernel, check an op, run the demo, time ops.

    tritongrad show EXAMPLE | FILE.py:KERNEL [--wrt a,b] [--outputs y] [--jvp]
    tritongrad check EXAMPLE... | FILE.py:OP... [--dtype D...] [--sizes S...]
    tritongrad demo
    tritongrad bench EXAMPLE... | FILE.py:OP... [--dtype D] [--sizes S...] [--mode M...] [--impl I...] [--graphs]
                     [--out DIR]

One grammar names what every command acts on: a bundled example's name (``rmsnorm``; for ``show``, the
backward of the example's kernels) or ``FILE.py:NAME``, a kernel for ``show``, an op (a ``@tritongrad.op``
function) for ``check`` and ``bench``. The file of an op also defines ``make_inputs(size, device, dtype)``, and
for ``check`` ``reference`` (the same computation in PyTorch); it may define ``SIZES``, ``BENCH_SIZES``,
``DTYPES``, and for ``bench`` ``traffic(size, dtype)`` (bytes one forward and one backward move:
``{"fwd": ..., "bwd": ...}``) and ``flops(size)``, as the bundled examples do. The file's folder is put on the
import path, as Python does for a script, so that it may import its siblings.

Without a GPU, show, check and demo switch Triton to its interpreter (CPU tensors) before any
kernel is defined. Exit status: 0 when all went well; 1 when a check failed (or, for show, the
kernel cannot be differentiated: the refusal, with its source line and hint); 2 for a mistake in
what was asked (a file, op, kernel, parameter or size that is not there or does not fit, a
``make_inputs`` or ``reference`` that fails), said in one line on stderr.
"""

from __future__ import annotations

import argparse
import os
import sys

EPILOG = """\
Each command names what it acts on as a bundled example (rmsnorm) or FILE.py:NAME: a kernel
for show; an op (a @tritongrad.op function) for check and bench, whose file defines
make_inputs(size, device, dtype), and for check reference (the same computation in PyTorch).
Exit status: 0 ok; 1 a check failed (show: the kernel cannot be differentiated); 2 a mistake
in what was asked, said in one line on stderr."""


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


def _name_list(text: str | None) -> tuple[str, ...] | None:
    return tuple(x.strip() for x in text.split(",") if x.strip()) if text else None


def show(args: argparse.Namespace) -> int:
    use_interpreter_without_gpu()
    from .. import NotDifferentiableError
    from ..codegen.generate import HEADER
    from ..core.source import unwrap
    from .subjects import UsageError, defined_at, load_kernels

    try:
        kernels = load_kernels(args.kernel)
        wrt, outputs = _name_list(args.wrt), _name_list(args.outputs)
        shown = _shown_tangent if args.jvp else _shown_backward
        texts = [shown(kernel, wrt, outputs) for kernel in kernels]
    except (UsageError, ValueError) as e:  # ValueError: --wrt / --outputs naming no such pointer
        return usage_error(e)
    except NotDifferentiableError as e:  # the refusal whole: where, what, and its hint
        print("\n".join([f"error: {e}", *getattr(e, "__notes__", ())]), file=sys.stderr)
        return 1
    if len(kernels) > 1:  # (an example's kernels, each under its name)
        what = "tangent kernel" if args.jvp else "backward"
        texts = [f"# the {what} of `{unwrap(k).fn.__name__}` ({defined_at(unwrap(k))})\n\n{t}"
                 for k, t in zip(kernels, texts, strict=True)]
    print(HEADER)
    print("\n\n".join(texts), end="")
    return 0


def _shown_backward(kernel, wrt, outputs) -> str:
    """A kernel's derived backward as ``show`` prints it, with the variants an op's backward launches."""
    from .. import grad
    from ..analysis.stored_outputs import stored_values
    from ..core.source import unwrap
    from ..runtime.augment import augmented

    bwd = grad(kernel, wrt=wrt, outputs=outputs)
    text = bwd.src
    notes = bwd.launch_notes()
    if notes:
        text += "\n" + notes
    readable = sorted({k.param for k in stored_values(bwd.program, bwd.analysis.stores).values()})
    kept = grad(kernel, wrt=wrt, outputs=outputs, kept_outputs=readable) if readable else bwd
    if kept.src != bwd.src:
        text += (f"\n\n# Through a tritongrad.op, which saves {', '.join(f'`{p}`' for p in readable)} for the "
                 f"backward, it reads back what the forward stored there (stored_outputs.py):\n\n{kept.src}")
    found = augmented(unwrap(kernel), {})
    best = bwd.saved_writes.best()
    if found is not None and bwd.saved_tapes() == found.tapes:
        text += (f"\n\n# Through a tritongrad.op, the forward keeps what the backward reads of its loops (augment.py): "
                 f"it launches\n\n{found.src}\n# and the backward reads them:\n\n{bwd.variant(best, saved=True).src}")
    return text


def _shown_tangent(kernel, wrt, outputs) -> str:
    """A kernel's derived tangent (forward-mode) kernel, as ``show --jvp`` prints it."""
    from .. import jvp

    return jvp(kernel, wrt=wrt, outputs=outputs).src


def usage_error(error: Exception) -> int:
    """A mistake in what was asked: one line on stderr, exit status 2 (as argparse's own)."""
    message = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    print(message if message.startswith("error: ") else f"error: {message}", file=sys.stderr)
    return 2


def check(args: argparse.Namespace) -> int:
    device = use_interpreter_without_gpu()
    import torch

    from .check import check as run_check
    from .check import default_dtypes, table
    from .demo import console as wide_console
    from .subjects import UsageError, check_sizes, load_subject

    dtypes = tuple(getattr(torch, d) for d in args.dtype) if args.dtype else default_dtypes(device)
    try:
        subjects = [load_subject(spec) for spec in args.subjects]
        for s in subjects:
            if not s.sizes and not args.sizes:
                raise UsageError(f"{s.name} has no SIZES; pass --sizes")
            check_sizes(s, args.sizes)
        rows = [row for s in subjects for row in run_check(s, device, dtypes, args.sizes)]
    except UsageError as e:
        return usage_error(e)
    if not rows:
        return usage_error(UsageError(f"none of {', '.join(s.name for s in subjects)} takes "
                                      f"{', '.join(str(d).removeprefix('torch.') for d in dtypes)}"))
    console = wide_console()  # (piped: wide enough that names are not folded)
    console.print(table(rows))
    for detail in dict.fromkeys(r.detail for r in rows if r.detail):  # refusals whole, once each
        print(f"\n{detail}")
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
    parser = argparse.ArgumentParser(prog="tritongrad", description="Reverse-mode AD of Triton kernels.",
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EPILOG)
    parser.add_argument("--version", action="version", version=f"tritongrad {_version()}")
    commands = parser.add_subparsers(dest="command", required=True)
    p = commands.add_parser("show", help="print the derived backward of an example's kernels or of FILE.py:KERNEL")
    p.add_argument("kernel", metavar="EXAMPLE|FILE.py:KERNEL")
    p.add_argument("--wrt", help="pointer parameters to differentiate, comma-separated")
    p.add_argument("--outputs", help="pointer parameters whose stores are differentiated, comma-separated")
    p.add_argument("--jvp", action="store_true", help="the tangent (forward-mode) kernel instead of the backward")
    p.set_defaults(func=show)
    p = commands.add_parser("check", help="an op's forward and gradients against its PyTorch reference (FILE.py "
                            "also defines reference and make_inputs(size, device, dtype))")
    p.add_argument("subjects", nargs="+", metavar="EXAMPLE|FILE.py:OP")
    p.add_argument("--dtype", nargs="+", choices=("float64", "float32", "bfloat16", "float16"),
                   help="default: float64 on a CPU, bfloat16 and float32 on a GPU")
    from .sizes import parse_size

    p.add_argument("--sizes", nargs="+", type=parse_size, help="N or AxB...; default: the subject's SIZES")
    p.set_defaults(func=check)
    p = commands.add_parser("demo", help="derive, print and check the backward of the bundled examples")
    p.set_defaults(func=demo)
    p = commands.add_parser("bench", help="time examples or FILE.py:OP against eager PyTorch, torch.compile and "
                            "Liger-Kernel (GPU; --replot DIR redraws plots from CSVs anywhere)")
    from .bench import add_arguments

    add_arguments(p)
    p.set_defaults(func=bench)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
