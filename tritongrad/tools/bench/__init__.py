"""``tritongrad bench``: time the examples' operators against PyTorch and Liger-Kernel on a GPU.

    tritongrad bench rmsnorm softmax [--dtype bfloat16|float16|float32] [--sizes 4096x4096 ...]
                     [--mode fwd|bwd|fwd+bwd ...] [--impl tritongrad eager ...] [--graphs] [--out DIR]
    tritongrad bench my_ops.py:my_op --sizes 8192x4096   # your own op
    tritongrad bench --replot DIR        # PNGs and summary.md again from DIR's CSVs (no GPU needed)

Your own op is named ``FILE.py:OP`` (the ``@tritongrad.op`` function); its file defines
``make_inputs(size, device, dtype)`` as the examples do (tritongrad/examples/__init__.py), and may define
``reference`` (the same computation in PyTorch: without it there are no eager and compile rows, and its
forward is not compared), ``BENCH_SIZES`` (else pass ``--sizes``), ``DTYPES``, ``traffic(size, dtype)``
(the bytes one forward and one backward move, ``{"fwd": ..., "bwd": ...}``: without it no GB/s) and
``flops(size)``. Its table, CSV and plot are those of an example, named after the op; Liger-Kernel rows
only where asked for with ``--impl``.

Implementations of one example, all measured in one run, one size after another:

- ``tritongrad``: the example's ``@tritongrad.op`` (its forward launches, the derived backward);
- ``tritongrad-compile`` (only with ``--impl``): that op under ``torch.compile``: Inductor launches its
  forward kernels and the derived backward kernels (traced through ``wrap_triton``);
- ``liger-fwd``: Liger-Kernel's own forward launcher wrapped with ``@tritongrad.op``, so the same
  forward runs with the derived backward (rmsnorm, layernorm, swiglu, softmax);
- ``liger``: Liger-Kernel's hand-written ``autograd.Function`` (forward and backward kernels);
- ``compile``: ``torch.compile`` of the example's plain-PyTorch reference;
- ``eager``: the reference itself.

Liger-Kernel is never a dependency: its rows appear where ``liger_kernel`` is importable and has
the operation, otherwise they get a '-' and a note. Before it is timed, every implementation's
forward output is compared with eager's (a wrong adapter or kernel gets a '-', not a time).

Timing: ``triton.testing.do_bench`` medians. ``fwd`` is the forward with autograd recording (the
floating-point inputs require grad, as in training); ``fwd+bwd`` the forward then
``torch.autograd.backward(outputs, grad_outputs)`` with fixed random output gradients;
``bwd = median(fwd+bwd) - median(fwd)``, the same for every implementation. GB/s use the example's
``traffic(size, dtype)`` (the fewest bytes the pass must move; fwd+bwd is the sum), TFLOP/s its
``flops(size)`` where it has one, and "% copy" is the share of the GPU's copy bandwidth measured at
the start of the run (a 1 GiB device-to-device copy: bytes read plus written over its median time).
With ``--graphs`` each pass is captured once in a CUDA graph and the graph's replays are timed: the
GPU's time alone, the host's launches and autograd's bookkeeping left out (where every implementation's
host takes longer than its GPU work, eager timings rank the hosts: both views together say which is which).

Output: a progress bar, a table per example and mode in the terminal, and under ``--out``
(default ``./bench-results``): ``EXAMPLE-DTYPE-MODE.csv`` with every number and the device, versions
and command; ``EXAMPLE-DTYPE-MODE.png`` (GB/s, or TFLOP/s, against size: one line per implementation)
when matplotlib is installed (``pip install 'tritongrad[plot]'``); ``summary.md``, markdown tables
of every CSV in the folder, ready for benchmarks/RESULTS.md.

This module is the command line; the implementations compared are in ``competitors.py``, the timers and the
measuring of one size in ``measure.py``, rows, CSV and tables in ``report.py``, the PNGs in ``plot.py``.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from ..sizes import format_size, parse_size
from ..subjects import UsageError, check_sizes, load_subject
from .competitors import IMPLS, implementations, installed_version
from .measure import copy_bandwidth, do_bench_median, graph_median, measure_size, short_error
from .plot import write_plot
from .report import EAGER, GRAPHS, make_rows, markdown, read_folder, rich_table, stem, write_csv

MODES = ("fwd", "bwd", "fwd+bwd")
DTYPES = ("bfloat16", "float16", "float32")

NO_GPU = ("tritongrad bench: no CUDA GPU here (bench times kernels on one); "
          "`tritongrad bench --replot DIR` redraws plots and tables from CSVs without one")


def replot(folder: Path, console=None) -> int:
    """Redraw every PNG and summary.md from the CSVs in `folder` (no GPU needed)."""
    from rich.console import Console

    console = console or Console()
    rows = read_folder(folder)
    if not rows:
        print(f"tritongrad bench: no benchmark CSVs in {folder}", file=sys.stderr)
        return 2
    plotted = 0
    for key in dict.fromkeys((r["example"], r["dtype"], r["mode"], r["timing"]) for r in rows):
        group = [r for r in rows if (r["example"], r["dtype"], r["mode"], r["timing"]) == key]
        plotted += write_plot(group, Path(folder) / f"{stem(*key)}.png")
    (Path(folder) / "summary.md").write_text(markdown(rows))
    if plotted:
        console.print(f"wrote {plotted} PNG(s) and summary.md in {folder}")
    else:
        console.print(f"matplotlib is not installed: no PNG (pip install 'tritongrad[plot]'); "
                      f"wrote {folder}/summary.md")
    return 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("examples", nargs="*", metavar="EXAMPLE|FILE.py:OP",
                   help="bundled examples, or your op: FILE.py:OP, whose file defines make_inputs(size, device, dtype) "
                   "and may define reference, BENCH_SIZES, DTYPES, traffic(size, dtype) and flops(size)")
    p.add_argument("--dtype", default="bfloat16", choices=DTYPES, help="input dtype (default: bfloat16)")
    p.add_argument("--sizes", nargs="+", type=parse_size, metavar="SIZE",
                   help="sizes as N or AxB (default: each example's BENCH_SIZES)")
    p.add_argument("--mode", nargs="+", default=["fwd+bwd"], choices=MODES,
                   help="what to time; bwd = median(fwd+bwd) - median(fwd) (default: fwd+bwd)")
    p.add_argument("--impl", nargs="+", choices=IMPLS, help=f"implementations (default: {' '.join(IMPLS)})")
    p.add_argument("--graphs", action="store_true",
                   help="time CUDA-graph replays of each pass (the GPU's time, without the host's launches)")
    p.add_argument("--out", default="bench-results", help="folder for the CSVs, PNGs and summary.md")
    p.add_argument("--replot", metavar="DIR", help="only redraw the PNGs and summary.md from DIR's CSVs")


def command_line(args: argparse.Namespace) -> str:
    words = ["tritongrad", "bench", *args.examples, "--dtype", args.dtype]
    if args.sizes:
        words += ["--sizes", *map(format_size, args.sizes)]
    words += ["--mode", *args.mode]
    if args.impl:
        words += ["--impl", *args.impl]
    if args.graphs:
        words.append("--graphs")
    return shlex.join(words)


def environment(device: str) -> dict:
    import torch
    import triton

    import tritongrad

    version = tritongrad.__version__
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=Path(__file__).parent, capture_output=True,
                             text=True, timeout=10).stdout.strip()
        version += f" ({sha})" if sha else ""
    except (OSError, subprocess.SubprocessError):
        pass
    name = torch.cuda.get_device_name() if str(device).startswith("cuda") else str(device)
    return {"device": name, "torch": torch.__version__, "triton": triton.__version__, "tritongrad": version,
            "liger": installed_version("liger_kernel") or installed_version("liger-kernel") or ""}


def _registry():
    """The bundled examples (imported on first use: importing them defines their kernels)."""
    from ... import examples

    return examples


def resolve(names: Sequence[str], registry=None) -> list:
    """Examples by name, and ``FILE.py:OP`` (the op, its file's ``make_inputs``, and where defined its
    ``reference``, ``BENCH_SIZES``, ``DTYPES``, ``traffic`` and ``flops``: subjects.load_subject); SystemExit with one
    line for an unknown name (listing the valid ones) or a mistake in the file."""
    found = []
    for name in names:
        if ":" in name or name.endswith(".py"):
            try:
                found.append(load_subject(name, reference=False))
            except UsageError as e:
                raise SystemExit(f"tritongrad bench: {e}") from None
            continue
        registry = registry or _registry()
        known = [e if isinstance(e, str) else e.name for e in registry.EXAMPLES]
        spelled = name if name in known else name.replace("-", "_")
        if spelled not in known:
            raise SystemExit(f"tritongrad bench: unknown example {name!r} (examples: {', '.join(known)}; "
                             "or name FILE.py:OP)")
        found.append(registry.get(spelled))
    return found


def gpu_device() -> str | None:
    import torch

    if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
        return "cuda"
    return None


def main(args: argparse.Namespace, *, registry=None, device: str | None = None, timer: Callable | None = None,
         console=None) -> int:
    """Run `tritongrad bench` (the CLI's arguments); registry, device and timer are injected by tests."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = console or (Console() if sys.stdout.isatty() else Console(width=150))  # logs: tables unwrapped
    if args.replot:
        return replot(Path(args.replot), console)
    if not args.examples:
        print("tritongrad bench: name at least one example (or --replot DIR)", file=sys.stderr)
        return 2
    try:
        examples = resolve(args.examples, registry)
    except SystemExit as e:
        print(e, file=sys.stderr)
        return 2
    device = device or gpu_device()
    if device is None:
        print(NO_GPU, file=sys.stderr)
        return 2
    plan = []
    for example in examples:
        sizes = list(args.sizes or getattr(example, "bench_sizes", None) or [])
        if not sizes:
            print(f"tritongrad bench: {example.name} has no BENCH_SIZES; pass --sizes", file=sys.stderr)
            return 2
        try:
            check_sizes(example, sizes)
        except UsageError as e:
            print(f"tritongrad bench: {e}", file=sys.stderr)
            return 2
        plan.append((example, sizes, implementations(example, args.impl, args.dtype)))
    eager_timer = timer or do_bench_median
    timer = timer or (graph_median if args.graphs else do_bench_median)
    args.mode = list(dict.fromkeys(args.mode))
    out = Path(args.out)
    meta = {**environment(device), "command": command_line(args), "timing": GRAPHS if args.graphs else EAGER}
    # launched eagerly under --graphs too: a captured copy is a graph's memcpy node, run by a copy engine (on an
    # H200 2755 GB/s, against 4248 by the kernel an eager copy launches)
    meta["copy_gbps"] = copy_bandwidth(eager_timer, device)
    console.print(f"[bold]tritongrad bench[/bold]: {meta['device']}, torch {meta['torch']}, triton {meta['triton']}, "
                  f"{args.dtype}; copy bandwidth {meta['copy_gbps']:.0f} GB/s "
                  "(1 GiB device to device, bytes read + written)")
    written, no_plot = [], False
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console) as progress:
        task = progress.add_task("bench", total=sum(len(s) * len(i) for _, s, i in plan))
        for example, sizes, impls in plan:
            timings = []
            for size in sizes:
                def started(impl, example=example, size=size):
                    progress.update(task, description=f"{example.name} {format_size(size)} {impl}")

                timings += measure_size(example, size, impls, dtype_name=args.dtype, device=device, modes=args.mode,
                                        timer=timer, started=started, done=lambda: progress.advance(task))
            for mode in args.mode:
                rows = make_rows(example.name, timings, mode=mode, dtype_name=args.dtype,
                                 traffic=getattr(example, "traffic", None), flops=getattr(example, "flops", None),
                                 meta=meta)
                progress.console.print(rich_table(rows))
                name = stem(example.name, args.dtype, mode, meta["timing"])
                write_csv(rows, out / f"{name}.csv")
                written.append(f"{name}.csv")
                try:
                    if write_plot(rows, out / f"{name}.png"):
                        written.append(f"{name}.png")
                    else:
                        no_plot = True
                except Exception as e:  # the numbers are in the CSV already; --replot can try again
                    progress.console.print(f"no plot for {name}: {short_error(e)}")
    (out / "summary.md").write_text(markdown(read_folder(out)))
    console.print(f"wrote {', '.join(written)} and summary.md (every CSV there) in {out}/")
    if no_plot:
        console.print("matplotlib is not installed: no PNG. Elsewhere: pip install 'tritongrad[plot]' and "
                      f"tritongrad bench --replot {out}")
    return 0
