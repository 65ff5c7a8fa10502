"""torch.func's reverse-mode transforms through ops (no forward mode involved): ``grad``, ``grad_and_value``,
``vjp``, ``jacrev``, ``vmap(grad(...))`` (per-sample gradients) and ``jacrev`` over ``jacrev``, through bare and named
ops, against the same transforms of a plain-PyTorch reference: float64 in the interpreter, sizes that are not powers
of two, fresh random inputs, outputs poisoned. Each call goes through ops/forward_mode.py's ``_ForwardMode`` (its
backward remakes the call in reverse mode and runs its launch record's backward as an op). Before: a named op raised
PyTorch's "must override the setup_context staticmethod", a bare op refused every such transform."""

import pytest
import torch
import triton
from conftest import DEVICE
from test_op_edges import sin_mul_kernel

import tritongrad
from tritongrad.core.errors import OpError
from tritongrad.examples import rmsnorm, sin, softmax, swiglu
from tritongrad.runtime.guards import StrayWriteError

DTYPE = torch.float64
TOL = {"rtol": 1e-9, "atol": 1e-9}


def _rmsnorm_then_sin(x, w):
    """Two launches: sin's backward reads the buffer rmsnorm wrote."""
    return sin.sin_launch(rmsnorm.rmsnorm_launch(x, w)())()


def _rmsnorm_then_sin_reference(x, w):
    return torch.sin(rmsnorm.reference(x, w))


named_rmsnorm_then_sin = tritongrad.op("tgfunc::rmsnorm_then_sin")(_rmsnorm_then_sin)

# name -> (named op, its host function, reference, the shapes of its float arguments)
OPS = {"rmsnorm": (rmsnorm.rmsnorm, rmsnorm.reference, ((7, 45), (45,))),
       "softmax": (softmax.softmax, softmax.reference, ((6, 37),)),
       "swiglu": (swiglu.swiglu, swiglu.reference, ((5, 61), (5, 61))),
       "rmsnorm_then_sin": (named_rmsnorm_then_sin, _rmsnorm_then_sin_reference, ((5, 29), (29,)))}
BARE = {name: tritongrad.op(op.__wrapped__) for name, (op, _, _) in OPS.items()}


def _case(name, kind, shapes=None):
    named, reference, default = OPS[name]
    op = BARE[name] if kind == "bare" else named
    primals = tuple(torch.randn(s, dtype=DTYPE, device=DEVICE) for s in shapes or default)
    weights = torch.randn_like(reference(*primals))

    def loss(fn):
        return lambda *xs: (fn(*xs) * weights).sum()

    return op, reference, primals, loss


# each op bare in the default run and named in the slow one, or the other way round (the two forms take one path)
CASES = pytest.mark.parametrize(("name", "kind"), [
    pytest.param(n, k, marks=() if (i + (k == "named")) % 2 == 0 else pytest.mark.slow)
    for i, n in enumerate(OPS) for k in ("bare", "named")])


@CASES
def test_grad_and_grad_and_value(name, kind, poisoned_empty):
    op, reference, primals, loss = _case(name, kind)
    argnums = tuple(range(len(primals)))
    got = torch.func.grad(loss(op), argnums=argnums)(*primals)
    torch.testing.assert_close(got, torch.func.grad(loss(reference), argnums=argnums)(*primals), **TOL)
    got = torch.func.grad_and_value(loss(op))(*primals)
    torch.testing.assert_close(got, torch.func.grad_and_value(loss(reference))(*primals), **TOL)


@pytest.mark.skipif(DEVICE != "cpu", reason="counts the interpreter's kernel runs")
@pytest.mark.parametrize("kind", ["bare", "named"])
def test_grad_launches_the_forward_once(kind, monkeypatch):
    """Under torch.func.grad the op's forward is its call in reverse mode, whose launch record the backward takes:
    the forward kernel runs once (not again for the backward's record, nor to make its buffers again), and at first
    order its backward runs as an eager backward does (not as an op, rehearsed first)."""
    from triton.runtime.interpreter import GridExecutor

    names, run = [], GridExecutor.__call__
    monkeypatch.setattr(GridExecutor, "__call__", lambda self, *a, **k: (names.append(self.fn.__name__),
                                                                         run(self, *a, **k))[1])
    op, reference, primals, loss = _case("rmsnorm", kind)
    got = torch.func.grad(loss(op), argnums=(0, 1))(*primals)
    torch.testing.assert_close(got, torch.func.grad(loss(reference), argnums=(0, 1))(*primals), **TOL)
    assert names == ["rmsnorm_fwd", "rmsnorm_fwd_bwd"]


@CASES
def test_vjp(name, kind, poisoned_empty):
    op, reference, primals, _ = _case(name, kind)
    out, vjp_fn = torch.func.vjp(op, *primals)
    want_out, want_fn = torch.func.vjp(reference, *primals)
    cotangent = torch.randn_like(want_out)
    torch.testing.assert_close(out, want_out, **TOL)
    torch.testing.assert_close(vjp_fn(cotangent), want_fn(cotangent), **TOL)
    torch.testing.assert_close(vjp_fn(cotangent.t().contiguous().t()), want_fn(cotangent), **TOL)  # (transposed)


@CASES
def test_jacrev(name, kind):
    shapes = tuple((3, 7) if len(s) == 2 else (7,) for s in OPS[name][2])
    op, reference, primals, _ = _case(name, kind, shapes)
    argnums = tuple(range(len(primals)))
    got = torch.func.jacrev(op, argnums=argnums)(*primals)
    torch.testing.assert_close(got, torch.func.jacrev(reference, argnums=argnums)(*primals), **TOL)


@CASES
def test_per_sample_gradients_vmap_of_grad(name, kind):
    """vmap runs the call once per slice (``_ForwardMode.vmap``), so its backward runs per slice too
    (ops/sliced_backward.py): the first argument batched, the others shared, then every argument batched."""
    op, reference, primals, loss = _case(name, kind)
    batch = 3
    argnums = tuple(range(len(primals)))
    batched = torch.randn(batch, *primals[0].shape, dtype=DTYPE, device=DEVICE)
    for in_dims, args in (((0, *[None] * (len(primals) - 1)), (batched, *primals[1:])),
                          ((0,) * len(primals), (batched, *[torch.randn(batch, *p.shape, dtype=DTYPE, device=DEVICE)
                                                            for p in primals[1:]]))):
        got = torch.func.vmap(torch.func.grad(loss(op), argnums=argnums), in_dims=in_dims)(*args)
        want = torch.func.vmap(torch.func.grad(loss(reference), argnums=argnums), in_dims=in_dims)(*args)
        torch.testing.assert_close(got, want, **TOL)


@pytest.mark.slow  # (reverse over reverse in the default run: tests/test_double_backward.py)
@pytest.mark.parametrize("kind", ["bare", "named"])
def test_reverse_over_reverse(kind):
    """jacrev over jacrev and grad over grad: the backward's call made again in reverse mode for its own launch
    record (autograd_function.backward_as_op's ``again``); before, refused as a third differentiation."""
    for name in ("rmsnorm", "rmsnorm_then_sin"):
        op, reference, primals, loss = _case(name, kind, ((3, 5), (5,)))
        got = torch.func.jacrev(torch.func.jacrev(loss(op)))(*primals)
        torch.testing.assert_close(got, torch.func.jacrev(torch.func.jacrev(loss(reference)))(*primals), **TOL)

        def grad_of_grad(fn, loss=loss):
            return torch.func.grad(lambda *xs: torch.func.grad(loss(fn), argnums=(0, 1))(*xs)[1].sin().sum(),
                                   argnums=(0, 1))

        torch.testing.assert_close(grad_of_grad(op)(*primals), grad_of_grad(reference)(*primals), **TOL)


@pytest.mark.parametrize("kind", ["bare", "named"])
def test_bindings_users_pass(kind):
    """The same tensor twice, overlapping views of one storage, under torch.func.grad. (A transposed input: the
    examples' host functions copy it contiguous, which torch.func refuses for a bare op and autograd for a named one;
    see the last test.)"""
    sw = BARE["swiglu"] if kind == "bare" else swiglu.swiglu
    a, weights = torch.randn(5, 29, dtype=DTYPE, device=DEVICE), torch.randn(5, 29, dtype=DTYPE, device=DEVICE)
    cases = [(lambda a: (sw(a, a) * weights).sum(), lambda a: (swiglu.reference(a, a) * weights).sum(), (a,)),
             (lambda base: (sw(base[:5], base[3:8]) * weights).sum(),  # (overlapping views)
              lambda base: (swiglu.reference(base[:5], base[3:8]) * weights).sum(), (torch.randn_like(a[:1]).repeat(
                  8, 1).normal_(),))]
    for op, reference, primals in cases:
        torch.testing.assert_close(torch.func.grad(op)(*primals), torch.func.grad(reference)(*primals), **TOL)


def test_a_bare_op_under_plain_vmap_and_autograd_through_it():
    """A bare op under vmap alone runs per slice (before: refused); autograd through the batch reaches each slice's
    call. A named op under vmap alone keeps the dispatcher's per-slice fallback."""
    x = torch.randn(3, 7, 45, dtype=DTYPE, device=DEVICE, requires_grad=True)
    w = torch.randn(45, dtype=DTYPE, device=DEVICE)
    for op in (BARE["rmsnorm"], rmsnorm.rmsnorm):
        y = torch.func.vmap(op, in_dims=(0, None))(x, w)
        torch.testing.assert_close(y, rmsnorm.reference(x, w), **TOL)
        g = torch.randn_like(y)
        torch.testing.assert_close(torch.autograd.grad(y, x, g), torch.autograd.grad(rmsnorm.reference(x, w), x, g),
                                   **TOL)


def test_what_stays_unsupported_is_refused_by_tritongrad():
    """Through torch.ops (torch.library's formula has no setup_context: PyTorch's error before), a derivative of
    per-sample gradients, a bare op under functionalize, a launch reading a copy the host function made."""
    from tritongrad.ops.library import DISPATCHER_REFUSES_FORWARD_MODE

    x, w = torch.randn(5, 29, dtype=DTYPE, device=DEVICE), torch.randn(29, dtype=DTYPE, device=DEVICE)
    if "tritongrad_examples::rmsnorm" in DISPATCHER_REFUSES_FORWARD_MODE:
        with pytest.raises(OpError, match=r"`tritongrad_examples::rmsnorm`: called through torch.ops under "
                                          r"torch.func.grad, vjp or jacrev"):
            torch.func.grad(lambda x: torch.ops.tritongrad_examples.rmsnorm(x, w).sum())(x)
    with pytest.raises(OpError, match=r"`rmsnorm`.*a derivative of gradients per slice of a batch"):
        torch.func.vmap(torch.func.jacrev(torch.func.grad(lambda x: BARE["rmsnorm"](x, w).pow(2).sum())))(
            x[:, None].contiguous())
    with pytest.raises(OpError, match=r"torch.func transforms other than .*\(functionalize\) are not supported by a "
                                      r"bare op"):
        torch.func.functionalize(lambda x: BARE["rmsnorm"](x, w))(x)
    with pytest.raises(OpError, match=r"`rmsnorm` under torch.func.grad \(or vjp, jacrev\): its backward takes "
                                      r"gradients of the call's own tensor arguments only, and a launch reads a tensor "
                                      r"made from one by PyTorch operations \(such as x.contiguous\(\) of a "
                                      r"transposed x\)"):  # (a second derivative: grad of grad)
        torch.func.grad(lambda y: torch.func.grad(lambda x: BARE["rmsnorm"](x.t(), w).pow(2).sum())(y).sum())(
            x.t().contiguous())


def test_a_bare_op_copying_its_input_takes_first_order_grad():
    """At first order torch.func.grad differentiates the call as eager autograd does, so a bare op whose host
    function copies its input (`.contiguous()` of a transposed one: a PyTorch operation before the launch) gets
    PyTorch's gradient (a Hessian of it stays refused: test_what_stays_unsupported_is_refused_by_tritongrad)."""
    x, w = torch.randn(29, 5, dtype=DTYPE, device=DEVICE), torch.randn(29, dtype=DTYPE, device=DEVICE)
    weights = torch.randn(5, 29, dtype=DTYPE, device=DEVICE)
    got = torch.func.grad(lambda x, w: (BARE["rmsnorm"](x.t(), w) * weights).sum(), argnums=(0, 1))(x, w)
    want = torch.func.grad(lambda x, w: (rmsnorm.reference(x.t(), w) * weights).sum(), argnums=(0, 1))(x, w)
    torch.testing.assert_close(got, want, **TOL)


@tritongrad.op
def _one_past_the_end(x, w):
    """Reads one element past ``x`` (a host function's wrong count)."""
    y = torch.empty_like(w)
    sin_mul_kernel[(triton.cdiv(w.numel(), 64),)](x, w, y, w.numel(), BLOCK=64)
    return y


def test_a_launch_reading_outside_a_tensor_is_refused_under_grad():
    """The backward under torch.func runs as an op, recorded, which lays no guard bands: its schedule's first backward
    is rehearsed on plain tensors first (autograd_function.rehearse). Without it the gradient read outside ``x``
    went unchecked (in eager double backward too), as autograd's first backward refuses it."""
    base, w = torch.randn(37, dtype=DTYPE, device=DEVICE), torch.randn(37, dtype=DTYPE, device=DEVICE)
    with pytest.raises(StrayWriteError, match=r"reads memory outside the elements of the tensor passed to `x_ptr`"):
        torch.func.grad(lambda base: _one_past_the_end(base[:36], w).sum())(base)
    leaf = base.clone().requires_grad_()
    with pytest.raises(StrayWriteError, match=r"reads memory outside the elements of the tensor passed to `x_ptr`"):
        torch.autograd.grad(_one_past_the_end(leaf[:36], w).pow(2).sum(), leaf, create_graph=True)


@pytest.mark.parametrize("kind", ["named", "bare"])
def test_gradients_batched_by_autograds_own_vmap_are_refused_naming_what_works(kind):
    """torch.autograd.grad(..., is_grads_batched=True) (jacobian(vectorize=True)) hands the backward batched tensors
    without memory: refused naming the ways that work (it failed inside the backward, 'Cannot access storage of
    BatchedTensorImpl'); the unbatched jacobian and torch.func.jacrev give PyTorch's."""
    op = sin.sin if kind == "named" else tritongrad.op(sin.sin.__wrapped__)
    x = torch.randn(9, dtype=DTYPE)
    with pytest.raises(OpError, match=r"its backward was given gradients batched by vmap .*is_grads_batched=True.* "
                                      r"Use torch\.func\.jacrev"):
        torch.autograd.functional.jacobian(op, x, vectorize=True)
    leaf = x.clone().requires_grad_()
    with pytest.raises(OpError, match="batched by vmap"):
        torch.autograd.grad(op(leaf), leaf, torch.eye(9, dtype=DTYPE), is_grads_batched=True)
    want = torch.autograd.functional.jacobian(sin.reference, x)
    torch.testing.assert_close(torch.autograd.functional.jacobian(op, x), want, **TOL)
    torch.testing.assert_close(torch.func.jacrev(op)(x), want, **TOL)
