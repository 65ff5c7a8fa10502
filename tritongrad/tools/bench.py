"""``tritongrad bench``: time the examples' operators against PyTorch and Liger-Kernel on a GPU.

    tritongrad bench rmsnorm softmax [--dtype bfloat16|float16|float32] [--sizes 4096x4096 ...]
                     [--mode fwd|bwd|fwd+bwd ...] [--impl tritongrad eager ...] [--graphs] [--out DIR]
    tritongrad bench --replot DIR        # PNGs and summary.md again from DIR's CSVs (no GPU needed)

Implementations of one example, all measured in one run, one size after another:

- ``tritongrad``: the example's ``@tritongrad.op`` (its forward launches, the derived backward);
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
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import shlex
import subprocess
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .check import flatten
from .sizes import format_size, parse_size

IMPLS = ("tritongrad", "liger-fwd", "liger", "compile", "eager")
MODES = ("fwd", "bwd", "fwd+bwd")
DTYPES = ("bfloat16", "float16", "float32")
WARMUP_MS, REP_MS = 50, 200  # do_bench's warm-up and measuring time per measurement
COPY_BYTES = 2**30  # the copy-bandwidth probe: this many bytes copied device to device
# largest |got - eager| / max |eager| of a forward output before an implementation is called wrong
# (a sanity check of adapters and kernels, not an accuracy test: `tritongrad check` is that)
FORWARD_TOLERANCE = {"bfloat16": 5e-2, "float16": 5e-2, "float32": 1e-2}

FIELDS = ("example", "size", "impl", "mode", "dtype", "timing", "ms", "gbps", "copy_pct", "tflops", "vs_best",
          "fwd_ms", "fwd_bwd_ms", "bwd_ms", "bytes", "flop", "note",
          "device", "copy_gbps", "torch", "triton", "tritongrad", "liger", "command")
NUMERIC = {"ms", "gbps", "copy_pct", "tflops", "vs_best", "fwd_ms", "fwd_bwd_ms", "bwd_ms", "bytes", "flop",
           "copy_gbps"}

OPTIONAL = {"timing"}  # fields CSVs written before them lack
EAGER, GRAPHS = "eager launches", "CUDA graphs"  # the timings: each call launched by the host, or graph replays

NO_GPU = ("tritongrad bench: no CUDA GPU here (bench times kernels on one); "
          "`tritongrad bench --replot DIR` redraws plots and tables from CSVs without one")


# --------------------------------------------------------------------------- Liger-Kernel adapters

# example -> (Liger module, its attribute, attribute -> a callable with the reference's signature).
# `liger`: Liger's hand-written autograd.Function.
LIGER = {
    "rmsnorm": ("liger_kernel.ops.rms_norm", "LigerRMSNormFunction",
                lambda f: lambda x, w, eps=1e-6: f.apply(x, w, eps)),
    "layernorm": ("liger_kernel.ops.layer_norm", "LigerLayerNormFunction",
                  lambda f: lambda x, w, b, eps=1e-5: f.apply(x, w, b, eps)),
    "add_rmsnorm": ("liger_kernel.ops.fused_add_rms_norm", "LigerFusedAddRMSNormFunction",
                    lambda f: lambda x, r, w, eps=1e-6: f.apply(x, r, w, eps)),
    "swiglu": ("liger_kernel.ops.swiglu", "LigerSiLUMulFunction", lambda f: lambda a, b: f.apply(a, b)),
    "geglu": ("liger_kernel.ops.geglu", "LigerGELUMulFunction", lambda f: lambda a, b: f.apply(a, b)),
    "softmax": ("liger_kernel.ops.softmax", "LigerSoftmaxFunction", lambda f: lambda x: f.apply(x)),
    "cross_entropy": ("liger_kernel.ops.cross_entropy", "LigerCrossEntropyFunction",
                      lambda f: lambda logits, target, ignore_index=-100:  # per-row losses, as the example's
                      f.apply(logits, target, None, ignore_index, 0.0, 0.0, "none")[0]),
    "rotary": ("liger_kernel.ops.rope", "LigerRopeFunction",
               lambda f: lambda q, k, cos, sin: f.apply(q, k, cos, sin)),
}

# `liger-fwd` (issue 10): Liger's forward launcher, which allocates the output and launches Liger's
# forward kernel, wrapped with @tritongrad.op (by `implementations`): the backward is the derived one.
LIGER_FWD = {
    "rmsnorm": ("liger_kernel.ops.rms_norm", "rms_norm_forward",
                lambda f: lambda x, w, eps=1e-6: f(x, w, eps, 0.0, "llama", None)[0]),
    "layernorm": ("liger_kernel.ops.layer_norm", "layer_norm_forward",
                  lambda f: lambda x, w, b, eps=1e-5: f(x, w, b, eps)[0]),
    "swiglu": ("liger_kernel.ops.swiglu", "swiglu_forward", lambda f: lambda a, b: f(a, b)[2]),
    "softmax": ("liger_kernel.ops.softmax", "_softmax_forward", lambda f: lambda x: f(x)[0]),
}

# other spellings of the examples' names
ALIASES = {"rms_norm": "rmsnorm", "layer_norm": "layernorm", "fused_add_rmsnorm": "add_rmsnorm",
           "residual_rmsnorm": "add_rmsnorm", "add_rms_norm": "add_rmsnorm", "crossentropy": "cross_entropy",
           "rope": "rotary", "rotary_embedding": "rotary", "silu_mul": "swiglu", "gelu_mul": "geglu"}


def _canonical(name: str) -> str:
    name = name.lower().replace("-", "_")
    return ALIASES.get(name, name)


def liger_adapter(table: dict, example: str) -> tuple[Callable | None, str]:
    """(callable, "") for the example from a Liger table, or (None, why not): Liger-Kernel is imported
    here, only when installed, and never required."""
    import importlib

    entry = table.get(_canonical(example))
    if entry is None:
        return None, f"Liger-Kernel has no counterpart of {example}"
    module_name, attribute, adapt = entry
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        return None, "liger_kernel is not installed"
    if not hasattr(module, attribute):
        return None, f"liger_kernel {_version('liger_kernel') or ''} has no {module_name}.{attribute}"
    return adapt(getattr(module, attribute)), ""


# --------------------------------------------------------------------------- measuring

@dataclass
class Timing:
    """One implementation at one size: medians in ms (None: not measured or failed) and a note."""

    size: Any
    impl: str
    fwd: float | None = None
    fwd_bwd: float | None = None
    note: str = ""

    def ms(self, mode: str) -> float | None:
        if mode == "fwd":
            return self.fwd
        if mode == "fwd+bwd":
            return self.fwd_bwd
        return backward_ms(self.fwd, self.fwd_bwd)


def backward_ms(fwd: float | None, fwd_bwd: float | None) -> float | None:
    """bwd = median(fwd+bwd) - median(fwd), the same for every implementation."""
    if fwd is None or fwd_bwd is None:
        return None
    return fwd_bwd - fwd


def do_bench_median(fn: Callable[[], Any], grad_to_none: list | None) -> float:
    """The default timer: triton.testing.do_bench's median, in ms."""
    import triton.testing

    return triton.testing.do_bench(fn, warmup=WARMUP_MS, rep=REP_MS, grad_to_none=grad_to_none,
                                   return_mode="median")


def graph_median(fn: Callable[[], Any], grad_to_none: list | None) -> float:
    """The ``--graphs`` timer: ``fn`` captured once in a CUDA graph, its replays timed by do_bench (median, ms).
    Warmed up first on a side stream, as capturing requires (compiling, autotuning, an op's first backward,
    which checks its gradients and waits for the device); gradients start as None, so that the captured
    backward stores them rather than adding to them (as do_bench's grad_to_none does for eager launches)."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            for t in grad_to_none or ():
                t.grad = None
            fn()
    torch.cuda.current_stream().wait_stream(side)
    for t in grad_to_none or ():
        t.grad = None
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            fn()
        return do_bench_median(graph.replay, None)
    finally:
        graph.reset()  # its memory back before the next implementation's


def copy_bandwidth(timer: Callable, device: str, nbytes: int | None = None) -> float:
    """GB/s of a device-to-device copy of `nbytes` (bytes read + bytes written over the median time)."""
    import torch

    nbytes = nbytes or COPY_BYTES
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    ms = timer(lambda: dst.copy_(src), None)
    return 2 * nbytes / (ms * 1e-3) / 1e9


class Mismatch(Exception):
    pass


def _short(e: BaseException) -> str:
    import torch

    if isinstance(e, torch.cuda.OutOfMemoryError):
        return "out of memory"
    if isinstance(e, Mismatch):
        return str(e)
    first = (str(e).strip().splitlines() or [""])[0]
    return f"{type(e).__name__}: {first}"[:300]


def forward_mismatch(got: list, want: list, dtype_name: str) -> str | None:
    """Why `got` is not the eager forward's `want` (None when it is, within FORWARD_TOLERANCE)."""
    import torch

    if len(got) != len(want):
        return f"returns {len(got)} outputs, eager {len(want)}"
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        if not isinstance(w, torch.Tensor):
            continue
        if not isinstance(g, torch.Tensor) or g.shape != w.shape:
            shape = tuple(g.shape) if isinstance(g, torch.Tensor) else type(g).__name__
            return f"output {i} has shape {shape}, eager {tuple(w.shape)}"
        if not w.is_floating_point():
            continue
        g, w = g.detach().float(), w.detach().float()
        if not torch.equal(torch.isfinite(g), torch.isfinite(w)):
            return f"output {i} has non-finite values where eager has none (or the reverse)"
        finite = torch.isfinite(w)
        scale = w[finite].abs().max().item() if finite.any() else 1.0
        err = (g - w)[finite].abs().max().item() / max(scale, 1e-30) if finite.any() else 0.0
        if err > FORWARD_TOLERANCE.get(dtype_name, 1e-2):
            return f"forward differs from eager (relative error {err:.2g})"
    return None


@dataclass
class Impl:
    name: str
    make: Callable[[], Callable] | None  # called once per size (torch.compile starts afresh); None: unavailable
    note: str = ""


def implementations(example, requested: Sequence[str] | None, dtype_name: str) -> list[Impl]:
    """The implementations to time for an example (all of IMPLS by default; Liger's where it has the op)."""
    import torch

    names = list(requested) if requested else [
        i for i in IMPLS
        if i not in ("liger", "liger-fwd") or _canonical(example.name) in (LIGER if i == "liger" else LIGER_FWD)]
    impls = []
    for name in names:
        if name == "tritongrad":
            dtypes = getattr(example, "dtypes", None)
            if dtypes and getattr(torch, dtype_name) not in dtypes:
                supported = ", ".join(str(d).removeprefix("torch.") for d in dtypes)
                impls.append(Impl(name, None, f"the example supports {supported}"))
            else:
                impls.append(Impl(name, lambda: example.op))
        elif name == "eager":
            impls.append(Impl(name, lambda: example.reference))
        elif name == "compile":
            def compiled():
                torch._dynamo.reset()  # a fresh compile per size: no recompile limit, no dynamic shapes
                return torch.compile(example.reference, dynamic=False)
            impls.append(Impl(name, compiled))
        elif name == "liger":
            fn, note = liger_adapter(LIGER, example.name)
            impls.append(Impl(name, (lambda fn=fn: fn) if fn else None, note))
        elif name == "liger-fwd":
            fn, note = liger_adapter(LIGER_FWD, example.name)
            if fn is not None:
                import tritongrad

                fn.__name__ = fn.__qualname__ = f"liger_{_canonical(example.name)}_forward"
                op = tritongrad.op(fn)
                impls.append(Impl(name, lambda op=op: op))
            else:
                impls.append(Impl(name, None, note))
        else:
            raise ValueError(f"unknown implementation {name!r} (there are: {', '.join(IMPLS)})")
    return impls


def measure_size(example, size, impls: list[Impl], *, dtype_name: str, device: str, modes: Sequence[str],
                 timer: Callable, started: Callable[[str], None] = lambda impl: None,
                 done: Callable[[], None] = lambda: None) -> list[Timing]:
    """Every implementation of an example at one size, in one go (`started(impl)` and `done()`
    around each, for a progress bar)."""
    import torch

    need_fwd = "fwd" in modes or "bwd" in modes
    need_fwd_bwd = "fwd+bwd" in modes or "bwd" in modes
    dtype = getattr(torch, dtype_name)
    timings = [Timing(size, impl.name, note=impl.note) for impl in impls]
    try:
        torch.manual_seed(0)
        master = tuple(flatten(example.make_inputs(size, device=device, dtype=dtype)))
        with torch.no_grad():
            want = flatten(example.reference(*master))
        torch.manual_seed(1)
        grads_master = [torch.randn_like(w) if isinstance(w, torch.Tensor) and w.is_floating_point() else None
                        for w in want]
    except Exception as e:
        for t in timings:
            t.note = t.note or f"inputs or eager failed: {_short(e)}"
            done()
        _empty_cache(device)
        return timings

    for impl, timing in zip(impls, timings, strict=True):
        started(impl.name)
        if impl.make is not None:
            try:
                _time_one(impl, timing, master, want, grads_master, dtype_name=dtype_name, need_fwd=need_fwd,
                          need_fwd_bwd=need_fwd_bwd, timer=timer)
            except Exception as e:  # out of memory, a dtype or shape it does not take, a compile error...
                timing.note = _short(e)
            _empty_cache(device)
        done()
    return timings


def _time_one(impl: Impl, timing: Timing, master: tuple, want: list, grads_master: list, *, dtype_name: str,
              need_fwd: bool, need_fwd_bwd: bool, timer: Callable) -> None:
    """Time one implementation on its own copies of the inputs and output gradients (some backward
    functions write into their saved inputs or the incoming gradient)."""
    import torch

    fn = impl.make()
    leaves = [t.detach().clone().requires_grad_(t.is_floating_point()) if isinstance(t, torch.Tensor) else t
              for t in master]
    grads = [g.clone() if g is not None else None for g in grads_master]
    out = flatten(fn(*leaves))  # warms up (compiles) and checks the forward
    if impl.name != "eager" and (why := forward_mismatch(out, want, dtype_name)):
        raise Mismatch(why)
    targets = [i for i, o in enumerate(out) if grads[i] is not None and isinstance(o, torch.Tensor) and o.requires_grad]
    del out
    tensors = [t for t in leaves if isinstance(t, torch.Tensor) and t.requires_grad]
    if need_fwd:
        timing.fwd = timer(lambda: fn(*leaves), tensors)
    if need_fwd_bwd:
        if not targets:
            raise Mismatch("no output carries a gradient")

        def step():
            outs = flatten(fn(*leaves))
            torch.autograd.backward([outs[i] for i in targets], [grads[i] for i in targets])

        timing.fwd_bwd = timer(step, tensors)


def _empty_cache(device: str) -> None:
    import torch

    if str(device).startswith("cuda"):
        torch.cuda.empty_cache()


# --------------------------------------------------------------------------- rows, CSV, tables, plots

def _pass_amount(table: dict | None, mode: str) -> float | None:
    if not table:
        return None
    if mode == "fwd+bwd":
        if table.get("fwd") is None or table.get("bwd") is None:
            return None
        return table["fwd"] + table["bwd"]
    return table.get(mode)


def make_rows(example_name: str, timings: Iterable[Timing], *, mode: str, dtype_name: str,
              traffic: Callable | None, flops: Callable | None, meta: dict) -> list[dict]:
    """One row per (size, implementation) for a mode: every number the CSV, tables and plots show."""
    import torch

    dtype = getattr(torch, dtype_name)
    timings = list(timings)
    rows = []
    for t in timings:
        ms = t.ms(mode)
        row = dict.fromkeys(FIELDS)
        row.update(example=example_name, size=format_size(t.size), impl=t.impl, mode=mode, dtype=dtype_name,
                   ms=ms, fwd_ms=t.fwd, fwd_bwd_ms=t.fwd_bwd, bwd_ms=backward_ms(t.fwd, t.fwd_bwd), note=t.note,
                   **meta)
        try:
            row["bytes"] = _pass_amount(traffic(t.size, dtype), mode) if traffic else None
        except Exception as e:
            row["note"] = (row["note"] + "; " if row["note"] else "") + f"traffic: {_short(e)}"
        try:
            row["flop"] = _pass_amount(flops(t.size), mode) if flops else None
        except Exception as e:
            row["note"] = (row["note"] + "; " if row["note"] else "") + f"flops: {_short(e)}"
        if ms is not None and ms > 0:
            if row["bytes"]:
                row["gbps"] = row["bytes"] / (ms * 1e-3) / 1e9
                if meta.get("copy_gbps"):
                    row["copy_pct"] = 100 * row["gbps"] / meta["copy_gbps"]
            if row["flop"]:
                row["tflops"] = row["flop"] / (ms * 1e-3) / 1e12
        rows.append(row)
    for row in rows:  # this time / the fastest other implementation's at the same size
        others = [r["ms"] for r in rows if r["size"] == row["size"] and r is not row and r["ms"] is not None
                  and r["ms"] > 0]
        if row["ms"] is not None and row["ms"] > 0 and others:
            row["vs_best"] = row["ms"] / min(others)
    return rows


def write_csv(rows: list[dict], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: ("" if row.get(k) is None else row[k]) for k in FIELDS})


def read_csv(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    for row in rows:
        for key in OPTIONAL:
            row.setdefault(key, "")
        for key in NUMERIC:
            value = row.get(key)
            row[key] = float(value) if value not in (None, "") else None
    return rows


def read_folder(folder: Path) -> list[dict]:
    """The rows of every benchmark CSV in a folder (other CSVs are left alone)."""
    rows = []
    for file in sorted(Path(folder).glob("*.csv")):
        with open(file, newline="") as f:
            header = next(csv.reader(f), [])
        if set(FIELDS) - OPTIONAL <= set(header):
            rows.extend(read_csv(file))
    return rows


def stem(example: str, dtype_name: str, mode: str, timing: str | None = None) -> str:
    return f"{example}-{dtype_name}-{mode}" + ("-graphs" if timing == GRAPHS else "")


def _fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _impl_order(rows: list[dict]) -> list[str]:
    seen = list(dict.fromkeys(r["impl"] for r in rows))
    return [i for i in IMPLS if i in seen] + [i for i in seen if i not in IMPLS]


def _caption(mode: str, timing: str | None = None) -> str:
    what = {"fwd": "forward (autograd recording)", "fwd+bwd": "forward + backward",
            "bwd": "backward = median(fwd+bwd) - median(fwd)"}[mode]
    how = "do_bench median of CUDA-graph replays (GPU time)" if timing == GRAPHS else "do_bench median"
    return f"{what}; ms: {how}; vs best: ms / the fastest other implementation's (above 1: slower)"


def rich_table(rows: list[dict]):
    """The terminal table of one example, dtype and mode: a section per size."""
    from rich.table import Table

    first = rows[0]
    with_flops = any(r["tflops"] is not None for r in rows)
    title = f"{first['example']} · {first['dtype']} · {first['mode']}"
    title += " · CUDA graphs" if first["timing"] == GRAPHS else ""
    table = Table(title=title, caption=_caption(first["mode"], first["timing"]))
    for column in ("size", "impl", "ms", "GB/s", "% copy", *(["TFLOP/s"] if with_flops else []), "vs best", "note"):
        table.add_column(column, justify="left" if column in ("size", "impl", "note") else "right")
    sizes = list(dict.fromkeys(r["size"] for r in rows))
    for size in sizes:
        group = [r for r in rows if r["size"] == size]
        for n, r in enumerate(sorted(group, key=lambda r: _impl_order(rows).index(r["impl"]))):
            best = r["vs_best"] is not None and r["vs_best"] <= 1
            table.add_row(size if n == 0 else "", r["impl"], _fmt(r["ms"], ".3f"), _fmt(r["gbps"], ".0f"),
                          _fmt(r["copy_pct"], ".0f"), *([_fmt(r["tflops"], ".1f")] if with_flops else []),
                          ("[bold green]" if best else "") + _fmt(r["vs_best"], ".2f"), _shorten(r["note"], 60),
                          end_section=n == len(group) - 1)
    return table


def _shorten(text: str | None, n: int) -> str:
    text = text or ""
    return text if len(text) <= n else text[: n - 1] + "…"


def markdown(rows: list[dict]) -> str:
    """Markdown tables of rows (any examples, dtypes, modes): per dtype and mode, a header with the
    command(s), GPU and versions, a summary (ms per implementation and % of copy bandwidth), then one
    detailed table per example."""
    out = []
    groups = list(dict.fromkeys((r["dtype"], r["mode"], r.get("timing") or EAGER) for r in rows))
    for dtype_name, mode, timing in groups:
        group = [r for r in rows if (r["dtype"], r["mode"], r.get("timing") or EAGER) == (dtype_name, mode, timing)]
        out.append(f"### {mode}, {dtype_name}" + (f", {timing}" if timing == GRAPHS else "") + "\n")
        for command in dict.fromkeys(r["command"] for r in group if r.get("command")):
            out.append(f"    {command}\n")
        for env in dict.fromkeys(_environment(r) for r in group):
            out.append(env + "\n")
        out.append(f"{_caption(mode, timing)}.\n")
        impls = _impl_order(group)
        out.append("| example | size | " + " | ".join(impls) + " |")
        out.append("| --- | --- | " + " | ".join("---" for _ in impls) + " |")
        for example in dict.fromkeys(r["example"] for r in group):
            ex_rows = [r for r in group if r["example"] == example]
            for size in dict.fromkeys(r["size"] for r in ex_rows):
                cells = []
                for impl in impls:
                    r = next((r for r in ex_rows if r["size"] == size and r["impl"] == impl), None)
                    cells.append(_summary_cell(r))
                out.append(f"| {example} | {size} | " + " | ".join(cells) + " |")
        out.append("\nms (share of the copy bandwidth); '-': not measured (see the details).\n")
        for example in dict.fromkeys(r["example"] for r in group):
            ex_rows = [r for r in group if r["example"] == example]
            with_flops = any(r["tflops"] is not None for r in ex_rows)
            out.append(f"#### {example}, {mode}, {dtype_name}" + (f", {timing}" if timing == GRAPHS else "") + "\n")
            head = ["size", "impl", "ms", "GB/s", "% copy", *(["TFLOP/s"] if with_flops else []), "vs best", "note"]
            out.append("| " + " | ".join(head) + " |")
            out.append("| " + " | ".join("---" for _ in head) + " |")
            for r in ex_rows:
                cells = [r["size"], r["impl"], _fmt(r["ms"], ".3f"), _fmt(r["gbps"], ".0f"), _fmt(r["copy_pct"], ".0f"),
                         *([_fmt(r["tflops"], ".1f")] if with_flops else []), _fmt(r["vs_best"], ".2f"),
                         (r["note"] or "").replace("|", "\\|")]
                out.append("| " + " | ".join(cells) + " |")
            out.append("")
    return "\n".join(out).rstrip() + "\n"


def _summary_cell(r: dict | None) -> str:
    if r is None or r["ms"] is None:
        return "-"
    return f"{r['ms']:.3f} ({r['copy_pct']:.0f}%)" if r["copy_pct"] is not None else f"{r['ms']:.3f}"


def _environment(r: dict) -> str:
    versions = [f"torch {r['torch']}", f"triton {r['triton']}", f"tritongrad {r['tritongrad']}"]
    if r.get("liger"):
        versions.append(f"Liger-Kernel {r['liger']}")
    copy = f"; copy bandwidth {r['copy_gbps']:.0f} GB/s (1 GiB device to device)" if r.get("copy_gbps") else ""
    return f"{r['device']}, " + ", ".join(versions) + copy + "."


def _size_axis(sizes: list[str]) -> tuple[list[float], str, bool]:
    """x positions for size labels, the axis label, and whether a log scale suits them."""
    try:
        parsed = [tuple(int(p) for p in s.split("x")) for s in sizes]
    except ValueError:
        return list(range(len(sizes))), "size", False
    if len({len(p) for p in parsed}) == 1:
        varying = [i for i in range(len(parsed[0])) if len({p[i] for p in parsed}) > 1]
        if len(parsed[0]) == 1 or len(varying) == 1:
            axis = varying[0] if varying else 0
            xs = [float(p[axis]) for p in parsed]
            label = "x".join("N" if i == axis else str(v) for i, v in enumerate(parsed[0])) if len(parsed[0]) > 1 \
                else "size"
            return xs, label, len(xs) > 1 and max(xs) / min(xs) >= 8
    xs = [float(math.prod(p)) for p in parsed]
    if len(set(xs)) == len(xs) and min(xs) > 0:  # (a trailing flag such as attention's causal 0 counts none)
        return xs, "elements", len(xs) > 1 and max(xs) / min(xs) >= 8
    return list(range(len(sizes))), "size", False


def write_plot(rows: list[dict], path: Path) -> bool:
    """A PNG of GB/s (TFLOP/s where the example counts FLOPs) against size, one line per
    implementation, for one example, dtype and mode. False (nothing written) without matplotlib."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        return False
    first = rows[0]
    key, unit = ("tflops", "TFLOP/s") if any(r["tflops"] is not None for r in rows) else ("gbps", "GB/s")
    sizes = list(dict.fromkeys(r["size"] for r in rows))
    xs, xlabel, log = _size_axis(sizes)
    x_of = dict(zip(sizes, xs, strict=True))
    fig = Figure(figsize=(7, 4.5), dpi=120)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for impl in _impl_order(rows):
        points = [(x_of[r["size"]], r[key]) for r in rows if r["impl"] == impl and r[key] is not None]
        color = f"C{IMPLS.index(impl)}" if impl in IMPLS else None  # one color per implementation in every plot
        if points:
            ax.plot(*zip(*points, strict=True), marker="o", label=impl, color=color,
                    linewidth=2 if impl == "tritongrad" else 1.2)
    copy = first.get("copy_gbps")
    if key == "gbps" and copy:
        ax.axhline(copy, color="gray", linestyle="--", linewidth=1, label=f"copy {copy:.0f} GB/s")
    if log:
        ax.set_xscale("log", base=2)
    ax.set_xticks(xs, sizes, rotation=30 if len(sizes) > 4 else 0, fontsize=8)
    ax.minorticks_off()
    ax.set_xlabel(xlabel)
    ax.set_ylabel(unit)
    ax.set_ylim(bottom=0)
    ax.set_title(f"{first['example']} · {first['mode']} · {first['dtype']} · {first.get('device') or ''}", fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    return True


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


# --------------------------------------------------------------------------- the command

def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("examples", nargs="*", metavar="EXAMPLE", help="bundled examples to time")
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


def _version(dist: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


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
            "liger": _version("liger_kernel") or _version("liger-kernel") or ""}


def _registry():
    """The bundled examples (imported on first use: importing them defines their kernels)."""
    from .. import examples

    return examples


def resolve(names: Sequence[str], registry=None) -> list:
    """Examples by name; SystemExit with one line listing the valid names for an unknown one."""
    registry = registry or _registry()
    known = [e if isinstance(e, str) else e.name for e in registry.EXAMPLES]
    found = []
    for name in names:
        spelled = name if name in known else name.replace("-", "_")
        if spelled not in known:
            raise SystemExit(f"tritongrad bench: unknown example {name!r} (examples: {', '.join(known)})")
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
                    progress.console.print(f"no plot for {name}: {_short(e)}")
    (out / "summary.md").write_text(markdown(read_folder(out)))
    console.print(f"wrote {', '.join(written)} and summary.md (every CSV there) in {out}/")
    if no_plot:
        console.print("matplotlib is not installed: no PNG. Elsewhere: pip install 'tritongrad[plot]' and "
                      f"tritongrad bench --replot {out}")
    return 0
