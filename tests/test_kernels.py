"""The bundled examples: forward against PyTorch, derived backward against torch autograd.

Every example through ``tritongrad check`` at each of its sizes (float64: the interpreter computes
it exactly as numpy does, tl.dot included; sizes are not multiples of the blocks), and single
launches through ``tritongrad.tools.testing`` with NaN-poisoned outputs, so a missed element fails.
"""

import inspect
import re
import sys

import pytest
import torch
import triton.language as tl

import tritongrad
from tritongrad import examples
from tritongrad.core.source import unwrap
from tritongrad.examples import gather, matmul, matvec, rmsnorm, softmax, softplus
from tritongrad.tools.check import Subject, check_size
from tritongrad.tools.testing import backward_launch, poison

DTYPE = torch.float64
TOL = {"rtol": 1e-10, "atol": 1e-10}
EXAMPLES = list(examples.EXAMPLES.values())
IDS = [e.name for e in EXAMPLES]
CASES = [(e, size) for e in EXAMPLES for size in e.sizes]


def subject(example: examples.Example) -> Subject:
    return Subject(example.name, example.op, example.reference, example.make_inputs, example.sizes, example.dtypes)


def derived_and_expected(launch: examples.Launch, reference, wrt: dict[str, torch.Tensor]):
    """The derived gradients of one launch (its output poisoned first), and torch autograd's on the
    reference for the same random d_out. ``wrt``: kernel parameter -> the reference's input tensor."""
    poison(launch.out)
    launch()
    leaves = {p: t.detach().clone().requires_grad_() for p, t in wrt.items()}
    out = reference(*leaves.values())
    d_out = torch.randn_like(out)
    got = backward_launch(launch.kernel, launch.grid, launch.args, launch.kwargs, {launch.output: d_out},
                          wrt=tuple(wrt))
    want = dict(zip(wrt, torch.autograd.grad(out, list(leaves.values()), d_out), strict=True))
    return got, want


# -- every example ----------------------------------------------------------------------------


@pytest.mark.parametrize(("example", "size"), CASES, ids=[f"{e.name}-{s}" for e, s in CASES])
def test_check_passes(example, size, device):
    dtype = DTYPE if DTYPE in example.dtypes else torch.float32
    rows = check_size(subject(example), size, device, dtype)
    assert all(r.ok for r in rows), [r for r in rows if not r.ok]
    inputs = example.make_inputs(size, device=device, dtype=dtype)
    names = list(inspect.signature(example.reference).parameters)
    differentiable = {f"d_{n}" for n, t in zip(names[:len(inputs)], inputs, strict=True)
                      if isinstance(t, torch.Tensor) and t.is_floating_point()}
    assert differentiable <= {r.tensor for r in rows}, rows


def test_make_inputs_are_fresh_and_not_powers_of_two(device):
    for example in EXAMPLES:
        for size in example.sizes:
            first = example.make_inputs(size, device=device, dtype=DTYPE)
            second = example.make_inputs(size, device=device, dtype=DTYPE)
            tensors = [t for t in first if isinstance(t, torch.Tensor)]
            assert all(t.device.type == torch.device(device).type for t in tensors)
            assert not torch.equal(first[0], second[0]), example.name
        if example.name != "fn1":  # seed 002's kernel is fixed at 16 x 16
            dims = {d for size in example.sizes for t in example.make_inputs(size, device=device, dtype=DTYPE)
                    if isinstance(t, torch.Tensor) for d in t.shape}
            assert any(d & (d - 1) for d in dims), f"{example.name}: sizes {dims} are all powers of two"


def test_the_registry_names_its_examples():
    assert examples.get("rmsnorm").op is rmsnorm.rmsnorm
    with pytest.raises(KeyError, match="there are: sin, softplus"):
        examples.get("rms_norm")


# the default wrt and outputs of each example's kernel
ROLES = {
    "sin": (("x_ptr",), ("output_ptr",)),
    "softplus": (("x_ptr",), ("y_ptr",)),
    "swiglu": (("a_ptr", "b_ptr"), ("y_ptr",)),
    "rmsnorm": (("x_ptr", "w_ptr"), ("y_ptr", "rstd_ptr")),
    "softmax": (("x_ptr",), ("y_ptr",)),
    "cross_entropy": (("logits_ptr",), ("loss_ptr",)),
    "matmul": (("a_ptr", "b_ptr"), ("c_ptr",)),
    "flash_attention": (("q_ptr", "k_ptr", "v_ptr"), ("o_ptr",)),
    "fn1": (("X", "Y"), ("Z",)),
    "matvec": (("w_ptr", "x_ptr"), ("out_ptr",)),
    "gather": (("x_ptr", "w_ptr"), ("y_ptr",)),
    "transpose": (("x_ptr", "s_ptr"), ("y_ptr",)),
    "gelu": (("x_ptr",), ("y_ptr",)),
    "geglu": (("a_ptr", "b_ptr"), ("y_ptr",)),
    "layernorm": (("x_ptr", "w_ptr", "b_ptr"), ("y_ptr", "mean_ptr", "rstd_ptr")),
    "add_rmsnorm": (("x_ptr", "r_ptr", "w_ptr"), ("y_ptr", "h_ptr")),
    "log_softmax": (("x_ptr",), ("y_ptr",)),
    "rotary": (("x_ptr", "cos_ptr", "sin_ptr"), ("out_ptr",)),
    "linear": (("w_ptr", "x_ptr"), ("out_ptr",)),
}


@pytest.mark.parametrize("example", EXAMPLES, ids=IDS)
def test_default_wrt_and_outputs(example):
    (kernel,) = example.kernels
    bwd = tritongrad.grad(kernel)
    assert (bwd.wrt, bwd.outputs) == ROLES[example.name]
    forward_params = tuple(inspect.signature(_function(kernel)).parameters)
    shadows = tuple(f"d_{p}" for p in (*bwd.outputs, *bwd.wrt))
    assert bwd.params[:len(forward_params) + len(shadows)] == (*forward_params, *shadows)
    assert bwd.shadow_params == dict(zip((*bwd.outputs, *bwd.wrt), shadows, strict=True))


def _function(kernel):
    return unwrap(kernel).fn


def test_gather_indices_carry_no_gradient():
    bwd = tritongrad.grad(gather.gather_kernel)
    assert "idx_ptr" not in bwd.wrt
    assert bwd.wrt == ("x_ptr", "w_ptr")
    assert "d_idx_ptr" not in bwd.params


# names each derived source must show: the forward's own variables, and their adjoints
SOURCE_NAMES = {
    "sin": ["offsets", "mask", "x", "d_output", "d_x"],
    "rmsnorm": ["row", "cols", "rstd", "mean_square", "d_y", "d_rstd", "d_x", "d_w"],
    "softmax": ["z", "y", "d_y", "d_z", "d_x"],
    "softplus": ["x", "d_y", "d_x"],
    "swiglu": ["a", "b", "d_y", "d_a", "d_b"],
    "matvec": ["offs_m", "offs_n", "offs_w", "mask_w", "mask_x", "d_out", "d_w", "d_x"],
    "matmul": ["offs_m", "offs_n", "offs_k", "a_ptrs", "b_ptrs", "d_c", "d_a", "d_b"],
    "transpose": ["rm", "rn", "d_y", "d_x", "d_s"],
    "gather": ["idx", "d_x", "d_w", "d_y"],
    "fn1": ["a", "b", "c", "d_z", "d_a", "d_b", "d_c", "d_x", "d_y"],
    "flash_attention": ["q", "k", "v", "s", "p", "alpha", "m_new", "d_acc", "d_l_i", "d_q", "d_k", "d_v"],
    "cross_entropy": ["target", "picked", "m_new", "d_loss", "d_s", "d_picked", "d_x"],
    "gelu": ["inner", "tanh", "d_tanh", "d_inner", "d_x"],
    "geglu": ["inner", "gelu", "d_gelu", "d_a", "d_b"],
    "layernorm": ["mean", "xc", "var", "rstd", "d_xc", "d_rstd", "d_x", "d_w", "d_b"],
    "add_rmsnorm": ["h", "rstd", "d_h", "d_rstd", "d_x", "d_r", "d_w"],
    "log_softmax": ["z", "d_y", "d_z", "d_x"],
    "rotary": ["pos", "x1", "x2", "cos1", "sin2", "d_x1", "d_x2", "d_cos1", "d_sin2"],
    "linear": ["offs_m", "offs_n", "offs_w", "mask_w", "mask_x", "d_out", "d_w", "d_x"],
}


@pytest.mark.parametrize("example", EXAMPLES, ids=IDS)
def test_source_reads_like_the_forward(example):
    (kernel,) = example.kernels
    fn = _function(kernel)
    src = tritongrad.grad(kernel).src
    forward_src = inspect.getsource(fn)
    # the text is the point (it reads like the forward): test_check_passes checks each example's gradients
    comments = re.findall(r"^ *# grad of: (.*)$", src, flags=re.M)
    assert comments, src
    module_src = inspect.getsource(sys.modules[fn.__module__])
    for line in comments:  # each comment quotes a line of the forward, or of a helper and its call site
        quoted, _, note = line.partition("  (")  # a helper's line says where it was called from
        if note.startswith("in "):
            helper, _, call = note.removeprefix("in ").removesuffix(")").partition(", from: ")
            assert f"def {helper}(" in module_src and quoted.strip() in module_src, line
            assert call.strip() in forward_src, line
        else:
            assert quoted.strip() in forward_src, line
    for name in SOURCE_NAMES[example.name]:
        assert re.search(rf"\b{name}\b", src), f"`{name}` missing from\n{src}"
    assert re.search(rf"def {fn.__name__}_bwd\w*\(", src)  # a kernel of its own per input: _bwd_a_ptr


# -- particular examples ----------------------------------------------------------------------


def test_matvec_matches_hand_written_backward(device):
    w, x = matvec.make_inputs(device=device, dtype=DTYPE)
    launch = matvec.matvec_launch(w, x)
    poison(launch.out)
    launch()
    d = torch.randn(w.shape[0], device=device, dtype=DTYPE)
    got = backward_launch(matvec.fwd_kernel, launch.grid, launch.args, launch.kwargs, {"out_ptr": d})
    dw, dx = matvec.matvec_backward(d, w, x)
    torch.testing.assert_close(got["w_ptr"], dw, **TOL)
    torch.testing.assert_close(got["x_ptr"], dx, **TOL)
    torch.testing.assert_close(dw, torch.outer(d, x), **TOL)  # the hand-written kernel itself is right
    torch.testing.assert_close(dx, d @ w, **TOL)


def test_gather_repeated_indices_accumulate(device):
    x, _, w = gather.make_inputs(device=device, dtype=DTYPE)
    n = w.numel()
    # every index repeats, within a program and across the 4 programs; some x get no gradient at all
    idx = torch.tensor([3, 3, 11, 0, 3, 11] * (n // 6) + [0] * (n % 6), device=device)
    launch = gather.gather_launch(x, idx, w)
    assert launch.grid[0] > 1
    got, want = derived_and_expected(launch, lambda x, w: x[idx] * w, {"x_ptr": x, "w_ptr": w})
    torch.testing.assert_close(got["x_ptr"], want["x_ptr"], **TOL)
    torch.testing.assert_close(got["w_ptr"], want["w_ptr"], **TOL)
    assert got["x_ptr"][[1, 2, 4]].eq(0).all()
    assert got["x_ptr"][3].abs() > 0


def test_gather_random_indices_have_repeats(device):
    _, idx, _ = gather.make_inputs(device=device, dtype=DTYPE)
    assert torch.unique(idx).numel() < idx.numel()


def test_gather_wrt_one_input(device):
    x, idx, w = gather.make_inputs(device=device, dtype=DTYPE)
    got, want = derived_and_expected(gather.gather_launch(x, idx, w), lambda x: x[idx] * w, {"x_ptr": x})
    assert set(got) == {"x_ptr"}
    torch.testing.assert_close(got["x_ptr"], want["x_ptr"], **TOL)


def test_rmsnorm_wrt_weights_only(device):
    x, w = rmsnorm.make_inputs(device=device, dtype=DTYPE)
    got, want = derived_and_expected(rmsnorm.rmsnorm_launch(x, w), lambda w: rmsnorm.reference(x, w), {"w_ptr": w})
    assert set(got) == {"w_ptr"}
    torch.testing.assert_close(got["w_ptr"], want["w_ptr"], **TOL)


def test_matmul_float32(device):
    tol = 1e-4 if device == "cpu" else 2e-2  # a float32 tl.dot is tf32 on the GPU, in forward and backward
    for size in matmul.SIZES:
        a, b, ta, tb = matmul.make_inputs(size, device=device, dtype=torch.float32)
        la, lb = a.clone().requires_grad_(), b.clone().requires_grad_()
        out = matmul.matmul(la, lb, ta, tb)
        ra, rb = a.clone().requires_grad_(), b.clone().requires_grad_()
        want = matmul.reference(ra, rb, ta, tb)
        torch.testing.assert_close(out, want, rtol=tol, atol=tol)
        g = torch.randn_like(want)
        for got, expected in zip(torch.autograd.grad(out, (la, lb), g), torch.autograd.grad(want, (ra, rb), g),
                                 strict=True):
            torch.testing.assert_close(got, expected, rtol=tol, atol=tol)


def test_softmax_large_inputs_stay_finite(device):
    (x,) = softmax.make_inputs(device=device, dtype=DTYPE)
    x = 500 * x  # exp(x) overflows without the max subtracted
    got, want = derived_and_expected(softmax.softmax_launch(x), softmax.reference, {"x_ptr": x})
    assert torch.isfinite(got["x_ptr"]).all()
    torch.testing.assert_close(got["x_ptr"], want["x_ptr"], **TOL)


def test_softplus_tails_stay_finite(device):
    x = torch.linspace(-800, 800, 301, device=device, dtype=DTYPE)  # exp(800) overflows float64
    launch = softplus.softplus_launch(x)
    poison(launch.out)
    torch.testing.assert_close(launch(), torch.logaddexp(x, torch.zeros_like(x)), **TOL)
    d_y = torch.randn_like(x)
    got = backward_launch(softplus.softplus_kernel, launch.grid, launch.args, launch.kwargs, {"y_ptr": d_y})
    # the exact derivative (torch's softplus switches to the identity above x = 20, so not its gradient)
    torch.testing.assert_close(got["x_ptr"], d_y * torch.sigmoid(x), **TOL)


def test_rmsnorm_raw_launch_convention(device):
    """``bwd[grid](*forward_args, *output_grads, *input_grads, **constexprs)``, without the testing helper."""
    x, w = rmsnorm.make_inputs(device=device, dtype=DTYPE)
    y = poison(torch.empty_like(x))
    rows, n = x.shape
    rstd = poison(torch.empty(rows, device=device, dtype=DTYPE))
    meta = {"BLOCK": 64, "COMPUTE": tl.float64}
    rmsnorm.rmsnorm_fwd[(rows,)](x, w, y, rstd, x.stride(0), n, 1e-6, **meta)
    d_y, d_rstd = torch.randn_like(y), torch.zeros_like(rstd)  # (the rstd it stores gets no gradient here)
    d_x, d_w = torch.zeros_like(x), torch.zeros_like(w)
    bwd = tritongrad.grad(rmsnorm.rmsnorm_fwd)
    bwd[(rows,)](x, w, y, rstd, x.stride(0), n, 1e-6, d_y, d_rstd, d_x, d_w, **meta)
    xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
    want_x, want_w = torch.autograd.grad(rmsnorm.reference(xr, wr), (xr, wr), d_y)
    torch.testing.assert_close(d_x, want_x, **TOL)
    torch.testing.assert_close(d_w, want_w, **TOL)
