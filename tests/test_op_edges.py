"""The edges of what an op's call can be: forward mode refused, tensors inside
containers treated as inputs, errors a user can catch, refusals that point at the right line.

Gradients are compared with PyTorch autograd on plain-PyTorch twins, in float64, on fresh random inputs of sizes
that are not powers of two, the op's outputs poisoned before its kernels write them.
"""

import os
import re

import pytest
import torch
import torch.autograd.forward_ad as fwAD
import triton
import triton.language as tl

import tritongrad
from tritongrad import NotDifferentiableError, OpError, TritongradError
from tritongrad.examples import EXAMPLES
from tritongrad.tools.testing import poison

DEVICE = "cuda" if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1" else "cpu"
D = torch.float64
BLOCK = 64


def rand(*shape, grad=True):
    return torch.randn(*shape, dtype=D, device=DEVICE, requires_grad=grad)


@triton.jit
def sin_mul_kernel(x_ptr, w_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, tl.sin(tl.load(x_ptr + offs, mask=mask)) * tl.load(w_ptr + offs, mask=mask), mask=mask)


@triton.jit
def through_a_pointer_table(table_ptr, y_ptr, n, BLOCK: tl.constexpr):
    group = tl.program_id(0)
    x_ptr = tl.load(table_ptr + group).to(tl.pointer_type(tl.float64))
    offs = tl.arange(0, BLOCK)
    tl.store(y_ptr + group * n + offs, tl.load(x_ptr + offs, mask=offs < n) * 2.0, mask=offs < n)


def sin_mul(x, w):
    y = poison(torch.empty_like(x))
    sin_mul_kernel[(triton.cdiv(x.numel(), BLOCK),)](x, w, y, x.numel(), BLOCK=BLOCK)
    return y


def grouped(ts):
    """Triton's grouped-GEMM host: the kernel reaches the tensors only through a table of their addresses."""
    table = torch.tensor([t.data_ptr() for t in ts], dtype=torch.int64, device=ts[0].device)
    y = poison(torch.empty(len(ts), ts[0].numel(), dtype=ts[0].dtype, device=ts[0].device))
    through_a_pointer_table[(len(ts),)](table, y, ts[0].numel(), BLOCK=BLOCK)
    return y


bare_sin_mul = tritongrad.op(sin_mul)
named_sin_mul = tritongrad.op("tgedges::sin_mul")(sin_mul)
OPS = pytest.mark.parametrize("kind", ["bare", "named"])


def op_of(kind):
    return bare_sin_mul if kind == "bare" else named_sin_mul


# -- 1. forward mode ----------------------------------------------------------------------------------------------


FORWARD = "forward-mode AD .* is not yet supported"


@OPS
@pytest.mark.parametrize("how", ["jvp", "jacfwd", "dual", "dual under no_grad"])
def test_forward_mode_gives_pytorchs_tangents(kind, how):
    """It gave a zero tangent (named), no tangent (dual tensors) or crashed on a storage-less tensor (bare jvp); now
    the launches' tangent kernels run (ops/forward_mode.py)."""
    op = op_of(kind)
    x, w, tx, tw = (rand(37, grad=False) for _ in range(4))
    want = torch.cos(x) * tx * w + torch.sin(x) * tw
    if how == "jvp":
        _, got = torch.func.jvp(op, (x, w), (tx, tw))
    elif how == "jacfwd":
        got, want = torch.func.jacfwd(op)(x, w), torch.diag(torch.cos(x) * w)
    else:
        with fwAD.dual_level(), torch.set_grad_enabled(how == "dual"):
            got = fwAD.unpack_dual(op(fwAD.make_dual(x, tx), fwAD.make_dual(w, tw))).tangent
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("how", ["jvp", "dual"])
def test_forward_mode_through_the_dispatcher_is_refused(how):
    """torch.ops.ns.name (no tritongrad wrapper around the call, and torch.library takes no forward-mode formula):
    torch.library's Autograd kernel passed the tangents by, a zero tangent; refused."""
    from tritongrad.ops.library import DISPATCHER_REFUSES_FORWARD_MODE

    if "tgedges::sin_mul" not in DISPATCHER_REFUSES_FORWARD_MODE:
        pytest.skip("this torch refuses to override the Autograd kernel torch.library registered")
    x, w, tx = (rand(37, grad=False) for _ in range(3))
    with pytest.raises(OpError, match=f"`tgedges::sin_mul`: {FORWARD}"):
        if how == "jvp":
            torch.func.jvp(lambda a: torch.ops.tgedges.sin_mul(a, w), (x,), (tx,))
        else:
            with fwAD.dual_level():
                torch.ops.tgedges.sin_mul(fwAD.make_dual(x, tx), w)


@pytest.mark.parametrize("name", ["rmsnorm", "softmax", "swiglu", "flash_attention"])
def test_forward_mode_through_the_bundled_examples_gives_pytorchs_tangents(name):
    example = EXAMPLES[name]
    inputs = example.make_inputs(example.sizes[0], device=DEVICE, dtype=D)
    tensors = [t for t in inputs if isinstance(t, torch.Tensor)]
    rest = inputs[len(tensors):]
    tangents = tuple(torch.randn_like(t) for t in tensors)
    _, got = torch.func.jvp(lambda *t: example.op(*t, *rest), tuple(tensors), tangents)
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.MATH):  # (attention's reference: the math backend has forward AD)
        _, want = torch.func.jvp(lambda *t: example.reference(*t, *rest), tuple(tensors), tangents)
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9)


def test_a_dual_level_without_tangents_leaves_reverse_mode_as_it_was():
    """Guard (passed before the fix too): a dual level open, no tangent among the arguments: nothing refused."""
    for op in (bare_sin_mul, named_sin_mul):
        x, w = rand(37), rand(37)
        g = torch.randn(37, dtype=D, device=DEVICE)
        with fwAD.dual_level():
            got = torch.autograd.grad(op(x, w), (x, w), g)
        want = torch.autograd.grad(torch.sin(x) * w, (x, w), g)
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_a_bare_op_under_torch_func_functionalize_is_refused_clearly():
    """It crashed: "Cannot access data pointer of Tensor that doesn't have storage". (grad, vjp, jacrev and vmap run:
    tests/test_func_transforms.py.)"""
    x, w = rand(37, grad=False), rand(37, grad=False)
    with pytest.raises(OpError, match=r"torch.func transforms other than .* \(functionalize\) are not supported by a "
                                      "bare op"):
        torch.func.functionalize(lambda a: bare_sin_mul(a, w))(x)


# -- 2. tensors inside containers ---------------------------------------------------------------------------------


@tritongrad.op
def grouped_args(*ts):
    return grouped(ts)


@tritongrad.op
def grouped_list(ts):
    return grouped(ts)


@tritongrad.op
def grouped_dict(d):
    return grouped([d["a"], d["b"]])


@tritongrad.op
def grouped_kwargs(**ts):
    return grouped(list(ts.values()))


@pytest.mark.parametrize("how", ["*args", "list", "tuple", "dict", "**kwargs"])
def test_tensors_reached_only_through_a_pointer_table_are_refused(how):
    """The outputs came back with no grad_fn: the tensors inside the container were never seen."""
    a, b = rand(45), rand(45)
    call, name = {"*args": (lambda: grouped_args(a, b), "ts[0]"), "list": (lambda: grouped_list([a, b]), "ts[0]"),
                  "tuple": (lambda: grouped_list((a, b)), "ts[0]"),
                  "dict": (lambda: grouped_dict({"a": a, "b": b}), "d['a']"),
                  "**kwargs": (lambda: grouped_kwargs(a=a, b=b), "a")}[how]
    with pytest.raises(OpError, match=rf"the argument `{re.escape(name)}` requires grad, but no kernel launch reads"):
        call()
    with torch.no_grad():  # nothing to differentiate: the op runs
        torch.testing.assert_close(grouped_list([a, b]), torch.stack([a, b]) * 2)


@tritongrad.op
def first_direct_rest_through_a_table(ts):
    y = sin_mul(ts[0], ts[0])
    return y, grouped(ts[1:])


def test_a_list_element_read_only_through_a_table_beside_one_read_directly_is_refused():
    """The first element's gradient came back, the second's was silently missing."""
    a, b = rand(45), rand(45)
    with pytest.raises(OpError, match=r"the argument `ts\[1\]` requires grad, but no kernel launch reads it"):
        first_direct_rest_through_a_table([a, b])


@tritongrad.op
def pairs(xs, ws):
    return [sin_mul(x, w) for x, w in zip(xs, ws, strict=True)]


def test_list_elements_passed_to_launches_get_their_gradients():
    """Guard (right before the fix too): tensors taken out of lists and launched on are differentiated."""
    xs, ws = [rand(37), rand(70)], [rand(37), rand(70)]
    ys = pairs(xs, ws)
    gs = [torch.randn_like(y) for y in ys]
    got = torch.autograd.grad(ys, [*xs, *ws], gs)
    want = torch.autograd.grad([torch.sin(x) * w for x, w in zip(xs, ws, strict=True)], [*xs, *ws], gs)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


@tritongrad.op
def as_dict(x, w):
    return {"y": sin_mul(x, w), "rest": [sin_mul(w, x)]}


def test_a_bare_op_returning_a_dict_gets_its_gradients():
    """It was refused: "the argument `x` requires grad, but no kernel launch reads it"."""
    x, w = rand(6, 37), rand(6, 37)
    out = as_dict(x, w)
    g, h = torch.randn_like(x), torch.randn_like(x)
    got = torch.autograd.grad([out["y"], out["rest"][0]], (x, w), [g, h])
    want = torch.autograd.grad([torch.sin(x) * w, torch.sin(w) * x], (x, w), [g, h])
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_a_named_op_returning_a_dict_is_refused_with_the_way_out():
    @tritongrad.op("tgedges::as_dict")
    def named_as_dict(x, w):
        return {"y": sin_mul(x, w)}

    with pytest.raises(OpError, match=r"output #0 is a dict; .* a bare @tritongrad.op also .* dicts"):
        named_as_dict(rand(37), rand(37))


@pytest.mark.parametrize("annotation", [list[torch.Tensor], tuple[torch.Tensor, ...], list[torch.Tensor] | None])
def test_a_named_op_taking_tensors_in_a_list_is_refused_at_registration(annotation):
    """It registered, and a call heard that the tensor was "neither an argument of the op nor written"."""
    def listy(xs, w: torch.Tensor) -> torch.Tensor:
        return sin_mul(xs[0], w)

    listy.__annotations__["xs"] = annotation
    with pytest.raises(OpError, match=r"the parameter `xs` of `listy` holds tensors in a container"):
        tritongrad.op("tgedges::listy")(listy)


# -- 7. errors a user can catch -----------------------------------------------------------------------------------


def test_every_error_is_exported_under_one_base():
    assert issubclass(OpError, TritongradError) and issubclass(NotDifferentiableError, TritongradError)
    assert issubclass(OpError, RuntimeError)  # code catching RuntimeError keeps catching it
    assert {"OpError", "TritongradError", "NotDifferentiableError"} <= set(tritongrad.__all__)


@pytest.mark.parametrize("name", [None, "tgedges::kernel"])
def test_op_of_a_kernel_is_refused(name):
    """It raised AttributeError: '__qualname__'."""
    with pytest.raises(OpError, match="not a kernel: `sin_mul_kernel` is a Triton kernel"):
        tritongrad.op(sin_mul_kernel) if name is None else tritongrad.op(name)(sin_mul_kernel)


@pytest.mark.parametrize("name", ["sin_mul", "tgedges::bad name", "tgedges::", "1tg::sin", "tgedges::sin.overload"])
def test_a_malformed_name_is_refused_naming_the_rule(name):
    """ValueError "not enough values to unpack", raw schema-parser RuntimeErrors, or an overload taken silently."""
    with pytest.raises(OpError, match=r"a named op's name is \"namespace::name\", both Python identifiers"):
        tritongrad.op(name)(sin_mul)


def _define_op():
    @tritongrad.op("tgedges::defined_twice")
    def twice(x, w):
        return sin_mul(x, w)

    return twice


def test_a_name_registered_by_another_function_is_refused():
    """torch.library replaced the first op silently."""
    _define_op()

    def other(x, w):
        return sin_mul(w, x)

    with pytest.raises(OpError, match=r"`tgedges::defined_twice` is already registered, by `_define_op.<locals>"
                                      r".twice`"):
        tritongrad.op("tgedges::defined_twice")(other)
    op = _define_op()  # the same function again (a module imported again, a test run again): taken
    x, w = rand(37), rand(37)
    torch.testing.assert_close(op(x, w), torch.sin(x) * w)


@OPS
def test_an_integer_tensor_where_the_kernel_computes_in_floating_point_names_the_argument(kind):
    """Triton's interpreter raised "Expected dtype ['fp32', 'fp64'] but got int64", naming no argument."""
    x, w = torch.randint(-3, 4, (37,), device=DEVICE), rand(37)

    def mixed(x, w):
        y = poison(torch.empty_like(w))
        sin_mul_kernel[(triton.cdiv(x.numel(), BLOCK),)](x, w, y, x.numel(), BLOCK=BLOCK)
        return y

    op = tritongrad.op(mixed) if kind == "bare" else tritongrad.op("tgedges::mixed")(mixed)
    with pytest.raises(OpError, match=r"launch #1 \(`sin_mul_kernel`\) computes in floating point where it was "
                                      r"passed int64 values: `x_ptr` \(torch.int64\)"):
        op(x, w)


# -- 8. refusals that point at the right line ---------------------------------------------------------------------


@triton.jit
def one_block_for_all(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.sin(tl.load(x_ptr + offs, mask=offs < n)), mask=offs < n)


def test_programs_storing_one_element_are_refused_at_the_store():
    """The refusal cited the @triton.jit line."""
    @tritongrad.op
    def shared(x):
        y = poison(torch.empty_like(x))
        one_block_for_all[(3,)](x, y, x.numel(), BLOCK=128)
        return y

    with pytest.raises(NotDifferentiableError, match="a grid of 3 programs along axis 0") as raised:
        shared(rand(100)).sum().backward()
    assert raised.value.source_line.startswith("tl.store(y_ptr + offs")


@triton.jit
def grid_stride_over_elements(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    for start in range(pid * BLOCK, n, tl.num_programs(0) * BLOCK):
        offs = start + tl.arange(0, BLOCK)
        tl.store(y_ptr + offs, tl.sin(tl.load(x_ptr + offs, mask=offs < n)), mask=offs < n)


@triton.jit
def grid_stride_over_tiles(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    for tile in range(tl.program_id(0), tl.cdiv(n, BLOCK), tl.num_programs(0)):
        offs = tile * BLOCK + tl.arange(0, BLOCK)
        tl.store(y_ptr + offs, tl.sin(tl.load(x_ptr + offs, mask=offs < n)), mask=offs < n)


def test_a_grid_stride_loop_over_elements_and_over_tiles_are_both_right():
    """The loop over elements was refused (its hint offered the loop over tiles); both now derive."""
    for kernel in (grid_stride_over_elements, grid_stride_over_tiles):
        @tritongrad.op
        def op(x, kernel=kernel):
            y = poison(torch.empty_like(x))
            kernel[(3,)](x, y, x.numel(), BLOCK=16)
            return y

        x = rand(101)
        g = torch.randn_like(x)
        torch.testing.assert_close(torch.autograd.grad(op(x), x, g)[0], torch.cos(x.detach()) * g,
                                   rtol=1e-12, atol=1e-12)
