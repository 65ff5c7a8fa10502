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
             "log_softmax": (3, 11)}
# hvp differentiates the double backward once more (its cotangent's gradient)
THRICE = ("sin", "softplus", "swiglu", "softmax")


def _example(name):
    return importlib.import_module(f"tritongrad.examples.{name}")


def _bare(name):
    """The example's host function as a bare op (its named op is the example's own)."""
    launch = getattr(_example(name), f"{name}_launch")

    def host(*args):
        return launch(*[a.contiguous() for a in args])()

    host.__qualname__ = f"bare_{name}"
    return tritongrad.op(host)


def _inputs(name, size):
    return tuple(t.requires_grad_() for t in _example(name).make_inputs(size, DEVICE, DTYPE))


@pytest.mark.parametrize("kind", ["named", "bare"])
@pytest.mark.parametrize("name", sorted(SUPPORTED))
def test_gradgradcheck(name, kind):
    torch.manual_seed(0)
    op = getattr(_example(name), name) if kind == "named" else _bare(name)
    assert torch.autograd.gradgradcheck(op, _inputs(name, SUPPORTED[name]))


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


def test_unsupported_double_backward_is_refused():
    """rmsnorm's backward reads `rstd`, an intermediate its forward launch wrote, whose dependence on the inputs
    autograd cannot see: the double backward raises, naming the op and why (never a silent zero); the first backward
    with create_graph=True still gives the gradient. (log_softmax's and gelu's were refused too, at tg.unbroadcast's
    loops over the ranks, differentiated again: it is written with compile-time ifs now, and gelu's derived kernel
    has none left: a global constant is a scalar to the shape analysis.)"""
    x, w = _inputs("rmsnorm", (3, 13))[:2]
    (dx,) = torch.autograd.grad(_example("rmsnorm").rmsnorm(x, w).sum(), x, create_graph=True)
    torch.testing.assert_close(dx, torch.autograd.grad(_example("rmsnorm").reference(x, w).sum(), x)[0])
    with pytest.raises(OpError, match=r"`tritongrad_examples::rmsnorm`: double backward is not supported \(its "
                       r"backward reads a buffer the host function made"):
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
