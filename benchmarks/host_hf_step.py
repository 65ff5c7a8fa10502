"""µs of host CPU per training step of the HF Llama as benchmarks/train_step.py's form B builds it (Liger's patch;
tritongrad's ops around Liger's forwards), at tiny sizes on the CPU with Triton's launches stubbed:
what is left is the Python of the step (HF's, PyTorch's, Liger's and tritongrad's), the part of a GPU step the host
decides when it is host-bound.

    python -m benchmarks.host_hf_step                       # eager, liger, tritongrad; 5 alternating runs each
    SORT=cumulative TOP=60 python -m benchmarks.host_hf_step --variants tritongrad --profile   # cProfile, sorted

Each variant runs in a process of its own (Liger's patch is global to transformers' modules). A worker builds the
model (the swaps are put in place unchecked: nothing computes; the GPU run checks them), takes five steps to warm up
(derived, checked, replays learnt), then times ``--steps`` steps by the process's CPU time (a shared machine's other
work does not count). Layers and op calls per step are the GPU run's (8 layers: 17 RMSNorms, 8 SwiGLUs, 8 ropes, one
loss); the sizes are tiny, so per-element work is nil. Needs transformers and liger-kernel.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

VARIANTS = ("eager", "liger", "tritongrad")


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--variants", nargs="*", default=list(VARIANTS), choices=VARIANTS)
    p.add_argument("--steps", type=int, default=20, help="steps per run")
    p.add_argument("--runs", type=int, default=5, help="runs per variant, alternating")
    p.add_argument("--profile", action="store_true", help="one run per variant under cProfile: top entries")
    p.add_argument("--worker", choices=VARIANTS, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def worker(variant: str, steps: int, profile: bool) -> None:
    from benchmarks.host_step import host_alone

    host_alone()  # (Liger's RMSNorm kernel does not run in the interpreter: nothing runs, from the start)
    import torch

    import tritongrad.tools.check as check
    from benchmarks.train_step import Config, build

    check.relative_errors = lambda got, want: (0.0, 0.0)  # the swaps' probes compare nothing: each swap is put in
    # place where it runs (train_step's GPU run checks their gradients)
    cfg = Config(model="hf", vocab=256, hidden=64, layers=8, heads=4, kv_heads=2, ffn=128, batch=1, seq=32,
                 dtype="float32", device="cpu")
    model, loss_fn, notes = build(cfg, variant)
    for note in notes:
        print(f"# {variant}: {note}", file=sys.stderr)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, cfg.vocab, (cfg.batch, cfg.seq + 1))

    def step():
        opt.zero_grad(set_to_none=True)
        loss_fn(model, ids).backward()
        opt.step()

    for _ in range(5):  # derived, checked, the ops' replays learnt
        step()
    if profile:
        import cProfile
        import pstats

        prof = cProfile.Profile()
        prof.runcall(lambda: [step() for _ in range(steps)])
        sort, top = os.environ.get("SORT", "tottime"), int(os.environ.get("TOP", "30"))
        pstats.Stats(prof, stream=sys.stderr).sort_stats(sort).print_stats(top)
    start = time.process_time()
    for _ in range(steps):
        step()
    print((time.process_time() - start) / steps * 1e6)


def main(argv: list[str] | None = None) -> dict:
    args = parse(argv)
    if args.worker:
        worker(args.worker, args.steps, args.profile)
        return {}
    samples: dict[str, list[float]] = {v: [] for v in args.variants}
    for run in range(1 if args.profile else args.runs):
        for v in args.variants:
            command = [sys.executable, "-m", "benchmarks.host_hf_step", "--worker", v, "--steps", str(args.steps)]
            done = subprocess.run(command + (["--profile"] if args.profile else []), capture_output=True, text=True,
                                  check=False)
            if done.returncode:
                raise SystemExit(f"{v} failed:\n{done.stderr[-3000:]}")
            if args.profile or run == 0:
                print(done.stderr, end="")
            samples[v].append(float(done.stdout.split()[-1]))
    print("# host_hf_step: µs of CPU per step, launches stubbed (median of runs, fastest in brackets)")
    print("  ".join(f"{v} {statistics.median(s):.0f} ({min(s):.0f})" for v, s in samples.items()))
    return samples


if __name__ == "__main__":
    main()
