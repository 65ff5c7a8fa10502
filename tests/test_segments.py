"""PyTorch operations inside a host function, on what its launches wrote: a bare op gives
them the launches' results with their history (tritongrad/segments.py); a named op refuses them, saying
how to restructure. Checked in float64 against PyTorch autograd on plain-PyTorch references, sizes that
are not powers of two, random upstream gradients."""

import pytest
import torch
import torch.nn.functional as F
import triton
import triton.language as tl

import tritongrad
from tritongrad.core.errors import OpError
from tritongrad.examples.cross_entropy import IGNORE_INDEX, cross_entropy_launch

DTYPE = torch.float64
BLOCK = 32


@triton.jit
def square_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(y_ptr + offs, x * x, mask=mask)


@triton.jit
def scale_kernel(x_ptr, w_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=mask) * tl.load(w_ptr + offs, mask=mask), mask=mask)


def square(x, out=None):
    out = torch.empty_like(x) if out is None else out
    square_kernel[(triton.cdiv(x.numel(), BLOCK),)](x, out, x.numel(), BLOCK=BLOCK)
    return out


def scale(x, w):
    y = torch.empty_like(x)
    scale_kernel[(triton.cdiv(x.numel(), BLOCK),)](x, w, y, x.numel(), BLOCK=BLOCK)
    return y


def leaves(*sizes, device):
    return [torch.randn(n, dtype=DTYPE, device=device, requires_grad=True) for n in sizes]


def assert_same_gradients(op, reference, inputs):
    """Forward values and every input's gradient against autograd on the reference."""
    got = op(*inputs)
    twins = [t.detach().clone().requires_grad_(t.requires_grad) for t in inputs]
    want = reference(*twins)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    g = torch.randn_like(want)
    diff = [t for t in inputs if t.requires_grad]
    got_grads = torch.autograd.grad(got, diff, g)
    want_grads = torch.autograd.grad(want, [t for t in twins if t.requires_grad], g)
    for a, b in zip(got_grads, want_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


def test_a_cross_entropy_host_function_averages_the_kernel_losses_with_pytorch(device):
    @tritongrad.op
    def cross_entropy_mean(logits, target):
        losses = cross_entropy_launch(logits, target)()
        return losses.sum() / (target != IGNORE_INDEX).sum()  # as production host functions reduce

    logits = 3 * torch.randn(11, 101, dtype=DTYPE, device=device)
    target = torch.randint(0, 101, (11,), device=device)
    target[2::4] = IGNORE_INDEX
    assert_same_gradients(lambda z: cross_entropy_mean(z, target),
                          lambda z: F.cross_entropy(z, target, ignore_index=IGNORE_INDEX),
                          [logits.requires_grad_()])


def test_a_pytorch_operation_between_two_launches(device):
    @tritongrad.op
    def f(x, w):
        h = square(x)
        return scale(torch.tanh(h) * 2, w)  # the second launch reads what PyTorch made of the first's result

    assert_same_gradients(f, lambda x, w: torch.tanh(x * x) * 2 * w, leaves(77, 77, device=device))


def test_views_made_before_the_launch_carry_its_history(device):
    @tritongrad.op
    def f(x):
        out = torch.empty(2, x.numel(), dtype=x.dtype, device=x.device)
        first, second = out[0], out[1]  # views of a buffer no launch has written yet
        square(x, first)
        square(x * 3, second)
        return first.exp() + second

    assert_same_gradients(f, lambda x: (x * x).exp() + 9 * x * x, leaves(45, device=device))


def test_views_pytorch_cannot_give_a_history_later_are_named(device):
    @tritongrad.op
    def f(x):
        first, second = torch.empty(2, x.numel(), dtype=x.dtype, device=x.device).unbind(0)
        square(x, first)
        return first.exp() + second

    with pytest.raises(RuntimeError, match="multiple views") as e:
        f(*leaves(45, device=device))
    assert "make those views by indexing" in "".join(getattr(e.value, "__notes__", []))


def test_an_in_place_pytorch_operation_on_a_launch_result(device):
    @tritongrad.op
    def f(x, w):
        y = scale(x, w)
        y.mul_(x)  # reads y: its history must be there before
        y[::2] = 0.0
        return y

    def reference(x, w):
        y = x * w * x
        return torch.where(torch.arange(x.numel(), device=x.device) % 2 == 0, 0.0, y)

    assert_same_gradients(f, reference, leaves(60, 60, device=device))


def test_a_copy_of_a_launch_result_keeps_the_history(device):
    @tritongrad.op
    def f(x):
        y = square(x)
        return y.view(7, 9).t().reshape(-1)  # the reshape of a transposed view copies

    assert_same_gradients(f, lambda x: (x * x).view(7, 9).t().reshape(-1), leaves(63, device=device))


def test_launches_reading_a_buffer_between_pytorch_operations_share_one_segment(device):
    @tritongrad.op
    def f(x, w):
        h = square(x)
        n = h.shape[0] + h.stride(0)  # reading sizes reads no values: one segment
        return scale(h, w) * n

    x, w = leaves(50, 50, device=device)
    y = f(x, w)
    assert type(y.grad_fn).__name__ == "MulBackward0"
    node = y.grad_fn.next_functions[0][0]
    assert node.name() == "FBackward" and all(type(n).__name__ != "FBackward" for n, _ in node.next_functions if n)
    assert_same_gradients(f, lambda x, w: x * x * w * 51, [x, w])


def test_a_single_launch_keeps_one_node_for_the_op(device):
    @tritongrad.op
    def single(x):
        return square(x)

    y = single(*leaves(30, device=device))
    assert y.grad_fn.name() == "SingleBackward"


def test_a_launch_writing_into_a_result_pytorch_already_read_is_refused(device):
    @tritongrad.op
    def f(x):
        y = square(x)
        total = y.sum()
        square(x, y)  # y has a history now: the backward would need what the first launch wrote
        return y + total

    with pytest.raises(OpError, match="writes to `y_ptr`, a tensor that requires grad"):
        f(*leaves(30, device=device))


def test_a_named_op_refuses_pytorch_operations_between_launches(device):
    @tritongrad.op("tgtest_segments::between")
    def between(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return scale(square(x) * 2, w)

    with pytest.raises(OpError, match="neither an argument of the op nor written by an earlier launch"):
        between(*leaves(40, 40, device=device))


@pytest.mark.parametrize("form", ["one node", "in place", "segments"])
def test_a_bare_op_call_leaves_no_reference_cycle(form, device):
    """A call's autograd nodes, arguments and outputs are freed as soon as nothing refers to them, without Python's
    cyclic collector: a cycle through a launch record (a node keeps its record, the record kept the call's Segments,
    which kept its arguments and outputs) held each step's activations on the GPU until a collection ran (gigabytes a
    step)."""
    import gc
    import weakref

    @tritongrad.op
    def one_node(x, w):
        y = torch.empty_like(x)
        scale_kernel[(triton.cdiv(x.numel(), 32),)](x, w, y, x.numel(), BLOCK=32)
        return y

    @tritongrad.op
    def in_place(x, w):
        y = x.clone()  # a PyTorch copy the launch updates in place (a segment with a history)
        scale_kernel[(triton.cdiv(y.numel(), 32),)](y, w, y, y.numel(), BLOCK=32)
        return y

    @tritongrad.op
    def segments(x, w):
        y = one_node(x, w) * 2.0  # a PyTorch operation between launches
        return one_node(y, w)

    op = {"one node": one_node, "in place": in_place, "segments": segments}[form]
    w = torch.randn(50, device=device, dtype=torch.float64, requires_grad=True)
    gc.collect()
    gc.disable()
    try:
        x = torch.randn(50, device=device, dtype=torch.float64, requires_grad=True) * 1.0  # an activation
        y = op(x, w)
        node, argument = weakref.ref(y.grad_fn), weakref.ref(x)
        y.sum().backward()
        del x, y
        assert node() is None and argument() is None
    finally:
        gc.enable()
