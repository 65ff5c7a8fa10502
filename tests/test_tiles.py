"""The backward of an autotuned launch under another of its autotuner's configs (configs.Tiles, tuning.py).

On a GPU the first backward at a shape times the derived kernels under each config and keeps the fastest.
Here the timer is replaced by one that runs each trial once and ranks the configs as a test says, so the
backward runs under a config the forward did not use; its gradient must still be the forward's."""

import itertools

import pytest
import torch
import triton
import triton.language as tl

import tritongrad
from tritongrad.examples import matmul
from tritongrad.examples.launch import compute_type
from tritongrad.host.configs import Tiles
from tritongrad.host.kernel_roles import kernel_info
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
    return launch(a, b), launch(a, b2)  # two launches write a's gradient: the later stores, the earlier adds


@pytest.fixture
def timed(monkeypatch):
    """Tuning on, with a timer that runs each config's trial once and reports the time ``ranks`` gives its
    tile sizes (2.0 if none; warps and stages are not tuned); the tile sizes of every backward launch are
    recorded in ``blocks``, the warps and stages passed in ``options``, the (forward's) grid in ``grids``."""
    state = {"ranks": {}, "trials": 0, "blocks": [], "options": [], "grids": []}

    def do_bench(fn, **kwargs):
        state["trials"] += 1
        fn()
        return state["ranks"].get(state["blocks"][-1], 2.0)

    real = derive.BackwardKernel.launch

    def spy(self, grid, named, *args, **kwargs):
        state["blocks"].append((named["BLOCK_M"], named["BLOCK_N"], named["BLOCK_K"]))
        state["options"].append({k: named[k] for k in ("num_warps", "num_stages") if k in named})
        state["grids"].append(tuple(grid))
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


@pytest.mark.parametrize("winner", [1, pytest.param(2, marks=pytest.mark.slow)])
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
    def offered(tuner, kernel, grid=lambda meta: (1,), k=64):
        args = (None,) * 5 + (k,)  # K is the sixth argument
        return Tiles.of(kernel, grid, kernel_info(kernel), args, {}, (tuner, args, {"grid": grid}))

    found = offered(tiled, tiled.fn)
    assert found is not None and len(found.configs) == 3  # but the one with BLOCK_K 128 > K
    assert offered(tiled, tiled.fn, k=20) is None  # one config fits
    assert offered(heuristic, heuristic.fn.fn) is None  # EVEN could read a config
    assert offered(tiled, tiled.fn, grid=(4, 4)) is None  # a fixed grid: another tile size needs another
    single = triton.autotune(CONFIGS[:1], key=["M"])(matmul.matmul_kernel.fn)
    assert offered(single, single.fn) is None


# -- configs declared for a kernel launched with a fixed config (tritongrad.backward_configs) -------------------------

FIXED = {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 32}  # the forward's: the largest tiles, the fewest programs
DECLARED = [triton.Config({"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 16}, num_warps=2),
            triton.Config({"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 64}, num_warps=8, num_stages=2),
            triton.Config({"BLOCK_M": 32, "BLOCK_N": 16, "BLOCK_K": 16})]
CANDIDATES = [(32, 32, 32), (16, 32, 16), (16, 16, 64), (32, 16, 16)]  # the forward's, then the declared configs'


def declared_kernel():
    """The example's matmul kernel, a jit function of its own, with DECLARED."""
    return tritongrad.backward_configs(DECLARED)(triton.jit(matmul.matmul_kernel.fn.fn))


def fixed_product(kernel, a, b, transpose_a=False, transpose_b=False, grid=None):
    """``op(a) @ op(b)`` by ``kernel`` with FIXED; ``grid``: a tuple instead of the grid function."""
    launch = matmul.matmul_launch(a, b, transpose_a, transpose_b, kernel, FIXED)
    if grid is not None:
        launch.grid = grid(launch.out.shape)
    return launch()


def assert_matmul_grads(op, timed, ranks):
    """``op(a, b)`` on fresh float64 45x70 and 70x37 inputs, its gradients PyTorch's; its backward timed with
    ``ranks`` (``timed``'s)."""
    a = torch.randn(45, 70, dtype=torch.float64, requires_grad=True)
    b = torch.randn(70, 37, dtype=torch.float64, requires_grad=True)
    c = op(a, b)
    g = torch.randn_like(c)
    timed["ranks"] = ranks
    got = torch.autograd.grad(c, [a, b], g)
    for x, y in zip(got, expected_grads(torch.matmul, [a, b], g), strict=True):
        torch.testing.assert_close(x, y, rtol=1e-12, atol=1e-12)


def expected_grads(f, inputs, g):
    leaves = [t.detach().clone().requires_grad_() for t in inputs]
    return torch.autograd.grad(f(*leaves), leaves, g)


@pytest.mark.parametrize("winner", range(len(CANDIDATES)))
def test_a_fixed_config_launch_gets_its_backward_under_whichever_declared_config_is_fastest(timed, poisoned_empty,
                                                                                              winner):
    kernel = declared_kernel()
    op = tritongrad.op(lambda a, b: fixed_product(kernel, a, b))
    assert_matmul_grads(op, timed, {CANDIDATES[winner]: 1.0})
    assert timed["blocks"][:-1] == CANDIDATES and timed["trials"] == 4  # each timed once, the forward's too
    assert timed["blocks"][-1] == CANDIDATES[winner]  # the launch that counts
    bm, bn, _ = CANDIDATES[winner]
    assert timed["grids"][-1] == (triton.cdiv(45, bm), triton.cdiv(37, bn))  # the grid function's for it
    assert timed["options"][-1] == ({}, {"num_warps": 2, "num_stages": 3}, {"num_warps": 8, "num_stages": 2},
                                     {"num_warps": 4, "num_stages": 3})[winner]  # (the forward passed none)


BINDINGS = {  # (a, b, transpose_a, transpose_b) -> the product in PyTorch, and a leaf per distinct tensor
    "a transposed": (lambda: (torch.randn(70, 45, dtype=torch.float64), torch.randn(70, 37, dtype=torch.float64)),
                     (True, False), lambda a, b: a.T @ b),
    "b expanded": (lambda: (torch.randn(45, 70, dtype=torch.float64), torch.randn(70, 1, dtype=torch.float64)),
                   (False, False), lambda a, b: a @ b.expand(70, 37)),
    "a @ a.T": (lambda: (torch.randn(45, 70, dtype=torch.float64),), (False, True), lambda a: a @ a.T),
}


@pytest.mark.parametrize("binding", BINDINGS)
def test_a_declared_config_gives_pytorchs_gradients_through_transposed_expanded_and_repeated_operands(
        timed, poisoned_empty, binding):
    make, (ta, tb), reference = BINDINGS[binding]
    kernel = declared_kernel()
    leaves = [t.requires_grad_() for t in make()]

    @tritongrad.op
    def product(*xs):
        a, b = (xs[0], xs[0]) if len(xs) == 1 else (xs[0], xs[1].expand(70, 37) if binding == "b expanded" else xs[1])
        return fixed_product(kernel, a, b, ta, tb)

    c = product(*leaves)
    g = torch.randn_like(c)
    timed["ranks"] = {CANDIDATES[2]: 1.0}  # the forward's BLOCK_K 32 by 64: another split of K too
    got = torch.autograd.grad(c, leaves, g)
    for x, y in zip(got, expected_grads(reference, leaves, g), strict=True):
        torch.testing.assert_close(x, y, rtol=1e-12, atol=1e-12)
    assert timed["blocks"][-1] == CANDIDATES[2]


def test_a_tuple_grid_keeps_the_forwards_config(timed):
    kernel = declared_kernel()
    grid = lambda shape: (triton.cdiv(shape[0], 32), triton.cdiv(shape[1], 32))  # noqa: E731 (FIXED's)
    op = tritongrad.op(lambda a, b: fixed_product(kernel, a, b, grid=grid))
    assert_matmul_grads(op, timed, {CANDIDATES[1]: 1.0})
    assert timed["trials"] == 0 and set(timed["blocks"]) == {CANDIDATES[0]}  # the forward's: no grid for another


def test_a_kernel_run_by_heuristics_or_deterministically_keeps_the_forwards_config(timed):
    kernel = declared_kernel()
    heuristic = triton.heuristics({"COMPUTE": lambda args: tl.float64})(kernel)  # (its values could be the tiles')
    a = torch.randn(45, 70, dtype=torch.float64, requires_grad=True)
    b = torch.randn(70, 37, dtype=torch.float64, requires_grad=True)
    g = torch.randn(45, 37, dtype=torch.float64)
    timed["ranks"] = {CANDIDATES[1]: 1.0}
    for op in (tritongrad.op(lambda a, b: fixed_product(heuristic, a, b)),
               tritongrad.op(lambda a, b: fixed_product(kernel, a, b), deterministic=True)):
        got = torch.autograd.grad(op(a, b), [a, b], g)
        for x, y in zip(got, expected_grads(torch.matmul, [a, b], g), strict=True):
            torch.testing.assert_close(x, y, rtol=1e-12, atol=1e-12)
    assert timed["trials"] == 0 and set(timed["blocks"]) == {CANDIDATES[0]}


def test_an_autotuned_kernels_declared_configs_replace_its_autotuners(timed):
    tuner = triton.autotune(CONFIGS, key=["M", "N", "K"], do_bench=forward_timer())(
        triton.jit(matmul.matmul_kernel.fn.fn))
    assert tritongrad.backward_configs(DECLARED)(tuner) is tuner
    op = tritongrad.op(lambda a, b: launch(a, b, tuner))
    assert_matmul_grads(op, timed, {CANDIDATES[3]: 1.0, (16, 16, 32): 0.5})  # (16, 16, 32): the autotuner's alone
    assert timed["blocks"] == CANDIDATES + [CANDIDATES[3]]  # the one the autotuner chose, the declared; the fastest


@pytest.mark.parametrize("config, said", [
    (triton.Config({"BLOCK_Q": 16}), "sets `BLOCK_Q`, which is not a parameter of kernel `matmul_kernel` (its "
                                     "constexprs: BLOCK_M, BLOCK_N, BLOCK_K, COMPUTE)"),
    (triton.Config({"BLOCK_M": 16, "K": 64}), "sets `K`, which is a parameter but not a constexpr of kernel"),
    (triton.Config({"BLOCK_M": 16}, pre_hook=lambda nargs: None), "has a pre_hook"),
])
def test_a_declaration_the_kernel_cannot_take_is_refused_naming_what(config, said):
    kernel = triton.jit(matmul.matmul_kernel.fn.fn)
    with pytest.raises(ValueError, match="^tritongrad.backward_configs: ") as e:
        tritongrad.backward_configs([DECLARED[0], config])(kernel)
    assert said in str(e.value)
    with pytest.raises(ValueError, match="no configs"):
        tritongrad.backward_configs([])
    with pytest.raises(TypeError, match="expected triton.Config objects, got dict"):
        tritongrad.backward_configs([{"BLOCK_M": 16}])
    from tritongrad.host.configs import DECLARED as declared

    assert id(kernel) not in declared


@pytest.mark.interpreter  # (the example's interpreter configs; on a GPU its FIXED is bf16's, 393 KB of shared
# memory in float64: test_op_gpu's named-tiles test runs the fixed config there)
@pytest.mark.parametrize("size", [s if i == 0 else pytest.param(s, marks=pytest.mark.slow)
                                  for i, s in enumerate(matmul.SIZES)])
def test_the_fixed_config_example_gets_pytorchs_gradients_under_a_declared_config(timed, size):
    a, b, ta, tb = matmul.make_inputs(size, device=torch.get_default_device(), dtype=torch.float64)
    a, b = a.requires_grad_(), b.requires_grad_()
    timed["ranks"] = {(32, 16, 32): 1.0}  # the second declared (the forward's is 16 x 16 x 16)
    for _ in range(2):  # the second call: the named op's, its kind of call known (replayed)
        c = matmul.matmul_fixed(a, b, ta, tb)
        g = torch.randn_like(c)
        got = torch.autograd.grad(c, [a, b], g)
        for x, y in zip(got, torch.autograd.grad(matmul.reference(a, b, ta, tb), [a, b], g), strict=True):
            torch.testing.assert_close(x, y, rtol=1e-12, atol=1e-12)
        assert timed["blocks"][-1] == (32, 16, 32)


NAMED_KERNEL = declared_kernel()
NAMED_HEURISTIC = triton.heuristics({"COMPUTE": lambda args: tl.float64})(declared_kernel())


@tritongrad.op("tgtiles::declared_product")
def declared_product(a, b):
    return fixed_product(NAMED_KERNEL, a, b)


@tritongrad.op("tgtiles::heuristic_product")
def heuristic_product(a, b):
    return fixed_product(NAMED_HEURISTIC, a, b)


@pytest.mark.slow  # (about 3-5 s each: torch.compile)
@pytest.mark.parametrize("op", [declared_product, heuristic_product], ids=["declared", "heuristics"])
def test_a_compiled_named_ops_saved_backward_offers_the_declared_configs_but_under_heuristics(timed, op):
    compiled = torch.compile(lambda a, b: op(a, b), fullgraph=True, backend="aot_eager")
    timed["ranks"] = {CANDIDATES[1]: 1.0}  # (before the forward: on a GPU the backward is traced, and its rehearsal
    assert_matmul_grads(compiled, timed, {CANDIDATES[1]: 1.0})  # tuned, when the compiled forward is first called)
    if op is heuristic_product:  # (the saved backward records the launches the host function made, told of these)
        assert timed["trials"] == 0 and set(timed["blocks"]) == {CANDIDATES[0]}
    else:  # the trials, then the launch that counts (on a GPU, the rehearsal's and the traced one)
        assert timed["blocks"][:4] == CANDIDATES and set(timed["blocks"][4:]) == {CANDIDATES[1]}


# -- constexprs named tile sizes (tritongrad.backward_configs(tiles=...)): configs made around the launch's ------------

TILED = {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 32}  # the forward's; none halved below 16
AROUND = [(16, 16, 32),  # the launch's own, then each tile halved, kept or doubled, the product within 2x
          (16, 16, 16), (16, 16, 64), (16, 32, 16), (16, 32, 32), (32, 16, 16), (32, 16, 32), (32, 32, 16)]


def named_tiles_kernel():
    """The example's matmul kernel, a jit function of its own, its three block sizes named tile sizes."""
    return tritongrad.backward_configs(tiles=("BLOCK_M", "BLOCK_N", "BLOCK_K"))(triton.jit(matmul.matmul_kernel.fn.fn))


def tiled_product(kernel, a, b, transpose_a=False, transpose_b=False):
    return matmul.matmul_launch(a, b, transpose_a, transpose_b, kernel, {**TILED, "num_warps": 2})()


def test_named_tiles_offer_configs_around_the_launchs():
    from tritongrad.host.configs import around

    kernel = named_tiles_kernel()
    names = ("BLOCK_M", "BLOCK_N", "BLOCK_K")
    assert [tuple(dict(c)[n] for n in names) for c in around(TILED, names, kernel)] == AROUND[1:]
    assert {dict(c)["BLOCK_K"] for c in around({"BLOCK_K": 8}, ("BLOCK_K",), kernel)} == {16}  # 4: below 8 and 16
    assert {dict(c)["BLOCK_K"] for c in around({"BLOCK_K": 256}, ("BLOCK_K",), kernel)} == {128}  # 512: above 256
    assert {dict(c)["BLOCK_K"] for c in around({"BLOCK_K": 1024}, ("BLOCK_K",), kernel)} == {512}  # none past its own


@pytest.mark.parametrize("winner", [pytest.param(1, marks=pytest.mark.slow), 4,
                                    pytest.param(7, marks=pytest.mark.slow)])
def test_a_launch_with_named_tiles_gets_its_backward_under_the_fastest_config_around_its_own(timed, poisoned_empty,
                                                                                              winner):
    kernel = named_tiles_kernel()
    op = tritongrad.op(lambda a, b: tiled_product(kernel, a, b))
    assert_matmul_grads(op, timed, {AROUND[winner]: 1.0})  # float64, 45 x 70 x 37: ragged under every config
    assert timed["blocks"][:-1] == AROUND and timed["trials"] == len(AROUND)
    assert timed["blocks"][-1] == AROUND[winner]  # the launch that counts
    bm, bn, _ = AROUND[winner]
    assert timed["grids"][-1] == (triton.cdiv(45, bm), triton.cdiv(37, bn))  # the grid function's for it
    assert timed["options"][-1] == {"num_warps": 2}  # the launch's own, as launched


@pytest.mark.parametrize("binding", [b if b == "a @ a.T" else pytest.param(b, marks=pytest.mark.slow)
                                     for b in BINDINGS])  # (about 3 s each: one in the default run)
def test_named_tiles_give_pytorchs_gradients_through_transposed_expanded_and_repeated_operands(
        timed, poisoned_empty, binding):
    make, (ta, tb), reference = BINDINGS[binding]
    kernel = named_tiles_kernel()
    leaves = [t.requires_grad_() for t in make()]

    @tritongrad.op
    def product(*xs):
        a, b = (xs[0], xs[0]) if len(xs) == 1 else (xs[0], xs[1].expand(70, 37) if binding == "b expanded" else xs[1])
        return tiled_product(kernel, a, b, ta, tb)

    c = product(*leaves)
    g = torch.randn_like(c)
    timed["ranks"] = {AROUND[7]: 1.0}  # every tile moved: BLOCK_K 32 by 16, another split of K
    got = torch.autograd.grad(c, leaves, g)
    for x, y in zip(got, expected_grads(reference, leaves, g), strict=True):
        torch.testing.assert_close(x, y, rtol=1e-12, atol=1e-12)
    assert timed["blocks"][-1] == AROUND[7]


@pytest.fixture
def replays(monkeypatch):
    """Counts the calls that ran on a replay to the end (host/replay.py)."""
    from tritongrad.host import replay

    counts, close = {"forward": 0}, replay.FastRecord.close

    def counted(self, *args, **kwargs):
        found = close(self, *args, **kwargs)
        counts["forward"] += found is not None
        return found

    monkeypatch.setattr(replay.FastRecord, "close", counted)
    return counts


@pytest.mark.parametrize("kind", ["named tiles", "autotuned"])
def test_later_calls_offering_configs_are_replayed_their_backward_under_the_config_chosen(timed, poisoned_empty,
                                                                                         replays, kind):
    """A named op's later calls of a kind seen before are replayed where a launch offers its backward other configs:
    the configs and their grids are the first call's. The backward, timed once, keeps the config chosen."""
    kernel = named_tiles_kernel()
    product = (lambda a, b: tiled_product(kernel, a, b)) if kind == "named tiles" else \
        (lambda a, b: launch(a, b, tiled))
    op = tritongrad.op(f"tgtiles::replayed_{kind.replace(' ', '_')}")(product)
    chosen = AROUND[4] if kind == "named tiles" else tuple(CONFIGS[2].kwargs.values())
    for call in range(4):
        assert_matmul_grads(op, timed, {chosen: 1.0})
        if call == 0:
            trials, launched = timed["trials"], len(timed["blocks"])
            assert timed["blocks"][-1] == chosen
    assert replays["forward"] == 3
    assert timed["trials"] == trials  # timed at the first call only
    assert set(timed["blocks"][launched:]) <= {chosen}  # (a replay's backward launches past the spy)


def test_a_call_whose_grid_function_gives_another_config_another_grid_is_not_the_replays(timed, poisoned_empty,
                                                                                        replays):
    """The grid under the launch's own config is not enough: a grid function reading what the kernel is not passed
    (here the rows it covers, padded) can give another config another grid, which the backward must take."""
    kernel = named_tiles_kernel()
    padded = {"rows": 45}

    def product(a, b):
        launch = matmul.matmul_launch(a, b, False, False, kernel, {**TILED, "BLOCK_M": 32, "num_warps": 2})
        launch.grid = lambda meta: (triton.cdiv(padded["rows"], meta["BLOCK_M"]), triton.cdiv(37, meta["BLOCK_N"]))
        return launch()

    op = tritongrad.op("tgtiles::padded_rows")(product)
    chosen = (16, 16, 32)  # BLOCK_M halved: 3 row programs for 45 rows, 4 for 50 (the launch's 32: 2 for both)
    for rows, replayed, grid in ((45, 0, (3, 3)), (45, 1, (3, 3)), (50, 1, (4, 3))):
        padded["rows"] = rows
        assert_matmul_grads(op, timed, {chosen: 1.0})
        assert replays["forward"] == replayed
        assert timed["grids"][-1] == grid  # (a replay's backward launches past the spy: the first call's)


def test_a_config_the_grid_function_cannot_take_is_not_offered(timed, poisoned_empty):
    """A grid function raising for a config (here for BLOCK_M 16) leaves it out of the configs offered, as tuning
    leaves out one the kernel cannot run under; the others are timed and the gradient is PyTorch's."""
    kernel = named_tiles_kernel()

    def grid(meta):
        if meta["BLOCK_M"] == 16:
            raise ValueError("no grid for BLOCK_M 16")
        return triton.cdiv(45, meta["BLOCK_M"]), triton.cdiv(37, meta["BLOCK_N"])

    def product(a, b):
        launch = matmul.matmul_launch(a, b, False, False, kernel, {**TILED, "BLOCK_M": 32, "num_warps": 2})
        launch.grid = grid
        return launch()

    assert_matmul_grads(tritongrad.op(product), timed, {(32, 16, 16): 1.0})
    assert timed["trials"] > 1 and all(bm == 32 or bm == 64 for bm, _, _ in timed["blocks"])
    assert timed["blocks"][-1] == (32, 16, 16)


def test_naming_a_constexpr_that_is_no_tile_size_is_refused_naming_it(timed):
    with pytest.raises(ValueError, match="^tritongrad.backward_configs: tiles= names `K`, which is a parameter but "
                                         "not a constexpr of kernel `matmul_kernel`"):
        tritongrad.backward_configs(tiles=("BLOCK_M", "K"))(triton.jit(matmul.matmul_kernel.fn.fn))
    with pytest.raises(ValueError, match="no tile sizes named"):
        tritongrad.backward_configs()
    kernel = tritongrad.backward_configs(tiles=("BLOCK_M", "COMPUTE"))(triton.jit(matmul.matmul_kernel.fn.fn))
    op = tritongrad.op(lambda a, b: tiled_product(kernel, a, b))
    a = torch.randn(45, 70, dtype=torch.float64, requires_grad=True)
    b = torch.randn(70, 37, dtype=torch.float64, requires_grad=True)
    with pytest.raises(tritongrad.OpError, match="names `COMPUTE` a tile size .* passes COMPUTE=.*float64.*, which is "
                                                 "not a power of two"):
        op(a, b)
