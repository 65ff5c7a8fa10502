"""How a call binds memory: the same tensor twice, views of one storage, expanded (stride-0)
inputs, a stride the host passes as 0. Every write strategy checks at launch the facts it needs
(launch_facts.py, the write strategies' conditions); each case here gave a silently wrong gradient or a crash
before, and now gives PyTorch's gradient, in float64, against a plain-PyTorch reference."""

import math
import random

import pytest
import torch
import triton
import triton.language as tl

import tritongrad
from tritongrad import NotDifferentiableError
from tritongrad.core.errors import OpError
from tritongrad.examples import get
from tritongrad.examples.layernorm import layernorm_launch
from tritongrad.examples.rmsnorm import rmsnorm_launch
from tritongrad.tools.testing import backward_launch
from tritongrad.writes.launch_facts import Layout, buffer_facts, overlap, self_overlapping

D = torch.float64


def gradients(fn, leaves, build, seed=1):
    """The leaves' gradients of ``sum(fn(*build(leaves)) * g)`` for a fixed random ``g``."""
    copies = [x.detach().clone().requires_grad_() for x in leaves]
    y = fn(*build(copies))
    g = torch.randn(y.shape, dtype=y.dtype, device=y.device,
                    generator=torch.Generator(device=y.device).manual_seed(seed))
    (y * g).sum().backward()
    return [x.grad for x in copies]


def assert_binding(fn, reference, leaves, build):
    for got, want in zip(gradients(fn, leaves, build), gradients(reference, leaves, build), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9)


M, N = 7, 45
ALIASED = {  # example, leaves, how the op's arguments are made from them
    "weight is a row of x": ("rmsnorm", lambda: [torch.randn(M, N, dtype=D)], lambda x: (x, x[0])),
    "tied weight and bias": ("layernorm", lambda: [torch.randn(M, N, dtype=D), torch.randn(N, dtype=D)],
                             lambda x, p: (x, p, p)),
    "weight and bias overlap": ("layernorm", lambda: [torch.randn(M, N, dtype=D), torch.randn(N + 1, dtype=D)],
                                lambda x, p: (x, p[:-1], p[1:])),
    "x @ x": ("matmul", lambda: [torch.randn(37, 37, dtype=D)], lambda x: (x, x)),
    "Gram matrix": ("matmul", lambda: [torch.randn(37, 45, dtype=D)], lambda x: (x, x.t())),
    "K = V": ("flash_attention", lambda: [torch.randn(2, 45, 12, dtype=D), torch.randn(2, 45, 12, dtype=D)],
              lambda q, k: (q, k, k)),
    "Q = K = V": ("flash_attention", lambda: [torch.randn(2, 45, 12, dtype=D)], lambda q: (q, q, q)),
    "linear(w, w[3])": ("linear", lambda: [torch.randn(37, 37, dtype=D)], lambda w: (w, w[3])),
    "matvec(w, w[0])": ("matvec", lambda: [torch.randn(37, 37, dtype=D)], lambda w: (w, w[0])),
    "packed weight and bias": ("layernorm", lambda: [torch.randn(M, N, dtype=D), torch.randn(2 * N, dtype=D)],
                               lambda x, p: (x, p[:N], p[N:])),
    "halves of one buffer": ("swiglu", lambda: [torch.randn(2, M, N, dtype=D)], lambda x: (x[0], x[1])),
    "packed Q, K and V": ("flash_attention", lambda: [torch.randn(3, 2, 45, 12, dtype=D)],
                          lambda qkv: (qkv[0], qkv[1], qkv[2])),
}


@pytest.mark.parametrize("case", ALIASED)
def test_inputs_sharing_memory_get_pytorchs_gradients(case, poisoned_empty):
    name, leaves, build = ALIASED[case]
    example = get(name)
    assert_binding(example.op, example.reference, leaves(), lambda ls: build(*ls))


@tritongrad.op(deterministic=True)
def rmsnorm_deterministic(x, w):
    return rmsnorm_launch(x, w)()


@tritongrad.op(deterministic=True)
def layernorm_deterministic(x, w, b):
    return layernorm_launch(x, w, b)()


def test_overlapping_inputs_under_deterministic_are_added_in_a_fixed_order():
    x = torch.randn(M, N, dtype=D)
    runs = [gradients(rmsnorm_deterministic, [x], lambda ls: (ls[0], ls[0][0]))[0] for _ in range(2)]
    assert torch.equal(runs[0], runs[1])
    torch.testing.assert_close(runs[0], gradients(get("rmsnorm").reference, [x], lambda ls: (ls[0], ls[0][0]))[0])
    p = torch.randn(N, dtype=D)
    got = gradients(layernorm_deterministic, [x, p], lambda ls: (ls[0], ls[1], ls[1]))
    want = gradients(get("layernorm").reference, [x, p], lambda ls: (ls[0], ls[1], ls[1]))
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b)


def test_views_that_do_not_overlap_keep_their_fast_writes():
    x = torch.randn(M, 3 * N)
    q, k, v = x[:, :N], x[:, N:2 * N], x[:, 2 * N:]
    assert buffer_facts({"q": q, "k": k, "v": v}) == (frozenset(), frozenset())
    assert buffer_facts({"x": x, "w": x[0]})[0] == {"x", "w"}
    interleaved = torch.randn(M, N, 2)
    assert buffer_facts({"a": interleaved[..., 0], "b": interleaved[..., 1]})[0] == frozenset()
    assert buffer_facts({"a": interleaved[..., 0], "b": interleaved[:, :, 0][:, 1:]})[0] == {"a", "b"}


def _addresses(layout: Layout) -> set[int]:
    found = {layout.address}
    for n, s in zip(layout.size, layout.stride, strict=True):
        found = {a + i * s * layout.itemsize for a in found for i in range(n)}
    return {a + b for a in found for b in range(layout.itemsize)} if layout.size and 0 not in layout.size else set()


def test_the_overlap_test_agrees_with_enumerating_addresses():
    rng = random.Random(0)
    strides = [0, 1, 2, 3, 4, 6, 8, -1, -2, -5, 12, 24]
    for _ in range(3000):
        a, b = (Layout(0, rng.randint(-40, 40), rng.choice([1, 2, 4, 8]), tuple(rng.randint(0, 5) for _ in range(r)),
                       tuple(rng.choice(strides) for _ in range(r))) for r in (rng.randint(1, 3), rng.randint(1, 3)))
        assert overlap(a, b) == bool(_addresses(a) & _addresses(b)), (a, b)
        distinct = len({x for x in _addresses(a) if (x - a.address) % a.itemsize == 0})
        assert self_overlapping(a) == (0 < distinct < math.prod(a.size)), a


# -- an address with one coordinate whose stride the launch gives -----------------------------------------------

@triton.jit
def scale_rows(x_ptr, s_ptr, y_ptr, N, stride_x, stride_s, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    s = tl.load(s_ptr + row * stride_s)  # one coordinate: the program id, its stride the launch's
    x = tl.load(x_ptr + row * stride_x + cols, mask=cols < N)
    tl.store(y_ptr + row * stride_x + cols, x * s, mask=cols < N)


@tritongrad.op
def scaled_rows(x, s):
    y = torch.empty_like(x)
    scale_rows[(x.shape[0],)](x, s, y, x.shape[1], x.stride(0), s.stride(0), BLOCK=64)
    return y


@triton.jit
def scale_lanes(x_ptr, c_ptr, y_ptr, N, stride_c, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    c = tl.load(c_ptr + offs * stride_c, mask=offs < N)  # one coordinate: the lanes
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < N) * c, mask=offs < N)


@tritongrad.op
def scaled_lanes(x, c):
    y = torch.empty_like(x)
    scale_lanes[(1,)](x, c, y, x.numel(), c.stride(0), BLOCK=64)
    return y


@triton.jit
def weighted_slabs(x_ptr, c_ptr, y_ptr, stride_c, SLABS: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], dtype=tl.float64)
    for i in range(SLABS):
        acc += tl.load(x_ptr + i * BLOCK + offs) * tl.load(c_ptr + i * stride_c)  # one coordinate: the loop's
    tl.store(y_ptr + offs, acc)


@tritongrad.op
def weighted_sum(x, c):
    y = torch.empty(x.shape[1], dtype=x.dtype)
    weighted_slabs[(1,)](x, c, y, c.stride(0), SLABS=x.shape[0], BLOCK=x.shape[1])
    return y


@tritongrad.op
def weighted_sum_expanded(x):
    """Returns an expanded view of what its kernel wrote."""
    y = torch.empty(x.shape[1], dtype=x.dtype)
    ones = torch.ones(x.shape[0], dtype=x.dtype)
    weighted_slabs[(1,)](x, ones, y, 1, SLABS=x.shape[0], BLOCK=x.shape[1])
    return y.expand(3, x.shape[1])


STRIDE_ZERO = {
    "a scale expanded along rows": (scaled_rows, lambda x, s: x * s[:, None],
                                    lambda: [torch.randn(M, N, dtype=D), torch.randn(1, dtype=D)],
                                    lambda x, c: (x, c.expand(M))),
    "a (1,) weight passed with stride 0": (scaled_rows, lambda x, s: x * s[:, None],
                                           lambda: [torch.randn(M, N, dtype=D), torch.randn(1, dtype=D)],
                                           lambda x, c: (x, c.as_strided((M,), (0,)))),
    "expanded along the lanes of one program": (scaled_lanes, lambda x, c: x * c,
                                                lambda: [torch.randn(N, dtype=D), torch.randn(1, dtype=D)],
                                                lambda x, c: (x, c.expand(N))),
    "expanded along a loop": (weighted_sum, lambda x, c: (x * c[:, None]).sum(0),
                              lambda: [torch.randn(9, 16, dtype=D), torch.randn(1, dtype=D)],
                              lambda x, c: (x, c.expand(9))),
    "an op returning an expanded view": (weighted_sum_expanded, lambda x: x.sum(0).expand(3, x.shape[1]),
                                         lambda: [torch.randn(9, 16, dtype=D)], lambda x: (x,)),
}


@pytest.mark.parametrize("case", STRIDE_ZERO)
def test_stride_zero_bindings_get_pytorchs_gradients(case, poisoned_empty):
    fn, reference, leaves, build = STRIDE_ZERO[case]
    assert_binding(fn, reference, leaves(), lambda ls: build(*ls))


@triton.jit
def weighted_rows(x_ptr, w_ptr, y_ptr, N, stride_w, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    w = tl.load(w_ptr + cols * stride_w, mask=cols < N)  # the same addresses in every program: partial rows
    x = tl.load(x_ptr + row * N + cols, mask=cols < N)
    tl.store(y_ptr + row * N + cols, x * w, mask=cols < N)


@tritongrad.op
def weighted(x, w):
    y = torch.empty_like(x)
    weighted_rows[(x.shape[0],)](x, w, y, x.shape[1], w.stride(0), BLOCK=64)
    return y


def test_a_weight_expanded_where_partial_rows_would_sum_it():
    c = torch.randn(1, dtype=D)
    assert_binding(weighted, lambda x, w: x * w, [torch.randn(M, N, dtype=D), c], lambda ls: (ls[0], ls[1].expand(N)))
    assert_binding(weighted, lambda x, w: x * w, [torch.randn(M, N, dtype=D), torch.randn(N, dtype=D)],
                   lambda ls: (ls[0], ls[1]))


@triton.jit
def row_sums(x_ptr, y_ptr, N, stride_y, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * N + cols, mask=cols < N, other=0.0)
    tl.store(y_ptr + row * stride_y, tl.sum(x * x, 0))  # one coordinate: the program id


def test_a_store_whose_one_coordinate_has_stride_zero_is_refused_at_launch():
    x = torch.randn(M, N, dtype=D)
    y = torch.empty(1, dtype=D).expand(M)  # every program writes the same element: only the last one's stays
    named = {"x_ptr": x, "y_ptr": y, "N": N, "stride_y": 0, "BLOCK": 64}
    with pytest.raises(NotDifferentiableError, match="two lanes or programs reach one element"):
        tritongrad.grad(row_sums).gradients((M,), named, {"y_ptr": torch.randn(1, dtype=D).expand(M)})
    named.update(y_ptr=torch.empty(M, dtype=D), stride_y=1)
    got = tritongrad.grad(row_sums).gradients((M,), named, {"y_ptr": torch.ones(M, dtype=D)})["x_ptr"]
    torch.testing.assert_close(got, 2 * x)


def test_the_raw_kernel_adds_an_expanded_inputs_gradient_into_its_one_element():
    x, c = torch.randn(M, N, dtype=D), torch.randn(1, dtype=D)
    y = torch.empty_like(x)
    scale_rows[(M,)](x, c.expand(M), y, N, N, 0, BLOCK=64)
    g = torch.randn_like(y)
    d_s = torch.zeros(1, dtype=D).expand(M)
    tritongrad.grad(scale_rows)[(M,)](x, c.expand(M), y, N, N, 0, g, torch.zeros_like(x), d_s, BLOCK=64)
    torch.testing.assert_close(d_s[0], (g * x).sum())


def test_a_stride_zero_input_under_deterministic_is_refused_by_name():
    @tritongrad.op(deterministic=True)
    def op(x, s):
        y = torch.empty_like(x)
        scale_rows[(x.shape[0],)](x, s, y, x.shape[1], x.stride(0), s.stride(0), BLOCK=64)
        return y

    x, c = torch.randn(M, N, dtype=D, requires_grad=True), torch.randn(1, dtype=D, requires_grad=True)
    with pytest.raises(NotDifferentiableError, match="`s_ptr` with deterministic=True"):
        op(x, c.expand(M)).sum().backward()


# -- a loop's state taped in the type it has in the loop --------------------------------------------------------

@triton.jit
def online_logsumexp(x_ptr, y_ptr, N, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    m = -float("inf")  # literals: float32 in Triton, float64 once the loop has run on float64 values
    s = 0.0
    for start in range(0, N, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + row * N + cols, mask=cols < N, other=-float("inf"))
        m_new = tl.maximum(m, tl.max(x, 0))
        s = s * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new), 0)
        m = m_new
    tl.store(y_ptr + row, m + tl.log(s))  # the running max is stored: the loop stays as written (a state tape)


@tritongrad.op
def logsumexp(x):
    y = torch.empty(x.shape[0], dtype=x.dtype)
    online_logsumexp[(x.shape[0],)](x, y, x.shape[1], BLOCK=16)
    return y


@pytest.mark.interpreter  # (compiled Triton refuses a loop whose state changes type: float32 literal, float64 sums)
def test_a_state_started_from_a_literal_is_taped_without_rounding():
    x = torch.randn(5, 70, dtype=D)
    got, = gradients(logsumexp, [x], lambda ls: ls)
    want, = gradients(lambda t: torch.logsumexp(t, 1), [x], lambda ls: ls)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    g = torch.randn(5, dtype=D)
    y = torch.empty(5, dtype=D)
    online_logsumexp[(5,)](x, y, 70, BLOCK=16)
    raw = backward_launch(online_logsumexp, (5,), (x, y, 70), {"BLOCK": 16}, {"y_ptr": g})["x_ptr"]
    torch.testing.assert_close(raw, torch.softmax(x, 1) * g[:, None], rtol=1e-12, atol=1e-12)


# -- an input read only through an address made from its own values ---------------------------------------------

@triton.jit
def largest_twice(x_ptr, y_ptr, N, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < N, other=-float("inf"))
    j = tl.argmax(x, 0)
    tl.store(y_ptr, tl.load(x_ptr + j) * 2.0)  # read again at an address its values chose


@tritongrad.op
def largest(x):
    y = torch.empty(1, dtype=x.dtype)
    largest_twice[(1,)](x, y, x.numel(), BLOCK=64)
    return y


def test_a_float_input_read_through_its_own_argmax_gets_its_gradient():
    x = torch.randn(37, dtype=D)
    got, = gradients(largest, [x], lambda ls: ls)
    want, = gradients(lambda t: t.max().reshape(1) * 2.0, [x], lambda ls: ls)
    torch.testing.assert_close(got, want)


def test_the_default_wrt_names_a_float_index_pointer_it_leaves_out():
    x, y = torch.randn(37, dtype=D), torch.empty(1, dtype=D)
    largest_twice[(1,)](x, y, 37, BLOCK=64)
    bwd = tritongrad.grad(largest_twice)
    with pytest.raises(NotDifferentiableError, match=r"wrt=\('x_ptr',\)"):
        bwd.gradients((1,), {"x_ptr": x, "y_ptr": y, "N": 37, "BLOCK": 64}, {"y_ptr": torch.ones(1, dtype=D)})


# -- double backward ------------------------------------------------------------------------------------------

@tritongrad.op
def bare_sin(x):
    return get("sin").module.sin_launch(x)()


@pytest.mark.parametrize("op", [bare_sin, get("sin").op], ids=["bare", "named"])
def test_double_backward_gives_the_second_derivative(op):
    x = torch.randn(37, dtype=D, requires_grad=True)
    (g,) = torch.autograd.grad(op(x).sum(), x, create_graph=True)
    torch.testing.assert_close(g, torch.cos(x).detach())
    (gg,) = torch.autograd.grad(g.sum(), x)
    torch.testing.assert_close(gg, -torch.sin(x).detach())
    assert torch.autograd.gradgradcheck(op, (x,))


# -- the raw derived kernel's buffers -----------------------------------------------------------------------------

def test_a_raw_launch_checks_its_gradient_buffers():
    x, s = torch.randn(M, N, dtype=D), torch.randn(M, dtype=D)
    y = torch.empty_like(x)
    g = torch.randn_like(y)
    bwd = tritongrad.grad(scale_rows)
    with pytest.raises(ValueError, match="`d_x_ptr` must have `x_ptr`'s sizes"):
        bwd[(M,)](x, s, y, N, N, 1, g, torch.zeros(3, dtype=D), torch.zeros_like(s), BLOCK=64)
    with pytest.raises(ValueError, match="`d_y_ptr` must have `y_ptr`'s sizes"):
        bwd[(M,)](x, s, y, N, N, 1, g.t().contiguous().t()[:, :5], torch.zeros_like(x), torch.zeros_like(s),
                  BLOCK=64)
    with pytest.raises(ValueError, match="overlaps the gradient of the output"):
        bwd[(M,)](x, s, y, N, N, 1, g, g, torch.zeros_like(s), BLOCK=64)
    with pytest.raises(NotDifferentiableError, match="`x_ptr` and the output `y_ptr` share memory"):
        bwd[(M,)](x, s, x, N, N, 1, g, torch.zeros_like(x), torch.zeros_like(s), BLOCK=64)


# -- inputs an op's launches cannot be seen reading -------------------------------------------------------------

@triton.jit
def through_a_pointer_table(table_ptr, y_ptr, N, BLOCK: tl.constexpr):
    group = tl.program_id(0)
    x_ptr = tl.load(table_ptr + group).to(tl.pointer_type(tl.float64))
    offs = tl.arange(0, BLOCK)
    tl.store(y_ptr + group * N + offs, tl.load(x_ptr + offs, mask=offs < N) * 2.0, mask=offs < N)


def _grouped(a, b):
    table = torch.tensor([a.data_ptr(), b.data_ptr()], dtype=torch.int64)
    y = torch.empty(2, a.numel(), dtype=a.dtype)
    through_a_pointer_table[(2,)](table, y, a.numel(), BLOCK=64)
    return y


grouped = tritongrad.op(_grouped)


@tritongrad.op("test_bindings::grouped")
def grouped_named(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    table = torch.tensor([a.data_ptr(), b.data_ptr()], dtype=torch.int64)
    y = torch.empty(2, a.numel(), dtype=a.dtype)
    through_a_pointer_table[(2,)](table, y, a.numel(), BLOCK=64)
    return y


@pytest.mark.parametrize("op", [grouped, grouped_named], ids=["bare", "named"])
def test_an_input_read_through_a_pointer_table_is_refused_at_the_call(op):
    a, b = (torch.randn(10, dtype=D, requires_grad=True) for _ in range(2))
    with pytest.raises(OpError, match="the argument `a` requires grad, but no kernel launch reads it"):
        op(a, b)
    assert torch.equal(op(a.detach(), b.detach()), torch.stack([a, b]).detach() * 2)  # nothing to differentiate


@triton.jit
def doubles(x_ptr, y_ptr, N, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < N) * 2.0, mask=offs < N)


@tritongrad.op
def doubled_copy(x):
    x2 = x * 1.0  # a tensor PyTorch made from the argument: autograd connects them
    y = torch.empty_like(x2)
    doubles[(1,)](x2, y, x.numel(), BLOCK=64)
    return y


def test_an_argument_a_launch_reads_through_a_pytorch_operation_is_connected():
    x = torch.randn(20, dtype=D)
    got, = gradients(doubled_copy, [x], lambda ls: ls)
    want, = gradients(lambda t: t * 2.0, [x], lambda ls: ls)
    torch.testing.assert_close(got, want)


@triton.jit
def halving_while(x_ptr, y_ptr, N, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < N)
    i = 0
    while i < 3:
        x = x * 0.5
        i += 1
    tl.store(y_ptr + offs, x, mask=offs < N)


@tritongrad.op
def halved(x):
    y = torch.empty_like(x)
    halving_while[(1,)](x, y, x.numel(), BLOCK=64)
    return y


@triton.jit
def _descriptor_of(desc_or_ptr, shape, strides, block_shape):  # as the fused-attention tutorial writes it
    if isinstance(desc_or_ptr, tl.tensor_descriptor):
        return desc_or_ptr
    else:
        return tl.make_tensor_descriptor(desc_or_ptr, shape, strides, block_shape)


@triton.jit
def doubles_through_descriptors(x_ptr, y_ptr, N, BLOCK: tl.constexpr):
    x = _descriptor_of(x_ptr, [N], [1], [BLOCK])
    y = _descriptor_of(y_ptr, [N], [1], [BLOCK])
    y.store([0], x.load([0]) * 2.0)


@tritongrad.op
def doubled_through_descriptors(x):
    y = torch.empty_like(x)
    doubles_through_descriptors[(1,)](x, y, x.numel(), BLOCK=16)
    return y


def test_a_kernel_the_analysis_cannot_read_is_refused_at_the_call_when_its_inputs_need_gradients():
    x = torch.randn(16, dtype=D, requires_grad=True)
    with pytest.raises(NotDifferentiableError, match="while"):
        halved(x)
    halved(x.detach())  # nothing to differentiate: it just runs


@pytest.mark.skipif(not hasattr(tl, "make_tensor_descriptor"), reason="this Triton has no tensor descriptors")
def test_the_tutorials_descriptor_helper_is_decided_as_triton_decides_it():
    """(Refused at the call before the helper's isinstance test was decided at derivation.)"""
    x = torch.randn(16, dtype=D, requires_grad=True)
    g = torch.randn(16, dtype=D)
    (got,) = torch.autograd.grad(doubled_through_descriptors(x), x, g)
    torch.testing.assert_close(got, 2.0 * g)
