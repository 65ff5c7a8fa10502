"""Every bundled example's training step in a CUDA graph: captured after a warm-up, replayed on new
values copied into the captured inputs, each replay's gradients those of the eager op on the same values; and the
same step under ``torch.compile(mode="reduce-overhead")``, which captures graphs of its own."""

import inspect

import pytest
import torch

import tritongrad
from tritongrad.examples import EXAMPLES
from tritongrad.host import shadows

pytestmark = pytest.mark.gpu


def _as_tuple(x):
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def _inputs(example, seed=0):
    torch.manual_seed(seed)
    args = example.make_inputs(example.sizes[0], device="cuda", dtype=torch.float32)
    return tuple(a.detach().requires_grad_() if isinstance(a, torch.Tensor) and a.is_floating_point() else a
                 for a in args)


def _leaves(args):
    return [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]


def _refresh(example, args, upstream, seed):
    """New values in the captured tensors: fresh inputs of the example's own (some keep a domain, positive say)."""
    with torch.no_grad():
        for t, new in zip(_leaves(args), _leaves(_inputs(example, seed)), strict=True):
            t.copy_(new)
        for t in upstream:
            t.copy_(torch.randn_like(t))


def _eager(fn, args, upstream):
    """The gradients of the op called eagerly on copies of the same values."""
    copies = tuple(a.detach().clone().requires_grad_() if isinstance(a, torch.Tensor) and a.requires_grad else a
                   for a in args)
    torch.autograd.backward(_as_tuple(fn(*copies)), upstream)
    return [a.grad for a in _leaves(copies)]


BARE: dict = {}


def _op(example, form):
    """The example's op, or its host function as a bare op (a bare causal attention once failed capture)."""
    if form == "named":
        return example.op
    if example.name not in BARE:
        BARE[example.name] = tritongrad.op(inspect.unwrap(example.op))
    return BARE[example.name]


@pytest.mark.parametrize("form", ["named", "bare"])
@pytest.mark.parametrize("name", list(EXAMPLES))
def test_a_step_captured_in_a_cuda_graph_replays_as_eager(name, form):
    example = EXAMPLES[name]
    op = _op(example, form)
    args = _inputs(example)
    upstream = [torch.randn_like(o) for o in _as_tuple(op(*args))]

    def step():
        torch.autograd.backward(_as_tuple(op(*args)), upstream)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm: compiled, derived, tuned, the first (checked) backward
        for _ in range(3):
            for t in _leaves(args):
                t.grad = None
            step()
    torch.cuda.current_stream().wait_stream(side)
    for t in _leaves(args):
        t.grad = None
    shadows._stand_ins.clear()  # made again while capturing: they must hold none of the graph's memory
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for seed in range(1, 4):
        _refresh(example, args, upstream, seed)
        graph.replay()
        torch.cuda.synchronize()
        for got, want in zip([t.grad for t in _leaves(args)], _eager(example.op, args, upstream), strict=True):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", list(EXAMPLES))
def test_a_step_under_reduce_overhead_matches_eager(name):
    example = EXAMPLES[name]
    args = _inputs(example)
    compiled = torch.compile(lambda *a: example.op(*a), mode="reduce-overhead")
    upstream = [torch.randn_like(o) for o in _as_tuple(example.op(*args))]
    for seed in range(1, 5):  # the first calls record; later ones replay the captured graphs
        _refresh(example, args, upstream, seed)
        copies = tuple(a.detach().clone().requires_grad_() if isinstance(a, torch.Tensor) and a.requires_grad
                       else a for a in args)
        torch.autograd.backward([o.clone() for o in _as_tuple(compiled(*copies))], upstream)
        for got, want in zip([a.grad for a in _leaves(copies)], _eager(example.op, args, upstream), strict=True):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
