"""Double backward through ops (autograd_function.backward_as_op): with create_graph=True an op's backward runs as a
bare op of its own whose launches of the derived kernels are recorded and derived in turn (reverse over reverse).
float64 in the interpreter, sizes that are not powers of two, random inputs, against plain-PyTorch references."""

import importlib
import os

import pytest
import torch
import triton
import triton.language as tl

import tritongrad
from tritongrad.core.errors import OpError

pytestmark = pytest.mark.slow  # (gradgradcheck in the interpreter: about 40 s; CI's `pytest -m slow` runs it)
DTYPE = torch.float64
DEVICE = "cuda" if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1" else "cpu"
SUPPORTED = {"sin": 37, "softplus": 45, "swiglu": (3, 13), "softmax": (3, 11), "gelu": 37, "geglu": (3, 13),
             "log_softmax": (3, 11), "rmsnorm": (3, 13), "layernorm": (3, 13), "fn1": 16, "gather": (5, 9),
             "linear": (5, 7), "matmul": (5, 6, 7), "matvec": (5, 7), "rotary": (1, 1, 3, 4), "transpose": (5, 7),
             "add_rmsnorm": (2, 7), "cross_entropy": (3, 37), "flash_attention": (1, 9, 5)}  # (causal, 1 program)
FAST = ("cross_entropy", "flash_attention")  # gradgradcheck's fast mode (cross_entropy: row 1 ignored, 37 = 32 + 5)
# hvp differentiates the double backward once more (its cotangent's gradient)
THRICE = ("sin", "softplus", "swiglu", "softmax")


def _example(name):
    return importlib.import_module(f"tritongrad.examples.{name}")


def _bare(name):
    """The example's host function as a bare op (its named op is the example's own): its launch on contiguous
    inputs, or (an example without a ``<name>_launch``) the named op's own host function."""
    example = _example(name)
    launch = getattr(example, f"{name}_launch", None)
    if launch is None:
        host = (getattr(example, "OP", None) or getattr(example, name)).__wrapped__
    else:
        def host(*args):
            return launch(*[a.contiguous() if isinstance(a, torch.Tensor) else a for a in args])()

    host.__qualname__ = f"bare_{name}"
    return tritongrad.op(host)


def _inputs(name, size):
    """The example's inputs, its floating-point tensors requiring grad (index tensors and flags as they are)."""
    return tuple(t.requires_grad_() if isinstance(t, torch.Tensor) and t.is_floating_point() else t
                 for t in _example(name).make_inputs(size, DEVICE, DTYPE))


def _of_differentiable(fn, inputs):
    """``fn`` as a function of the inputs that require grad only (the others fixed), and those inputs."""
    at = [i for i, t in enumerate(inputs) if isinstance(t, torch.Tensor) and t.requires_grad]

    def call(*xs):
        args = list(inputs)
        for i, x in zip(at, xs, strict=True):
            args[i] = x
        return fn(*args)

    return call, tuple(inputs[i] for i in at)


@pytest.mark.parametrize("kind", ["named", "bare"])
@pytest.mark.parametrize("name", sorted(SUPPORTED))
def test_gradgradcheck(name, kind):
    torch.manual_seed(0)
    example = _example(name)
    op = (getattr(example, "OP", None) or getattr(example, name)) if kind == "named" else _bare(name)
    # (cross_entropy: 111 inputs whose full Jacobian took 70-120 s in the interpreter; random projections instead,
    # beside test_<name>_second_derivative_matches_reference's exact comparison, flash_attention's too)
    fast = name in FAST
    assert torch.autograd.gradgradcheck(*_of_differentiable(op, _inputs(name, SUPPORTED[name])), fast_mode=fast)


@pytest.mark.parametrize("kind", ["named", "bare"])
@pytest.mark.parametrize("name", THRICE)
def test_hvp_matches_reference(name, kind):
    torch.manual_seed(1)
    example = _example(name)
    op = getattr(example, name) if kind == "named" else _bare(name)
    inputs = _inputs(name, SUPPORTED[name])
    weights = torch.randn(example.reference(*inputs).shape, dtype=DTYPE)  # a loss of every output element
    vectors = tuple(torch.randn_like(x) for x in inputs)
    got = torch.autograd.functional.hvp(lambda *xs: (op(*xs) * weights).sum(), inputs, vectors)
    want = torch.autograd.functional.hvp(lambda *xs: (example.reference(*xs) * weights).sum(), inputs, vectors)
    for g, w in zip((*got[1],) if isinstance(got[1], tuple) else (got[1],),
                    (*want[1],) if isinstance(want[1], tuple) else (want[1],), strict=True):
        torch.testing.assert_close(g, w, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("kind", ["named", "bare"])
@pytest.mark.parametrize("name", ["rmsnorm", "layernorm"])
def test_hvp_through_a_kept_statistic(name, kind):
    """Thrice derived, through the statistic the forward stored (rmsnorm's rstd, layernorm's mean and rstd). Crashed
    before: the twice-derived kernel's `if` recomputing what its recomputed constexpr `if` assigned gave a merge copy
    of a name never assigned there (UnboundLocalError `result_16`); then a reshape's 0-d result (a scalar in the
    interpreter) had an adjoint `tl.reshape` refuses."""
    test_hvp_matches_reference(name, kind)


@pytest.mark.parametrize("kind", ["named", "bare"])
@pytest.mark.parametrize("name", THRICE)
def test_hvp_of_a_sum_matches_reference(name, kind):
    """The loss a plain `.sum()`: its gradient reaches the op expanded (stride 0). Refused before ("its backward
    reads a buffer the host function made"): the backward op made the contiguous copy inside itself, an intermediate
    to its own backward; and the first (checked) backward returned the guard-banded buffers as its outputs."""
    torch.manual_seed(2)
    example = _example(name)
    op = getattr(example, name) if kind == "named" else _bare(name)
    inputs = _inputs(name, SUPPORTED[name])
    vectors = tuple(torch.randn_like(x) for x in inputs)
    got = torch.autograd.functional.hvp(lambda *xs: op(*xs).sum(), inputs, vectors)[1]
    want = torch.autograd.functional.hvp(lambda *xs: example.reference(*xs).sum(), inputs, vectors)[1]
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("kind", ["named", "bare"])
def test_cross_entropy_second_derivative_matches_reference(kind, poisoned_empty):
    """The backward stores a row's logits' adjoints and adds the target's after the kernel (later adds), reading the
    log-sum-exp its augmented forward kept: refused before ("cannot differentiate `load` through a pointer that
    does not come from a parameter", tg.tape_get's). Recorded to be differentiated again, it replays the loop and
    adds atomically. Rows ignored (target -100), 5 rows, a vocabulary of two blocks and 9 columns; a random
    incoming gradient; unfilled buffers poisoned; the bare op given a transposed view (made contiguous inside).
    Twice, with fresh values: the second call is replayed, its backward op too."""
    torch.manual_seed(6)
    example = _example("cross_entropy")
    op = example.cross_entropy if kind == "named" else _bare("cross_entropy")
    for _ in range(2):
        logits, target, ignore = example.make_inputs((5, 73), DEVICE, DTYPE)
        target[3] = ignore  # (rows 1 and 3 ignored)
        x = logits.requires_grad_() if kind == "named" else logits.t().contiguous().requires_grad_()
        g = torch.randn(5, dtype=DTYPE, device=DEVICE)
        v = torch.randn(5, 73, dtype=DTYPE, device=DEVICE)

        def second(fn, x=x, target=target, ignore=ignore, g=g, v=v):
            (dx,) = torch.autograd.grad(fn(x if kind == "named" else x.t(), target, ignore), x, g, create_graph=True)
            return dx, torch.autograd.grad(((dx if kind == "named" else dx.t()) * v).sum(), x)[0]

        (dx, ddx), (want_dx, want_ddx) = second(op), second(example.reference)
        torch.testing.assert_close(dx, want_dx, rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(ddx, want_ddx, rtol=1e-9, atol=1e-9)
        rows = want_ddx if kind == "named" else want_ddx.t()
        assert rows[1].abs().max() == 0 and rows[0].abs().max() > 0  # (ignored rows have none)


def test_cross_entropy_double_backward_with_deterministic_is_refused_naming_why():
    """deterministic=True refuses atomics, which a backward to be differentiated again takes in place of later adds:
    the second backward raises naming the input and why (before: a state tape's load, which said nothing of it); the
    first backward with create_graph=True is still right."""
    torch.manual_seed(7)
    example = _example("cross_entropy")
    op = tritongrad.op(lambda x, t, i: example.cross_entropy_launch(x, t, i)(), deterministic=True)
    logits, target, ignore = example.make_inputs((5, 41), DEVICE, DTYPE)
    x = logits.requires_grad_()
    (dx,) = torch.autograd.grad(op(x, target, ignore).sum(), x, create_graph=True)
    torch.testing.assert_close(dx, torch.autograd.grad(example.reference(x, target, ignore).sum(), x)[0])
    with pytest.raises(OpError, match=r"`logits_ptr` with deterministic=True: its gradient can only be added "
                       r"atomically here \(a backward to be differentiated again adds atomically"):
        dx.sum().backward()


def test_second_derivative_matches_reference_twice():
    """The gradient of the gradient, taken again by the same op (its backward ops' plans and derived kernels reused):
    sin'' = -sin, with a random incoming gradient."""
    op = _example("sin").sin
    for size in (37, 37, 50):
        x = torch.randn(size, dtype=DTYPE, requires_grad=True)
        g = torch.randn(size, dtype=DTYPE)
        (dx,) = torch.autograd.grad(op(x), x, g, create_graph=True)
        (ddx,) = torch.autograd.grad(dx.sum(), x)
        torch.testing.assert_close(ddx, -torch.sin(x.detach()) * g, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("kind", ["named", "bare"])
@pytest.mark.parametrize("name", ["rmsnorm", "softmax"])
def test_a_repeated_hvp_plans_its_backward_op_once(name, kind, monkeypatch):
    """Hessian-vector products taken again and again (an optimizer's steps): the op's backward run as an op is one
    op across calls, whose kind of call is planned once and then replayed. Before, each call made a new op with no
    plans: every call planned it and checked its first backward (2.5-5.5 ms of host time a call on an H200). Fresh
    values on each call; rmsnorm's rstd made again (remake.py) at another size between two of the same, so the
    backward op's replay of the first size meets a launch that is not its own and hands over to a launch record that
    records it."""
    from tritongrad.host import launch_record

    example = _example(name)
    op = getattr(example, name) if kind == "named" else _bare(name)
    planned = []
    plan = launch_record.Planner.plan
    monkeypatch.setattr(launch_record.Planner, "plan", lambda self, *a: planned.append(self.name) or plan(self, *a))
    for call, size in enumerate([(3, 13), (3, 13), (3, 13), (5, 9), (3, 13)]):
        torch.manual_seed(call)
        inputs = _inputs(name, size)
        g = torch.randn(size, dtype=DTYPE)
        v = tuple(torch.randn_like(x) for x in inputs)
        del planned[:]
        got = torch.autograd.grad(torch.autograd.grad(op(*inputs), inputs, g, create_graph=True), inputs, v)
        want = torch.autograd.grad(torch.autograd.grad(example.reference(*inputs), inputs, g, create_graph=True),
                                   inputs, v)
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9)
        if call in (1, 2, 4):  # (a kind of call seen before)
            assert planned == [], f"call {call} planned {planned}"


@pytest.mark.compiled
@pytest.mark.parametrize("kind", ["named", "bare"])
@pytest.mark.parametrize("name", ["rmsnorm", "layernorm"])
def test_second_derivative_through_a_kept_statistic_with_the_compile_check(name, kind, poisoned_empty):
    """The backward reads a statistic its forward launch stored (rmsnorm's rstd; layernorm's mean and rstd, made
    again without layernorm's bias, which the op does not keep: a zero stand-in, the statistics not computed from
    it): refused before ("its backward reads a buffer the host function made"). Each launch, the forward's made
    again and the derived kernels, also compiled for a GPU (the compile check); buffers left unfilled poisoned."""
    torch.manual_seed(4)
    example = _example(name)
    op = getattr(example, name) if kind == "named" else _bare(name)
    inputs = _inputs(name, (4, 19))
    g = torch.randn(4, 19, dtype=DTYPE, device=DEVICE)
    v = tuple(torch.randn_like(x) for x in inputs)
    got = torch.autograd.grad(op(*inputs), inputs, g, create_graph=True)
    want = torch.autograd.grad(example.reference(*inputs), inputs, g, create_graph=True)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)
    second = torch.autograd.grad(sum((a * u).sum() for a, u in zip(got, v, strict=True)), inputs, allow_unused=True)
    expected = torch.autograd.grad(sum((b * u).sum() for b, u in zip(want, v, strict=True)), inputs,
                                   allow_unused=True)  # (nothing depends on layernorm's bias twice)
    for a, b, x in zip(second, expected, inputs, strict=True):
        zero = torch.zeros_like(x)
        torch.testing.assert_close(zero if a is None else a, zero if b is None else b, rtol=1e-9, atol=1e-9)


@triton.jit
def _shifted_mean_kernel(x_ptr, b_ptr, y_ptr, s_ptr, n, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n
    x = tl.load(x_ptr + row * n + cols, mask=mask, other=0.0)
    s = tl.sum(x, axis=0) / n + tl.load(b_ptr)  # a statistic of x and b (its backward reads it back, not b)
    tl.store(s_ptr + row, s)
    tl.store(y_ptr + row * n + cols, x * s, mask=mask)


@tritongrad.op
def _shifted_mean_scale(x, b):
    y, s = torch.empty_like(x), torch.empty(x.shape[0], dtype=x.dtype, device=x.device)
    _shifted_mean_kernel[(x.shape[0],)](x, b, y, s, x.shape[1], BLOCK=32)
    return y


@tritongrad.op
def _scale_by_a_pytorch_statistic(x):
    with torch.no_grad():  # a statistic PyTorch made in the host function, which the launch reads
        s = x.sum(-1) / x.shape[-1]
    y = torch.empty_like(x)
    _scale_rows_kernel[(x.shape[0],)](x, s, y, x.shape[1], BLOCK=32)
    return y


@triton.jit
def _scale_rows_kernel(x_ptr, s_ptr, y_ptr, n, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n
    x = tl.load(x_ptr + row * n + cols, mask=mask, other=0.0)
    tl.store(y_ptr + row * n + cols, x * tl.load(s_ptr + row), mask=mask)


def test_unsupported_double_backward_is_refused():
    """A statistic the double backward cannot make again: computed from a tensor the op does not keep (no derived
    kernel reads `b`), or made by PyTorch in the host function. The double backward raises, naming the op and why
    (never a silent zero); the first backward with create_graph=True still gives the gradient."""
    torch.manual_seed(5)
    x = torch.randn(3, 13, dtype=DTYPE, device=DEVICE, requires_grad=True)
    b = torch.randn(1, dtype=DTYPE, device=DEVICE)
    (dx,) = torch.autograd.grad(_shifted_mean_scale(x, b).sum(), x, create_graph=True)
    s = x.mean(-1, keepdim=True) + b
    torch.testing.assert_close(dx, torch.autograd.grad((x * s).sum(), x)[0])
    with pytest.raises(OpError, match=r"`_shifted_mean_scale`: double backward is not supported \(its backward reads "
                       r"`s_ptr`, which launch #1 \(`_shifted_mean_kernel`\) computed from `b_ptr`, a tensor the op "
                       r"does not keep"):
        dx.sum().backward()
    gy = torch.randn(3, 13, dtype=DTYPE, device=DEVICE, requires_grad=True)  # (the backward reads no x: s and gy)
    (dx,) = torch.autograd.grad(_scale_by_a_pytorch_statistic(x), x, gy, create_graph=True)
    with pytest.raises(OpError, match=r"its backward reads `s_ptr` of launch #1 \(`_scale_rows_kernel`\), a buffer "
                       r"the host function made with PyTorch operations"):
        dx.sum().backward()


def test_gradgradcheck_with_the_bindings_users_pass():
    """The same tensor twice (swiglu(x, x): both gradients and both second derivatives add), a transposed input and
    an expanded (stride-0) one made contiguous inside a bare op (its segments carry the copy's history)."""
    torch.manual_seed(2)
    swiglu = _example("swiglu")
    a = torch.randn(3, 13, dtype=DTYPE, requires_grad=True)
    t = torch.randn(13, 3, dtype=DTYPE, requires_grad=True)
    e = torch.randn(1, 13, dtype=DTYPE, requires_grad=True)
    assert torch.autograd.gradgradcheck(lambda x: swiglu.swiglu(x, x), (a,))
    bare_sin, bare_swiglu = _bare("sin"), _bare("swiglu")
    assert torch.autograd.gradgradcheck(lambda x: bare_sin(x.t()), (t,))
    assert torch.autograd.gradgradcheck(lambda x: bare_swiglu(x.expand(3, 13), a), (e,))


@triton.jit
def _sin_and_lane_index(x_ptr, y_ptr, z_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, tl.sin(tl.load(x_ptr + offs, mask=mask)), mask=mask)
    tl.store(z_ptr + offs, offs.to(tl.float64) * 0.5, mask=mask)  # an output that does not depend on x


@tritongrad.op
def _sin_and_index(x):
    y, z = torch.empty_like(x), torch.empty_like(x)
    _sin_and_lane_index[(1,)](x, y, z, x.numel(), BLOCK=64)
    return y, z


def test_an_incoming_gradient_the_backward_does_not_read_has_no_second_derivative():
    """The double-backward trick (output gradients that require grad, as torch.autograd.functional.hvp makes them)
    through an op with an output that does not depend on its input: its incoming gradient, which no derived kernel
    reads, gets a zero second derivative. Refused before (found by the fuzzer's double-backward check): the backward
    run as an op took it for an argument read unseen, as through a pointer table ("requires grad, but no kernel
    launch reads it")."""
    torch.manual_seed(3)
    x = torch.randn(37, dtype=DTYPE, device=DEVICE, requires_grad=True)
    gy, gz = (torch.randn(37, dtype=DTYPE, device=DEVICE, requires_grad=True) for _ in range(2))
    v, w = torch.randn(37, dtype=DTYPE, device=DEVICE), torch.randn(37, dtype=DTYPE, device=DEVICE)
    (dx,) = torch.autograd.grad(_sin_and_index(x), x, (gy, gz), create_graph=True)
    d2x, d2gy, d2gz = torch.autograd.grad((dx * v).sum(), (x, gy, gz), allow_unused=True)
    x0 = x.detach()
    torch.testing.assert_close(d2x, -torch.sin(x0) * gy.detach() * v, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(d2gy, torch.cos(x0) * v, rtol=1e-12, atol=1e-12)
    assert d2gz is None or not d2gz.any()
    # hvp of a loss reading the unrelated output through a .sum(): an op call whose backward launches nothing
    got = torch.autograd.functional.hvp(lambda x: (_sin_and_index(x)[0] * w).sum() + _sin_and_index(x)[1].sum(),
                                        x0, v)[1]
    torch.testing.assert_close(got, -torch.sin(x0) * w * v, rtol=1e-12, atol=1e-12)


def _math_attention(q, k, v, causal):
    """Attention in plain PyTorch (SDPA's CPU backward has no double backward), at the example's softmax scale."""
    s = q @ k.transpose(-1, -2) * _example("flash_attention").softmax_scale(q.shape[-1])
    if causal:
        n = q.shape[-2]
        s = s.masked_fill(~torch.ones(n, n, dtype=torch.bool, device=q.device).tril(), float("-inf"))
    return torch.softmax(s, dim=-1) @ v


@pytest.mark.compiled
@pytest.mark.parametrize("size,causal,bindings", [((2, 45, 12), True, "apart"), ((1, 37, 16), False, "apart"),
                                                  ((1, 9, 5), True, "shared")])
def test_flash_attention_second_derivative_matches_reference(size, causal, bindings, poisoned_empty):
    """The derived backward splits its key loops where the causal mask holds in every lane (codegen/peel.py: a
    binary search, a `while` loop) and, with one program of queries, stores dK and dV in a loop whose range follows
    the program id: both refused when derived in turn ("cannot differentiate a `while` loop"; "cannot differentiate
    a tl.store to `d_k_ptr` whose address follows tl.program_id(0) through the range of the loop"). Recorded to be
    differentiated again, its loops are not split and those gradients are added atomically. Each kernel compiled for
    a GPU too (the compile check): the twice-derived kernel inlines tg.to_float, whose static_assert read a name
    assigned `x.dtype.is_floating()` (a tensor to compiled Triton: "could not be determined at compile-time") before
    the frontend kept a metadata's method call inline. Against a plain-PyTorch
    attention in float64: sequence lengths of partial blocks, causal and not, one program of queries; a random
    incoming gradient and random second-stage weights; unfilled buffers poisoned; ``shared``: queries and keys one
    tensor and the values a transposed view, through the bare op (made contiguous inside it)."""
    torch.manual_seed(8)
    op = _example("flash_attention").flash_attention if bindings == "apart" else _bare("flash_attention")
    heads, n, d = size
    q, k, v = (torch.randn(1, heads, n, d, dtype=DTYPE, device=DEVICE, requires_grad=True) for _ in range(3))
    if bindings == "shared":
        vt = torch.randn(1, heads, d, n, dtype=DTYPE, device=DEVICE, requires_grad=True)
        inputs, call = (q, vt), lambda f, q, vt: f(q, q, vt.transpose(-1, -2), causal)
    else:
        inputs, call = (q, k, v), lambda f, q, k, v: f(q, k, v, causal)
    g = torch.randn(1, heads, n, d, dtype=DTYPE, device=DEVICE)
    weights = tuple(torch.randn_like(x) for x in inputs)

    def second(f):
        first = torch.autograd.grad(call(f, *inputs), inputs, g, create_graph=True)
        return first, torch.autograd.grad(sum((a * w).sum() for a, w in zip(first, weights, strict=True)), inputs)

    (got, got2), (want, want2) = second(op), second(_math_attention)
    for a, b in zip((*got, *got2), (*want, *want2), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9)
