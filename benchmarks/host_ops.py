"""µs of host CPU per call of each op of the HF Llama step (benchmarks/train_hf.py's swaps), tritongrad against
Liger-Kernel's autograd.Function, launches stubbed: what is timed is the Python around the kernels.

    python -m benchmarks.host_ops                          # every op, forward + backward
    python -m benchmarks.host_ops --ops rope --forward     # forward only
    python -m benchmarks.host_ops --ops rms --profile      # tritongrad's steps under cProfile (SORT=, TOP=)
    python -m benchmarks.host_ops --ops rope --wrap        # inclusive µs per call of tritongrad's host functions
    python -m benchmarks.host_ops --no-donation            # donation's candidates none (its overhead, by difference)

Needs liger-kernel (``PYTHONPATH=/tmp/ligsite:$PWD`` where it is not installed). Ops, as the step calls them (calls
per step of the 8-layer model): ``rms`` (Liger's rms_norm forward as a named op, 17), ``swiglu`` (named, 8), ``rope``
(bare, in place on HF's transposed views of q and k, 8), ``ce`` (Liger's cross-entropy loss-only as a bare op, 1).
Both implementations of an op run in one process, alternating runs of ``--steps`` steps (benchmarks/host_step.py's
``_time``: median run's CPU time per step, the fastest in brackets); ``base`` is a step of the inputs' PyTorch alone.
"""

from __future__ import annotations

import argparse
import collections
import functools
import time

OPS = ("rms", "swiglu", "rope", "ce")


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ops", nargs="*", default=list(OPS), choices=OPS)
    p.add_argument("--steps", type=int, default=400, help="steps per run")
    p.add_argument("--runs", type=int, default=5, help="runs per implementation, alternating")
    p.add_argument("--forward", action="store_true", help="forward only (no backward)")
    p.add_argument("--profile", action="store_true", help="tritongrad's steps under cProfile")
    p.add_argument("--wrap", action="store_true", help="inclusive µs per call of tritongrad's host functions")
    p.add_argument("--no-donation", action="store_true", help="no input a donation candidate")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    args = parse(argv)
    from benchmarks.host_step import _profile, _time, host_alone

    host_alone()
    if args.no_donation:
        from tritongrad.host import donation

        donation.candidates = lambda plan: frozenset()
    steps = _steps(args.ops, args.forward)
    if args.wrap:
        for op in args.ops:
            _wrapped(steps[f"{op}_tg"], op, args.steps * 5)
        return {}
    timed = _time(steps, args.steps, args.runs, "cpu")
    print(f"# host_ops: µs per {'forward' if args.forward else 'forward + backward'}, launches stubbed")
    for k, (m, f) in timed.items():
        print(f"{k:12s} {m:7.1f} ({f:.1f})")
    if args.profile:
        for op in args.ops:
            _profile(steps[f"{op}_tg"], args.steps, "cpu")
    return timed


def _steps(ops: list[str], forward: bool) -> dict:
    import torch
    from liger_kernel.ops.rms_norm import LigerRMSNormFunction
    from liger_kernel.ops.swiglu import LigerSiLUMulFunction

    import benchmarks.host_bare as host_bare
    from benchmarks import train_hf

    if forward:
        host_bare._step = lambda fn, inputs, leaves: (lambda: fn(*inputs()))
    torch.manual_seed(0)
    x, w = torch.randn(32, 64, requires_grad=True), torch.randn(64, requires_grad=True)
    rms_inputs = lambda: (x * 1.0, w)  # noqa: E731
    found = {"base": host_bare._step(lambda a, b: a * 1.0, rms_inputs, [x, w])}
    if "rms" in ops:
        rms = train_hf.tritongrad_op(train_hf.liger_rms_norm, "named")
        found["rms_tg"] = host_bare._step(lambda a, b: rms(a, b, 1e-6), rms_inputs, [x, w])
        found["rms_lig"] = host_bare._step(
            lambda a, b: LigerRMSNormFunction.apply(a, b, 1e-6, 0.0, "llama", True), rms_inputs, [x, w])
    if "swiglu" in ops:
        a, b = torch.randn(32, 128, requires_grad=True), torch.randn(32, 128, requires_grad=True)
        swiglu = train_hf.tritongrad_op(train_hf.liger_swiglu, "named")
        inputs = lambda: (a * 1.0, b * 1.0)  # noqa: E731
        found["swiglu_tg"] = host_bare._step(swiglu, inputs, [a, b])
        found["swiglu_lig"] = host_bare._step(LigerSiLUMulFunction.apply, inputs, [a, b])
    for op, case in (("rope", "rope"), ("ce", "cross_entropy")):
        if op in ops:
            made = host_bare.steps(case)
            found[f"{op}_tg"], found[f"{op}_lig"] = made["bare"], made["liger"]
    return found


def _wrapped(step, op: str, n: int) -> None:
    """Inclusive wall time per step of tritongrad's host functions on the op's path (wrappers cost ~0.3 µs each)."""
    from tritongrad.host import donation, replay
    from tritongrad.ops import autograd_function, segments

    spent, calls = collections.Counter(), collections.Counter()
    clock = time.perf_counter_ns
    undo = []

    def wrap(owner, name: str) -> None:
        original = getattr(owner, name)
        label = f"{getattr(owner, '__name__', owner)}.{name}"

        @functools.wraps(original)
        def timed(*a, **k):
            start = clock()
            try:
                return original(*a, **k)
            finally:
                spent[label] += clock() - start
                calls[label] += 1

        setattr(owner, name, timed)
        undo.append((owner, name, original))

    for owner, name in [(replay.Replays, "call"), (replay.FastRecord, "launch"), (replay.FastRecord, "close"),
                        (replay.Replay, "backward"), (segments.Segments, "__init__"), (segments.Segments, "launched"),
                        (segments.Segments, "__torch_function__"), (segments.Segments, "finish"),
                        (segments.Segments, "close"), (segments.Segments, "returned"), (donation, "apply"),
                        (donation, "offered"), (autograd_function, "_backward"),
                        (autograd_function, "_check_reached"), (autograd_function, "_histories")]:
        wrap(owner, name)
    try:
        for _ in range(50):
            step()
        spent.clear()
        calls.clear()
        start = clock()
        for _ in range(n):
            step()
        total = clock() - start
    finally:
        for owner, name, original in reversed(undo):
            setattr(owner, name, original)
    print(f"{op}: {total / n / 1e3:.1f} µs/step (wrapped)")
    for k, v in sorted(spent.items(), key=lambda kv: -kv[1]):
        print(f"  {k:40s} {v / n / 1e3:7.2f} µs/step ({calls[k] / n:.0f} calls)")


if __name__ == "__main__":
    main()
