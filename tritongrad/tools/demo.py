"""``tritongrad demo``: a guided tour on the bundled examples.

1. a forward kernel and the backward tritongrad derives for it, with its notes (how each input's
   gradient is written, how loops are reversed);
2. ``tritongrad check`` on every example: forward and gradients against PyTorch;
3. on a GPU, a short ``tritongrad bench`` table: the derived backward against eager PyTorch and
   torch.compile (and Liger-Kernel where it is installed).
"""

from __future__ import annotations

import argparse
import inspect

from rich.console import Console
from rich.syntax import Syntax

# the tour's kernels: a row-wise norm with a shared weight, and an online log-sum-exp loop
SHOWN = ("rmsnorm", "cross_entropy")
BENCHED = ("rmsnorm", "softmax", "swiglu")  # on a GPU, at one size


def run(device: str) -> int:
    from .. import grad
    from ..codegen.generate import HEADER
    from ..core.source import unwrap
    from ..examples import EXAMPLES
    from .check import check, default_dtypes, load_subject, table

    console = Console()
    where = "Triton's interpreter on the CPU" if device == "cpu" else _gpu_name()
    console.print(f"[bold]tritongrad demo[/bold]: {where}\n")
    for name in SHOWN:
        kernel = EXAMPLES[name].kernels[0]
        fn = unwrap(kernel).fn
        console.print(f"[bold]1. {name}[/bold]: the forward kernel [bold]{fn.__name__}[/bold] "
                      f"(tritongrad/examples/{name}.py) ...")
        console.print(Syntax(inspect.getsource(fn), "python", theme="ansi_dark", word_wrap=True))
        bwd = grad(kernel)
        console.print("... and the backward tritongrad derives from it (`tritongrad show` prints the same):")
        # long lines wrap (word_wrap) rather than being cut at the terminal's width
        console.print(Syntax(HEADER + "\n" + bwd.src, "python", theme="ansi_dark", word_wrap=True))
        if notes := bwd.launch_notes():
            console.print(notes)

    console.print("\n[bold]2. tritongrad check[/bold]: every example's forward and gradients against PyTorch "
                  "(fresh random inputs, sizes that are not multiples of the blocks)")
    rows = [r for name in EXAMPLES for r in check(load_subject(name), device, default_dtypes(device))]
    console.print(table(rows))
    failures = sum(not r.ok for r in rows)
    console.print(f"[red]{failures} of {len(rows)} failed" if failures else f"[green]all {len(rows)} ok")

    if device != "cpu":
        console.print("\n[bold]3. tritongrad bench[/bold] (a short run; `tritongrad bench --help` for more)")
        from .bench import add_arguments, main

        parser = argparse.ArgumentParser()
        add_arguments(parser)
        main(parser.parse_args([*BENCHED, "--sizes", "8192x4096", "--mode", "bwd", "--dtype", "bfloat16",
                                "--impl", "tritongrad", "eager", "compile", "--out", "bench-results/demo"]))
    else:
        console.print("\n(on a GPU, the demo ends with a short `tritongrad bench` table)")
    return 1 if failures else 0


def _gpu_name() -> str:
    import torch

    return torch.cuda.get_device_name()
