"""Timing: ``do_bench`` medians of eager launches or of CUDA-graph replays, the copy bandwidth the GB/s are
compared with, and every implementation of an example at one size on its own copies of the same inputs, its
forward checked against eager's first (a wrong adapter or kernel gets a note, not a time)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..check import flatten
from .competitors import Impl

WARMUP_MS, REP_MS = 50, 200  # do_bench's warm-up and measuring time per measurement
COPY_BYTES = 2**30  # the copy-bandwidth probe: this many bytes copied device to device
# largest |got - eager| / max |eager| of a forward output before an implementation is called wrong
# (a sanity check of adapters and kernels, not an accuracy test: `tritongrad check` is that)
FORWARD_TOLERANCE = {"bfloat16": 5e-2, "float16": 5e-2, "float32": 1e-2}


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
    """An implementation's forward is not eager's: it gets this note instead of a time."""


def short_error(e: BaseException) -> str:
    """An exception as one line of a table's note column (out of memory, a mismatch, else its type and first line)."""
    import torch

    if isinstance(e, torch.cuda.OutOfMemoryError):
        return "out of memory"
    if isinstance(e, Mismatch):
        return str(e)
    lines = [line.strip() for line in str(e).strip().splitlines() if line.strip()] or [""]
    said = lines[0] if len(lines) == 1 or not lines[0].endswith(":") else f"{lines[0]} {lines[-1]}"  # Triton's
    return f"{type(e).__name__}: {said}"[:300]  # compile errors: "at 5:40:", the source, then what is wrong


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
        with torch.no_grad():  # (an op without a reference: its own outputs give the output gradients' shapes)
            want = flatten((example.reference or example.op)(*master))
        torch.manual_seed(1)
        grads_master = [torch.randn_like(w) if isinstance(w, torch.Tensor) and w.is_floating_point() else None
                        for w in want]
    except Exception as e:
        for t in timings:
            t.note = t.note or f"inputs or eager failed: {short_error(e)}"
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
                timing.note = short_error(e)
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
