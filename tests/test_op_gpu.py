"""``tritongrad.op`` on the GPU: torch.compile with Inductor, opcheck, aten overrides, bfloat16,
multi-config autotuning, and DistributedDataParallel on two GPUs."""

import logging
import os
import re
import socket

import pytest
import torch
import triton
import triton.language as tl

import tritongrad
from tritongrad.core.errors import OpError
from tritongrad.host import backward as op_backward
from tritongrad.host import shadows
from tritongrad.host.launch_record import LaunchRecord, _relaunchers
from tritongrad.runtime import relaunch, tuning

pytestmark = pytest.mark.gpu

BLOCK = 128


@triton.jit
def mul_kernel(a_ptr, b_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    a = tl.load(a_ptr + offs, mask=mask)
    b = tl.load(b_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, a * b, mask=mask)


@triton.jit
def sin_mul_kernel(a_ptr, b_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    a = tl.load(a_ptr + offs, mask=mask)
    b = tl.load(b_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, tl.sin(a.to(tl.float32)).to(a.dtype) * b, mask=mask)


@triton.autotune(configs=[triton.Config({"BLOCK": b}, num_warps=w) for b, w in ((32, 1), (128, 4), (512, 8))],
                 key=["n"])
@triton.jit
def tuned_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(y_ptr + offs, x * tl.sigmoid(x), mask=mask)


def chain_body(x, w):
    n = x.numel()
    h, y = torch.empty_like(x), torch.empty_like(x)
    mul_kernel[(triton.cdiv(n, BLOCK),)](x, w, h, n, BLOCK=BLOCK)
    sin_mul_kernel[(triton.cdiv(n, BLOCK),)](h, x, y, n, BLOCK=BLOCK)
    return y


chain = tritongrad.op(chain_body)
named_chain = tritongrad.op("tggpu::chain")(chain_body)


def chain_ref(x, w):
    return torch.sin(x * w) * x


def rand(*shape, dtype=torch.float32, grad=True):
    return torch.randn(*shape, device="cuda", dtype=dtype, requires_grad=grad)


def grads_of(fn, *inputs, upstream=None):
    inputs = [t.detach().clone().requires_grad_() for t in inputs]
    out = fn(*inputs)
    out.backward(upstream if upstream is not None else torch.ones_like(out))
    return out.detach(), [t.grad for t in inputs]


def test_compile_fullgraph_with_inductor():
    x, w = rand(1000), rand(1000)
    g = torch.randn(1000, device="cuda")
    compiled = torch.compile(lambda x, w: named_chain(x, w).tanh(), fullgraph=True)
    got, got_grads = grads_of(compiled, x, w, upstream=g)
    want, want_grads = grads_of(lambda x, w: chain_ref(x, w).tanh(), x, w, upstream=g)
    torch.testing.assert_close(got, want)
    for a, b in zip(got_grads, want_grads, strict=True):
        torch.testing.assert_close(a, b)


def named_tuned_body(x, w):
    n = x.numel()
    h, y = torch.empty_like(x), torch.empty_like(x)
    mul_kernel[(triton.cdiv(n, BLOCK),)](x, w, h, n, BLOCK=BLOCK)
    tuned_kernel[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](h, y, n)
    return y


named_tuned = tritongrad.op("tggpu::tuned")(named_tuned_body)
FORWARD_KERNELS = re.compile(r"(mul_kernel|sin_mul_kernel|tuned_kernel)(?!_bwd)")  # as Inductor may suffix them


def kernels_run(fn):
    """The names of the CUDA kernels ``fn()`` launches, and how many launch records it entered (one is entered only
    where the forward launches run again: the eager forward, the recomputing backwards)."""
    records_entered, enter = [], LaunchRecord.__enter__

    def counted(self):
        records_entered.append(self.name)
        return enter(self)

    LaunchRecord.__enter__ = counted
    try:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
    finally:
        LaunchRecord.__enter__ = enter
    return [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA], records_entered


def test_named_op_is_a_triton_op_on_the_gpu():
    assert not named_chain.opaque and named_chain.saving_op is not None
    assert isinstance(named_chain.op, torch._library.custom_ops.CustomOpDef)  # triton_op makes one too


@pytest.mark.parametrize("fullgraph", [True, False])
def test_compiled_backward_does_not_rerun_the_forward_launches(fullgraph):
    x, w = rand(1000), rand(1000)
    g = torch.randn(1000, device="cuda")
    compiled = torch.compile(lambda x, w: named_chain(x, w).tanh(), fullgraph=fullgraph)
    want, want_grads = grads_of(lambda x, w: chain_ref(x, w).tanh(), x, w, upstream=g)
    for _ in range(2):  # the first backward of a kind is checked (stray gradients), later ones are not
        a, b = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
        y = compiled(a, b)
        names, entered = kernels_run(lambda: y.backward(g))  # noqa: B023
        assert entered == [], entered  # no recomputing backward
        assert not [n for n in names if FORWARD_KERNELS.search(n)], names
        assert any("_bwd" in n for n in names), names  # the derived kernels ran
        torch.testing.assert_close(y.detach(), want)
        torch.testing.assert_close(a.grad, want_grads[0])
        torch.testing.assert_close(b.grad, want_grads[1])


def test_compiled_backward_launches_the_derived_kernels_inductor_traced(caplog):
    """The backward is a triton_op too: Inductor's code for it launches the derived kernels, no opaque
    op and no launch record; the first trace rehearses the backward on real tensors (checks, launch settings)."""
    from torch._inductor.utils import run_and_get_code

    x, w = rand(1000), rand(1000)
    g = torch.randn(1000, device="cuda")
    want, want_grads = grads_of(lambda x, w: chain_ref(x, w).tanh(), x, w, upstream=g)
    torch._dynamo.reset()
    compiled = torch.compile(lambda x, w: named_chain(x, w).tanh(), fullgraph=True)
    with caplog.at_level(logging.INFO, logger="tritongrad"):
        (got, got_grads), codes = run_and_get_code(lambda: grads_of(compiled, x, w, upstream=g))
    assert "opaquely" not in caplog.text, caplog.text
    assert not any("chain_saved_backward" in c for c in codes), codes
    assert sum(len(re.findall(r"def \w*_bwd\w*\(", c)) for c in codes) >= 2, codes  # the two derived kernels
    torch.testing.assert_close(got, want)
    for a, b in zip(got_grads, want_grads, strict=True):
        torch.testing.assert_close(a, b)
    a, b = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    y = compiled(a, b)
    names, entered = kernels_run(lambda: y.backward(g))
    assert entered == [] and any("_bwd" in n for n in names), (entered, names)
    torch.testing.assert_close(a.grad, want_grads[0])


@pytest.mark.parametrize("name", ["rmsnorm", "layernorm", "softmax", "swiglu", "matmul", "cross_entropy",
                                  "flash_attention"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_compiled_examples_get_the_eager_ops_gradients(name, dtype, caplog):
    """Each example compiled, forward and backward, against the same op run eagerly; the ops without an autotuned
    forward (whose config Inductor picks when the graph runs) get their backward traced, not opaque."""
    from tritongrad.examples import get

    example = get(name)
    if getattr(example, "dtypes", None) and dtype not in example.dtypes:
        pytest.skip(f"{name} takes {example.dtypes}")
    torch.manual_seed(39)
    inputs = [t.requires_grad_() if isinstance(t, torch.Tensor) and t.is_floating_point() else t
              for t in example.make_inputs(example.sizes[-1], device="cuda", dtype=dtype)]
    leaves = [t for t in inputs if isinstance(t, torch.Tensor) and t.requires_grad]
    out = example.op(*inputs)
    g = torch.randn_like(out)
    want = torch.autograd.grad(out, leaves, g)
    torch._dynamo.reset()
    with caplog.at_level(logging.INFO, logger="tritongrad"):
        out2 = torch.compile(example.op, fullgraph=True)(*inputs)
        got = torch.autograd.grad(out2, leaves, g)
    tol = {} if dtype == torch.float32 else {"rtol": 2e-2, "atol": 2e-2}
    torch.testing.assert_close(out2, out, **tol)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, **tol)
    if name != "matmul":
        assert "opaquely" not in caplog.text, caplog.text


def _rows_bound(binding):
    """rmsnorm's (x, w) as a user may bind them: leaves, and how x and w are made of them."""
    leaf = lambda *shape: torch.randn(*shape, device="cuda", requires_grad=True)  # noqa: E731
    if binding == "a weight that is a row of the input":
        return (leaf(9, 333),), lambda b: (b[1:], b[0])
    # (the example reads x and w as contiguous: it refuses other layouts, eagerly and compiled alike)
    return (leaf(9, 333),), lambda b: (b, b[3])  # "one tensor, both": w is one of x's own rows


@pytest.mark.parametrize("binding", ["a weight that is a row of the input", "one tensor, both"])
def test_compiled_backward_gets_the_eager_gradients_however_the_tensors_are_bound(binding):
    """The traced backward plans from fake tensors: views of one storage and one tensor in two roles must reach it
    as they reach the eager op (the same leaves' gradients as eagerly and as PyTorch's)."""
    from tritongrad.examples import rmsnorm

    leaves, bind = _rows_bound(binding)

    def step(fn):
        for t in leaves:
            t.grad = None
        out = fn(*bind(*leaves))
        upstream = torch.randn(out.shape, device="cuda", generator=torch.Generator("cuda").manual_seed(40))
        out.backward(upstream)
        return out.detach(), [t.grad.clone() for t in leaves]

    want = step(rmsnorm.reference)
    eager = step(rmsnorm.rmsnorm)
    torch._dynamo.reset()
    got = step(torch.compile(rmsnorm.rmsnorm, fullgraph=True))
    torch.testing.assert_close(got[0], eager[0])
    for a, b, c in zip(got[1], eager[1], want[1], strict=True):
        torch.testing.assert_close(a, b)
        torch.testing.assert_close(a, c, rtol=1e-4, atol=1e-4)


def test_compiled_backward_of_a_launch_reading_outside_its_tensor_is_refused():
    """The check a first eager backward makes (gradient outside the tensors passed) holds under torch.compile."""
    x, w = rand(1000), rand(1001)
    compiled = torch.compile(lambda x, w: named_chain(x, w[:999]), fullgraph=False)  # the launch reads w[999]
    y = compiled(x, w)
    with pytest.raises(OpError, match="reads memory outside the elements of the tensor passed to `b_ptr`"):
        y.backward(torch.randn_like(y))


def test_compiled_forward_runs_the_kernels_inductor_traced():
    x, w = rand(1000), rand(1000)
    compiled = torch.compile(lambda x, w: named_chain(x, w).tanh(), fullgraph=True)
    compiled(x, w)  # compiles
    names, entered = kernels_run(lambda: compiled(x, w))
    assert entered == []  # not the eager op's launch record: Inductor launches the kernels
    assert any(FORWARD_KERNELS.search(n) for n in names), names


def test_compiled_autotuned_named_op_falls_back_to_recomputing():
    """Inductor tunes the autotuned launch; its config is unknown to the backward, which re-runs the forward."""
    x, w = rand(3000), rand(3000)
    g = torch.randn(3000, device="cuda")
    compiled = torch.compile(lambda x, w: named_tuned(x, w) * 3, fullgraph=True)
    got, got_grads = grads_of(compiled, x, w, upstream=g)
    ref = lambda x, w: torch.sigmoid(x * w) * x * w * 3  # noqa: E731
    want, want_grads = grads_of(ref, x, w, upstream=g)
    torch.testing.assert_close(got, want)
    for a, b in zip(got_grads, want_grads, strict=True):
        torch.testing.assert_close(a, b)


def test_compile_reduce_overhead_replays_cuda_graphs(monkeypatch):
    """Also where the op's first backward runs in cudagraph trees' warm-up, whose allocations are the graph's
    memory: the tensor the backward keeps for a parameter launches only write holds none (cudagraph trees refuse
    a graph whose memory something else holds)."""
    monkeypatch.setattr(shadows, "_stand_ins", {})
    x, w = rand(1000), rand(1000)
    g = torch.randn(1000, device="cuda")
    compiled = torch.compile(lambda x, w: named_chain(x, w).tanh(), mode="reduce-overhead", fullgraph=True)
    want, want_grads = grads_of(lambda x, w: chain_ref(x, w).tanh(), x, w, upstream=g)
    for _ in range(4):  # the first calls record; later ones replay the captured CUDA graphs
        got, got_grads = grads_of(compiled, x, w, upstream=g)
        torch.testing.assert_close(got, want)
        for a, b in zip(got_grads, want_grads, strict=True):
            torch.testing.assert_close(a, b)


def test_forward_and_backward_captured_in_a_cuda_graph():
    """A training step through an op (rmsnorm: partial rows for the weight, launches made directly) captured in a
    CUDA graph, as users capture whole steps: each replay on new values copied into the captured inputs gives
    PyTorch's gradients. bench --graphs times such replays (graph_median, run here once on the same step)."""
    from tritongrad.examples import rmsnorm
    from tritongrad.tools.bench import measure

    x, w = rand(1000, 333), rand(333)
    upstream = torch.randn(1000, 333, device="cuda")

    def step():
        rmsnorm.rmsnorm(x, w).backward(upstream)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm: compiled, derived, the first (checked) backward
        for _ in range(3):
            x.grad = w.grad = None
            step()
    torch.cuda.current_stream().wait_stream(side)
    x.grad = w.grad = None
    shadows._stand_ins.clear()  # made again while capturing
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    stand_ins = shadows._stand_ins
    assert stand_ins and all(t.data_ptr() == 0 for t in stand_ins.values())  # none of its memory
    for _ in range(3):
        with torch.no_grad():
            x.copy_(torch.randn_like(x))
            w.copy_(torch.randn_like(w))
            upstream.copy_(torch.randn_like(upstream))
        graph.replay()
        _, want = grads_of(rmsnorm.reference, x.double(), w.double(), upstream=upstream.double())
        for got, expected in zip((x.grad, w.grad), want, strict=True):  # w's: 1000 rows summed, in another order
            torch.testing.assert_close(got.double(), expected, rtol=1e-4, atol=1e-4)
    assert measure.graph_median(step, [x, w]) > 0


def test_opcheck():
    torch.library.opcheck(named_chain.op, (rand(1000), rand(1000)))
    torch.library.opcheck(named_chain.op, (rand(33, 7), rand(33, 7, grad=False)))


@pytest.mark.parametrize("backward", ["aten", "derived"])
def test_override_aten_sin(backward):
    from tritongrad.examples.sin import triton_sin

    calls = []

    def counted_sin(x):
        calls.append(1)
        return triton_sin(x)

    x = rand(3, 1000)
    with tritongrad.override("aten::sin", counted_sin, backward=backward):
        y = torch.sin(x)
        assert calls
        assert y.grad_fn.name() == ("SinBackward0" if backward == "aten" else "CountedSinBackward")
        g = torch.randn_like(y)
        y.backward(g)
    torch.testing.assert_close(y.detach(), x.detach().sin())
    torch.testing.assert_close(x.grad, g * x.detach().cos())
    n = len(calls)
    torch.sin(x)
    assert len(calls) == n  # restored on exit


def test_bfloat16_inputs_accumulate_in_float32():
    x, w = rand(3000, dtype=torch.bfloat16), rand(3000, dtype=torch.bfloat16)
    g = torch.randn(3000, device="cuda", dtype=torch.bfloat16)
    got, (gx, gw) = grads_of(chain, x, w, upstream=g)
    assert got.dtype == gx.dtype == gw.dtype == torch.bfloat16
    want, (wx, ww) = grads_of(chain_ref, x.double(), w.double(), upstream=g.double())
    torch.testing.assert_close(got.double(), want, rtol=5e-2, atol=5e-2)
    torch.testing.assert_close(gx.double(), wx, rtol=5e-2, atol=5e-2)
    torch.testing.assert_close(gw.double(), ww, rtol=5e-2, atol=5e-2)


def backward_launches(monkeypatch) -> list:
    """The (grid, arguments) of each derived kernel's launch from here on, tuning's config choices forgotten."""
    launched = []
    real = op_backward.grad

    def spy(*args, **kwargs):
        bwd = real(*args, **kwargs)

        class Spy:
            def __getattr__(self, name):
                return getattr(bwd, name)

            def launch(self, grid, named, *args, **kwargs):
                launched.append((grid, named))
                return bwd.launch(grid, named, *args, **kwargs)

        return Spy()

    monkeypatch.setattr(op_backward, "grad", spy)
    monkeypatch.setattr(tuning, "_configs", {})
    return launched


def test_multi_config_autotune_backward_runs_under_one_of_its_configs_with_its_grid(monkeypatch):
    launched = backward_launches(monkeypatch)

    @tritongrad.op
    def silu(x):
        y = torch.empty_like(x)
        n = x.numel()
        tuned_kernel[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](x, y, n)
        return y

    x = rand(5000)
    got, (gx,) = grads_of(silu, x)
    want, (wx,) = grads_of(lambda x: x * torch.sigmoid(x), x)
    torch.testing.assert_close(gx, wx)
    configs = {(c.kwargs["BLOCK"], c.num_warps) for c in tuned_kernel.configs}
    assert {(kwargs["BLOCK"], kwargs["num_warps"]) for _, kwargs in launched} == configs  # each timed (configs.Tiles)
    (chosen,) = tuning._configs.values()
    assert launched[-1][1]["BLOCK"] == dict(chosen)["BLOCK"]  # the launch that counts: the fastest
    for grid, kwargs in launched:  # each under its config's grid, not the forward's
        assert grid == (triton.cdiv(5000, kwargs["BLOCK"]),)


def test_a_fixed_config_launch_of_a_kernel_declaring_configs_gets_its_backward_under_the_fastest(monkeypatch):
    launched = backward_launches(monkeypatch)
    declared = [triton.Config({"BLOCK": b}, num_warps=w) for b, w in ((64, 2), (1024, 8))]
    kernel = tritongrad.backward_configs(declared)(triton.jit(tuned_kernel.fn.fn))

    @tritongrad.op
    def silu(x):
        y = torch.empty_like(x)
        n = x.numel()
        kernel[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](x, y, n, BLOCK=256, num_warps=4)
        return y

    x = rand(5000)
    got, (gx,) = grads_of(silu, x)
    want, (wx,) = grads_of(lambda x: x * torch.sigmoid(x), x)
    torch.testing.assert_close(gx, wx)
    assert {kwargs["BLOCK"] for _, kwargs in launched} == {64, 256, 1024}  # the declared and the forward's, timed
    (chosen,) = tuning._configs.values()
    assert launched[-1][1]["BLOCK"] == dict(chosen)["BLOCK"]  # the launch that counts: the fastest
    for grid, kwargs in launched:
        assert grid == (triton.cdiv(5000, kwargs["BLOCK"]),)


def test_a_fixed_config_matmul_naming_its_tile_sizes_gets_its_backward_under_the_fastest_config_around_its_own(
        monkeypatch):
    from tritongrad.examples import matmul
    from tritongrad.host.configs import around

    launched = backward_launches(monkeypatch)
    a = torch.randn(1000, 700, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    b = torch.randn(700, 900, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    c = matmul.matmul_fixed(a, b, named_tiles=True)
    g = torch.randn_like(c)
    got = torch.autograd.grad(c, [a, b], g)
    wide = [t.detach().float().requires_grad_() for t in (a, b)]
    want = torch.autograd.grad(wide[0] @ wide[1], wide, g.float())
    for x, y in zip(got, want, strict=True):
        assert ((x.float() - y).abs().max() / y.abs().max()).item() < 2e-2
    names = ("BLOCK_M", "BLOCK_N", "BLOCK_K")
    offered = {tuple(dict(c)[n] for n in names) for c in around(matmul.FIXED, names, matmul.matmul_tiles_kernel)}
    tried = {tuple(kwargs[n] for n in names) for _, kwargs in launched}
    assert (128, 128, 128) in offered and tried <= offered | {tuple(matmul.FIXED[n] for n in names)}
    (chosen,) = tuning._configs.values()
    assert tuple(dict(chosen)[n] for n in names) == tuple(launched[-1][1][n] for n in names)  # the fastest counts
    for grid, kwargs in launched:
        assert grid == (triton.cdiv(1000, kwargs["BLOCK_M"]), triton.cdiv(900, kwargs["BLOCK_N"]))


def test_no_host_sync_on_repeated_calls():
    x, w = rand(1000), rand(1000)
    chain(x, w).sum().backward()  # warm: kernels compiled, backward kernels derived
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        y = chain(x, w)
        y.backward(torch.ones_like(y))
    finally:
        torch.cuda.set_sync_debug_mode("default")


def test_forward_launches_made_again_call_their_compiled_kernels(monkeypatch):
    """An op's forward launch with arguments recorded before calls its compiled kernel directly (relaunch.py),
    kept per the alignment of its tensors: a view 4 bytes past an aligned address is another compiled kernel,
    another size another launcher. Outputs and gradients as PyTorch's on each call."""
    if not relaunch.supported():
        pytest.skip("this Triton's launch is not the one relaunch.py repeats")
    op = tritongrad.op(chain_body)  # launchers of its own sizes: other tests launch chain at 1000
    direct, through_triton = [], []  # (a replayed call launches directly: Relauncher.launch, from replay.py)
    launch, first = relaunch.Relauncher.launch, relaunch.Relauncher._first

    def spied_launch(self, values):
        compiled = launch(self, values)
        if compiled is not None:
            direct.append(self.kernel)
        return compiled

    def spied_first(self, *args):
        through_triton.append(self.kernel)
        return first(self, *args)

    monkeypatch.setattr(relaunch.Relauncher, "launch", spied_launch)
    monkeypatch.setattr(relaunch.Relauncher, "_first", spied_first)
    before = set(_relaunchers)
    for n, offset in [(1001, 0)] * 3 + [(1001, 1)] * 2 + [(777, 0)] * 2:
        base, w = rand(n + offset), rand(n)
        x = base[offset:]  # not cloned: its address is the point
        assert (x.data_ptr() % 16 == 0) == (offset == 0)
        upstream = torch.randn(n, device="cuda")
        got = op(x, w)
        got.backward(upstream)
        want, want_grads = grads_of(chain_ref, x, w, upstream=upstream)
        torch.testing.assert_close(got.detach(), want)
        torch.testing.assert_close(base.grad[offset:], want_grads[0])
        torch.testing.assert_close(w.grad, want_grads[1])
    assert through_triton.count(mul_kernel) == 3 and direct.count(mul_kernel) == 4  # first of each alignment, size
    kept = [r for k, r in _relaunchers.items() if k not in before and r.kernel is mul_kernel]
    assert sorted(len(r.compiled) for r in kept) == [1, 2] and all(r.direct for r in kept)


def test_cpu_tensors_are_refused_outside_the_interpreter():
    if os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("kernels are interpreted")
    x, w = (torch.randn(100, device="cpu", requires_grad=True) for _ in range(2))
    with pytest.raises(OpError, match="passes a CPU tensor"):
        chain(x, w)


# -- DistributedDataParallel on two GPUs -------------------------------------------------------------


def _ddp_worker(rank, world, port):
    import torch.distributed as dist

    from tritongrad.examples.linear import CustomLinear

    class Twin(torch.nn.Module):
        def __init__(self, weights):
            super().__init__()
            self.weights = torch.nn.Parameter(weights.detach().clone())

        def forward(self, x):
            return self.weights @ x

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world)
    try:
        torch.manual_seed(0)  # same initial weights on both ranks
        lin = CustomLinear(45, 30).cuda()
        twin = Twin(lin.weights)
        models = [torch.nn.parallel.DistributedDataParallel(m, device_ids=[rank]) for m in (lin, twin)]
        opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in models]
        torch.manual_seed(1 + rank)  # different data on each rank
        for _ in range(3):
            x, target = torch.randn(45, device="cuda"), torch.randn(30, device="cuda")
            for model, opt in zip(models, opts, strict=True):
                opt.zero_grad()
                ((model(x) - target) ** 2).mean().backward()
                opt.step()
        torch.testing.assert_close(lin.weights, twin.weights, rtol=1e-5, atol=1e-5)
        gathered = [torch.empty_like(lin.weights) for _ in range(world)]
        dist.all_gather(gathered, lin.weights.detach())
        torch.testing.assert_close(gathered[0], gathered[1])  # gradients were averaged across ranks
    finally:
        dist.destroy_process_group()


@pytest.mark.gpu2
def test_ddp_on_two_gpus():
    os.environ["NCCL_NVLS_ENABLE"] = "0"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    torch.multiprocessing.spawn(_ddp_worker, args=(2, port), nprocs=2, join=True)


@pytest.mark.parametrize("name", ["cross_entropy", "flash_attention"])
def test_replayed_calls_keep_state_tapes_of_their_own(name):
    """On the GPU, where a replayed call's launches go past Triton: forwards that keep their online softmax's
    state (augment.py) replayed three times before any backward, the backwards in another order; each gets its
    own inputs' gradients (float32 against PyTorch in float64)."""
    from tritongrad import examples
    from tritongrad.tools.check import relative_errors

    example = examples.get(name)
    size = (64, 1000) if name == "cross_entropy" else (4, 200, 64)
    calls = [example.make_inputs(size, device="cuda", dtype=torch.float32) for _ in range(4)]
    runs = []
    for inputs in calls:
        args = [t.clone().requires_grad_() if isinstance(t, torch.Tensor) and t.is_floating_point() else t
                for t in inputs]
        runs.append((args, example.op(*args)))
    for args, out in (runs[2], runs[0], runs[3], runs[1]):
        upstream = torch.randn_like(out)
        out.backward(upstream)
        ref = [t.detach().double().requires_grad_() if isinstance(t, torch.Tensor) and t.is_floating_point() else t
               for t in args]
        want = example.reference(*ref)
        wanted = torch.autograd.grad(want, [t for t in ref if isinstance(t, torch.Tensor) and t.requires_grad],
                                     upstream.double())
        got = [t.grad for t in args if isinstance(t, torch.Tensor) and t.requires_grad]
        for g, w in zip([out, *got], [want, *wanted], strict=True):  # (tl.dot is tf32: relative to the largest)
            assert relative_errors(g, w.detach())[1] < 5e-3
