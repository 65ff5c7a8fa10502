"""The backward of an autotuned launch under another of its autotuner's configs (tape.Tiles, tuning.py).

On a GPU the first backward at a shape times the derived kernels under each config and keeps the fastest.
Here the timer is replaced by one that runs each trial once and ranks the configs as a test says, so the
backward runs under a config the forward did not use; its gradient must still be the forward's."""

import itertools

import pytest
import torch
import triton

import tritongrad
from tritongrad.examples import matmul
from tritongrad.examples.launch import compute_type
from tritongrad.ops import tape as tapes
from tritongrad.runtime import derive, tuning

# the forward's (the first) has the largest tiles: another's grid has more programs
CONFIGS = [triton.Config({"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 32}),
           triton.Config({"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 16}),
           triton.Config({"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 32}),
           triton.Config({"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 128})]
PRUNED = (16, 16, 128)  # dropped by the prune below at these sizes: never a candidate, however fast


def fitting_k(configs, nargs, **kwargs):
    return [c for c in configs if c.kwargs["BLOCK_K"] <= nargs["K"]]


def forward_timer():
    """The forward's autotuner times nothing in the interpreter: the first config of each shape wins."""
    count = itertools.count()
    return lambda fn, quantiles: [float(next(count))] * len(quantiles)


tiled = triton.autotune(CONFIGS, key=["M", "N", "K"], prune_configs_by={"early_config_prune": fitting_k},
                        do_bench=forward_timer())(matmul.matmul_kernel.fn)


def launch(a, b, kernel=tiled):
    (m, k), (_, n) = a.shape, b.shape
    c = torch.empty(m, n, dtype=a.dtype)
    grid = lambda meta: (triton.cdiv(m, meta["BLOCK_M"]), triton.cdiv(n, meta["BLOCK_N"]))  # noqa: E731
    kernel[grid](a, b, c, m, n, k, *a.stride(), *b.stride(), *c.stride(), COMPUTE=compute_type(a.dtype))
    return c


@tritongrad.op
def two_products(a, b, b2):
    return launch(a, b), launch(a, b2)  # two launches write a's gradient: the first replayed stores, the other adds


@pytest.fixture
def timed(monkeypatch):
    """Tuning on, with a timer that runs each config's trial once and reports the time ``ranks`` gives its
    tile sizes (2.0 if none; warps and stages are not tuned); the tile sizes of every backward launch are
    recorded in ``blocks``."""
    state = {"ranks": {}, "trials": 0, "blocks": []}

    def do_bench(fn, **kwargs):
        state["trials"] += 1
        fn()
        return state["ranks"].get(state["blocks"][-1], 2.0)

    real = derive.BackwardKernel.launch

    def spy(self, grid, named, *args, **kwargs):
        state["blocks"].append((named["BLOCK_M"], named["BLOCK_N"], named["BLOCK_K"]))
        return real(self, grid, named, *args, **kwargs)

    monkeypatch.setattr(tuning, "enabled", lambda device: True)
    monkeypatch.setattr(triton.testing, "do_bench", do_bench)
    monkeypatch.setattr(derive.BackwardKernel, "launch", spy)
    monkeypatch.setattr(tuning, "best", lambda *args, **kwargs: tuning.DEFAULT)
    monkeypatch.setattr(tuning, "_configs", {})
    return state


def inputs():
    a = torch.randn(45, 70, dtype=torch.float64, requires_grad=True)
    b = torch.randn(70, 37, dtype=torch.float64, requires_grad=True)
    b2 = torch.randn(70, 29, dtype=torch.float64, requires_grad=True)
    return a, b, b2


def reference_grads(a, b, b2, g, g2):
    leaves = [t.detach().clone().requires_grad_() for t in (a, b, b2)]
    torch.autograd.backward([leaves[0] @ leaves[1], leaves[0] @ leaves[2]], [g, g2])
    return [t.grad for t in leaves]


@pytest.mark.parametrize("winner", [1, 2])
def test_backward_runs_under_the_fastest_of_the_autotuners_configs(timed, poisoned_empty, winner):
    op = tritongrad.op(two_products.__wrapped__)  # an op of its own: a step keeps its choice
    a, b, b2 = inputs()
    c, c2 = op(a, b, b2)
    g, g2 = torch.randn_like(c), torch.randn_like(c2)
    chosen = tuple(CONFIGS[winner].kwargs.values())
    timed["ranks"] = {chosen: 1.0, PRUNED: 0.5}
    got = torch.autograd.grad([c, c2], [a, b, b2], [g, g2])
    for x, y in zip(got, reference_grads(a, b, b2, g, g2), strict=True):
        torch.testing.assert_close(x, y, rtol=1e-12, atol=1e-12)
    assert tiled.best_config.kwargs == CONFIGS[0].kwargs  # the forward's
    assert timed["blocks"][-1] == chosen  # the last launch is no trial
    assert timed["blocks"].count(chosen) == 4  # a trial, then the launch that counts, for each forward launch
    assert PRUNED not in timed["blocks"] and timed["trials"] == 6
    again = torch.autograd.grad(op(a, b, b2), [a, b, b2], [g, g2])  # the choice is kept per shape
    assert timed["trials"] == 6 and timed["blocks"][-1] == chosen
    for x, y in zip(again, got, strict=True):
        torch.testing.assert_close(x, y, rtol=1e-12, atol=1e-12)  # a GPU's atomics may add in another order


def test_deterministic_backward_keeps_the_forwards_config(timed):
    op = tritongrad.op(two_products.__wrapped__, deterministic=True)
    a, b, b2 = inputs()
    c, c2 = op(a, b, b2)
    g, g2 = torch.randn_like(c), torch.randn_like(c2)
    got = torch.autograd.grad([c, c2], [a, b, b2], [g, g2])
    for x, y in zip(got, reference_grads(a, b, b2, g, g2), strict=True):
        torch.testing.assert_close(x, y, rtol=1e-12, atol=1e-12)
    assert timed["trials"] == 0 and set(timed["blocks"]) == {(32, 32, 32)}  # the forward's


def test_configs_are_offered_only_where_the_autotuner_launches_the_kernel_with_a_grid_function():
    heuristic = triton.autotune(CONFIGS, key=["M"])(triton.heuristics({"EVEN": lambda args: True})(
        matmul.matmul_kernel.fn))
    def autotuned(tuner, grid, k=64):
        return tuner, (None,) * 5 + (k,), {"grid": grid}  # K is the sixth argument

    offered = tapes.Tiles.of(autotuned(tiled, lambda meta: (1,)), tiled.fn)
    assert offered is not None and len(offered.configs) == 3  # but the one with BLOCK_K 128 > K
    assert tapes.Tiles.of(autotuned(tiled, lambda meta: (1,), k=20), tiled.fn) is None  # one config fits
    assert tapes.Tiles.of(autotuned(heuristic, lambda meta: (1,)), heuristic.fn.fn) is None  # EVEN could read a config
    assert tapes.Tiles.of(autotuned(tiled, (4, 4)), tiled.fn) is None  # a fixed grid: another tile size needs another
    single = triton.autotune(CONFIGS[:1], key=["M"])(matmul.matmul_kernel.fn)
    assert tapes.Tiles.of(autotuned(single, lambda meta: (1,)), single.fn) is None
