"""µs per eager forward+backward step at small sizes, where the host decides the step: every
example side by side with its peers, each step on the same inputs, synchronised at the end of each run of steps.

    python -m benchmarks.host_step                     # a GPU: every example, float32 and bfloat16
    python -m benchmarks.host_step --examples rmsnorm softmax --dtypes bfloat16 --profile
    python -m benchmarks.host_step --smoke             # CPU, Triton's interpreter: tiny sizes, two steps (a test)
    python -m benchmarks.host_step --stub              # CPU, launches stubbed out: the host's Python alone

Implementations: ``tritongrad`` (the example's op), ``floor`` (a minimal hand-written autograd.Function launching
the example's forward kernel and a hand-written backward kernel with ``kernel[grid]``: benchmarks/host_floors.py;
rmsnorm, layernorm, swiglu, softmax), ``liger`` (Liger-Kernel's Function, where installed and it has the op),
``compile`` (torch.compile of the example's PyTorch reference) and ``eager`` (the reference). Each is first checked
against the eager reference (outputs and gradients; skipped with --stub, whose kernels do nothing) and left out of
the table, with a note, where it is wrong or fails. A step resets the leaves' gradients to None, runs the forward
and backs random output gradients through it (as host_gpu_split.training_step). Runs of ``--steps`` steps
alternate between implementations; each figure is the median run (and its fastest), per step. On a CPU the
clock is the process's CPU time (a shared machine's other work does not count), on a GPU the wall clock.
``--profile``: the op's step under cProfile, top entries.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

# a small size per example (the rows examples': 64x256); --smoke takes each example's first checked size
SMALL = {"sin": 16384, "softplus": 16384, "fn1": 16, "flash_attention": (2, 128, 64), "matmul": (128, 128, 128),
         "gather": (256, 1024), "rotary": (1, 4, 64, 64)}
ROWS = (64, 256)
IMPLS = ("tritongrad", "floor", "liger", "compile", "eager")


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--examples", nargs="*", help="example names (default: all)")
    p.add_argument("--dtypes", nargs="*", help="default: float32 bfloat16 (float32 on a CPU)")
    p.add_argument("--impls", nargs="*", help=f"default: {' '.join(IMPLS)} (no compile or liger on a CPU)")
    p.add_argument("--size", help="one size for every example, as 64x256 (default: a small one per example)")
    p.add_argument("--steps", type=int, help="steps per run (default 200; --smoke 2)")
    p.add_argument("--runs", type=int, help="runs per implementation (default 15; --smoke 1)")
    p.add_argument("--profile", action="store_true", help="profile the op's step")
    p.add_argument("--smoke", action="store_true", help="CPU, interpreter, tiny sizes, a few steps")
    p.add_argument("--stub", action="store_true", help="CPU, interpreter, launches stubbed out: Python only")
    return p.parse_args(argv)


def _stub_launches() -> None:
    """Triton's interpreted launch returns at once (before tritongrad's hooks wrap it): what is left is Python."""
    from triton.runtime.interpreter import InterpretedFunction

    def no_launch(self, *args, grid, warmup, **kwargs):
        return None

    InterpretedFunction.run = no_launch


def host_alone(stub: bool = True) -> None:
    """This process times the host's Python alone: Triton's interpreter (set before any kernel is defined), its
    launches stubbed (``stub``), one intra-op thread (the clock is the process's CPU time: no idle threads spinning
    on it), denormals flushed (stubbed kernels leave buffers unwritten: denormals would slow their sums)."""
    os.environ["TRITON_INTERPRET"] = "1"
    if stub:
        _stub_launches()
    import torch

    torch.set_num_threads(1)
    torch.set_flush_denormal(True)


def main(argv: list[str] | None = None) -> list[dict]:
    args = parse(argv)
    cpu = args.smoke or args.stub
    if args.stub:
        host_alone()
    elif cpu:
        os.environ["TRITON_INTERPRET"] = "1"  # before any kernel is defined
    import torch

    from tritongrad import examples
    from tritongrad.tools.sizes import format_size, parse_size

    device = "cpu" if cpu or not torch.cuda.is_available() else "cuda"
    names = args.examples or list(examples.NAMES)
    dtypes = args.dtypes or (["float32"] if device == "cpu" else ["float32", "bfloat16"])
    impls = args.impls or [i for i in IMPLS if device == "cuda" or i not in ("compile", "liger")]
    steps = args.steps or (2 if args.smoke else 200)
    runs = args.runs or (1 if args.smoke else 15)
    rows = []
    print(f"# host_step: {device}{' (launches stubbed)' if args.stub else ''}, {_environment(device)}")
    for name in names:
        example = examples.get(name)
        size = parse_size(args.size) if args.size else example.sizes[0] if args.smoke else SMALL.get(name, ROWS)
        for dtype_name in dtypes:
            dtype = getattr(torch, dtype_name)
            row = {"example": name, "size": format_size(size), "dtype": dtype_name, "notes": []}
            rows.append(row)
            if dtype not in example.dtypes:
                row["notes"].append(f"{name} takes {', '.join(str(d).removeprefix('torch.') for d in example.dtypes)}")
                continue
            master = example.make_inputs(size, device=device, dtype=dtype)
            candidates = _candidates(example, impls, row)
            if not args.stub:
                candidates = {k: fn for k, fn in candidates.items() if _correct(k, fn, example, master, dtype_name,
                                                                                 row)}
            made = {k: training_step(fn, master) for k, fn in candidates.items()}
            row.update(_time(made, steps, runs, device))
            print(_line(row), flush=True)
            if args.profile and "tritongrad" in made:
                _profile(made["tritongrad"], steps, device)
    print()
    print(markdown(rows, impls))
    return rows


def _environment(device: str) -> str:
    import torch
    import triton

    gpu = torch.cuda.get_device_name() if device == "cuda" else "no GPU"
    return f"{gpu}, torch {torch.__version__}, triton {triton.__version__}"


def _candidates(example, impls: list[str], row: dict) -> dict:
    """The implementations' callables for an example (a note for each one that is unavailable)."""
    import torch

    from benchmarks.host_floors import FLOORS
    from tritongrad.tools.bench.competitors import LIGER, liger_adapter

    found = {}
    for impl in impls:
        if impl == "tritongrad":
            found[impl] = example.op
        elif impl == "eager":
            found[impl] = example.reference
        elif impl == "floor":
            if example.name in FLOORS:
                found[impl] = FLOORS[example.name]
        elif impl == "liger":
            fn, note = liger_adapter(LIGER, example.name)
            if fn is None:
                row["notes"].append(f"liger: {note}")
            else:
                found[impl] = fn
        elif impl == "compile":
            torch._dynamo.reset()  # a fresh compile per example and dtype: no recompile limit
            found[impl] = torch.compile(example.reference, dynamic=False)
        else:
            raise SystemExit(f"unknown implementation {impl!r} (there are: {', '.join(IMPLS)})")
    return found


def training_step(fn, master: list):
    """One forward+backward of ``fn`` on leaves copied from ``master``, with fixed random output gradients, the
    leaves' .grad reset to None first."""
    import torch

    leaves = [t.detach().clone().requires_grad_(t.is_floating_point()) if isinstance(t, torch.Tensor) else t
              for t in master]
    outs = fn(*leaves)
    outs = [o for o in (outs if isinstance(outs, (tuple, list)) else (outs,)) if o.is_floating_point()]
    grads = [torch.randn_like(o) for o in outs]
    tensors = [t for t in leaves if isinstance(t, torch.Tensor) and t.requires_grad]

    def step():
        for t in tensors:
            t.grad = None
        outs = fn(*leaves)
        outs = [o for o in (outs if isinstance(outs, (tuple, list)) else (outs,)) if o.is_floating_point()]
        torch.autograd.backward(outs, grads)

    step.leaves, step.outputs = tensors, outs
    return step


def _correct(impl: str, fn, example, master: list, dtype_name: str, row: dict) -> bool:
    """Whether ``fn``'s outputs and gradients are the eager reference's (else a note, and no time)."""
    import torch

    from tritongrad.tools.check import TOLERANCE, relative_errors  # (`tritongrad check`'s measure and bounds)

    tol = TOLERANCE[getattr(torch, dtype_name)]
    try:
        got = _outputs_and_grads(fn, master)
        want = _outputs_and_grads(example.reference, master)
        for g, w in zip(got, want, strict=True):
            if (g is None) != (w is None):
                raise AssertionError("a gradient is missing")
            if g is not None and (error := relative_errors(g, w)[1]) > tol:
                raise AssertionError(f"max |error| / max |reference| {error:.1e} > {tol:.0e}")
    except Exception as e:  # noqa: BLE001 (a wrong or failing implementation is noted, the others timed)
        row["notes"].append(f"{impl}: {type(e).__name__}: {str(e).splitlines()[0][:120]}")
        return False
    return True


def _outputs_and_grads(fn, master: list) -> list:
    import torch

    gen = torch.Generator(device="cpu").manual_seed(0)
    leaves = [t.detach().clone().requires_grad_(t.is_floating_point()) if isinstance(t, torch.Tensor) else t
              for t in master]
    outs = fn(*leaves)
    outs = [o for o in (outs if isinstance(outs, (tuple, list)) else (outs,)) if o.is_floating_point()]
    grads = [torch.randn(o.shape, generator=gen).to(o) for o in outs]
    torch.autograd.backward(outs, grads)
    return [*[o.detach() for o in outs],
            *[t.grad for t in leaves if isinstance(t, torch.Tensor) and t.is_floating_point()]]


def _time(made: dict, steps: int, runs: int, device: str) -> dict:
    """Per implementation: (median, fastest) µs per step over ``runs`` runs of ``steps`` steps, alternating."""
    import torch

    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    clock = time.perf_counter if device == "cuda" else time.process_time
    for step in made.values():  # warm: compiled, derived, tuned, the op's replays learnt
        for _ in range(max(3, steps // 10)):
            step()
    sync()
    samples: dict[str, list[float]] = {k: [] for k in made}
    for _ in range(runs):
        for k, step in made.items():
            start = clock()
            for _ in range(steps):
                step()
            sync()
            samples[k].append((clock() - start) / steps * 1e6)
    return {k: (statistics.median(v), min(v)) for k, v in samples.items()}


def _line(row: dict) -> str:
    times = "  ".join(f"{k} {row[k][0]:.1f}" for k in IMPLS if k in row)
    notes = f"  ({'; '.join(row['notes'])})" if row["notes"] else ""
    return f"{row['example']} {row['size']} {row['dtype']}: {times or 'nothing timed'}{notes}"


def markdown(rows: list[dict], impls: list[str]) -> str:
    """The table: µs per step (median run; the fastest in brackets), ours over the floor and over Liger."""
    shown = [i for i in IMPLS if i in impls]
    head = ["example", "size", "dtype", *shown, "ours / floor", "ours / liger"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for row in rows:
        cells = [row["example"], row["size"], row["dtype"]]
        cells += [f"{row[i][0]:.1f} ({row[i][1]:.1f})" if i in row else "" for i in shown]
        for peer in ("floor", "liger"):
            cells.append(f"{row['tritongrad'][0] / row[peer][0]:.2f}" if "tritongrad" in row and peer in row else "")
        lines.append("| " + " | ".join(cells) + " |")
    notes = [f"- {r['example']} {r['dtype']}: {n}" for r in rows for n in r["notes"]]
    return "\n".join(lines + ([""] + notes if notes else []))


def _profile(step, steps: int, device: str) -> None:
    """The op's step under cProfile, top entries by own time. (Not torch.profiler: a named op called while it
    records takes the dispatcher's path, which is not the eager step timed here: library._plain_eager.)"""
    import cProfile
    import pstats

    import torch

    profile = cProfile.Profile()
    profile.enable()
    for _ in range(steps):
        step()
    if device == "cuda":
        torch.cuda.synchronize()
    profile.disable()
    sort, top = os.environ.get("SORT", "tottime"), int(os.environ.get("TOP", "25"))
    pstats.Stats(profile, stream=sys.stdout).sort_stats(sort).print_stats(top)


if __name__ == "__main__":
    main()
