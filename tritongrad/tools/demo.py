"""``tritongrad demo``: a guided tour on the bundled examples.

1., 2. two forward kernels, each with the backward tritongrad derives for it and its notes (how each
   input's gradient is written, how loops are reversed);
3. ``tritongrad check`` on every example: forward and gradients against PyTorch;
4. on a GPU, a short ``tritongrad bench`` table: the derived backward against eager PyTorch and
   torch.compile (and Liger-Kernel where it is installed).

On a terminal, source is highlighted and long lines wrap at its width; piped (``tritongrad demo | cat``, a
file), source is printed as it is, each line whole, and tables get a width at which their cells stay whole.
"""

from __future__ import annotations

import argparse
import inspect
from typing import IO

from rich.console import Console
from rich.syntax import Syntax

# the tour's kernels: a row-wise norm with a shared weight, and an online log-sum-exp loop
SHOWN = ("rmsnorm", "cross_entropy")
BENCHED = ("rmsnorm", "softmax", "swiglu")  # on a GPU, at one size
PIPED_WIDTH = 160  # columns of output that is not a terminal's (rich would take 80): the check table's cells fit


def console(file: IO[str] | None = None) -> Console:
    """A console on ``file`` (stdout): a terminal's width on a terminal, at least PIPED_WIDTH columns elsewhere."""
    found = Console(file=file)
    return found if found.is_terminal else Console(file=file, width=max(found.width, PIPED_WIDTH))


def print_source(out: Console, text: str) -> None:
    """Kernel source: highlighted on a terminal, its long lines wrapped (not cut) at the terminal's width; elsewhere
    as it is, each line whole, so that it can be pasted."""
    if out.is_terminal:
        out.print(Syntax(text.rstrip("\n"), "python", theme="ansi_dark", word_wrap=True))
    else:
        out.out(text.rstrip("\n"), highlight=False)


def run(device: str) -> int:
    from .. import grad
    from ..codegen.generate import HEADER
    from ..core.source import unwrap
    from ..examples import EXAMPLES
    from .check import check, default_dtypes, load_subject, table

    out = console()
    where = "Triton's interpreter on the CPU" if device == "cpu" else _gpu_name()
    out.print(f"[bold]tritongrad demo[/bold]: {where}\n")
    for step, name in enumerate(SHOWN, start=1):
        kernel = EXAMPLES[name].kernels[0]
        fn = unwrap(kernel).fn
        out.print(f"[bold]{step}. {name}[/bold]: the forward kernel [bold]{fn.__name__}[/bold] "
                  f"(tritongrad/examples/{name}.py) ...")
        print_source(out, inspect.getsource(fn))
        bwd = grad(kernel)
        out.print("... and the backward tritongrad derives from it (`tritongrad show` prints the same):")
        print_source(out, HEADER + "\n" + bwd.src + (f"\n{notes}" if (notes := bwd.launch_notes()) else ""))
        out.print()
    step = len(SHOWN) + 1

    out.print(f"\n[bold]{step}. tritongrad check[/bold]: every example's forward and gradients against PyTorch "
              "(fresh random inputs, sizes that are not multiples of the blocks)")
    rows = [r for name in EXAMPLES for r in check(load_subject(name), device, default_dtypes(device))]
    out.print(table(rows))
    failures = sum(not r.ok for r in rows)
    out.print(f"[red]{failures} of {len(rows)} failed" if failures else f"[green]all {len(rows)} ok")

    if device != "cpu":
        out.print(f"\n[bold]{step + 1}. tritongrad bench[/bold] (a short run; `tritongrad bench --help` for more)")
        from .bench import add_arguments, main

        parser = argparse.ArgumentParser()
        add_arguments(parser)
        main(parser.parse_args([*BENCHED, "--sizes", "8192x4096", "--mode", "bwd", "--dtype", "bfloat16",
                                "--impl", "tritongrad", "eager", "compile", "--out", "bench-results/demo"]))
    else:
        out.print("\n(on a GPU, the demo ends with a short `tritongrad bench` table)")
    return 1 if failures else 0


def _gpu_name() -> str:
    import torch

    return torch.cuda.get_device_name()
