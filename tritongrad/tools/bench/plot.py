"""The PNG of a run: GB/s (or TFLOP/s, or ms) against size, a line per implementation, the copy bandwidth as a
reference line; optional (matplotlib, ``pip install 'tritongrad[plot]'``): the CSV holds every number anyway."""

from __future__ import annotations

import math
from pathlib import Path

from .competitors import IMPLS
from .report import impl_order


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
    """A PNG of GB/s (TFLOP/s where the example counts FLOPs; ms where it counts neither) against size, one line
    per implementation, for one example, dtype and mode. False (nothing written) without matplotlib."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        return False
    first = rows[0]
    key, unit = ("tflops", "TFLOP/s") if any(r["tflops"] is not None for r in rows) else ("gbps", "GB/s")
    if key == "gbps" and all(r["gbps"] is None for r in rows):  # an op without traffic(): its times (lower: better)
        key, unit = "ms", "ms (lower is faster)"
    sizes = list(dict.fromkeys(r["size"] for r in rows))
    xs, xlabel, log = _size_axis(sizes)
    x_of = dict(zip(sizes, xs, strict=True))
    fig = Figure(figsize=(7, 4.5), dpi=120)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for impl in impl_order(rows):
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
