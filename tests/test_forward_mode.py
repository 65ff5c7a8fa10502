"""Forward mode through ops (ops/forward_mode.py): ``torch.func.jvp``, ``torch.autograd.forward_ad`` dual tensors and
``torch.func.jacfwd`` through the bundled examples' named ops and through bare ops, against the same transforms of a
plain-PyTorch reference; float64 in the interpreter, sizes that are not powers of two, random inputs and tangents."""

import pytest
import torch
import torch.autograd.forward_ad as fwAD
import triton
import triton.language as tl
from conftest import DEVICE

import tritongrad
from tritongrad.core.errors import OpError
from tritongrad.examples import cross_entropy, flash_attention, get, rmsnorm, sin, softmax, swiglu

DTYPE = torch.float64
TOL = {"rtol": 1e-9, "atol": 1e-9}


def _attention(q, k, v, causal=True):  # (SDPA has no forward AD on a CPU)
    s = q @ k.transpose(-1, -2) * flash_attention.softmax_scale(q.shape[-1])
    if causal:
        n = q.shape[-2]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    return torch.softmax(s, -1) @ v


def _layer_norm(x, w, b, eps=1e-5):
    """F.layer_norm written out: F.layer_norm's own second derivative under vmap, as jacrev batches its cotangents,
    is wrong in torch 2.13 on a CPU (its Hessian's d(dw)/dx block; without vmap it agrees with this one)."""
    mean = x.mean(-1, keepdim=True)
    return (x - mean) * torch.rsqrt(((x - mean) ** 2).mean(-1, keepdim=True) + eps) * w + b


REFERENCES = {"flash_attention": _attention, "layernorm": _layer_norm}


def _differentiated(name, size):
    """The example's inputs, and a function of its float tensors alone (the rest held), as the op and as the
    reference."""
    example = get(name)
    inputs = example.make_inputs(size, DEVICE, DTYPE)
    floats = [i for i, v in enumerate(inputs) if isinstance(v, torch.Tensor) and v.is_floating_point()]

    def of(fn):
        def f(*xs):
            full = list(inputs)
            for i, x in zip(floats, xs, strict=True):
                full[i] = x
            return fn(*full)
        return f

    primals = tuple(inputs[i] for i in floats)
    return primals, of(example.op), of(REFERENCES.get(name, example.reference))


EXAMPLES = [("rmsnorm", (7, 45)), ("softmax", (6, 37)), ("swiglu", (5, 61)), ("flash_attention", (2, 37, 12)),
            ("flash_attention", (1, 37, 16, 0)), ("cross_entropy", (7, 101)), ("matmul", (5, 6, 7))]  # (autotuned)


@pytest.mark.parametrize(("name", "size"), EXAMPLES)
def test_torch_func_jvp_through_a_named_example(name, size):
    primals, op, reference = _differentiated(name, size)
    tangents = tuple(torch.randn_like(p) for p in primals)
    got = torch.func.jvp(op, primals, tangents)
    torch.testing.assert_close(got, torch.func.jvp(reference, primals, tangents), **TOL)


@pytest.mark.parametrize(("name", "size"), EXAMPLES[:4])
def test_dual_tensors_through_a_named_example(name, size):
    primals, op, reference = _differentiated(name, size)
    tangents = tuple(torch.randn_like(p) for p in primals)
    with fwAD.dual_level():
        out = fwAD.unpack_dual(op(*[fwAD.make_dual(p, t) for p, t in zip(primals, tangents, strict=True)]))
        got = (out.primal, out.tangent)
    torch.testing.assert_close(got, torch.func.jvp(reference, primals, tangents), **TOL)


def _weighted_losses(op, reference, primals):
    """Scalar losses of the op and of the reference with a Hessian of every entry of every output: each output
    weighted by the same fresh random weights."""
    outputs = reference(*primals)
    weights = [torch.randn_like(o) for o in (outputs if isinstance(outputs, tuple) else (outputs,))]

    def of(fn):
        def loss(*xs):
            found = fn(*xs)
            return sum((o * w).sum() for o, w in zip(found if isinstance(found, tuple) else (found,), weights,
                                                      strict=True))
        return loss

    return of(op), of(reference)


HESSIAN = [("sin", 37), ("rmsnorm", (3, 13)), ("softmax", (3, 11)), *[pytest.param(name, size, marks=pytest.mark.slow)
           for name, size in [("softplus", 45), ("gelu", 37), ("swiglu", (3, 13)), ("geglu", (3, 13)),
                              ("log_softmax", (3, 11)), ("layernorm", (3, 13)), ("add_rmsnorm", (2, 7)), ("fn1", 16),
                              ("gather", (5, 9)), ("linear", (5, 7)), ("matmul", (5, 6, 7)),
                              ("matmul", (5, 6, 7, 1, 1)), ("matvec", (5, 7)), ("rotary", (1, 1, 3, 4)),
                              ("transpose", (5, 7)), ("cross_entropy", (3, 37)), ("flash_attention", (1, 9, 5))]]]
# (matmul's (.., 1, 1): both operands passed transposed; flash_attention's: causal, one program)


@pytest.mark.parametrize(("name", "size"), HESSIAN)
def test_hessian_through_a_named_example_matches_pytorch(name, size, poisoned_empty):
    """torch.func.hessian is jacfwd over jacrev: the op's backward, run as an op of its own (its derived kernels'
    launches), in forward mode (their tangent kernels; rmsnorm's rstd made again by its forward launch), one call
    per cotangent under jacrev's vmap. Every pair of float arguments, against the Hessian of the plain-PyTorch
    reference; unfilled buffers poisoned. Before, refused (OpError: 'not yet supported')."""
    primals, op, reference = _differentiated(name, size)
    loss, reference_loss = _weighted_losses(op, reference, primals)
    argnums = tuple(range(len(primals)))
    want = torch.func.hessian(reference_loss, argnums=argnums)(*primals)
    torch.testing.assert_close(torch.func.hessian(loss, argnums=argnums)(*primals), want, **TOL)


def test_jacfwd_through_a_named_example():
    primals, op, reference = _differentiated("rmsnorm", (3, 7))
    got = torch.func.jacfwd(op, argnums=(0, 1))(*primals)
    torch.testing.assert_close(got, torch.func.jacfwd(reference, argnums=(0, 1))(*primals), **TOL)


# -- bare ops: the examples' launches, and a buffer passed from one launch to the next ---------------------------


@tritongrad.op
def bare_rmsnorm(x, w):
    return rmsnorm.rmsnorm_launch(x, w)()


@tritongrad.op
def bare_attention(q, k, v):
    return flash_attention.flash_attention_launch(q, k, v, True)()


@tritongrad.op
def softmax_then_swiglu(x, b):
    """Two launches: the second reads the buffer the first wrote (its tangent carried through tangent memory)."""
    y = softmax.softmax_launch(x)()
    return swiglu.swiglu_launch(y, b)()


def test_jvp_and_dual_tensors_through_bare_ops():
    x, w, tx, tw = (torch.randn(5, 29, dtype=DTYPE), torch.randn(29, dtype=DTYPE), torch.randn(5, 29, dtype=DTYPE),
                    torch.randn(29, dtype=DTYPE))
    want = torch.func.jvp(rmsnorm.reference, (x, w), (tx, tw))
    torch.testing.assert_close(torch.func.jvp(bare_rmsnorm, (x, w), (tx, tw)), want, **TOL)
    with fwAD.dual_level():
        out = fwAD.unpack_dual(bare_rmsnorm(fwAD.make_dual(x, tx), w))  # w without a tangent
        got = (out.primal, out.tangent)
    torch.testing.assert_close(got, torch.func.jvp(lambda x: rmsnorm.reference(x, w), (x,), (tx,)), **TOL)
    q, k, v = (torch.randn(1, 2, 21, 16, dtype=DTYPE) for _ in range(3))
    tq, tk, tv = (torch.randn_like(q) for _ in range(3))
    torch.testing.assert_close(torch.func.jvp(bare_attention, (q, k, v), (tq, tk, tv)),
                               torch.func.jvp(_attention, (q, k, v), (tq, tk, tv)), **TOL)


@tritongrad.op
def rmsnorm_then_sin(x, w):
    """Two launches: sin's backward reads the buffer rmsnorm wrote (made again from x and w, which the op keeps)."""
    return sin.sin_launch(rmsnorm.rmsnorm_launch(x, w)())()


@tritongrad.op
def bare_swiglu(a, b):
    return swiglu.swiglu_launch(a, b)()


@pytest.mark.slow  # (the default run's Hessians: test_hessian_through_a_named_example_matches_pytorch)
def test_second_derivatives_in_forward_over_reverse_through_bare_ops(poisoned_empty):
    """torch.func.hessian, jacfwd of one argument's jacrev, forward over reverse by hand (a jvp of a grad) and dual
    tensors differentiated in reverse mode: each runs the op's backward in forward mode (before: refused, OpError).
    One launch, and two (a buffer passed from one to the next, made again for the backward), against the
    reference."""
    x, w, tx, tw = (torch.randn(3, 11, dtype=DTYPE), torch.randn(11, dtype=DTYPE), torch.randn(3, 11, dtype=DTYPE),
                    torch.randn(11, dtype=DTYPE))
    for op, reference in ((bare_rmsnorm, rmsnorm.reference),
                          (rmsnorm_then_sin, lambda x, w: torch.sin(rmsnorm.reference(x, w)))):
        loss, reference_loss = _weighted_losses(op, reference, (x, w))
        for transform in (lambda f: torch.func.hessian(f, argnums=(0, 1)),
                          lambda f: torch.func.jacfwd(torch.func.jacrev(f, argnums=1), argnums=0),
                          lambda f: lambda x, w: torch.func.jvp(torch.func.grad(f, argnums=(0, 1)), (x, w), (tx, tw))):
            torch.testing.assert_close(transform(loss)(x, w), transform(reference_loss)(x, w), **TOL)
        want = torch.func.jvp(torch.func.grad(reference_loss), (x, w), (tx, torch.zeros_like(w)))
        leaf = x.clone().requires_grad_()
        with fwAD.dual_level():
            grad, = torch.autograd.grad(loss(fwAD.make_dual(leaf, tx), w), leaf)
            got = fwAD.unpack_dual(grad)
        torch.testing.assert_close((got.primal, got.tangent), want, **TOL)


@pytest.mark.slow  # (the default run's Hessians: test_hessian_through_a_named_example_matches_pytorch)
def test_second_derivatives_in_forward_mode_refuse_what_they_do_not_follow_naming_reverse_over_reverse():
    """Refused, naming what and the way that takes it: one tensor passed twice (the backward adds the gradients of
    inputs sharing memory with PyTorch operations, which forward mode does not follow), and a backward reading a
    buffer the op cannot make again (softmax's output, computed from x, which it does not keep). Reverse over
    reverse gives the first's Hessian."""
    x, b, weights = (torch.randn(4, 23, dtype=DTYPE) for _ in range(3))
    with pytest.raises(OpError, match=r"`bare_swiglu`: its backward runs in forward mode \(torch\.func\.hessian: "
                                      r"jacfwd over jacrev\).*an output is a tensor no launch wrote.*try reverse over "
                                      r"reverse \(torch\.autograd\.functional\.hessian or hvp\)"):
        torch.func.hessian(lambda x: (bare_swiglu(x, x) * weights).sum())(x)
    with pytest.raises(OpError, match=r"`softmax_then_swiglu`: its backward runs in forward mode.*computed from "
                                      r"`x_ptr`, a tensor the op does not keep"):
        torch.func.hessian(lambda x, b: (softmax_then_swiglu(x, b) * weights).sum())(x, b)
    got = torch.autograd.functional.hessian(lambda x: (bare_swiglu(x, x) * weights).sum(), x)
    torch.testing.assert_close(got, torch.func.hessian(lambda x: (swiglu.reference(x, x) * weights).sum())(x), **TOL)


def test_forward_over_forward_is_refused_naming_the_orders_that_work():
    """A tangent differentiated in forward mode again (jacfwd of jacfwd, of a Hessian) is tritongrad's refusal naming
    the second-order compositions it takes (it was PyTorch's "You must implement the jvp function"), and reverse over
    forward, one of them, gives PyTorch's answer."""
    x = torch.randn(11, dtype=DTYPE)
    with pytest.raises(OpError, match=r"`tritongrad_examples::sin` in forward mode: a derivative in forward mode of "
                                      r"its tangents \(jacfwd of jacfwd, or of a Hessian\) is not yet supported.*"
                                      r"torch\.func\.hessian.*jacrev of jacfwd"):
        torch.func.jacfwd(torch.func.jacfwd(sin.sin))(x)
    torch.testing.assert_close(torch.func.jacrev(torch.func.jacfwd(sin.sin))(x),
                               torch.func.jacrev(torch.func.jacfwd(sin.reference))(x), **TOL)


def test_one_jvp_runs_the_tangents_below_its_level_and_reverse_over_it_still_reaches_the_inputs(monkeypatch):
    """Under one torch.func.jvp the tangents run below its level without a second pass through torch.func's
    custom-function machinery (forward_mode._tangents_at_one_level, for host time); the tangents are PyTorch's, and
    autograd around the transform still differentiates them (reverse over forward)."""
    from tritongrad.ops import forward_mode

    calls = []
    real = forward_mode.custom_function_call
    monkeypatch.setattr(forward_mode, "custom_function_call", lambda f, *a: calls.append(f.__name__) or real(f, *a))
    x, w = torch.randn(5, 37, dtype=DTYPE, requires_grad=True), torch.randn(37, dtype=DTYPE, requires_grad=True)
    tx, tw = torch.randn_like(x), torch.randn_like(w)
    y, ty = torch.func.jvp(rmsnorm.rmsnorm, (x, w), (tx, tw))
    assert calls == ["_ForwardMode"]
    want = torch.func.jvp(rmsnorm.reference, (x, w), (tx, tw))
    torch.testing.assert_close((y, ty), want, **TOL)
    g = torch.randn_like(ty)
    torch.testing.assert_close(torch.autograd.grad(ty, (x, w), g), torch.autograd.grad(want[1], (x, w), g), **TOL)


def test_linearize_is_refused_naming_what_to_call_instead():
    """torch.func.linearize traces the jvp with make_fx: tensors without memory, which the op's kernels cannot be
    launched on. Refused naming it and the ways that work (Triton's launch failed, naming none of this)."""
    x = torch.randn(7, dtype=DTYPE)
    with pytest.raises(OpError, match=r"`tritongrad_examples::sin`: torch\.func\.linearize .* Call torch\.func\.jvp "
                                      r"for each tangent instead, or compile the function"):
        torch.func.linearize(sin.sin, x)
    bare = tritongrad.op(sin.sin.__wrapped__)
    with pytest.raises(OpError, match=r"torch\.func\.linearize"):
        torch.func.linearize(bare, x)


def test_a_buffer_carries_the_tangent_from_one_launch_to_the_next():
    x, b = torch.randn(4, 33, dtype=DTYPE), torch.randn(4, 33, dtype=DTYPE)
    tx, tb = torch.randn_like(x), torch.randn_like(b)

    def reference(x, b):
        return swiglu.reference(torch.softmax(x, -1), b)

    torch.testing.assert_close(torch.func.jvp(softmax_then_swiglu, (x, b), (tx, tb)),
                               torch.func.jvp(reference, (x, b), (tx, tb)), **TOL)
    torch.testing.assert_close(torch.func.jacfwd(softmax_then_swiglu)(x[:2, :5].contiguous(), b[:2, :5].contiguous()),
                               torch.func.jacfwd(reference)(x[:2, :5], b[:2, :5]), **TOL)


def test_views_of_one_storage_and_the_same_tensor_twice():
    base, w = torch.randn(6, 29, dtype=DTYPE), torch.randn(29, dtype=DTYPE)
    t_base, t_w = torch.randn_like(base), torch.randn_like(w)
    got = torch.func.jvp(lambda base, w: bare_rmsnorm(base[1:5], w), (base, w), (t_base, t_w))
    want = torch.func.jvp(lambda base, w: rmsnorm.reference(base[1:5], w), (base, w), (t_base, t_w))
    torch.testing.assert_close(got, want, **TOL)
    a, ta = torch.randn(3, 20, dtype=DTYPE), torch.randn(3, 20, dtype=DTYPE)
    got = torch.func.jvp(lambda a: swiglu.swiglu(a, a), (a,), (ta,))  # one tensor, one tangent: its elements'
    torch.testing.assert_close(got, torch.func.jvp(lambda a: swiglu.reference(a, a), (a,), (ta,)), **TOL)
    with pytest.raises(OpError, match="shares memory with itself .* or another argument, and the tangents"):
        torch.func.jvp(swiglu.swiglu, (a, a), (ta, torch.randn_like(a)))  # two tangents for one memory


# -- reverse mode through the tangents ---------------------------------------------------------------------------


@tritongrad.op
def bare_softmax(x):
    return softmax.softmax_launch(x)()


THROUGH_TANGENTS = [(rmsnorm.rmsnorm, rmsnorm.reference), (bare_rmsnorm, rmsnorm.reference),
                    (softmax.softmax, softmax.reference), (bare_softmax, softmax.reference)]
THROUGH_IDS = ["rmsnorm", "bare_rmsnorm", "softmax", "bare_softmax"]


def _inputs(reference, rows, cols):
    """Fresh inputs of rmsnorm (x, w) or softmax (x)."""
    x = torch.randn(rows, cols, dtype=DTYPE)
    return (x, torch.randn(cols, dtype=DTYPE)) if reference is rmsnorm.reference else (x,)


def _through_tangents(op, inputs, tangents, weights, way):
    """The gradients w.r.t. the inputs and the tangents (as leaves: ``wrt``) of <weights, J(x) tx> + sum(J(x) tx) +
    <weights, f(x)>, the tangent J(x) tx taken by ``way``: torch.func.jvp, or dual tensors."""
    leaves = [t.clone().requires_grad_() for t in (*inputs, *tangents)]
    primals, directions = leaves[:len(inputs)], leaves[len(inputs):]
    if way == "jvp":
        out, tangent = torch.func.jvp(op, tuple(primals), tuple(directions))
        found = torch.autograd.grad((tangent * weights).sum() + tangent.sum() + (out * weights).sum(), leaves)
    else:
        with fwAD.dual_level():
            dual = fwAD.unpack_dual(op(*[fwAD.make_dual(p, t) for p, t in zip(primals, directions, strict=True)]))
            out, tangent = dual.primal, dual.tangent
            found = torch.autograd.grad((tangent * weights).sum() + tangent.sum() + (out * weights).sum(), leaves)
    return found


@pytest.mark.parametrize("way", ["jvp", "dual"])
@pytest.mark.parametrize(("op", "reference"), THROUGH_TANGENTS, ids=THROUGH_IDS)
def test_reverse_mode_through_a_tangent_matches_pytorch(op, reference, way, poisoned_empty):
    """Reverse mode through the tangent J(x) tx of a call in forward mode, w.r.t. x (a second derivative: the op's
    backward in forward mode along tx) and w.r.t. tx (J^T: its backward), named and bare, against torch.func.jvp of
    the reference (PyTorch's dual tensors differentiated in reverse mode refuse its softmax). Before, the tangent
    carried no autograd link to x: the gradient w.r.t. x silently dropped the op's part; w.r.t. tx it raised
    NotImplementedError (a Function without backward)."""
    inputs = _inputs(reference, 5, 37)
    tangents = tuple(torch.randn_like(x) for x in inputs)
    weights = torch.randn(5, 37, dtype=DTYPE)
    want = _through_tangents(reference, inputs, tangents, weights, "jvp")
    torch.testing.assert_close(_through_tangents(op, inputs, tangents, weights, way), want, **TOL)


@pytest.mark.parametrize(("op", "reference"), THROUGH_TANGENTS[:2], ids=THROUGH_IDS[:2])
def test_reverse_mode_through_a_tangent_of_the_inputs_alone(op, reference):
    """The issue's repro: only x requires grad (the tangent a constant), torch.func.jvp and dual tensors; before, the
    gradient was the sum's ones alone."""
    x, w, tx, weights = (torch.randn(5, 37, dtype=DTYPE), torch.randn(37, dtype=DTYPE),
                         torch.randn(5, 37, dtype=DTYPE), torch.randn(5, 37, dtype=DTYPE))

    def gradient(f, dual=False):
        leaf = x.clone().requires_grad_()
        if not dual:
            tangent = torch.func.jvp(lambda x: f(x, w), (leaf,), (tx,))[1]
            return torch.autograd.grad((tangent * weights).sum() + leaf.sum(), leaf)[0]
        with fwAD.dual_level():
            tangent = fwAD.unpack_dual(f(fwAD.make_dual(leaf, tx), w)).tangent
            return torch.autograd.grad((tangent * weights).sum() + leaf.sum(), leaf)[0]

    want = gradient(reference)
    torch.testing.assert_close(gradient(op), want, **TOL)
    torch.testing.assert_close(gradient(op, dual=True), want, **TOL)


@pytest.mark.parametrize(("op", "reference"), [pytest.param(*THROUGH_TANGENTS[0], marks=pytest.mark.slow),
                                              THROUGH_TANGENTS[3]], ids=[THROUGH_IDS[0], THROUGH_IDS[3]])
def test_jacrev_and_grad_of_a_jvp_match_pytorch(op, reference):
    """torch.func's reverse transforms over torch.func.jvp: jacrev w.r.t. the inputs and the tangents (its
    cotangents batched by vmap: the op's backward in forward mode one call per slice) and grad, against the
    reference's. Before: jacrev w.r.t. the tangent raised NotImplementedError, w.r.t. the input it was silently
    zero."""
    inputs = _inputs(reference, 3, 11)
    tangents = tuple(torch.randn_like(x) for x in inputs)
    weights = torch.randn(3, 11, dtype=DTYPE)
    count, argnums = len(inputs), tuple(range(2 * len(inputs)))

    def tangent_of(f):
        return lambda *xt: torch.func.jvp(f, xt[:count], xt[count:])[1]

    for transform in (lambda f: torch.func.jacrev(tangent_of(f), argnums=argnums),
                      lambda f: torch.func.grad(lambda *xt: (tangent_of(f)(*xt) * weights).sum(), argnums=argnums)):
        torch.testing.assert_close(transform(op)(*inputs, *tangents), transform(reference)(*inputs, *tangents), **TOL)


def test_reverse_mode_through_a_tangent_of_one_tensor_passed_twice():
    """swiglu(a, a): w.r.t. the tangent (the op's backward) against the reference; w.r.t. a, whose backward in
    forward mode adds the two gradients with PyTorch operations it does not follow, refused naming it (before:
    NotImplementedError, and a gradient w.r.t. a alone silently dropped the op's part)."""
    a, ta, weights = (torch.randn(3, 20, dtype=DTYPE) for _ in range(3))

    def gradient(f, wrt_a):
        leaf, t = a.clone().requires_grad_(wrt_a), ta.clone().requires_grad_(not wrt_a)
        tangent = torch.func.jvp(lambda a: f(a, a), (leaf,), (t,))[1]
        return torch.autograd.grad((tangent * weights).sum(), leaf if wrt_a else t)[0]

    torch.testing.assert_close(gradient(swiglu.swiglu, False), gradient(swiglu.reference, False), **TOL)
    with pytest.raises(OpError, match=r"swiglu` in forward mode: reverse mode through its tangents w.r.t. its "
                                      r"inputs .*an output is a tensor no launch wrote"):
        gradient(swiglu.swiglu, True)


def test_a_derivative_of_a_gradient_through_a_tangent():
    """A third differentiation through forward mode: jacrev w.r.t. x of the gradient w.r.t. the tangent (d/dx of
    J(x)^T c, the op's backward called in forward mode, made again in reverse mode for a launch record of its own:
    autograd_function.backward_as_op's ``again``), and autograd's create_graph alike, against the reference. Before:
    NotImplementedError; then silently zero; then refused (OpError)."""
    x, tx, weights = (torch.randn(3, 11, dtype=DTYPE) for _ in range(3))

    def gradient_wrt_tangent(op):
        return lambda x: torch.func.grad(lambda t: (torch.func.jvp(op, (x,), (t,))[1] * weights).sum())(tx)

    torch.testing.assert_close(torch.func.jacrev(gradient_wrt_tangent(softmax.softmax))(x),
                               torch.func.jacrev(gradient_wrt_tangent(softmax.reference))(x), **TOL)
    found = []
    for op in (softmax.softmax, softmax.reference):
        leaf, t0 = x.clone().requires_grad_(), tx.clone().requires_grad_()
        tangent = torch.func.jvp(op, (leaf,), (t0,))[1]
        gradient, = torch.autograd.grad((tangent * weights).sum(), t0, create_graph=True)
        found.append(torch.autograd.grad((gradient * weights.flip(0)).sum(), leaf))
    torch.testing.assert_close(*found, **TOL)


def test_vmap_of_a_jvp_over_batched_inputs():
    """vmap over torch.func.jvp with the inputs batched: one call per slice, each with its own tangents (before, the
    tangents ran on the batch's call, which had not run: ValueError)."""
    x, w = torch.randn(3, 4, 19, dtype=DTYPE), torch.randn(19, dtype=DTYPE)
    tx = torch.randn_like(x)

    def batched(f):
        return torch.func.vmap(lambda x, t: torch.func.jvp(lambda x: f(x, w), (x,), (t,)))(x, tx)

    torch.testing.assert_close(batched(rmsnorm.rmsnorm), batched(rmsnorm.reference), **TOL)


# -- refusals ---------------------------------------------------------------------------------------------------


@triton.jit
def scale_in_place_kernel(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n)
    tl.store(x_ptr + offs, x * 2.0, mask=offs < n)


@tritongrad.op
def doubled_in_place(x):
    y = x.clone()
    scale_in_place_kernel[(1,)](y, y.numel(), BLOCK=64)
    return y


@tritongrad.op
def softmax_of_twice(x):
    return softmax.softmax_launch(x * 2.0)()


def test_what_forward_mode_does_not_follow_is_refused_naming_it():
    x, t = torch.randn(3, 20, dtype=DTYPE), torch.randn(3, 20, dtype=DTYPE)
    with pytest.raises(OpError, match=r"softmax_of_twice` in forward mode: launch 0 \(`softmax_kernel`\) reads "
                                      r"`x_ptr`, a tensor neither an argument"):
        torch.func.jvp(softmax_of_twice, (x,), (t,))
    with pytest.raises(OpError, match=r"updates `x_ptr` in place"):
        torch.func.jvp(doubled_in_place, (x,), (t,))


def test_cross_entropy_with_ignored_rows_and_a_target_without_tangent():
    logits, target, ignore = cross_entropy.make_inputs((6, 40), DEVICE, DTYPE)
    t = torch.randn_like(logits)
    with fwAD.dual_level():
        out = fwAD.unpack_dual(cross_entropy.cross_entropy(fwAD.make_dual(logits, t), target, ignore)).tangent
    want = torch.func.jvp(lambda z: cross_entropy.reference(z, target, ignore), (logits,), (t,))[1]
    torch.testing.assert_close(out, want, **TOL)


@triton.jit
def column_sums_kernel(x_ptr, total_ptr, n, BLOCK: tl.constexpr):
    cols = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + tl.program_id(0) * n + cols, mask=cols < n, other=0.0)
    tl.atomic_add(total_ptr + cols, tl.exp(x), mask=cols < n)


@tritongrad.op
def column_sums(x):
    total = torch.zeros(x.shape[1], dtype=x.dtype, device=x.device)
    column_sums_kernel[(x.shape[0],)](x, total, x.shape[1], BLOCK=32)
    return total


def test_an_atomic_add_adds_the_tangent_and_the_forward_once():
    x, t = torch.randn(6, 29, dtype=DTYPE), torch.randn(6, 29, dtype=DTYPE)
    torch.testing.assert_close(torch.func.jvp(column_sums, (x,), (t,)),
                               torch.func.jvp(lambda x: torch.exp(x).sum(0), (x,), (t,)), **TOL)


def test_a_repeated_call_finds_its_tangent_kernels_once(monkeypatch):
    """torch.func.jvp and dual tensors called again (a training loop's steps): each launch's tangent kernel is found
    once per kernel and specialization (causal and full attention: another value of a constexpr that decides an
    `if`) and launched directly. Before, every launch of every call looked its kernel up again, and again for its
    specialization, then bound its arguments (with Function.apply's signature binding, ~0.5 ms of host time per
    call). Fresh values on each call, against the reference."""
    from tritongrad.ops import forward_mode

    looked_up = []
    find = forward_mode.tangent_kernel
    monkeypatch.setattr(forward_mode, "tangent_kernel", lambda kernel, *a: looked_up.append(kernel) or find(kernel, *a))
    for call, causal in enumerate([True, False, True, False, True]):
        torch.manual_seed(call)
        primals = tuple(torch.randn(1, 2, 19, 16, dtype=DTYPE) for _ in range(3))
        tangents = tuple(torch.randn_like(p) for p in primals)
        del looked_up[:]

        def op(q, k, v, causal=causal):
            return flash_attention.flash_attention(q, k, v, causal)

        def reference(q, k, v, causal=causal):
            return _attention(q, k, v, causal)

        want = torch.func.jvp(reference, primals, tangents)
        torch.testing.assert_close(torch.func.jvp(op, primals, tangents), want, **TOL)
        with fwAD.dual_level():
            out = fwAD.unpack_dual(op(*[fwAD.make_dual(p, t) for p, t in zip(primals, tangents, strict=True)]))
        torch.testing.assert_close((out.primal, out.tangent), want, **TOL)
        if call >= 2:  # (both specializations seen)
            assert looked_up == [], f"call {call} looked up {looked_up}"


def test_tangents_batched_by_autograds_own_vmap_are_refused_naming_jacfwd():
    """jacobian(vectorize=True, strategy="forward-mode") batches the tangents with autograd's own vmap: tensors
    without memory for the tangent kernels. Refused naming torch.func.jacfwd, which gives PyTorch's Jacobian (it
    failed with PyTorch's "vmap: aten::copy_ ... is not possible")."""
    x = torch.randn(9, dtype=DTYPE)
    for op in (sin.sin, tritongrad.op(sin.sin.__wrapped__)):
        with pytest.raises(OpError, match=r"its tangents were batched by vmap .*Use torch\.func\.jacfwd"):
            torch.autograd.functional.jacobian(op, x, vectorize=True, strategy="forward-mode")
        torch.testing.assert_close(torch.func.jacfwd(op)(x), torch.func.jacfwd(sin.reference)(x), **TOL)
