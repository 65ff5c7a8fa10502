"""µs of host CPU per call of forward mode and double backward through ops, launches stubbed (as host_bare.py):
what is timed is the Python around the kernels, which on a GPU decides these calls at small sizes.

    python -m benchmarks.host_forward_mode                  # every case
    python -m benchmarks.host_forward_mode --cases "rmsnorm hvp" --profile

Cases: ``rmsnorm hvp`` and ``softmax hvp`` (benchmarks/forward_mode.py's ``hvp``: ``autograd.grad`` with
create_graph, then the gradient of <grad, v>; the named ops, 3x40 float32), ``rmsnorm fwd+bwd`` (the same op's
first-order step, for scale), ``rmsnorm func.grad`` (that step as ``torch.func.grad``), ``attention func.jvp`` and
``attention dual`` (``torch.func.jvp`` and ``forward_ad`` dual tensors through the causal flash-attention op,
1x2x16x16). Each figure is the median run's CPU time per call (the process's), the fastest in brackets. On a GPU,
``python -m benchmarks.forward_mode --parts hvp`` and ``--parts attention`` time the same calls whole.
"""

from __future__ import annotations

import argparse
import os

from benchmarks.host_step import _profile, _stub_launches, _time

CASES = ("rmsnorm hvp", "softmax hvp", "rmsnorm fwd+bwd", "rmsnorm func.grad", "attention func.jvp", "attention dual")


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", nargs="*", default=list(CASES), choices=CASES)
    p.add_argument("--steps", type=int, default=100, help="calls per run")
    p.add_argument("--runs", type=int, default=7, help="runs per case")
    p.add_argument("--profile", action="store_true", help="each case's calls under cProfile")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    args = parse(argv)
    os.environ["TRITON_INTERPRET"] = "1"  # before any kernel is defined
    _stub_launches()
    import torch

    torch.set_num_threads(1)  # the clock is the process's CPU time
    _zeroed_empty(torch)
    print(f"# host_forward_mode: cpu (launches stubbed), torch {torch.__version__}")
    results = {}
    for case in args.cases:
        step = make(case)
        results[case] = _time({case: step}, args.steps, args.runs, "cpu")[case]
        print(f"{case}: {results[case][0]:.0f} ({results[case][1]:.0f})", flush=True)
        if args.profile:
            _profile(step, args.steps, "cpu")
    return results


def _zeroed_empty(torch) -> None:
    """Stubbed launches write nothing: buffers come zeroed, so that a buffer made again for the double backward
    (host/remake.py compares it with the forward's) equals the one the forward left."""
    empty, empty_like = torch.empty, torch.empty_like
    torch.empty = lambda *a, **k: empty(*a, **k).zero_()
    torch.empty_like = lambda *a, **k: empty_like(*a, **k).zero_()


def make(case: str):
    """A call of the case on fixed random inputs."""
    import torch

    from benchmarks.forward_mode import hvp
    from tritongrad.examples import flash_attention, get

    torch.manual_seed(0)
    if case.startswith("attention"):
        shape = (1, 2, 16, 16)
        primals = tuple(torch.randn(shape) for _ in range(3))
        tangents = tuple(torch.randn(shape) for _ in range(3))

        def attention(q, k, v):
            return flash_attention.flash_attention(q, k, v, True)

        if case == "attention func.jvp":
            return lambda: torch.func.jvp(attention, primals, tangents)

        def dual():
            with torch.autograd.forward_ad.dual_level():
                out = attention(*[torch.autograd.forward_ad.make_dual(p, t) for p, t in zip(primals, tangents,
                                                                                                 strict=True)])
                return torch.autograd.forward_ad.unpack_dual(out).tangent
        return dual
    name, what = case.split(" ")
    example = get(name)
    size = (3, 40)
    inputs = [t for t in example.make_inputs(size, "cpu", torch.float32) if isinstance(t, torch.Tensor)]
    leaves = [x.detach().clone().requires_grad_() for x in inputs]
    cotangent = torch.randn(size)
    if what == "hvp":
        directions = [torch.randn_like(x) for x in inputs]
        return lambda: hvp(example.op, leaves, cotangent, directions)
    if what == "func.grad":
        grad = torch.func.grad(lambda *xs: (example.op(*xs) * cotangent).sum(), argnums=tuple(range(len(inputs))))
        return lambda: grad(*inputs)
    return lambda: torch.autograd.backward(example.op(*leaves), cotangent)


if __name__ == "__main__":
    main()
