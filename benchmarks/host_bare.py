"""µs of host CPU per forward+backward step of a bare op's repeated call, launches stubbed:
Triton's interpreted launch returns at once, so what is timed is the Python around the kernels (tritongrad's and
PyTorch's), as on a GPU where the host decides the step.

    python -m benchmarks.host_bare                     # every case, launches stubbed
    python -m benchmarks.host_bare --cases rope --profile

Cases, each as the HF Llama step calls it (benchmarks/train_hf.py):

- ``rope``: Liger-Kernel's ``rope_forward`` as a bare op, in place on HF's non-leaf transposed views of q and k
  (``q = (x @ wq.T).view(b, s, h, d).transpose(1, 2)``);
- ``cross_entropy``: Liger's ``cross_entropy_forward`` launched loss-only, rows summed after the op;
- ``rmsnorm``: the bundled rmsnorm's host function as a bare op (``tritongrad.op(inspect.unwrap(...))``).

Implementations: ``bare`` (the bare op), ``named`` (the bundled named op, rmsnorm only: Liger's rope and
cross-entropy write their arguments, which a named op refuses), ``liger`` (Liger's autograd.Function, where
installed) and ``floor`` (benchmarks/host_floors.py's hand-written Function, rmsnorm). Every step includes the same
PyTorch around the op (the projections for rope, the sum for cross-entropy), so differences are the op's. Runs of
``--steps`` steps alternate between implementations; each figure is the median run's CPU time per step (the
process's: other work on a shared machine does not count), the fastest in brackets. ``--profile``: the bare op's
steps under cProfile, top entries by own time.
"""

from __future__ import annotations

import argparse
import inspect

from benchmarks.host_step import _profile, _time, host_alone

CASES = ("rope", "cross_entropy", "rmsnorm")
IMPLS = ("bare", "named", "liger", "floor")
IGNORE_INDEX = -100


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", nargs="*", default=list(CASES))
    p.add_argument("--impls", nargs="*", default=list(IMPLS))
    p.add_argument("--steps", type=int, default=200, help="steps per run")
    p.add_argument("--runs", type=int, default=9, help="runs per implementation")
    p.add_argument("--profile", action="store_true", help="the bare op's steps under cProfile")
    p.add_argument("--no-stub", action="store_true", help="run the kernels (the interpreter: slow; a smoke test)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    args = parse(argv)
    host_alone(stub=not args.no_stub)
    import torch

    print(f"# host_bare: cpu{'' if args.no_stub else ' (launches stubbed)'}, torch {torch.__version__}")
    results = {}
    for case in args.cases:
        made = {k: step for k, step in steps(case).items() if k in args.impls}
        timed = _time(made, args.steps, args.runs, "cpu")
        results[case] = timed
        print(f"{case}: " + "  ".join(f"{k} {m:.1f} ({f:.1f})" for k, (m, f) in timed.items()), flush=True)
        if args.profile and "bare" in made:
            _profile(made["bare"], args.steps, "cpu")
    return results


def steps(case: str) -> dict:
    """Per implementation, a step: the case's forward on fresh non-leaf inputs from fixed leaves, then backward."""
    import torch

    import tritongrad
    from benchmarks import train_hf

    torch.manual_seed(0)
    found = {}
    liger = _liger()
    if case == "rope":
        b, s, h, kv, d, hidden = 2, 12, 4, 2, 16, 24
        x = torch.randn(b, s, hidden, requires_grad=True)
        wq = torch.randn(h * d, hidden, requires_grad=True)
        wk = torch.randn(kv * d, hidden, requires_grad=True)
        angles = torch.rand(1, s, d) * 6
        cos, sin = angles.cos(), angles.sin()
        leaves = [x, wq, wk]

        def inputs():  # HF Llama's q and k: transposed views of the projections
            q = (x @ wq.T).view(b, s, h, d).transpose(1, 2)
            k = (x @ wk.T).view(b, s, kv, d).transpose(1, 2)
            return q, k, cos, sin

        fns = {"bare": tritongrad.op(train_hf.liger_rope)}
        if liger:
            from liger_kernel.ops.rope import LigerRopeFunction
            fns["liger"] = LigerRopeFunction.apply
    elif case == "cross_entropy":
        rows, vocab = 24, 40
        z = torch.randn(rows, vocab, requires_grad=True)
        target = torch.randint(0, vocab, (rows,))
        target[::5] = IGNORE_INDEX
        leaves = [z]

        def inputs():  # the logits are not a leaf: Liger's kernel writes them
            return z * 1.0, target

        bare = tritongrad.op(train_hf.liger_cross_entropy_rows)
        fns = {"bare": lambda x, t: bare(x, t, IGNORE_INDEX).sum()}
        if liger:
            from liger_kernel.ops.cross_entropy import LigerCrossEntropyFunction
            fns["liger"] = lambda x, t: LigerCrossEntropyFunction.apply(x, t, None, IGNORE_INDEX, 0.0, 0.0,
                                                                         "none")[0].sum()
    elif case == "rmsnorm":
        from benchmarks.host_floors import FLOORS
        from tritongrad.examples import rmsnorm

        x = torch.randn(64, 256, requires_grad=True)
        w = torch.randn(256, requires_grad=True)
        leaves = [x, w]

        def inputs():
            return x, w

        fns = {"bare": tritongrad.op(inspect.unwrap(rmsnorm.rmsnorm)), "named": rmsnorm.rmsnorm,
               "floor": FLOORS["rmsnorm"]}
        if liger:
            from liger_kernel.ops.rms_norm import LigerRMSNormFunction
            fns["liger"] = lambda x, w: LigerRMSNormFunction.apply(x, w, 1e-6)
    else:
        raise SystemExit(f"unknown case {case!r} (there are: {', '.join(CASES)})")
    for k, fn in fns.items():
        found[k] = _step(fn, inputs, leaves)
    return found


def _step(fn, inputs, leaves: list):
    import torch

    outs = _float_outputs(fn(*inputs()))
    grads = [torch.randn_like(o) for o in outs]

    def step():
        for t in leaves:
            t.grad = None
        torch.autograd.backward(_float_outputs(fn(*inputs())), grads)

    return step


def _float_outputs(result) -> list:
    return [o for o in (result if isinstance(result, (tuple, list)) else (result,)) if o.is_floating_point()]


def _liger() -> bool:
    try:
        import liger_kernel  # noqa: F401
    except ImportError:
        return False
    return True


if __name__ == "__main__":
    main()
