"""What a run reports: a row per size and implementation for a mode (ms, GB/s, share of the copy bandwidth,
TFLOP/s, ratio to the fastest other), its CSV (read back for ``--replot``), the terminal table and the markdown
summary that benchmarks/RESULTS.md quotes."""

from __future__ import annotations

import csv
from collections.abc import Callable, Iterable
from pathlib import Path

from ..sizes import format_size
from .competitors import IMPLS
from .measure import Timing, backward_ms, short_error

FIELDS = ("example", "size", "impl", "mode", "dtype", "timing", "ms", "gbps", "copy_pct", "tflops", "vs_best",
          "fwd_ms", "fwd_bwd_ms", "bwd_ms", "bytes", "flop", "note",
          "device", "copy_gbps", "torch", "triton", "tritongrad", "liger", "command")
NUMERIC = {"ms", "gbps", "copy_pct", "tflops", "vs_best", "fwd_ms", "fwd_bwd_ms", "bwd_ms", "bytes", "flop",
           "copy_gbps"}

OPTIONAL = {"timing"}  # fields CSVs written before them lack
EAGER, GRAPHS = "eager launches", "CUDA graphs"  # the timings: each call launched by the host, or graph replays


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
            row["note"] = (row["note"] + "; " if row["note"] else "") + f"traffic: {short_error(e)}"
        try:
            row["flop"] = _pass_amount(flops(t.size), mode) if flops else None
        except Exception as e:
            row["note"] = (row["note"] + "; " if row["note"] else "") + f"flops: {short_error(e)}"
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


def impl_order(rows: list[dict]) -> list[str]:
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
        for n, r in enumerate(sorted(group, key=lambda r: impl_order(rows).index(r["impl"]))):
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
        impls = impl_order(group)
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
