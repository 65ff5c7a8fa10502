"""benchmarks/train_step.py's report: the rows of one run compared with eager's, as a rich table, markdown and
JSON."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

GROUPS = ("embedding", "attention", "mlp", "norms", "lm_head")


def environment(cfg) -> str:
    import torch
    import triton

    from tritongrad.tools.bench.competitors import installed_version

    gpu = torch.cuda.get_device_name() if cfg.device == "cuda" and torch.cuda.is_available() else "CPU (interpreter)"
    found = [f"torch {torch.__version__}", f"triton {triton.__version__}"]
    found += [f"{d} {v}" for d in ("transformers", "liger_kernel") if (v := installed_version(d))]
    return f"{gpu}, {', '.join(found)}"


def header(cfg, variants: list[str]) -> str:
    shape = (f"{cfg.layers} layers, hidden {cfg.hidden}, {cfg.heads} heads ({cfg.kv_heads} KV), FFN {cfg.ffn}, "
             f"vocab {cfg.vocab}; batch {cfg.batch} x {cfg.seq} tokens, {cfg.dtype}, AdamW lr {cfg.lr}, "
             f"{cfg.steps} steps ({cfg.warmup} warm-up)")
    form = "HF LlamaForCausalLM" if cfg.model == "hf" else "Llama from the bundled examples"
    parallel = f", {cfg.parallel.upper()}" if cfg.parallel else ""
    return f"# train_step: {form}{parallel}: {shape}\n# {environment(cfg)}\n# variants: {' '.join(variants)}"


def compare(rows: list[dict]) -> None:
    """Each row's largest loss difference from eager's, step by step (in place)."""
    eager = next((r for r in rows if r["variant"] == "eager" and "losses" in r), None)
    for row in rows:
        if eager is not None and "losses" in row:
            row["loss_diff"] = max(abs(a - b) for a, b in zip(row["losses"], eager["losses"], strict=True))


def _cells(row: dict) -> list[str]:
    if "losses" not in row:
        return [row["variant"], *[""] * (8 + len(GROUPS))]
    errors = row.get("grad_errors") or {}
    peak = row.get("peak_gib")
    return [row["variant"], f"{row['losses'][0]:.4f}", f"{row['losses'][-1]:.4f}",
            f"{row['loss_diff']:.2e}" if "loss_diff" in row else "",
            *[f"{errors[g]:.1e}" if g in errors else "" for g in GROUPS],
            f"{row['ms']:.1f}", f"{row['tokens_per_s'] / 1e3:.1f}k",
            f"{peak:.2f}" if peak is not None else "", f"{row['first_peak_gib']:.2f}" if peak is not None else "",
            row.get("sync", "")]


COLUMNS = ["variant", "loss[0]", "loss[-1]", "max Δloss", *[f"∇ {g}" for g in GROUPS], "ms/step", "tokens/s",
           "peak GiB", "1st step GiB", "sync-free"]


def notes(rows: list[dict]) -> list[str]:
    found = [f"{r['variant']}: {n}" for r in rows for n in r.get("notes", ())]
    found += [f"{r['variant']}: ranks' parameters differ by at most {r['rank_spread']:.1e}" for r in rows
              if "rank_spread" in r]
    found += [f"{r['variant']}: {r['donated']} gradient buffers written over their inputs (host/donation.py)"
              for r in rows if r.get("donated") is not None]
    return found


def show(rows: list[dict], cfg) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="training step (∇: first-step gradient, ||g - g_eager|| / ||g_eager|| per group)")
    for column in COLUMNS:
        table.add_column(column, justify="left" if column == "variant" else "right")
    for row in rows:
        table.add_row(*_cells(row))
    console = Console(width=200)
    console.print(table)
    for line in notes(rows):
        console.print(f"- {line}", highlight=False, markup=False)
    for row in rows:
        if row.get("profile"):
            print(f"\n## {row['variant']}: top 20 ops by CUDA time (3 steps)\n{row['profile']}")
        if row.get("memory"):
            print(f"\n## {row['variant']}: memory at the first step's peak and a later one's\n{row['memory']}")


def markdown(rows: list[dict]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(_cells(r)) + " |" for r in rows]
    return "\n".join(lines + [""] + [f"- {n}" for n in notes(rows)])


def write(rows: list[dict], cfg, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps({"config": asdict(cfg), "environment": environment(cfg),
                                                  "rows": rows}, indent=1))
    (out / "results.md").write_text(f"{header(cfg, [r['variant'] for r in rows])}\n\n{markdown(rows)}\n")
    print(f"wrote {out / 'results.json'} and {out / 'results.md'}")
