"""A training step of a Llama model, variant by variant, side by side from one run.

    python benchmarks/train_step.py                          # a GPU: form A, every variant, 30 steps
    python benchmarks/train_step.py --model hf               # form B: HF LlamaForCausalLM patched with Liger-Kernel
    python benchmarks/train_step.py --model hf --variants liger tritongrad --swap rope   # one op swapped at a time
    python benchmarks/train_step.py --ddp                     # each variant under torchrun on 2 GPUs (DDP; --fsdp)
    torchrun --nproc-per-node 2 benchmarks/train_step.py --ddp --variants eager tritongrad   # the same, in-process
    python benchmarks/train_step.py --smoke                   # CPU, Triton's interpreter, float64, tiny (a test)

Form A (``--model examples``, benchmarks/train_llama.py): a Llama-style decoder built from the bundled examples;
variants ``eager`` (PyTorch), ``tritongrad`` (the examples' ops; ``--ops named|bare``, or the variant spelled
``tritongrad-named`` / ``tritongrad-bare``), ``compile`` (torch.compile of the eager model), ``compile-tritongrad``
(torch.compile(fullgraph=True) with the named ops inside) and ``liger`` (Liger-Kernel's Functions, where installed);
asked for by name, ``compile-graphs`` and ``compile-tritongrad-graphs``: the same compiled with
``mode="reduce-overhead"`` (the forward's and backward's graphs replayed as CUDA graphs).
Form B (``--model hf``, benchmarks/train_hf.py): HF's LlamaForCausalLM with random weights; ``eager`` (SDPA),
``liger`` (``apply_liger_kernel_to_llama``), ``tritongrad`` (the same patch, each Liger Function named in ``--swap``
replaced by a tritongrad op around Liger's own forward function; an op tritongrad refuses falls back to a
workaround, said in the notes) and ``compile``.

Every variant runs in a process of its own (its peak memory its own; Liger's patches global), on the same weights
(train_step.init_weights) and the same batches (random token ids from one seed), bf16 weights and AdamW by
default. Reported per variant: the loss per step and its largest difference from eager's; the first step's
gradients against eager's per parameter group (||g - g_eager|| / ||g_eager||); ms/step (median of the steps after
``--warmup``, each timed with torch.cuda.synchronize), tokens/s, and peak memory over the steps after the first
(torch.cuda.max_memory_allocated; the first step's, with its compilation and tuning, beside it).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

VARIANTS = {"examples": ("eager", "tritongrad", "compile", "compile-tritongrad", "liger"),
            "hf": ("eager", "liger", "tritongrad", "compile")}


@dataclass
class Config:
    model: str = "examples"
    vocab: int = 32000
    hidden: int = 2048
    layers: int = 8
    heads: int = 16
    kv_heads: int = 4
    ffn: int = 5632
    batch: int = 4
    seq: int = 2048
    steps: int = 30
    warmup: int = 5
    dtype: str = "bfloat16"
    lr: float = 3e-4
    seed: int = 0
    ops: str = "named"
    swap: str = ""  # form B: the Liger Functions replaced (empty: all that apply)
    loss: str = "ce"  # form B: Liger's cross_entropy (ce) or fused_linear_cross_entropy (flce)
    fused_add_norm: bool = False  # form B: the post-attention residual add and RMSNorm fused (Liger's Function)
    parallel: str = ""  # "", "ddp" or "fsdp"
    profile: bool = False
    memory: bool = False
    sync_debug: bool = False
    device: str = "cuda"


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    d = Config()
    p.add_argument("--model", choices=VARIANTS, default=d.model, help="examples (form A) or hf (form B)")
    p.add_argument("--variants", nargs="*", help="default: all of the form's (liger where installed)")
    p.add_argument("--ops", choices=("named", "bare"), default=d.ops, help="tritongrad's ops (default named)")
    p.add_argument("--swap", default=d.swap, help="form B: comma-separated Liger Functions to replace (default: "
                                                  "rms_norm,swiglu,rope and the loss's; fused_add_rms_norm)")
    p.add_argument("--loss", choices=("ce", "flce"), default=d.loss, help="form B: Liger's loss (default ce)")
    p.add_argument("--fused-add-norm", action="store_true", help="form B: fused residual add + RMSNorm")
    for name in ("vocab", "hidden", "layers", "heads", "kv_heads", "ffn", "batch", "seq", "steps", "warmup", "seed"):
        p.add_argument(f"--{name.replace('_', '-')}", type=int, default=getattr(d, name))
    p.add_argument("--dtype", default=d.dtype, help="weights' dtype (default bfloat16)")
    p.add_argument("--lr", type=float, default=d.lr)
    p.add_argument("--profile", action="store_true", help="torch.profiler over 3 steps: top 20 ops by CUDA time")
    p.add_argument("--memory", action="store_true", help="the first step and one more with the allocator's history "
                                                            "recorded: MiB alive at each's peak by allocation site")
    p.add_argument("--sync-debug", action="store_true", help="2 more steps under set_sync_debug_mode('warn'): "
                                                                "each place that synchronized")
    p.add_argument("--ddp", action="store_true", help="DistributedDataParallel over --nproc GPUs (NCCL)")
    p.add_argument("--fsdp", action="store_true", help="FSDP2: fully_shard per layer, then the root")
    p.add_argument("--nproc", type=int, default=2, help="GPUs for --ddp / --fsdp (default 2)")
    p.add_argument("--device", help="cuda (default where there is one) or cpu (Triton's interpreter)")
    p.add_argument("--out", help="a folder: results.json and results.md")
    p.add_argument("--smoke", action="store_true", help="CPU, Triton's interpreter, float64, a tiny model")
    p.add_argument("--worker", help=argparse.SUPPRESS)  # a variant, run in this process (what the launcher starts)
    p.add_argument("--result", help=argparse.SUPPRESS)  # where the worker writes its row
    p.add_argument("--grads", help=argparse.SUPPRESS)  # eager's first-step gradients: written (eager) or read
    return p.parse_args(argv)


def config_of(args: argparse.Namespace) -> Config:
    cfg = Config(**{k: getattr(args, k) for k in Config.__dataclass_fields__ if hasattr(args, k)})
    cfg.parallel = "fsdp" if args.fsdp else "ddp" if args.ddp else ""
    cfg.device = args.device or ("cuda" if _cuda() else "cpu")
    if args.smoke:
        cfg = Config(model="examples", vocab=97, hidden=32, layers=2, heads=2, kv_heads=1, ffn=48, batch=1, seq=24,
                     steps=3, warmup=1, dtype="float64", lr=1e-3, seed=args.seed, device="cpu")
    return cfg


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def variants_of(args: argparse.Namespace, cfg: Config) -> list[str]:
    """The variants asked for, ``tritongrad`` spelled out as ``tritongrad-<ops>`` (form A), eager first."""
    if args.smoke:
        return ["eager", "tritongrad-bare", "tritongrad-named"]
    names = list(args.variants or VARIANTS[cfg.model])
    if not args.variants and not _importable("liger_kernel"):
        names.remove("liger")
    if cfg.model == "examples":
        names = [f"tritongrad-{cfg.ops}" if n == "tritongrad" else n for n in names]
    return ["eager", *[n for n in names if n != "eager"]]


def _importable(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def group_of(name: str) -> str:
    """A parameter's group, by its HF-style name (both forms name them alike)."""
    if "embed" in name:
        return "embedding"
    if "lm_head" in name:
        return "lm_head"
    if "norm" in name:
        return "norms"
    if any(p in name for p in ("q_proj", "k_proj", "v_proj", "o_proj")):
        return "attention"
    if any(p in name for p in ("gate_proj", "up_proj", "down_proj")):
        return "mlp"
    raise ValueError(f"no group for parameter {name}")


def init_weights(model, seed: int) -> None:
    """The same weights for every variant, whatever its modules' own initialisation: by name, in sorted order,
    from one generator on the model's device: matrices N(0, 1/fan_in) (embeddings N(0, 1)), norms 1 + N(0, 0.1)."""
    import torch

    params = dict(model.named_parameters())
    device = next(iter(params.values())).device
    gen = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for name in sorted(params):
            p = params[name]
            values = torch.randn(p.shape, generator=gen, device=device, dtype=torch.float32)
            if p.dim() == 1:
                values = 1 + 0.1 * values
            elif "embed" not in name:
                values /= p.shape[-1] ** 0.5
            p.copy_(values)


def build(cfg: Config, variant: str):
    """(model, loss_fn(model, ids), notes) on the device in the config's dtype, weights from init_weights."""
    import torch

    if cfg.model == "hf":
        from benchmarks.train_hf import build as build_form
    else:
        from benchmarks.train_llama import build as build_form
        from benchmarks.train_llama import check_config

        check_config(cfg)
    variant = variant.removesuffix("-graphs")  # (compiled under CUDA graphs: the same model)
    model, loss_fn, notes = build_form(cfg, "eager" if variant == "compile" else variant)  # compile: eager's
    model = model.to(device=cfg.device, dtype=getattr(torch, cfg.dtype))
    init_weights(model, cfg.seed)
    return model, loss_fn, notes


def batches(cfg: Config, rank: int) -> list:
    """``steps`` batches of random token ids, (batch, seq + 1), from one seed (per rank)."""
    import torch

    gen = torch.Generator().manual_seed(cfg.seed + 1000 * rank)
    return [torch.randint(0, cfg.vocab, (cfg.batch, cfg.seq + 1), generator=gen).to(cfg.device)
            for _ in range(cfg.steps)]


def run_variant(cfg: Config, variant: str, reference: dict | None = None) -> tuple[dict, dict]:
    """One variant's run: (its row, its first-step gradients on the CPU by parameter name)."""
    import torch

    from benchmarks import train_parallel as parallel

    rank, world = parallel.setup(cfg)
    raw, loss_fn, notes = build(cfg, variant)
    for note in notes if rank == 0 else ():
        print(f"# {variant}: {note}", flush=True)
    model = parallel.wrap(cfg, raw)
    graphs = variant.endswith("-graphs")  # mode="reduce-overhead": the compiled graphs replayed as CUDA graphs
    if variant.startswith("compile"):
        torch._dynamo.reset()
        model = torch.compile(model, fullgraph=variant.startswith("compile-tritongrad"),
                              mode="reduce-overhead" if graphs else None)
    opt = torch.optim.AdamW(raw.parameters(), lr=cfg.lr)
    data = batches(cfg, rank)
    cuda = cfg.device == "cuda"

    def step(ids):  # a whole training step, unsynchronized (--sync-debug, --profile)
        if graphs:
            torch.compiler.cudagraph_mark_step_begin()
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model, ids)
        loss.backward()
        opt.step()
        return loss

    losses, times, grads, first_peak = [], [], {}, None

    def one(ids, first: bool):  # a timed step (the first keeps its gradients, for the table)
        nonlocal grads
        if graphs:
            torch.compiler.cudagraph_mark_step_begin()
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model, ids)
        loss.backward()
        if first:
            grads = parallel.full_grads(cfg, raw)
        opt.step()
        if cuda:
            torch.cuda.synchronize()
        losses.append(loss.detach().clone())  # (a CUDA graph's output is overwritten by its next replay)

    for i, ids in enumerate(data):
        start = time.perf_counter()
        if i == 0 and cfg.memory and cuda:  # (its compilation, tuning and checked backwards included)
            from benchmarks.memory_peak import at_peak

            row_memory = at_peak(lambda ids=ids: one(ids, True))
        else:
            one(ids, i == 0)
        times.append(time.perf_counter() - start)
        if i == 0 and cuda:
            first_peak = torch.cuda.max_memory_allocated()
            torch.cuda.reset_peak_memory_stats()
    peak = torch.cuda.max_memory_allocated() if cuda else None
    row = {"variant": variant, "losses": [float(x) for x in torch.stack(losses).float().cpu()],
           "ms": statistics.median(times[cfg.warmup:] or times) * 1e3, "notes": notes, "world": world,
           "peak_gib": parallel.max_over_ranks(peak) / 2**30 if peak is not None else None,
           "first_peak_gib": parallel.max_over_ranks(first_peak) / 2**30 if first_peak is not None else None}
    donation = sys.modules.get("tritongrad.host.donation")
    row["donated"] = donation.taken if donation is not None and "tritongrad" in variant else None
    row["tokens_per_s"] = cfg.batch * cfg.seq * world / (row["ms"] / 1e3)
    if reference is not None and rank == 0:
        row["grad_errors"] = grad_errors(grads, reference)
    if world > 1 and cfg.parallel == "ddp":
        row["rank_spread"] = parallel.rank_spread(raw)
    if cfg.sync_debug and cuda:
        row["sync"] = _sync_free(step, data)
    if cfg.profile and cuda:
        row["profile"] = _profile(step, data)
    if cfg.memory and cuda:
        from benchmarks.memory_peak import at_peak

        row["memory"] = f"the first step:\n{row_memory}\n\na later step:\n{at_peak(lambda: step(data[-1]))}"
    return row, grads


def grad_errors(grads: dict, reference: dict) -> dict:
    """Per group, ||g - g_ref|| / ||g_ref|| over the group's parameters (float64)."""
    from benchmarks.train_report import GROUPS


    sums = {g: [0.0, 0.0] for g in GROUPS}
    for name, ref in reference.items():
        got = grads.get(name)
        if got is None or got.shape != ref.shape:
            sums[group_of(name)][0] = float("inf")
            continue
        ref64 = ref.double()
        sums[group_of(name)][0] += float((got.double() - ref64).pow(2).sum())
        sums[group_of(name)][1] += float(ref64.pow(2).sum())
    return {g: (d / r) ** 0.5 if r else (0.0 if d == 0 else float("inf")) for g, (d, r) in sums.items()}


def _sync_free(step, data) -> str:
    """Two steady-state steps under torch.cuda.set_sync_debug_mode("warn"): "yes", or each place that synchronized
    (its innermost frames outside torch, with how many times), so that every sync is found in one run."""
    import collections
    import traceback
    import warnings

    import torch

    sites: collections.Counter = collections.Counter()

    def record(message, category, filename, lineno, file=None, line=None):
        if "synchronizing" not in str(message):
            return
        frames = [f for f in traceback.extract_stack()[:-1] if "/torch/" not in f.filename
                  and "/warnings.py" not in f.filename and "train_step.py" not in f.filename]
        sites[" <- ".join(f"{f.filename.rsplit('/', 2)[-1]}:{f.lineno} {f.name}" for f in frames[-3:][::-1])] += 1

    torch.cuda.synchronize()
    shown = warnings.showwarning
    warnings.showwarning = record
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.showwarning = record
            for ids in data[:2]:
                step(ids)
    finally:
        torch.cuda.set_sync_debug_mode(0)
        warnings.showwarning = shown
    torch.cuda.synchronize()
    if not sites:
        return "yes"
    return "no: " + "; ".join(f"{n // 2 if n > 1 else n}x/step {site}" for site, n in sites.most_common(8))


def _profile(step, data) -> str:
    """torch.profiler over three steps, after one profiled step to warm up: the GPU's busy time a step against the
    step's wall time (a step longer than its GPU time waits on the host), then the top 20 ops by their own CUDA
    time and the top 15 by their own CPU time."""
    import time

    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]):  # (a named op takes the dispatcher's
        step(data[0])  # path while a profiler runs: its first backwards there are planned, not measured)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        start = time.perf_counter()
        for ids in data[:3]:
            step(ids)
        torch.cuda.synchronize()
        wall = (time.perf_counter() - start) / 3 * 1e3
    averages = prof.key_averages()
    busy = _kernel_time(prof.events()) / 3 / 1e3
    return (f"a step (profiled): {wall:.1f} ms wall, {busy:.1f} ms of GPU kernels\n"
            + averages.table(sort_by="self_device_time_total", row_limit=20)
            + averages.table(sort_by="self_cpu_time_total", row_limit=15))


def _kernel_time(events) -> float:
    """µs the GPU ran kernels (and copies): the union of their intervals. Not the sum of every device row, which
    counts a kernel again under its annotation (an autograd Function's range, the optimizer's step) and counts the
    profiler's own markers ("Command Buffer Full")."""
    from torch.autograd import DeviceType

    spans = sorted((e.time_range.start, e.time_range.end) for e in events if e.device_type == DeviceType.CUDA
                   and not e.is_user_annotation and e.name not in ("Command Buffer Full", "Activity Buffer Request"))
    total, end = 0.0, float("-inf")
    for a, b in spans:
        total += max(0.0, b - max(a, end))
        end = max(end, b)
    return total


def free_memory() -> None:
    """Everything of the last variant gone before the next (an in-process run)."""
    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    torch._dynamo.reset()


def run_in_process(cfg: Config, variants: list[str]) -> list[dict]:
    """Every variant in this process, one after another (--smoke, and under torchrun)."""
    rows, reference = [], None
    for variant in variants:
        try:
            row, grads = run_variant(cfg, variant, reference)
        except Exception as e:  # noqa: BLE001 (a failing variant is a row saying why; the others run)
            row, grads = {"variant": variant, "notes": [f"failed: {type(e).__name__}: {_first_line(e)}"]}, {}
        if variant == "eager":
            reference = grads
            row["grad_errors"] = grad_errors(grads, grads) if grads else {}
        rows.append(row)
        del grads
        free_memory()
    return rows


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [""])[0][:200]


def run_in_subprocesses(args: argparse.Namespace, argv: list[str], cfg: Config, variants: list[str]) -> list[dict]:
    """Each variant in a fresh process (under torchrun for --ddp / --fsdp); eager's first-step gradients passed
    to the others through a file."""
    rows = []
    with tempfile.TemporaryDirectory(prefix="train_step-") as tmp:
        grads = str(Path(tmp) / "eager_grads.pt")
        for variant in variants:
            result = Path(tmp) / f"{variant}.json"
            launcher = [sys.executable]
            if cfg.parallel:
                launcher += ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={args.nproc}"]
            command = [*launcher, str(Path(__file__).resolve()), *argv, "--worker", variant,
                       "--result", str(result), "--grads", grads]
            print(f"# {variant}: {' '.join(command)}", flush=True)
            env = {**os.environ, "NCCL_NVLS_ENABLE": "0",
                   "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(__file__).resolve().parents[1]),
                                                               os.environ.get("PYTHONPATH")]))}
            done = subprocess.run(command, env=env, check=False)
            if done.returncode == 0 and result.exists():
                rows.append(json.loads(result.read_text()))
            else:
                rows.append({"variant": variant, "notes": [f"failed: exit status {done.returncode} (its output is "
                                                           "above)"]})
    return rows


def worker(args: argparse.Namespace, cfg: Config) -> None:
    """One variant (``--worker``), its row written to ``--result`` by rank 0."""
    import torch

    variant = args.worker
    reference = None if variant == "eager" else torch.load(args.grads, mmap=True) if os.path.exists(args.grads) \
        else None
    row, grads = run_variant(cfg, variant, reference)
    if int(os.environ.get("RANK", "0")) == 0:
        if variant == "eager":
            torch.save(grads, args.grads)
            row["grad_errors"] = grad_errors(grads, grads)
        Path(args.result).write_text(json.dumps(row))
    from benchmarks import train_parallel

    train_parallel.teardown()


def main(argv: list[str] | None = None) -> list[dict]:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse(argv)
    cfg = config_of(args)
    if cfg.device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"  # before any kernel is defined
    if args.worker:
        worker(args, cfg)
        return []
    variants = variants_of(args, cfg)
    from benchmarks import train_report

    print(train_report.header(cfg, variants), flush=True)
    under_torchrun = "WORLD_SIZE" in os.environ
    if args.smoke or under_torchrun:
        if under_torchrun and cfg.model == "hf" and len([v for v in variants if v in ("liger", "tritongrad")]) > 1:
            raise SystemExit("form B's liger and tritongrad patch transformers for the whole process: under torchrun "
                             "run one of them per run, or run without torchrun (--ddp launches it per variant)")
        rows = run_in_process(cfg, variants)
    else:
        rows = run_in_subprocesses(args, argv, cfg, variants)
    if int(os.environ.get("RANK", "0")) == 0:
        train_report.compare(rows)
        train_report.show(rows, cfg)
        if args.out:
            train_report.write(rows, cfg, Path(args.out))
    if under_torchrun:
        from benchmarks import train_parallel

        train_parallel.teardown()
    return rows


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `python benchmarks/train_step.py` from anywhere
    main()

