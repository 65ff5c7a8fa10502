"""Launch settings of derived kernels, chosen by timing them (backward tuning).

A derived backward is not its forward: it reads more, holds more values per row, and a
persistent one loops over the forward's programs, so the forward's ``num_warps`` is
rarely its best (on an H200 a bf16 RMSNorm backward ran 1.6x faster with 4 warps and 8
programs per multiprocessor than with the forward's 8 warps and one). On a GPU, the first
launch of each variant at each shape times a few settings for each of its kernels with
``triton.testing.do_bench`` and keeps the fastest; later launches at that shape reuse it.
Buffers the kernel adds into are restored after the trials, so the launch that counts
starts from what the caller gave.

The backward of an autotuned launch is also launched under the autotuner's other configs (their tile
sizes, warps and stages; host/configs.py says why that is the same gradient), and that of a kernel that
declares configs (``tritongrad.backward_configs``) under those, and keeps the fastest, per shape: a
matmul's input gradients are products of other shapes than its output, and at 4096^3 in bf16 on an
H200 its backward ran 1.7x faster with 128 x 128 x 128 tiles than with the forward's best.

Not tuned (the forward's settings are used): in Triton's interpreter, while a CUDA graph
is being captured, with ``deterministic=True`` (another setting sums in another order),
and with the environment variable ``TRITONGRAD_TUNE=0``.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..core.device import recorded, tracing

WARPS = (4, 8, 16, 32)  # 32: a program holding a 16384-wide row
WAVES = (1, 2, 4, 8)  # persistent programs per multiprocessor
# software pipelining of a kernel's loop (over blocks, over the forward's programs: interchange.py, or a persistent
# kernel's over its rows: persistent.py); 1: none, the least shared memory, which float32 tiles of
# 128 x 128 x 64 need on an H200
STAGES = (1, 2, 3, 4)


@dataclass(frozen=True)
class Setting:
    """How to launch a derived kernel: ``num_warps`` (None: the forward's), for a persistent one how many
    programs per multiprocessor, and for one with a loop its ``num_stages`` (None: the forward's; a persistent
    kernel's loop over its rows: 1); ``held``: a persistent kernel holds the values it loads once (a weight) in
    registers across its loop, else loads them for each row (persistent.py)."""

    num_warps: int | None = None
    waves: int = 1
    num_stages: int | None = None
    held: bool = True


DEFAULT = Setting()
_best: dict[tuple, Setting] = {}
_configs: dict[tuple, tuple] = {}
_lock = threading.Lock()


def enabled(device: Any) -> bool:
    if os.environ.get("TRITONGRAD_TUNE", "1") == "0" or os.environ.get("TRITON_INTERPRET", "0") == "1":
        return False
    if recorded():  # (a recorded backward: its trials would be recorded too)
        return False
    if getattr(device, "type", None) != "cuda":
        return False
    import torch

    return not torch.cuda.is_current_stream_capturing()


def candidates(persistent: bool, pipelined: bool = False, holds: bool = False, taped: bool = False) -> list[Setting]:
    if persistent:  # how many programs share a multiprocessor, how many rows each has in flight, what it holds
        # ``taped``: its rows share the program's state tape rows, written and read again in each row's turn; a
        # pipelined loop over the rows gave wrong gradients on an H200 (a nested static loop's tape): not pipelined
        return [Setting(w, v, n, h) for w in WARPS for v in WAVES for n in ((1,) if taped else STAGES)
                for h in ((True, False) if holds else (True,))]
    if pipelined:  # a loop: the tile's warps and the loads in flight
        return [Setting(w, 1, n) for w in WARPS for n in STAGES]
    return [Setting(w) for w in WARPS]


def best(key: tuple, persistent: bool, trial: Callable[[Setting], None], touched: Sequence[Any],
         pipelined: bool = False, holds: bool = False, taped: bool = False) -> Setting:
    """The fastest setting for ``key``, timing ``trial`` under each candidate on first use. ``touched``:
    tensors a trial adds into (restored afterwards). ``holds``: the kernel may hold loads across its loop;
    ``taped``: it keeps loop states on tapes (see candidates)."""
    with _lock:
        found = _best.get(key)
    if found is not None or tracing():  # (traced: fake tensors, nothing to time; saved_backward.py rehearses)
        return found or DEFAULT
    touched = [_memory_of(t) for t in touched]  # (an expanded tensor cannot be copied into: its memory can)
    saved = [t.clone() for t in touched]
    try:
        options = candidates(persistent, pipelined, holds, taped)
        return _fastest(_best, key, options, lambda s: lambda: trial(s), DEFAULT)
    finally:
        for t, s in zip(touched, saved, strict=True):
            t.copy_(s)


def best_config(key: tuple, configs: Sequence[tuple], trial: Callable[[tuple], Callable[[], Any]]) -> tuple:
    """The config whose launch ``trial(config)`` (a function launching the backward under it) runs fastest
    for ``key``, timed on first use; () where none could run."""
    return _fastest(_configs, key, configs, trial, ())


def _fastest(cache: dict, key: tuple, options: Sequence[Any], run_under: Callable[[Any], Callable[[], Any]],
             default: Any) -> Any:
    """The option under which ``run_under(option)`` (a function to time) runs fastest, kept in ``cache`` by
    ``key``; ``default`` where none could run. An option the kernel cannot take (too many registers, too
    much shared memory, a backward that cannot be derived under a config) is not a candidate."""
    with _lock:
        found = cache.get(key)
    if found is not None or tracing():
        return found or default
    import triton

    times = []
    for option in options:
        try:
            ms = triton.testing.do_bench(run_under(option), warmup=5, rep=20, return_mode="median")
        except Exception:
            continue
        times.append((ms, option))
    found = min(times, key=lambda x: x[0])[1] if times else default
    with _lock:
        cache[key] = found
    return found


def _memory_of(t: Any) -> Any:
    """The memory a tensor spans, as a one-dimensional view."""
    span = 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride(), strict=True)) if t.numel() else 0
    return t.as_strided((span,), (1,), t.storage_offset())


def describe(named: dict[str, Any]) -> tuple:
    """What a launch's speed depends on: tensors' layouts and dtypes, integer and constexpr arguments (not
    floats such as a scale, which may change every call)."""
    out = []
    for k, v in sorted(named.items()):
        shape = getattr(v, "shape", None)
        if shape is not None and hasattr(v, "stride"):
            out.append((k, tuple(shape), v.stride(), str(v.dtype)))
        elif isinstance(v, (bool, int, str)) or v is None:
            out.append((k, v))
    return tuple(out)
