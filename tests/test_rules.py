"""One test per derivative rule: a tiny kernel applying it, against torch autograd.

The kernels are written from templates into a module file (their source must be
readable, as users' kernels are), over tiles whose sizes are not powers of two, with
NaN-poisoned outputs and random upstream gradients, in float64.
"""

import ast
import importlib.util
import itertools

import pytest
import torch

import tritongrad
from tritongrad.tools.testing import backward_launch, poison

R, C = 5, 11  # tile sizes, masked inside blocks of 8 x 16
RB, CB = 8, 16

# name: (expression of x and y over (RB, CB) tiles, torch reference, domain)
ELEMENTWISE = {
    "add": ("x + y", lambda x, y: x + y, "any"),
    "sub": ("x - y", lambda x, y: x - y, "any"),
    "mul": ("x * y", lambda x, y: x * y, "any"),
    "truediv": ("x / y", lambda x, y: x / y, "positive"),
    "neg": ("-x + y", lambda x, y: -x + y, "any"),
    "constant_ops": ("2.0 * x - x / 3.0 + 1.5", lambda x, y: 2.0 * x - x / 3.0 + 1.5, "any"),
    "exp": ("tl.exp(x)", lambda x, y: torch.exp(x), "any"),
    "exp2": ("tl.exp2(x)", lambda x, y: torch.exp2(x), "any"),
    "log": ("tl.log(x)", lambda x, y: torch.log(x), "positive"),
    "log2": ("tl.log2(x)", lambda x, y: torch.log2(x), "positive"),
    "sqrt": ("tl.sqrt(x)", lambda x, y: torch.sqrt(x), "positive"),
    "rsqrt": ("tl.rsqrt(x)", lambda x, y: torch.rsqrt(x), "positive"),
    "sin": ("tl.sin(x)", lambda x, y: torch.sin(x), "any"),
    "cos": ("tl.cos(x)", lambda x, y: torch.cos(x), "any"),
    "sigmoid": ("tl.sigmoid(x)", lambda x, y: torch.sigmoid(x), "any"),
    "erf": ("tl.erf(x)", lambda x, y: torch.erf(x), "any"),
    "abs": ("tl.abs(x)", lambda x, y: torch.abs(x), "any"),
    "fma": ("tl.fma(x, y, x)", lambda x, y: x * y + x, "any"),
    "div_rn": ("tl.div_rn(x, y)", lambda x, y: x / y, "positive"),
    "maximum": ("tl.maximum(x, y)", torch.maximum, "ties"),
    "minimum": ("tl.minimum(x, y)", torch.minimum, "ties"),
    "maximum_constant": ("tl.maximum(x, 0.0)", lambda x, y: torch.clamp_min(x, 0.0), "any"),
    "where": ("tl.where(x > y, x * y, y - x)", lambda x, y: torch.where(x > y, x * y, y - x), "any"),
    "clamp": ("tl.clamp(x, -0.5, 0.5)", lambda x, y: torch.clamp(x, -0.5, 0.5), "any"),
    "cast": ("x.to(tl.float32).to(tl.float64) * y", lambda x, y: x.float().double() * y, "any"),
    "cast_runtime_dtype": ("x.to(y.dtype) * y", lambda x, y: x * y, "any"),
    "cast_to_int_blocks_gradient": ("x.to(tl.int32).to(tl.float64) * y", lambda x, y: x.int().double() * y, "any"),
    "broadcast_rows": ("x * tl.sum(tl.where(mask, y, 0.0), axis=1)[:, None]",
                       lambda x, y: x * y.sum(1, keepdim=True), "any"),
    "broadcast_to": ("tl.broadcast_to(tl.sum(tl.where(mask, x, 0.0), axis=0, keep_dims=True), (RB, CB)) * y",
                     lambda x, y: x.sum(0, keepdim=True) * y, "any"),
    "expand_dims": ("tl.expand_dims(tl.sum(tl.where(mask, x, 0.0), axis=1), 1) * y",
                    lambda x, y: x.sum(1, keepdim=True) * y, "any"),
    "reshape": ("tl.reshape(tl.reshape(x, (CB, RB)) * 2.0, (RB, CB)) + y", lambda x, y: 2 * x + y, "any"),
    "trans": ("tl.trans(tl.trans(x) * 3.0) * y", lambda x, y: 3 * x * y, "any"),
    "T": ("(x.T * 3.0).T * y", lambda x, y: 3 * x * y, "any"),
    "permute": ("tl.permute(tl.permute(x, (1, 0)) * 3.0, (1, 0)) * y", lambda x, y: 3 * x * y, "any"),
    "method_exp": ("x.exp() * y", lambda x, y: x.exp() * y, "any"),
    "view": ("tl.reshape(tl.view(x, (RB * CB,)) * 2.0, (RB, CB)) + y", lambda x, y: 2 * x + y, "any"),
    "sqrt_rn": ("tl.sqrt_rn(x) * y", lambda x, y: torch.sqrt(x) * y, "positive"),
    "fdiv": ("tl.fdiv(x, y)", lambda x, y: x / y, "positive"),
    # a tile of one runtime value, and compiler hints returning their operand (gave no gradient before)
    "full": ("tl.full((RB, CB), tl.sum(tl.where(mask, y, 0.0)), tl.float64) * x", lambda x, y: y.sum() * x, "any"),
    "multiple_of": ("tl.multiple_of(x, [1, 1]) * y", lambda x, y: x * y, "any"),
    "max_contiguous": ("tl.max_contiguous(x, [1, 1]) * y", lambda x, y: x * y, "any"),
    "max_constancy": ("tl.max_constancy(x * x, [1, 1]) + y", lambda x, y: x * x + y, "any"),
}

# name: (expression, torch reference, output kind, `other` for masked lanes, domain)
REDUCTIONS = {
    "sum_all": ("tl.sum(x)", lambda x: x.sum(), "scalar", "0.0", "any"),
    "sum_axis0": ("tl.sum(x, axis=0)", lambda x: x.sum(0), "cols", "0.0", "any"),
    "sum_axis1": ("tl.sum(x * x, axis=1)", lambda x: (x * x).sum(1), "rows", "0.0", "any"),
    "sum_keep_dims": ("tl.sum(x, axis=1, keep_dims=True) * x", lambda x: x.sum(1, keepdim=True) * x, "tile", "0.0",
                      "any"),
    "max_axis1": ("tl.max(x, axis=1)", lambda x: x.amax(1), "rows", "-float('inf')", "ties"),
    "max_axis0": ("tl.max(x, axis=0)", lambda x: x.amax(0), "cols", "-float('inf')", "ties"),
    "min_axis1": ("tl.min(x, axis=1)", lambda x: x.amin(1), "rows", "float('inf')", "ties"),
    "max_all": ("tl.max(x)", lambda x: x.amax(), "scalar", "-float('inf')", "ties"),
    "method_sum": ("x.sum(axis=0)", lambda x: x.sum(0), "cols", "0.0", "any"),
    # tl.reduce with a combine function recognized as a sum, max or min
    "reduce_add": ("tl.reduce(x, 1, _add)", lambda x: x.sum(1), "rows", "0.0", "any"),
    "reduce_maximum": ("tl.reduce(x, 0, _maximum)", lambda x: x.amax(0), "cols", "-float('inf')", "ties"),
    "reduce_minimum_keep_dims": ("tl.reduce(tl.where(mask, x, 1e30), 1, _minimum, keep_dims=True) * x",
                                 lambda x: x.amin(1, True) * x, "tile", "0.0", "any"),
    # scans, forwards and backwards along either axis; cumprod over inputs with zeros, some twice in a row
    "cumsum_axis1": ("tl.cumsum(x, axis=1)", lambda x: x.cumsum(1), "tile", "0.0", "any"),
    "cumsum_reverse_axis0": ("tl.cumsum(x, 0, reverse=True) * x", lambda x: x.flip(0).cumsum(0).flip(0) * x,
                             "tile", "0.0", "any"),
    "cumprod_axis1": ("tl.cumprod(x, axis=1)", lambda x: x.cumprod(1), "tile", "1.0", "zeros"),
    "cumprod_reverse_axis1": ("tl.cumprod(x, 1, reverse=True)", lambda x: x.flip(1).cumprod(1).flip(1), "tile",
                              "1.0", "zeros"),
    "cumprod_axis0": ("tl.cumprod(x, axis=0)", lambda x: x.cumprod(0), "tile", "1.0", "any"),
}

STORE = {
    "tile": ("y_ptr + rows[:, None] * C + cols[None, :]", "mask"),
    "rows": ("y_ptr + rows", "rows < R"),
    "cols": ("y_ptr + cols", "cols < C"),
    "scalar": ("y_ptr", None),
}

HEADER = f'''
import triton
import triton.language as tl

R, C, RB, CB = tl.constexpr({R}), tl.constexpr({C}), tl.constexpr({RB}), tl.constexpr({CB})


@triton.jit
def _add(a, b):
    return a + b


@triton.jit
def _maximum(a, b):
    return tl.maximum(b, a)


@triton.jit
def _minimum(a, b):
    return tl.minimum(a, b)
'''

ELEMENTWISE_KERNEL = '''
@triton.jit
def k_{name}(x_ptr, y_ptr, z_ptr):
    rows = tl.arange(0, RB)
    cols = tl.arange(0, CB)
    mask = (rows[:, None] < R) & (cols[None, :] < C)
    offs = rows[:, None] * C + cols[None, :]
    x = tl.load(x_ptr + offs, mask=mask, other=1.0)
    y = tl.load(y_ptr + offs, mask=mask, other=1.0)
    tl.store(z_ptr + offs, {expr}, mask=mask)
'''

REDUCTION_KERNEL = '''
@triton.jit
def k_{name}(x_ptr, y_ptr):
    rows = tl.arange(0, RB)
    cols = tl.arange(0, CB)
    mask = (rows[:, None] < R) & (cols[None, :] < C)
    x = tl.load(x_ptr + rows[:, None] * C + cols[None, :], mask=mask, other={other})
    tl.store({address}, {expr}{mask})
'''


@pytest.fixture(scope="module")
def kernels(tmp_path_factory):
    src = [HEADER]
    for name, (expr, *_) in ELEMENTWISE.items():
        src.append(ELEMENTWISE_KERNEL.format(name=name, expr=expr))
    for name, (expr, _, out, other, _) in REDUCTIONS.items():
        address, mask = STORE[out]
        src.append(REDUCTION_KERNEL.format(name=name, expr=expr, other=other, address=address,
                                           mask=f", mask={mask}" if mask else ""))
    path = tmp_path_factory.mktemp("rules") / "rule_kernels.py"
    path.write_text("".join(src))
    spec = importlib.util.spec_from_file_location("rule_kernels", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def sample(domain, *shape):
    x = torch.randn(*shape, dtype=torch.float64)
    if domain == "positive":
        return x.abs() + 0.5
    if domain == "ties":  # few distinct values, so maxima and minima tie
        return torch.randint(-2, 3, shape).double() / 2
    if domain == "zeros":  # zeros alone and in pairs along rows
        x[:, 2] = 0.0
        x[1::2, 5:7] = 0.0
    return x


# Triton has these for float32 only: div_rn, sqrt_rn, fdiv (interpreter), clamp (the GPU compiler)
FLOAT32_ONLY = {"div_rn", "clamp", "sqrt_rn", "fdiv"}
# a float32 round trip rounds torch's gradient to float32; tritongrad keeps it in float64
TOLERANCE = {"cast": 1e-6}


def close(got, want, tol=1e-9):
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)


@pytest.mark.parametrize("name", ELEMENTWISE)
def test_elementwise_rule(kernels, name):
    expr, reference, domain = ELEMENTWISE[name]
    kernel = getattr(kernels, f"k_{name}")
    dtype = torch.float32 if name in FLOAT32_ONLY else torch.float64
    tol = 1e-5 if name in FLOAT32_ONLY else TOLERANCE.get(name, 1e-9)
    x, y = sample(domain, R, C).to(dtype), sample(domain, R, C).to(dtype)
    z = poison(torch.empty(R, C, dtype=dtype))
    kernel[(1,)](x, y, z)
    xs, ys = x.clone().requires_grad_(), y.clone().requires_grad_()
    want = reference(xs, ys)
    close(z, want.detach(), tol)
    dz = torch.randn(R, C, dtype=dtype)
    want_grads = torch.autograd.grad(want, [xs, ys], dz, allow_unused=True)
    got = backward_launch(kernel, (1,), (x, y, z), {}, {"z_ptr": dz}, wrt=("x_ptr", "y_ptr"))
    for param, want_grad in zip(("x_ptr", "y_ptr"), want_grads, strict=True):
        close(got[param], want_grad if want_grad is not None else torch.zeros_like(x), tol)


@pytest.mark.parametrize("name", REDUCTIONS)
def test_reduction_rule(kernels, name):
    expr, reference, out, _, domain = REDUCTIONS[name]
    kernel = getattr(kernels, f"k_{name}")
    x = sample(domain, R, C)
    xs = x.clone().requires_grad_()
    want = reference(xs)
    y = poison(torch.empty(want.shape, dtype=torch.float64))
    kernel[(1,)](x, y)
    close(y, want.detach())
    dy = torch.randn(want.shape, dtype=torch.float64)
    (want_grad,) = torch.autograd.grad(want, [xs], dy)
    got = backward_launch(kernel, (1,), (x, y), {}, {"y_ptr": dy})
    close(got["x_ptr"], want_grad)


def test_max_ties_share_the_gradient_evenly(kernels):
    x = torch.tensor([[1.0, 3.0, 3.0, 2.0, 3.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]] * R, dtype=torch.float64)
    y = torch.empty(R, dtype=torch.float64)
    dy = torch.randn(R, dtype=torch.float64)
    got = backward_launch(kernels.k_max_axis1, (1,), (x, y), {}, {"y_ptr": dy})["x_ptr"]
    close(got[:, 1], dy / 3)
    close(got[:, 0], torch.zeros(R, dtype=torch.float64))


def test_every_rule_has_a_test():
    from tritongrad.core.operations import OPERATIONS

    RULES = {k for k, o in OPERATIONS.items() if o.has_rule}

    tested = {name for name in itertools.chain(ELEMENTWISE, REDUCTIONS)}
    # copy, subscript, cast: in every kernel here; dot: test_kernels (matmul) and test_features;
    # pow, pos: Triton tensors have no `**` or unary `+` today, so no kernel reaches these rules
    # linear_scan, item: test_scans; join, split: test_join_split; libdevice (GPU only): test_libdevice;
    # softmax (tl.softmax, and one written out): test_stored_outputs
    kinds = {"copy", "cast", "dot", "subscript", "pow", "pos", "linear_scan", "item", "join", "split",
             "tanh", "log1p", "expm1", "fpow", "softmax"}
    covered = {k for k in RULES if any(k == t or t.startswith(k) or t.endswith(k) for t in tested)} | kinds
    assert set(RULES) <= covered, sorted(set(RULES) - covered)


def test_backward_kernel_parameters_follow_the_convention(kernels):
    bwd = tritongrad.grad(kernels.k_mul)
    assert bwd.params == ("x_ptr", "y_ptr", "z_ptr", "d_z_ptr", "d_x_ptr", "d_y_ptr")
    assert bwd.shadow_params == {"z_ptr": "d_z_ptr", "x_ptr": "d_x_ptr", "y_ptr": "d_y_ptr"}
    # the text is the point (the calling convention): test_elementwise_rule[mul] checks this kernel's gradients
    assert "# grad of: tl.store(z_ptr + offs, x * y, mask=mask)" in bwd.src


def test_integer_math_a_launch_check_redoes_agrees_with_the_kernel():
    """operations' ``on_host`` (launch conditions evaluated on the host) divides as a kernel does: C's
    truncation toward zero for ``//``, ``%`` and ``tl.cdiv`` (the quotient is the host's floor only for
    operands of one sign)."""
    import triton
    import triton.language as tl

    from tritongrad.core.operations import OPERATIONS

    @triton.jit
    def divide(out, a, b):
        tl.store(out, a // b)
        tl.store(out + 1, a % b)
        tl.store(out + 2, tl.cdiv(a, b))

    got = torch.zeros(3, dtype=torch.int32)
    for a, b in itertools.product((-7, -5, -4, -1, 0, 3, 5, 8), (-4, -3, 2, 3, 4)):
        divide[(1,)](got, a, b)
        host = [OPERATIONS[op].on_host(a, b) for op in ("floordiv", "mod", "cdiv")]
        assert host == got.tolist(), (a, b)


def test_a_hint_the_interpreter_left_replaced_is_still_known(monkeypatch):
    """Triton's interpreter replaces `tl.multiple_of` and the other hints by a `functools.partial` of its own while a
    kernel runs, and leaves it so where the kernel raised (a refusal inside a launch): the name still says which
    operation it is (it was a call without a rule, refused, in every kernel derived after)."""
    import functools

    import triton.language as tl

    from tritongrad.core.source import triton_language_name

    def _set_attr(input, values, name):  # the interpreter's stand-in
        return input

    _set_attr.__module__ = "triton.runtime.interpreter"
    monkeypatch.setattr(tl, "multiple_of", functools.partial(_set_attr, name="tt.divisibility"))
    spelled = ast.parse("tl.multiple_of", mode="eval").body
    assert triton_language_name(tl.multiple_of, spelled) == "multiple_of"
