"""The bundled examples: forward against PyTorch, derived backward against torch autograd.

Float64 throughout (the interpreter computes it exactly as numpy does, tl.dot included);
sizes are not powers of two and every launch has several programs, except seed 002's
fixed 16 x 16 ``tr_forward``. Output buffers start as NaN so a missed element fails.
"""

import inspect
import re
import sys

import pytest
import torch

import tritongrad
from tritongrad import examples
from tritongrad.examples import gather, matmul, matvec, rmsnorm, softmax, softplus
from tritongrad.testing import backward_launch, poison

DTYPE = torch.float64
TOL = {"rtol": 1e-10, "atol": 1e-10}
EXAMPLES = examples.EXAMPLES
IDS = [e.name for e in EXAMPLES]


def run_forward(launch: examples.Launch) -> torch.Tensor:
    poison(launch.out)
    return launch()


def leaves(example: examples.Example, inputs) -> list[torch.Tensor]:
    """Copies of the inputs for the reference, the differentiated ones requiring grad."""
    return [t.detach().clone().requires_grad_(p in example.wrt) for t, p in zip(inputs, example.params, strict=True)]


def derived_and_expected(example: examples.Example, inputs, wrt=None):
    """The derived gradients of one launch, and torch autograd's on the reference, for the same random d_out."""
    wrt = example.wrt if wrt is None else wrt
    launch = example.launch(*inputs)
    run_forward(launch)
    ref_inputs = [t.detach().clone().requires_grad_(p in wrt) for t, p in zip(inputs, example.params, strict=True)]
    out = example.reference(*ref_inputs)
    d_out = torch.randn_like(out)
    got = backward_launch(example.kernel, launch.grid, launch.args, launch.kwargs, {launch.output: d_out}, wrt=wrt)
    want = torch.autograd.grad(out, [t for t in ref_inputs if t.requires_grad], d_out)
    wanted = {p: g for p, g in zip([p for p in example.params if p in wrt], want, strict=True)}
    return got, wanted


# -- every example ----------------------------------------------------------------------------


@pytest.mark.parametrize("example", EXAMPLES, ids=IDS)
def test_forward_matches_reference(example, device):
    inputs = example.make_inputs(device, DTYPE)
    launch = example.launch(*inputs)
    assert max(launch.grid) > 1 or example.name == "fn1", "use several programs"
    out = run_forward(launch)
    torch.testing.assert_close(out, example.reference(*inputs), **TOL)
    torch.testing.assert_close(example.launcher(*inputs), out, **TOL)


@pytest.mark.parametrize("example", EXAMPLES, ids=IDS)
def test_gradients_match_autograd(example, device):
    inputs = example.make_inputs(device, DTYPE)
    got, want = derived_and_expected(example, inputs)
    assert set(got) == set(example.wrt)
    for name in example.wrt:
        assert got[name].shape == want[name].shape
        torch.testing.assert_close(got[name], want[name], **TOL, msg=lambda m, n=name: f"d_{n}: {m}")


@pytest.mark.parametrize("example", EXAMPLES, ids=IDS)
def test_check_for_the_demo(example, device):
    errors = examples.check(example, device)
    assert set(errors) == {"forward", *(f"d_{w}" for w in example.wrt)}
    assert max(errors.values()) < 1e-12, errors


def test_make_inputs_are_fresh_and_not_powers_of_two(device):
    for example in EXAMPLES:
        first, second = example.make_inputs(device, DTYPE), example.make_inputs(device, DTYPE)
        assert all(t.device.type == torch.device(device).type for t in first)
        assert not torch.equal(first[0], second[0]), example.name
        if example.name != "fn1":  # seed 002's kernel is fixed at 16 x 16
            sizes = {s for t in first for s in t.shape}
            assert any(s & (s - 1) for s in sizes), f"{example.name}: sizes {sizes} are all powers of two"


@pytest.mark.parametrize("example", EXAMPLES, ids=IDS)
def test_default_wrt_and_outputs(example, device):
    launch = example.launch(*example.make_inputs(device, DTYPE))
    bwd = tritongrad.grad(example.kernel)
    assert bwd.wrt == example.wrt
    assert bwd.outputs == (launch.output,)
    forward_params = tuple(inspect.signature(example.kernel.fn).parameters)
    shadows = tuple(f"d_{p}" for p in (*bwd.outputs, *bwd.wrt))
    assert bwd.params == (*forward_params, *shadows)
    assert bwd.shadow_params == dict(zip((*bwd.outputs, *bwd.wrt), shadows, strict=True))


def test_gather_indices_carry_no_gradient():
    bwd = tritongrad.grad(gather.gather_kernel)
    assert "idx_ptr" not in bwd.wrt
    assert bwd.wrt == ("x_ptr", "w_ptr")
    assert "d_idx_ptr" not in bwd.params


# names each derived source must show: the forward's own variables, and their adjoints
SOURCE_NAMES = {
    "sin": ["offsets", "mask", "x", "d_output", "d_x"],
    "rmsnorm": ["row", "cols", "rstd", "mean_square", "d_y", "d_rstd", "d_x", "d_w"],
    "softmax": ["numerator", "denominator", "z", "d_numerator", "d_denominator", "d_z", "d_x"],
    "softplus": ["x", "d_y", "d_x"],
    "swiglu": ["a", "b", "d_y", "d_a", "d_b"],
    "matvec": ["offs_m", "offs_n", "offs_w", "mask_w", "mask_x", "d_out", "d_w", "d_x"],
    "matmul": ["rm", "rn", "rk", "a_mask", "b_mask", "c_mask", "d_c", "d_a", "d_b"],
    "transpose": ["rm", "rn", "d_y", "d_x", "d_s"],
    "gather": ["idx", "d_x", "d_w", "d_y"],
    "fn1": ["a", "b", "c", "d_z", "d_a", "d_b", "d_c", "d_x", "d_y"],
    "flash_attention": ["q", "k", "v", "s", "p", "alpha", "m_new", "d_acc", "d_l_i", "d_q", "d_k", "d_v"],
    "cross_entropy": ["target", "keep", "picked", "m_new", "d_loss", "d_s", "d_picked", "d_x"],
}


@pytest.mark.parametrize("example", EXAMPLES, ids=IDS)
def test_source_reads_like_the_forward(example):
    src = tritongrad.grad(example.kernel).src
    forward_src = inspect.getsource(example.kernel.fn)
    comments = re.findall(r"^ *# grad of: (.*)$", src, flags=re.M)
    assert comments, src
    module_src = inspect.getsource(sys.modules[example.kernel.fn.__module__])
    for line in comments:  # each comment quotes a line of the forward, or of a helper and its call site
        quoted, _, called_from = line.partition("  (in ")
        if called_from:
            helper, _, call = called_from.removesuffix(")").partition(", from: ")
            assert f"def {helper}(" in module_src and quoted.strip() in module_src, line
            assert call.strip() in forward_src, line
        else:
            assert quoted.strip() in forward_src, line
    for name in SOURCE_NAMES[example.name]:
        assert re.search(rf"\b{name}\b", src), f"`{name}` missing from\n{src}"
    assert f"def {example.kernel.fn.__name__}_bwd(" in src


# -- particular examples ----------------------------------------------------------------------


def test_matvec_matches_hand_written_backward(device):
    w, x = matvec.make_inputs(device, DTYPE)
    launch = matvec.matvec_launch(w, x)
    run_forward(launch)
    d = torch.randn(w.shape[0], device=device, dtype=DTYPE)
    got = backward_launch(matvec.fwd_kernel, launch.grid, launch.args, launch.kwargs, {"out_ptr": d})
    dw, dx = matvec.matvec_backward(d, w, x)
    torch.testing.assert_close(got["w_ptr"], dw, **TOL)
    torch.testing.assert_close(got["x_ptr"], dx, **TOL)
    torch.testing.assert_close(dw, torch.outer(d, x), **TOL)  # the hand-written kernel itself is right
    torch.testing.assert_close(dx, d @ w, **TOL)


def test_gather_repeated_indices_accumulate(device):
    x, _, w = gather.make_inputs(device, DTYPE)
    n = w.numel()
    # every index repeats, within a program and across the 4 programs; some x get no gradient at all
    idx = torch.tensor([3, 3, 11, 0, 3, 11] * (n // 6) + [0] * (n % 6), device=device)
    assert gather.gather_launch(x, idx, w).grid[0] > 1
    got, want = derived_and_expected(examples.get("gather"), (x, idx, w))
    torch.testing.assert_close(got["x_ptr"], want["x_ptr"], **TOL)
    torch.testing.assert_close(got["w_ptr"], want["w_ptr"], **TOL)
    assert got["x_ptr"][[1, 2, 4]].eq(0).all()
    assert got["x_ptr"][3].abs() > 0


def test_gather_random_indices_have_repeats(device):
    _, idx, _ = gather.make_inputs(device, DTYPE)
    assert torch.unique(idx).numel() < idx.numel()


def test_gather_wrt_one_input(device):
    inputs = gather.make_inputs(device, DTYPE)
    got, want = derived_and_expected(examples.get("gather"), inputs, wrt=("x_ptr",))
    assert set(got) == {"x_ptr"}
    torch.testing.assert_close(got["x_ptr"], want["x_ptr"], **TOL)


def test_rmsnorm_wrt_weights_only(device):
    inputs = rmsnorm.make_inputs(device, DTYPE)
    got, want = derived_and_expected(examples.get("rmsnorm"), inputs, wrt=("w_ptr",))
    assert set(got) == {"w_ptr"}
    torch.testing.assert_close(got["w_ptr"], want["w_ptr"], **TOL)


def test_matmul_single_block(device):
    a = torch.randn(29, 27, device=device, dtype=DTYPE)
    b = torch.randn(27, 31, device=device, dtype=DTYPE)
    assert matmul.matmul_launch(a, b).grid == (1, 1)
    got, want = derived_and_expected(examples.get("matmul"), (a, b))
    torch.testing.assert_close(got["a_ptr"], want["a_ptr"], **TOL)
    torch.testing.assert_close(got["b_ptr"], want["b_ptr"], **TOL)


def test_matmul_float32(device):
    tol = 1e-4 if device == "cpu" else 2e-2  # a float32 tl.dot is tf32 on the GPU, in forward and backward
    a = torch.randn(45, 27, device=device)
    b = torch.randn(27, 37, device=device)
    launch = matmul.matmul_launch(a, b)
    torch.testing.assert_close(run_forward(launch), a @ b, rtol=tol, atol=tol)
    got, want = derived_and_expected(examples.get("matmul"), (a, b))
    torch.testing.assert_close(got["a_ptr"], want["a_ptr"], rtol=tol, atol=tol)
    torch.testing.assert_close(got["b_ptr"], want["b_ptr"], rtol=tol, atol=tol)


def test_softmax_large_inputs_stay_finite(device):
    (x,) = softmax.make_inputs(device, DTYPE)
    x = 500 * x  # exp(x) overflows without the max subtracted
    got, want = derived_and_expected(examples.get("softmax"), (x,))
    assert torch.isfinite(got["x_ptr"]).all()
    torch.testing.assert_close(got["x_ptr"], want["x_ptr"], **TOL)


def test_softplus_tails_stay_finite(device):
    x = torch.linspace(-800, 800, 301, device=device, dtype=DTYPE)  # exp(800) overflows float64
    launch = softplus.softplus_launch(x)
    torch.testing.assert_close(run_forward(launch), torch.logaddexp(x, torch.zeros_like(x)), **TOL)
    d_y = torch.randn_like(x)
    got = backward_launch(softplus.softplus_kernel, launch.grid, launch.args, launch.kwargs, {"y_ptr": d_y})
    # the exact derivative (torch's softplus switches to the identity above x = 20, so not its gradient)
    torch.testing.assert_close(got["x_ptr"], d_y * torch.sigmoid(x), **TOL)


def test_rmsnorm_raw_launch_convention(device):
    """``bwd[grid](*forward_args, *output_grads, *input_grads, **constexprs)``, without the testing helper."""
    x, w = rmsnorm.make_inputs(device, DTYPE)
    y = poison(torch.empty_like(x))
    rows, n = x.shape
    block = 64
    rmsnorm.rmsnorm_fwd[(rows,)](x, w, y, x.stride(0), n, 1e-6, BLOCK=block)
    d_y = torch.randn_like(y)
    d_x, d_w = torch.zeros_like(x), torch.zeros_like(w)
    bwd = tritongrad.grad(rmsnorm.rmsnorm_fwd)
    bwd[(rows,)](x, w, y, x.stride(0), n, 1e-6, d_y, d_x, d_w, BLOCK=block)
    xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
    want_x, want_w = torch.autograd.grad(rmsnorm.reference(xr, wr), (xr, wr), d_y)
    torch.testing.assert_close(d_x, want_x, **TOL)
    torch.testing.assert_close(d_w, want_w, **TOL)
