"""tritongrad.kept: what a call keeps for its backward, tensor by tensor, its own memory told from its arguments'."""

import pytest
import torch
import triton
import triton.language as tl

import tritongrad
from tritongrad.examples import rmsnorm


@triton.jit
def scale_in_place_kernel(x_ptr, w_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(x_ptr + offs, x * tl.load(w_ptr + offs, mask=mask), mask=mask)


@tritongrad.op
def scale_a_copy(x, w):
    y = x.clone()  # a PyTorch copy the launch updates in place: the launch record keeps its values from before
    scale_in_place_kernel[(triton.cdiv(y.numel(), 32),)](y, w, y.numel(), BLOCK=32)
    return y


def test_an_op_keeps_its_arguments_and_a_statistic_of_its_own(device):
    x = torch.randn(37, 21, device=device, dtype=torch.float64, requires_grad=True)
    w = torch.randn(21, device=device, dtype=torch.float64, requires_grad=True)
    report = tritongrad.kept(rmsnorm.rmsnorm, x, w)
    whose = {t.name.split()[-1]: t.whose for t in report.tensors}
    assert whose == {"x_ptr": "argument #0", "w_ptr": "argument #1", "rstd_ptr": "own"}
    assert report.own_bytes == 37 * 8  # one float64 statistic per row (rstd), and nothing else
    assert report.held_bytes == (37 * 21 + 21) * 8
    assert "RmsnormBackward" in str(report) and "rstd_ptr" in str(report)


def test_a_copy_taken_before_an_in_place_launch_is_own_memory(device):
    x = torch.randn(45, device=device, dtype=torch.float64, requires_grad=True)
    w = torch.randn(45, device=device, dtype=torch.float64, requires_grad=True)
    report = tritongrad.kept(scale_a_copy, x, w)
    own = [t for t in report.tensors if t.whose == "own"]
    assert own and all(t.dtype == torch.float64 for t in own)
    assert report.own_bytes == 45 * 8  # the copy of y's values before the launch (x's own memory is not it)
    y = scale_a_copy(x, w)  # and the op is right
    (g,) = torch.autograd.grad((y * torch.arange(45.0, device=device, dtype=torch.float64)).sum(), (w,))
    torch.testing.assert_close(g, x.detach() * torch.arange(45.0, device=device, dtype=torch.float64))


def test_a_hand_written_function_and_pytorch_nodes_are_measured_alike(device):
    x = torch.randn(33, 17, device=device, dtype=torch.float64, requires_grad=True)
    w = torch.randn(17, device=device, dtype=torch.float64, requires_grad=True)
    eager = tritongrad.kept(rmsnorm.reference, x, w)
    assert eager.tensors and {t.whose for t in eager.tensors} >= {"argument #0", "own"}
    assert eager.own_bytes >= 33 * 17 * 8  # PyTorch's written-out rmsnorm keeps a normalized copy of x

    class Square(torch.autograd.Function):
        @staticmethod
        def forward(ctx, a):
            ctx.save_for_backward(a)
            return a * a

        @staticmethod
        def backward(ctx, g):
            (a,) = ctx.saved_tensors
            return 2 * a * g

    report = tritongrad.kept(Square.apply, x)
    assert [(t.name, t.whose) for t in report.tensors] == [("saved #0", "argument #0")]
    assert report.own_bytes == 0


@pytest.mark.slow  # (about 3 s)
@pytest.mark.interpreter  # (its --smoke sets TRITON_INTERPRET for the process: not on a GPU run)
def test_the_op_memory_benchmark_runs_on_the_interpreter():
    from benchmarks import op_memory

    rows = op_memory.main(["--smoke", "--ops", "rmsnorm", "rope", "cross_entropy"])
    by = {(r["op"], r["impl"]): r for r in rows}
    assert all("error" not in by[(op, "tritongrad")] for op in ("rmsnorm", "rope", "cross_entropy"))
    assert by[("rmsnorm", "tritongrad")]["kept"] <= by[("rmsnorm", "eager")]["kept"]


@triton.jit
def rotate_in_place_kernel(x_ptr, cos_ptr, sin_ptr, half, BLOCK: tl.constexpr):
    row, cols = tl.program_id(0), tl.arange(0, BLOCK)
    mask = cols < half
    x1 = tl.load(x_ptr + row * 2 * half + cols, mask=mask)
    x2 = tl.load(x_ptr + row * 2 * half + half + cols, mask=mask)
    c, s = tl.load(cos_ptr + cols, mask=mask), tl.load(sin_ptr + cols, mask=mask)
    tl.store(x_ptr + row * 2 * half + cols, x1 * c - x2 * s, mask=mask)
    tl.store(x_ptr + row * 2 * half + half + cols, x2 * c + x1 * s, mask=mask)


@tritongrad.op
def rotate_a_copy(x, cos, sin):
    y = x.clone()  # updated in place: its old values' gradient needs cos and sin only (they require none)
    rotate_in_place_kernel[(y.shape[0],)](y, cos, sin, y.shape[1] // 2, BLOCK=16)
    return y


def test_what_no_derived_kernel_reads_is_not_kept(device):
    """A rotation updating a tensor in place: the copy of its old values the launch record takes is read by no derived
    kernel when the angles need no gradient, so the op keeps an empty stand-in in its place; its gradient is
    PyTorch's."""
    x = torch.randn(7, 22, device=device, dtype=torch.float64, requires_grad=True)
    angles = torch.rand(11, device=device, dtype=torch.float64) * 6
    cos, sin = angles.cos(), angles.sin()
    report = tritongrad.kept(rotate_a_copy, x, cos, sin)
    assert report.own_bytes == 0 and any(t.whose == "not kept" for t in report.tensors), str(report)
    g = torch.randn(7, 22, device=device, dtype=torch.float64)
    (got,) = torch.autograd.grad(rotate_a_copy(x, cos, sin), (x,), g)
    g1, g2 = g[:, :11], g[:, 11:]
    torch.testing.assert_close(got, torch.cat([g1 * cos + g2 * sin, g2 * cos - g1 * sin], dim=1))
    # where the angles need a gradient, the old values are read, and kept
    cos_, sin_ = cos.clone().requires_grad_(), sin.clone().requires_grad_()
    assert tritongrad.kept(rotate_a_copy, x, cos_, sin_).own_bytes == 7 * 22 * 8


def test_the_rotary_example_keeps_neither_q_nor_k(device):
    from tritongrad.examples import rotary

    q, k, cos, sin = rotary.make_inputs((2, 3, 5, 12), device, torch.float64)
    report = tritongrad.kept(rotary.rotary, q.requires_grad_(), k.requires_grad_(), cos, sin)
    assert {t.name.split()[-1] for t in report.tensors if t.whose == "not kept"} == {"x_ptr"}, str(report)
    assert report.held_bytes == (cos.numel() + sin.numel()) * 8


def test_a_copy_no_derived_kernel_read_is_not_taken_again(device, monkeypatch):
    """The first call of a kind copies what a launch updates in place (before the backward kernels are derived);
    later calls of that kind, shown no derived kernel reads it, take no copy (an empty placeholder stands in), and
    their gradients are PyTorch's; where the angles need a gradient (the old values are read) copies are taken."""
    from tritongrad.host.launch_record import LaunchRecord

    copies = []
    real = LaunchRecord._copy
    monkeypatch.setattr(LaunchRecord, "_copy", lambda self, v: copies.append(v.shape) or real(self, v))

    @tritongrad.op
    def rotate(x, cos, sin):
        y = x.clone()
        rotate_in_place_kernel[(y.shape[0],)](y, cos, sin, y.shape[1] // 2, BLOCK=16)
        return y

    angles = torch.rand(11, device=device, dtype=torch.float64) * 6
    for needs_angles, copied in ((False, 1), (True, 3)):
        copies.clear()
        cos, sin = angles.cos().requires_grad_(needs_angles), angles.sin().requires_grad_(needs_angles)
        for _ in range(3):
            x = torch.randn(7, 22, device=device, dtype=torch.float64, requires_grad=True)
            g = torch.randn(7, 22, device=device, dtype=torch.float64)
            y = rotate(x, cos, sin)
            x1, x2 = x[:, :11], x[:, 11:]
            want = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=1)
            leaves = [x, cos, sin] if needs_angles else [x]
            torch.testing.assert_close(torch.autograd.grad(y, leaves, g), torch.autograd.grad(want, leaves, g))
        assert len(copies) == copied


def test_an_argument_updated_in_place_ends_the_walk_where_its_history_began(device):
    """An op updating its argument in place (a view of a tensor with a history) becomes that argument's grad_fn: the
    walk starts at the call's node and stops where the argument's history began before the call (before: at the
    call's own node, listing nothing), not past it into the matmul that made the argument."""
    @tritongrad.op
    def scale(x, w):
        scale_in_place_kernel[(triton.cdiv(x.numel(), 32),)](x, w, x.numel(), BLOCK=32)
        return x

    a = torch.randn(5, 7, device=device, dtype=torch.float64, requires_grad=True)
    b = torch.randn(7, 2 * 37, device=device, dtype=torch.float64, requires_grad=True)
    w = torch.randn(5 * 37, device=device, dtype=torch.float64)
    for x in ((a @ b)[:, :37].contiguous(), (a @ b).view(-1)[:5 * 37]):  # (a tensor of its own; a view of one)
        report = tritongrad.kept(scale, x, w)
        assert [t.whose for t in report.tensors if t.name.endswith(" w_ptr")] == ["argument #1"], str(report)
        assert not any(t.node.startswith("Mm") for t in report.tensors), str(report)
