"""What is alive at a step's memory peak, by where it was allocated: the CUDA caching allocator's trace of one step
(``torch.cuda.memory._record_memory_history``) replayed allocation by allocation to its highest point, the blocks
alive there summed by the first frames outside torch (a model's line, an op's host function, an autograd node's
backward; ``<autograd engine>`` where the allocation had no Python frame: a built-in node's backward).

    from benchmarks.memory_peak import at_peak
    print(at_peak(lambda: train_step(batch)))   # MiB by site, allocations made inside the call only

Blocks allocated before the call (weights, optimizer state, gradients kept from the step before) are not in the trace:
the table is what the call added at its peak, beside ``max_memory_allocated``'s absolute peak.
"""

from __future__ import annotations

import collections
from collections.abc import Callable

TOP = 15


def at_peak(call: Callable[[], object], top: int = TOP, depth: int = 2) -> str:
    """Runs ``call`` once with the allocator's history recorded; a table of MiB alive at its peak by site."""
    import torch

    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    torch.cuda.memory._record_memory_history(context="alloc", stacks="python", max_entries=1_000_000)
    try:
        call()
        torch.cuda.synchronize()
        snapshot = torch.cuda.memory._snapshot()
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    absolute = torch.cuda.max_memory_allocated() / 2**20
    events = [e for trace in snapshot["device_traces"] for e in trace]
    peak, alive = peak_allocations(events)
    by_site, count = collections.Counter(), collections.Counter()
    for size, frames in alive.values():
        where = site(frames, depth)
        by_site[where] += size
        count[where] += 1
    lines = [f"added at the peak: {peak / 2**20:.0f} MiB in {len(alive)} blocks (max_memory_allocated "
             f"{absolute:.0f} MiB)", "| MiB | blocks | allocated at |", "|---|---|---|"]
    for where, size in by_site.most_common(top):
        lines.append(f"| {size / 2**20:.1f} | {count[where]} | {where} |")
    return "\n".join(lines)


def peak_allocations(events: list[dict]) -> tuple[int, dict]:
    """(bytes allocated at the highest point, {address: (size, frames)} alive there), replaying the trace's allocs
    and completed frees (frees of blocks allocated before the trace began are ignored)."""
    alive: dict[int, tuple[int, list]] = {}
    current = peak = 0
    at: dict = {}
    for e in events:
        if e["action"] == "alloc":
            alive[e["addr"]] = (e["size"], e.get("frames", []))
            current += e["size"]
            if current > peak:
                peak, at = current, dict(alive)
        elif e["action"] == "free_completed" and e["addr"] in alive:
            current -= alive.pop(e["addr"])[0]
    return peak, at


def site(frames: list[dict], depth: int) -> str:
    """The first ``depth`` frames outside torch and this benchmark's own loop, innermost first."""
    outside = [f for f in frames if "/torch/" not in f["filename"] and "memory_peak" not in f["filename"]]
    if not outside:
        return "<autograd engine>"
    return " < ".join(f"{_short(f['filename'])}:{f['line']} {f['name']}" for f in outside[:depth])


def _short(filename: str) -> str:
    for anchor in ("tritongrad/", "transformers/", "liger_kernel/", "benchmarks/", "triton/"):
        if anchor in filename:
            return anchor + filename.rsplit(anchor, 1)[1]
    return filename.rsplit("/", 1)[-1]
