"""A 2-D convolution written as an implicit GEMM: the output pixel of each row of the product split
from its flat index by `//` and `%` (`n = offs_m // (OH * OW)`, `oh = (offs_m // OW) % OH`, `ow = offs_m % OW`,
analysis/radix.py), the input gathered at im2col addresses with stride and padding as masks, `tl.dot` over the
K = C * KH * KW reduction against weights laid out (K, Cout), the output stored NCHW or NHWC.

Float64 against torch.nn.functional.conv2d, random inputs, sizes that are not powers of two, NaN-poisoned
outputs; the kernel alone (`tritongrad.grad`), and the bare and named ops; blocks of 16 so that `tl.dot`
compiles for float64 on a GPU.
"""

import functools
import random

import pytest
import torch
import triton
import triton.language as tl
from test_refusals import marked_line

import tritongrad
from tritongrad import NotDifferentiableError
from tritongrad.analysis.forms import Digit, Lane, form_of_terms
from tritongrad.analysis.radix import undetermined
from tritongrad.tools.testing import assert_gradients_match, backward_launch, poison

D = torch.float64
BLOCKS = {"BM": 16, "BN": 16, "BK": 16}


@triton.jit
def conv2d_im2col(x_ptr, w_ptr, y_ptr, N, C, H, W, COUT, OH, OW,
                  sxn, sxc, sxh, sxw, swk, swn, syn, syc, syh, syw,
                  STRIDE_H, STRIDE_W, PAD_H, PAD_W, KH: tl.constexpr, KW: tl.constexpr,
                  BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    """y[n, co, oh, ow] = sum over (c, kh, kw) of x[n, c, oh * s - p + kh, ow * s - p + kw] * w[(c, kh, kw), co]:
    rows of the product are output pixels (n, oh, ow), columns output channels, the reduction (c, kh, kw)."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    M = N * OH * OW
    K = C * KH * KW
    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_n = pid_n * BN + tl.arange(0, BN)
    n = offs_m // (OH * OW)
    oh = (offs_m // OW) % OH
    ow = offs_m % OW
    acc = tl.zeros((BM, BN), dtype=tl.float64)
    for k0 in range(0, K, BK):
        offs_k = k0 + tl.arange(0, BK)
        c = offs_k // (KH * KW)
        kh = (offs_k // KW) % KH
        kw = offs_k % KW
        ih = oh[:, None] * STRIDE_H - PAD_H + kh[None, :]
        iw = ow[:, None] * STRIDE_W - PAD_W + kw[None, :]
        a_mask = (offs_m[:, None] < M) & (offs_k[None, :] < K) & (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)
        a = tl.load(x_ptr + n[:, None] * sxn + c[None, :] * sxc + ih * sxh + iw * sxw, mask=a_mask, other=0.0)
        b = tl.load(w_ptr + offs_k[:, None] * swk + offs_n[None, :] * swn,
                    mask=(offs_k[:, None] < K) & (offs_n[None, :] < COUT), other=0.0)
        acc += tl.dot(a, b)
    y_mask = (offs_m[:, None] < M) & (offs_n[None, :] < COUT)
    y_ptrs = y_ptr + n[:, None] * syn + offs_n[None, :] * syc + oh[:, None] * syh + ow[:, None] * syw
    tl.store(y_ptrs, acc, mask=y_mask)  # refused


def out_size(size: int, kernel: int, stride: int, padding: int) -> int:
    return (size + 2 * padding - kernel) // stride + 1


def launch_args(x, w_kc, y, kh, kw, stride, padding, nhwc, ow=None):
    """The kernel's grid, arguments and constexprs; ``y`` (N, OH, OW, Cout) where ``nhwc``, else (N, Cout, OH,
    OW); ``ow``: the output width passed, where not ``y``'s."""
    n, c, h, w = x.shape
    cout = w_kc.shape[1]
    oh, ow_real = (y.shape[1], y.shape[2]) if nhwc else (y.shape[2], y.shape[3])
    ow = ow_real if ow is None else ow
    syn, syc, syh, syw = (y.stride(0), y.stride(3), y.stride(1), y.stride(2)) if nhwc else y.stride()
    grid = (triton.cdiv(n * oh * ow, BLOCKS["BM"]), triton.cdiv(cout, BLOCKS["BN"]))
    args = (x, w_kc, y, n, c, h, w, cout, oh, ow, *x.stride(), *w_kc.stride(), syn, syc, syh, syw,
            stride[0], stride[1], padding[0], padding[1])
    return grid, args, {"KH": kh, "KW": kw, **BLOCKS}


def conv2d(x: torch.Tensor, weight: torch.Tensor, stride: int, padding: int, nhwc: bool) -> torch.Tensor:
    """The host function: weight (Cout, C, KH, KW) read as (K, Cout) through a transposed view, the output NCHW,
    or NHWC (returned as the NHWC tensor)."""
    cout, _, kh, kw = weight.shape
    n, _, h, w = x.shape
    oh, ow = out_size(h, kh, stride, padding), out_size(w, kw, stride, padding)
    y = torch.empty((n, oh, ow, cout) if nhwc else (n, cout, oh, ow), dtype=x.dtype, device=x.device)
    grid, args, meta = launch_args(x, weight.reshape(cout, -1).t(), y, kh, kw, (stride, stride), (padding, padding),
                                   nhwc)
    conv2d_im2col[grid](*args, **meta)
    return y


OPS = {"bare": tritongrad.op(conv2d), "named": tritongrad.op("tgtest_im2col::conv2d")(conv2d)}


def reference(x, weight, stride, padding, nhwc):
    y = torch.nn.functional.conv2d(x, weight, stride=stride, padding=padding)
    return y.permute(0, 2, 3, 1) if nhwc else y


# (batch, channels in, channels out, height, width, kernel (KH, KW), stride (h, w), padding (h, w))
SHAPES = [
    (2, 3, 5, 7, 6, (3, 3), (1, 1), (1, 1)),
    (3, 2, 17, 9, 5, (2, 3), (2, 1), (0, 1)),
    (1, 5, 3, 6, 11, (1, 1), (1, 2), (0, 0)),
]
LAYOUTS = pytest.mark.parametrize("nhwc", [False, True], ids=["nchw", "nhwc"])


def kernel_case(batch, cin, cout, h, w, k, stride, padding, nhwc):
    """Inputs, a poisoned output and the launch for one convolution: x (N, C, H, W), weights (K, Cout)."""
    x = torch.randn(batch, cin, h, w, dtype=D)
    w_kc = torch.randn(cin * k[0] * k[1], cout, dtype=D)
    oh, ow = out_size(h, k[0], stride[0], padding[0]), out_size(w, k[1], stride[1], padding[1])
    y = poison(torch.empty((batch, oh, ow, cout) if nhwc else (batch, cout, oh, ow), dtype=D))
    return x, w_kc, y


def assert_kernel_matches(x, w_kc, y, k, stride, padding, nhwc):
    """The forward against conv2d, and the derived gradients of x and the (K, Cout) weights against autograd's."""
    grid, args, meta = launch_args(x, w_kc, y, k[0], k[1], stride, padding, nhwc)
    conv2d_im2col[grid](*args, **meta)
    xs, ws = x.detach().clone().requires_grad_(), w_kc.detach().clone().requires_grad_()
    weight = ws.t().reshape(w_kc.shape[1], x.shape[1], *k)
    want = torch.nn.functional.conv2d(xs, weight, stride=stride, padding=padding)
    want = want.permute(0, 2, 3, 1) if nhwc else want
    torch.testing.assert_close(y, want.detach(), rtol=1e-10, atol=1e-10)
    assert_gradients_match(conv2d_im2col, grid, args, meta, y, want, [xs, ws], ["x_ptr", "w_ptr"])


@LAYOUTS
@pytest.mark.parametrize("shape", SHAPES, ids=["3x3-pad1", "2x3-stride2", "1x1-stride-w2"])
def test_the_kernel_alone_gets_conv2ds_gradients(shape, nhwc):
    batch, cin, cout, h, w, k, stride, padding = shape
    x, w_kc, y = kernel_case(batch, cin, cout, h, w, k, stride, padding, nhwc)
    assert_kernel_matches(x, w_kc, y, k, stride, padding, nhwc)


def test_the_kernel_alone_with_views_of_one_storage():
    """The input channels-last (a permuted view) and the weights a transposed view of (Cout, K), both in one
    storage."""
    batch, cin, cout, h, w, k = 2, 3, 19, 6, 7, (3, 2)
    kk = cin * k[0] * k[1]
    buffer = torch.randn(batch * h * w * cin + cout * kk, dtype=D)
    x = buffer[:batch * h * w * cin].view(batch, h, w, cin).permute(0, 3, 1, 2)
    w_kc = buffer[batch * h * w * cin:].view(cout, kk).t()
    y = poison(torch.empty(batch, cout, h - 2, w - 1, dtype=D))
    assert_kernel_matches(x, w_kc, y, k, (1, 1), (0, 0), False)


def assert_op_matches(op, leaves, bind, stride, padding, nhwc):
    """The op's output and its leaves' gradients against conv2d's, the arguments made from the leaves by
    ``bind`` (views, expansions) for both."""
    got = op(*bind(*leaves), stride, padding, nhwc)
    want = reference(*bind(*leaves), stride, padding, nhwc)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    g = torch.randn_like(want)
    for a, b in zip(torch.autograd.grad(got, leaves, g), torch.autograd.grad(want, leaves, g), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("kind", OPS)
@LAYOUTS
def test_the_op_gets_conv2ds_gradients(kind, nhwc):
    for batch, cin, cout, h, w, (kh, kw), (stride, _), (padding, _) in SHAPES[:2]:
        x = torch.randn(batch, cin, h, w, dtype=D, requires_grad=True)
        weight = torch.randn(cout, cin, kh, kw, dtype=D, requires_grad=True)
        assert_op_matches(OPS[kind], (x, weight), lambda a, b: (a, b), stride, padding, nhwc)


def one_storage(buffer):
    """A channels-last input (2, 3, 7, 6) and weights (5, 3, 3, 2) viewing one buffer."""
    x = buffer[:2 * 7 * 6 * 3].view(2, 7, 6, 3).permute(0, 3, 1, 2)
    return x, buffer[2 * 7 * 6 * 3:].view(5, 3, 3, 2)


BINDINGS = {
    "channels-last input": (lambda: (torch.randn(2, 7, 6, 3, dtype=D), torch.randn(5, 3, 3, 2, dtype=D)),
                            lambda x, w: (x.permute(0, 3, 1, 2), w)),
    "weights expanded along Cout": (lambda: (torch.randn(2, 3, 7, 6, dtype=D), torch.randn(1, 3, 3, 2, dtype=D)),
                                    lambda x, w: (x, w.expand(17, 3, 3, 2))),
    "one storage": (lambda: (torch.randn(2 * 7 * 6 * 3 + 5 * 3 * 3 * 2, dtype=D),), one_storage),
    "the same tensor twice": (lambda: (torch.randn(3, 3, 3, 3, dtype=D),), lambda t: (t, t)),
}


@pytest.mark.parametrize("kind", OPS)
@pytest.mark.parametrize("binding", BINDINGS)
def test_the_op_however_its_arguments_are_bound(kind, binding):
    make, bind = BINDINGS[binding]
    leaves = tuple(t.requires_grad_() for t in make())
    assert_op_matches(OPS[kind], leaves, bind, 1, 1, binding == "one storage")


# -- refused: lanes that really write one element ----------------------------------------------------------


@triton.jit
def width_split_short(x_ptr, y_ptr, M, OH, OW, syn, syh, syw, BM: tl.constexpr):
    """Output pixels split with the width's remainder taken by OW - 1: lanes 0 and OW - 1 both land on pixel
    (0, 0, 0)."""
    offs_m = tl.program_id(0) * BM + tl.arange(0, BM)
    n = offs_m // (OH * OW)
    oh = (offs_m // OW) % OH
    ow = offs_m % (OW - 1)
    x = tl.load(x_ptr + offs_m, mask=offs_m < M, other=0.0)
    tl.store(y_ptr + n * syn + oh * syh + ow * syw, x * x, mask=offs_m < M)  # refused


@triton.jit
def row_split_only(x_ptr, y_ptr, M, OH, OW, syn, syh, BM: tl.constexpr):
    """The row index split into its batch and row digits, the column left out: the lanes of one row share it."""
    offs_m = tl.program_id(0) * BM + tl.arange(0, BM)
    row = offs_m // OW
    x = tl.load(x_ptr + offs_m, mask=offs_m < M, other=0.0)
    tl.store(y_ptr + (row // OH) * syn + (row % OH) * syh, x * x, mask=offs_m < M)  # refused


@triton.jit
def pixel_split_only(x_ptr, y_ptr, M, H, W, syh, syw, BM: tl.constexpr):
    """The pixel index of each image split into row and column, the image left out: images share their pixels."""
    offs_m = tl.program_id(0) * BM + tl.arange(0, BM)
    hw = offs_m % (H * W)
    x = tl.load(x_ptr + offs_m, mask=offs_m < M, other=0.0)
    tl.store(y_ptr + (hw // W) * syh + (hw % W) * syw, x * x, mask=offs_m < M)  # refused


@pytest.mark.parametrize("kernel, missing", [
    (width_split_short, "`((lane axis 0 + BM * tl.program_id(0)) // OW) % OH` without the other digit "
                        "`(lane axis 0 + BM * tl.program_id(0)) % OW`"),
    (row_split_only, "without the other digit `(lane axis 0 + BM * tl.program_id(0)) % OW`"),
    (pixel_split_only, "without the other digit `(lane axis 0 + BM * tl.program_id(0)) // (H * W)`"),
], ids=["width-by-OW-minus-1", "row-split-alone", "pixel-split-alone"])
def test_a_split_that_does_not_determine_the_pixel_is_refused(kernel, missing):
    with pytest.raises(NotDifferentiableError, match="may fold lanes together") as info:
        tritongrad.grad(kernel)
    assert missing in info.value.construct, str(info.value)
    assert info.value.line == marked_line(kernel)


def test_an_output_width_larger_than_the_tensors_is_refused_at_launch():
    """The host computes OW without the stride (9 where the output is 5 wide): pixel (oh, 5..8) of a row lands on
    (oh + 1, 0..3), two lanes on one element."""
    x, w_kc, y = kernel_case(2, 3, 5, 9, 9, (3, 3), (2, 2), (1, 1), False)
    grid, args, meta = launch_args(x, w_kc, y, 3, 3, (2, 2), (1, 1), False, ow=9)
    with pytest.raises(NotDifferentiableError, match="two lanes or programs reach one element") as info:
        backward_launch(conv2d_im2col, grid, args, meta, {"y_ptr": torch.randn_like(y)})
    assert info.value.line == marked_line(conv2d_im2col)


# -- the rule itself against brute force --------------------------------------------------------------------


@functools.cache
def digit_values(digit: Digit) -> tuple[int, ...]:
    """The digit's value at each lane index 0..287 (past every product of the divisors drawn)."""
    dividend = [sum(c[0] * (x if isinstance(k, Lane) else digit_values(k)[x]) for k, c in digit.dividend.terms)
                for x in range(288)]
    divisor = int(eval(digit.divisor))  # (literal products: "2 * 3")
    return tuple(v // divisor if digit.quotient else v % divisor for v in dividend)


def random_digits(rng) -> list[Digit]:
    """Digits of a lane index: a mixed-radix split (the index, then digits, split into quotient and remainder
    again, a quotient of a quotient sometimes spelled as one division by the product), or, as often, one digit
    changed (a divisor, dropped, a quotient for a remainder) or any digits of digits at all. Divisors literal."""
    index = form_of_terms({Lane(0): (1, ())}, 1)
    divisors = ["2", "3", "4", "6", "2 * 3", "3 * 2", "2 * 2"]
    if rng.random() < 0.25:
        made: list[Digit] = []
        for _ in range(rng.randint(1, 5)):
            dividend = index if not made or rng.random() < 0.4 else form_of_terms({rng.choice(made): (1, ())}, 1)
            made.append(Digit(dividend, rng.choice(divisors), rng.random() < 0.5))
        return rng.sample(made, rng.randint(1, len(made)))
    digits: list[Digit] = []
    pending = [index]
    for _ in range(rng.randint(1, 3)):
        value = pending.pop(rng.randrange(len(pending)))
        d = rng.choice(divisors)
        inner = value.terms[0][0]
        if isinstance(inner, Digit) and inner.quotient and rng.random() < 0.5:
            quotient = Digit(inner.dividend, f"{inner.divisor} * {d}", True)  # (x // a) // d as x // (a * d)
        else:
            quotient = Digit(value, d, True)
        pending += [form_of_terms({quotient: (1, ())}, 1), form_of_terms({Digit(value, d, False): (1, ())}, 1)]
    digits = [v.terms[0][0] for v in pending]
    if rng.random() < 0.5:
        k = rng.randrange(len(digits))
        changed = rng.choice(["divisor", "drop", "flip"])
        if changed == "divisor":
            digits[k] = Digit(digits[k].dividend, rng.choice(divisors), digits[k].quotient)
        elif changed == "drop":
            del digits[k]
        else:
            digits[k] = digits[k].partner
    return digits


def test_digits_accepted_determine_their_index():
    """Whenever radix.undetermined accepts a set of digits of a lane index, distinct index values keep distinct
    digits (over 0..287); and the spellings of one three-digit split are accepted."""
    rng = random.Random(52)
    accepted = 0
    for _ in range(2000):
        digits = random_digits(rng)
        if undetermined(digits) is None:
            accepted += 1
            assert len(set(zip(*(digit_values(d) for d in digits), strict=True))) == 288, [str(d) for d in digits]
    assert accepted > 500
    x = form_of_terms({Lane(0): (1, ())}, 1)

    def of(digit):
        return form_of_terms({digit: (1, ())}, 1)

    hw, q = Digit(x, "3 * 4", False), Digit(x, "4", True)
    for split in ([Digit(x, "3 * 4", True), Digit(of(q), "3", False), Digit(x, "4", False)],  # im2col's
                  [Digit(x, "12", True), Digit(of(hw), "4", True), Digit(of(hw), "4", False)],  # hw split again
                  [Digit(of(q), "3", True), Digit(of(q), "3", False), Digit(x, "4", False)],  # the quotient split
                  [Digit(x, "4 * 3", True), Digit(of(Digit(x, "4 * 3", False)), "4", True), Digit(x, "4", False)]):
        assert undetermined(split) is None, [str(d) for d in split]
