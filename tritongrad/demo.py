"""``tritongrad demo``: derive, print and check the backward of every bundled example."""

from __future__ import annotations

import torch
from rich.console import Console
from rich.syntax import Syntax
from rich.table import Table

# relative error allowed: float64 in the interpreter; float32 on a GPU (tl.dot uses tf32)
TOLERANCE = {torch.float64: 1e-9, torch.float32: 5e-3}


def run(device: str) -> int:
    from . import grad
    from .codegen import HEADER
    from .examples import EXAMPLES, check, rmsnorm

    console = Console()
    dtype = torch.float64 if device == "cpu" else torch.float32
    where = "Triton's interpreter on the CPU" if device == "cpu" else torch.cuda.get_device_name()
    console.print(f"[bold]tritongrad demo[/bold]: {where}, {str(dtype).removeprefix('torch.')}\n")
    console.print("The forward kernel [bold]rmsnorm_fwd[/bold] (tritongrad/examples/rmsnorm.py) has this "
                  "derived backward:\n")
    # long lines wrap (word_wrap, overflow="fold") rather than being cut at the terminal's width
    console.print(Syntax(HEADER + "\n" + grad(rmsnorm.rmsnorm_fwd).src, "python", theme="ansi_dark", word_wrap=True))

    table = Table(title="Derived gradients against PyTorch autograd (largest relative error)")
    for column in ("example", "inputs", "forward", "gradients", "result"):
        table.add_column(column, overflow="fold")
    failures = 0
    for example in EXAMPLES:
        try:
            errors = check(example, device, dtype)
        except Exception as e:  # a demo reports every example, then fails at the end
            failures += 1
            table.add_row(example.name, ", ".join(example.wrt), "-", f"{type(e).__name__}: {e}", "[red]error")
            continue
        forward = errors.pop("forward")
        worst = max([forward, *errors.values()])
        ok = worst <= TOLERANCE[dtype]
        failures += not ok
        table.add_row(example.name, ", ".join(example.wrt), f"{forward:.1e}",
                      "  ".join(f"{k} {v:.1e}" for k, v in errors.items()),
                      "[green]ok" if ok else "[red]MISMATCH")
    console.print(table)
    if failures:
        console.print(f"[red]{failures} example(s) failed")
    return 1 if failures else 0
