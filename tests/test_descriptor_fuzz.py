"""A fuzz family for descriptor loads' write facts: random row-block kernels reading ``x`` (and a weight ``w`` every
program shares) through tensor descriptors, called through a ``tritongrad.op`` with random sizes, blocks, grids and
bindings, each gradient against PyTorch autograd in float64 with poisoned allocations; a quarter of them also
differentiated twice, and refused by name in forward mode.

What is drawn (``random_case``): ``M``, ``N`` (not powers of two: ragged blocks along both dimensions), the blocks,
the columns walked by a loop or by a second grid axis, a weight or none, ``x``'s row stride a literal or a
parameter, a row shift (a block offset that does not start at zero: no bound, no covers), and the binding: ``x``
fresh, a row slice of a larger tensor, one storage with ``w``, rows expanded (stride 0: the launch's stride breaks
apartness, so its gradient is added), or grids of one program. ``x``'s gradient is stored where the launch keeps
its elements apart, else added through the descriptor; either way it must be PyTorch's.

    TRITON_INTERPRET=1 python tests/test_descriptor_fuzz.py 400      # a campaign: outcomes counted by x's strategy
"""

import collections
import random
import sys

import pytest
import torch
import triton
import triton.language as tl

import tritongrad
from tritongrad.tools.testing import poison

pytestmark = pytest.mark.skipif(not hasattr(tl, "make_tensor_descriptor"),
                                reason="this Triton has no tl.make_tensor_descriptor")

BINDINGS = ("fresh", "row slice", "one storage", "expanded rows", "one program")


@triton.jit
def descriptor_rows(x_ptr, w_ptr, y_ptr, M, N, stride_m, SHIFT: tl.constexpr, BLOCK_M: tl.constexpr,
                    BLOCK_N: tl.constexpr, LOOP: tl.constexpr, WEIGHT: tl.constexpr, STRIDED: tl.constexpr):
    if STRIDED:
        x_desc = tl.make_tensor_descriptor(x_ptr, [M, N], [stride_m, 1], [BLOCK_M, BLOCK_N])
    else:
        x_desc = tl.make_tensor_descriptor(x_ptr, [M, N], [N, 1], [BLOCK_M, BLOCK_N])
    w_desc = tl.make_tensor_descriptor(w_ptr, [N], [1], [BLOCK_N])
    y_desc = tl.make_tensor_descriptor(y_ptr, [M, N], [N, 1], [BLOCK_M, BLOCK_N])
    row = tl.program_id(0) * BLOCK_M
    if SHIFT == 0:
        first = row
    else:  # (rows read from SHIFT above: their offset does not start at zero, so no bound and no covers)
        first = row - SHIFT
    if LOOP:
        for col in range(0, N, BLOCK_N):
            x = x_desc.load([first, col])
            y = tl.exp(x) * x
            if WEIGHT:
                y = y * w_desc.load([col])[None, :]
            y_desc.store([row, col], y)
    else:
        col = tl.program_id(1) * BLOCK_N
        x = x_desc.load([first, col])
        y = tl.exp(x) * x
        if WEIGHT:
            y = y * w_desc.load([col])[None, :]
        y_desc.store([row, col], y)


def random_case(rng: random.Random) -> dict:
    binding = rng.choice(BINDINGS)
    m, n = rng.choice([3, 5, 11, 13, 19]), rng.choice([6, 10, 20, 22, 30])
    block_m, block_n = rng.choice([2, 4, 8]), rng.choice([4, 8, 16])
    if binding == "one program":
        block_m, block_n = 16, 32
    return dict(binding=binding, m=m, n=n, block_m=block_m, block_n=block_n, loop=rng.random() < 0.5,
                weight=binding == "one storage" or rng.random() < 0.6, shift=rng.choice([0, 0, 0, 1, 2]),
                strided=binding == "expanded rows" or rng.random() < 0.5, seed=rng.randrange(1 << 30))


def _inputs(case: dict):
    """(leaves, x, w) for the case's binding."""
    m, n, binding = case["m"], case["n"], case["binding"]
    g = torch.Generator().manual_seed(case["seed"])

    def rand(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64).requires_grad_()

    if binding == "one storage":
        base = rand(m * n + n)
        return [base], base[:m * n].view(m, n), base[m * n:]
    w = rand(n)
    if binding == "row slice":
        big = rand(m + 3, n)
        return [big, w], big[2:2 + m], w
    if binding == "expanded rows":
        row = rand(1, n)
        return [row, w], row.expand(m, n), w
    x = rand(m, n)
    return [x, w], x, w


def _reference(x: torch.Tensor, w: torch.Tensor, case: dict) -> torch.Tensor:
    shift = case["shift"]  # rows read shifted down, the first `shift` rows of zeros (the descriptor's padding)
    shifted = torch.cat([x.new_zeros(shift, x.shape[1]), x[:x.shape[0] - shift]]) if shift else x
    y = torch.exp(shifted) * shifted
    return y * w if case["weight"] else y


def run_case(case: dict, seen: list) -> str:
    """Run one case; x's write strategy at its launch ("STORE covers", "STORE", "ATOMIC"). Raises on a mismatch."""
    m, n = case["m"], case["n"]

    @tritongrad.op
    def rows(x, w):
        y = poison(torch.empty(m, n, dtype=x.dtype))
        grid = (triton.cdiv(m, case["block_m"]), 1 if case["loop"] else triton.cdiv(n, case["block_n"]))
        descriptor_rows[grid](x, w, y, m, n, x.stride(0), SHIFT=case["shift"], BLOCK_M=case["block_m"],
                              BLOCK_N=case["block_n"], LOOP=case["loop"], WEIGHT=case["weight"],
                              STRIDED=case["strided"])
        return y

    leaves, x, w = _inputs(case)  # (x's rows N apart but where expanded, whose stride the kernel is passed)
    y = rows(x, w)
    want = _reference(x, w, case)
    torch.testing.assert_close(y, want, rtol=1e-12, atol=1e-12)
    g = torch.randn(m, n, generator=torch.Generator().manual_seed(case["seed"] + 1), dtype=torch.float64)
    got = torch.autograd.grad(y, leaves, g, allow_unused=True)
    expected = torch.autograd.grad(want, leaves, g, allow_unused=True)
    for name, a, b in zip(("x", "w"), got, expected, strict=False):
        b = torch.zeros_like(a) if b is None and a is not None else b
        a = torch.zeros_like(b) if a is None and b is not None else a
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10, msg=f"d{name}")
    (choices,) = seen[-1:]
    mode, covers = choices["x_ptr"]
    if case["seed"] % 4 == 0:  # a quarter: differentiated twice, and in forward mode (refused by name)
        _check_twice(rows, leaves, x, w, g, case)
        if case["binding"] != "expanded rows":  # (PyTorch's make_dual itself refuses an expanded primal)
            with pytest.raises((tritongrad.OpError, tritongrad.NotDifferentiableError), match="forward mode"):
                torch.func.jvp(rows, (x.detach(), w.detach()), (torch.randn_like(x), torch.randn_like(w)))
    return f"{mode} covers" if covers else mode


def _check_twice(rows, leaves, x, w, g, case) -> None:
    """The gradient's own gradient (w.r.t. the leaves and the upstream gradient) against PyTorch's."""
    g = g.clone().requires_grad_()
    probes = [torch.randn_like(t) for t in leaves]

    def second(y):
        first = torch.autograd.grad(y, leaves, g, create_graph=True, allow_unused=True)
        total = sum((a * p).sum() for a, p in zip(first, probes, strict=True) if a is not None)
        return torch.autograd.grad(total, [*leaves, g], allow_unused=True)

    for a, b in zip(second(rows(x, w)), second(_reference(x, w, case)), strict=True):
        if a is None or b is None:
            assert (a is None or not a.any()) and (b is None or not b.any())
        else:
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


@pytest.fixture
def launches(monkeypatch) -> list:
    """Each derived launch's choices, x's and w's (mode, covers), from here on."""
    from tritongrad.runtime import derive

    seen, real = [], derive.BackwardKernel.launch

    def spy(self, grid, named, output_grads, buffers, prepared, *args, **kwargs):
        seen.append({p: (c.mode.name, c.covers) for p, c in prepared.choices.items()})
        return real(self, grid, named, output_grads, buffers, prepared, *args, **kwargs)

    monkeypatch.setattr(derive.BackwardKernel, "launch", spy)
    return seen


@pytest.mark.parametrize("seed", range(12))
def test_random_descriptor_kernels_get_pytorchs_gradients(seed, launches, poisoned_empty):
    outcome = run_case(random_case(random.Random(seed)), launches)
    assert outcome in ("STORE covers", "STORE", "ATOMIC")


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(12, 80))
def test_more_random_descriptor_kernels_get_pytorchs_gradients(seed, launches, poisoned_empty):
    run_case(random_case(random.Random(seed)), launches)


@pytest.mark.parametrize("binding, strided, shift, strategy", [
    ("fresh", False, 0, "STORE covers"), ("row slice", False, 0, "STORE covers"), ("fresh", True, 0, "STORE covers"),
    ("row slice", True, 0, "STORE covers"), ("fresh", True, 2, "STORE"), ("expanded rows", True, 0, "ATOMIC")])
def test_the_launchs_strides_decide_the_strategy(binding, strided, shift, strategy, launches, poisoned_empty):
    """Rows apart (contiguous, or a slice of a larger tensor's rows; their stride a literal or passed) are stored
    into an unfilled buffer; rows read from a shift above are stored into a zero-filled one (their offset does not
    start at zero: no bound, no covers); rows of stride 0 (one row expanded) reach one element from every row:
    added."""
    case = dict(binding=binding, m=11, n=20, block_m=4, block_n=8, loop=True, weight=True, shift=shift,
                strided=strided, seed=7)
    assert run_case(case, launches) == strategy


def campaign(count: int) -> collections.Counter:
    """``count`` random cases (seeds 0..count-1), counted by binding and x's strategy; a mismatch raises."""
    from tritongrad.runtime import derive

    seen, real = [], derive.BackwardKernel.launch

    def spy(self, grid, named, output_grads, buffers, prepared, *args, **kwargs):
        seen.append({p: (c.mode.name, c.covers) for p, c in prepared.choices.items()})
        return real(self, grid, named, output_grads, buffers, prepared, *args, **kwargs)

    derive.BackwardKernel.launch = spy
    for name in ("empty", "empty_strided"):  # (as conftest's poisoned_empty: buffers left unfilled come back NaN)
        setattr(torch, name, _nan_filled(getattr(torch, name)))
    counts: collections.Counter = collections.Counter()
    for seed in range(count):
        case = random_case(random.Random(seed))
        counts[(case["binding"], run_case(case, seen))] += 1
    return counts


def _nan_filled(empty):
    def made(*args, **kwargs):
        t = empty(*args, **kwargs)
        return t.fill_(float("nan")) if t.is_floating_point() else t
    return made


if __name__ == "__main__":
    for (binding, outcome), k in sorted(campaign(int(sys.argv[1]) if len(sys.argv) > 1 else 200).items()):
        print(f"{binding:14s} {outcome:13s} {k}")
