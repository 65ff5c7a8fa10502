"""Tensor descriptors (``tl.make_tensor_descriptor``, ``desc.load / store / atomic_add``).

The shadow of a descriptor is a descriptor over the shadow pointer with the same shape,
strides and block: a load's adjoint is ``d_desc.atomic_add(offsets, g)``, a store's reads
``d_desc.load(offsets)`` (out-of-bounds elements, dropped by the forward, read as zero).
Checked against torch autograd on plain-PyTorch references: float64, ragged blocks along
both dimensions, several programs, NaN-poisoned outputs, random upstream gradients.
Descriptors' strides must be 16-byte aligned, so rows hold a multiple of 16 bytes.
"""

import pytest
import torch
import triton
import triton.language as tl

import tritongrad
from tritongrad import NotDifferentiableError
from tritongrad.tools.testing import assert_gradients_match, backward_launch, poison

pytestmark = pytest.mark.skipif(not hasattr(tl, "make_tensor_descriptor"),
                                reason="this Triton has no tl.make_tensor_descriptor")

DTYPE = torch.float64
TOL = {"rtol": 1e-10, "atol": 1e-10}


def check(kernel, grid, args, meta, out, want, leaves, names, tol=TOL, forward=True):
    if forward:
        kernel[grid](*args, **meta)
        torch.testing.assert_close(out, want.detach(), **tol)
    assert_gradients_match(kernel, grid, args, meta, out, want, leaves, names, tol=tol["rtol"])


@triton.jit
def scaled_rows(x_ptr, w_ptr, y_ptr, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """y = exp(x) * w: blocks of rows, the last row block and every column block ragged."""
    x_desc = tl.make_tensor_descriptor(x_ptr, shape=[M, N], strides=[N, 1], block_shape=[BLOCK_M, BLOCK_N])
    y_desc = tl.make_tensor_descriptor(y_ptr, [M, N], [N, 1], [BLOCK_M, BLOCK_N])
    w_desc = tl.make_tensor_descriptor(w_ptr, shape=[N], strides=[1], block_shape=[BLOCK_N])
    row = tl.program_id(0) * BLOCK_M
    for col in range(0, N, BLOCK_N):
        x = x_desc.load([row, col])
        w = w_desc.load([col])
        y_desc.store([row, col], tl.exp(x) * w[None, :])


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])  # on a GPU, float32 adds through descriptors
def test_rows_and_a_shared_weight(dtype):
    m, n = 11, 20
    x, w = torch.randn(m, n, dtype=dtype), torch.randn(n, dtype=dtype)
    y = poison(torch.empty_like(x))
    leaves = [t.clone().requires_grad_() for t in (x, w)]
    want = torch.exp(leaves[0]) * leaves[1]
    tol = TOL if dtype == torch.float64 else {"rtol": 1e-5, "atol": 1e-5}
    check(scaled_rows, (triton.cdiv(m, 4),), (x, w, y, m, n), {"BLOCK_M": 4, "BLOCK_N": 8}, y, want, leaves,
          ("x_ptr", "w_ptr"), tol)


@pytest.mark.parametrize("binding", ["fresh", "row slice", "one storage"])
def test_a_descriptor_load_each_element_of_which_one_program_reads_gets_its_gradient_stored(binding, monkeypatch,
                                                                                          poisoned_empty):
    """x's blocks, ragged at the last row block and at every row's end (20 columns in blocks of 8: the lanes past
    a row's end are clipped, not the next row's), are read once each: x's gradient is stored, not added, into a
    buffer left unfilled (poisoned here: the blocks cover x); w, which every program reads, has its tiles added.
    The bindings: x a slice of rows of a larger tensor (its descriptor over the slice's pointer), and x and w views
    of one storage (their gradients added in one buffer)."""
    from tritongrad.runtime import derive

    seen, real = [], derive.BackwardKernel.launch

    def spy(self, grid, named, output_grads, buffers, prepared, *args, **kwargs):
        seen.append({p: (c.mode.name, c.covers) for p, c in prepared.choices.items()})
        return real(self, grid, named, output_grads, buffers, prepared, *args, **kwargs)

    monkeypatch.setattr(derive.BackwardKernel, "launch", spy)
    m, n = 11, 20

    @tritongrad.op
    def rows(x, w):
        y = poison(torch.empty_like(x))
        scaled_rows[(triton.cdiv(m, 4),)](x, w, y, m, n, BLOCK_M=4, BLOCK_N=8)
        return y

    if binding == "one storage":
        base = torch.randn(m * n + n, dtype=DTYPE, requires_grad=True)
        leaves, x, w = [base], base[:m * n].view(m, n), base[m * n:]
    else:
        big = torch.randn(m + 3, n, dtype=DTYPE, requires_grad=True)
        w = torch.randn(n, dtype=DTYPE, requires_grad=True)
        x = big[2:2 + m] if binding == "row slice" else big[:m].detach().clone().requires_grad_()
        leaves = [big if binding == "row slice" else x, w]
    y = rows(x, w)
    g = torch.randn_like(y)
    got = torch.autograd.grad(y, leaves, g)
    want = torch.autograd.grad(torch.exp(x) * w, leaves, g)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, **TOL)
    assert seen == [{"x_ptr": ("STORE", True), "w_ptr": ("ATOMIC", False)}]


@triton.jit
def matmul_descriptors(a_ptr, b_ptr, c_ptr, M, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                       BLOCK_K: tl.constexpr):
    """C = A @ B with every operand read and written through descriptors, looping over K."""
    a_desc = tl.make_tensor_descriptor(a_ptr, [M, K], [K, 1], [BLOCK_M, BLOCK_K])
    b_desc = tl.make_tensor_descriptor(b_ptr, [K, N], [N, 1], [BLOCK_K, BLOCK_N])
    c_desc = tl.make_tensor_descriptor(c_ptr, [M, N], [N, 1], [BLOCK_M, BLOCK_N])
    pid_m, pid_n = tl.program_id(0) * BLOCK_M, tl.program_id(1) * BLOCK_N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float64)
    for k in range(0, K, BLOCK_K):
        acc = tl.dot(a_desc.load([pid_m, k]), b_desc.load([k, pid_n]), acc, out_dtype=tl.float64)
    c_desc.store([pid_m, pid_n], acc)


def test_matmul_looping_over_k():
    m, n, k = 18, 30, 38
    a, b = torch.randn(m, k, dtype=DTYPE), torch.randn(k, n, dtype=DTYPE)
    c = poison(torch.empty(m, n, dtype=DTYPE))
    leaves = [t.clone().requires_grad_() for t in (a, b)]
    meta = {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16}
    check(matmul_descriptors, (2, 2), (a, b, c, m, n, k), meta, c, leaves[0] @ leaves[1], leaves, ("a_ptr", "b_ptr"))


@triton.jit
def column_sums(x_ptr, s_ptr, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """s[j] = sum_i x[i, j]^2, programs adding their row blocks' partial sums with desc.atomic_add."""
    x_desc = tl.make_tensor_descriptor(x_ptr, [M, N], [N, 1], [BLOCK_M, BLOCK_N])
    s_desc = tl.make_tensor_descriptor(s_ptr, [1, N], [N, 1], [1, BLOCK_N])
    x = x_desc.load([tl.program_id(0) * BLOCK_M, tl.program_id(1) * BLOCK_N])
    s_desc.atomic_add([0, tl.program_id(1) * BLOCK_N], tl.sum(x * x, axis=0, keep_dims=True))


def test_atomic_add_output():
    """In float32 (descriptors cannot add float64), so on a GPU the input's adjoint goes through the descriptor
    too. The interpreter has no descriptor atomics: there, only the backward runs (through pointers)."""
    m, n = 13, 12
    x = torch.randn(m, n)
    s = torch.zeros(1, n)
    leaf = x.clone().requires_grad_()
    want = (leaf * leaf).sum(0, keepdim=True)
    check(column_sums, (2, 2), (x, s, m, n), {"BLOCK_M": 8, "BLOCK_N": 8}, s, want, [leaf], ("x_ptr",),
          tol={"rtol": 1e-5, "atol": 1e-5}, forward=torch.cuda.is_available())


def test_backward_source_goes_through_shadow_descriptors():
    """Each operand's tiles, shared by the programs along an axis, are added through shadow descriptors (a kernel
    of its own, as a pointer matmul gets, measured slower for descriptor loads), the output's gradient read through
    one."""
    bwd = tritongrad.grad(matmul_descriptors)
    # the text is the point (what is read and written through descriptors): test_matmul_looping_over_k checks this
    # kernel's gradients
    assert [c.mode.name for c in bwd.writes.best().values()] == ["ATOMIC", "ATOMIC"]
    assert "d_a_desc = tl.make_tensor_descriptor(d_a_ptr, [M, K], [K, 1], [BLOCK_M, BLOCK_K])" in bwd.src
    assert "d_a_desc.atomic_add([pid_m, k], " in bwd.src and "d_c_desc.load([pid_m, pid_n])" in bwd.src


def test_a_deterministic_descriptor_matmul_is_refused_saying_why():
    m, n, k = 18, 30, 38
    a, b = (torch.randn(*s, dtype=DTYPE, requires_grad=True) for s in ((m, k), (k, n)))

    @tritongrad.op(deterministic=True)
    def product(a, b):
        c = poison(torch.empty(m, n, dtype=a.dtype, device=a.device))
        matmul_descriptors[(2, 2)](a, b, c, m, n, k, BLOCK_M=16, BLOCK_N=16, BLOCK_K=16)
        return c

    with pytest.raises(NotDifferentiableError, match="programs share its descriptor's tiles, added through the "
                                                     "descriptor"):
        torch.autograd.grad(product(a, b), [a, b], torch.randn(m, n, dtype=DTYPE))


@triton.jit
def stored_twice(x_ptr, y_ptr, N, BLOCK: tl.constexpr):
    x_desc = tl.make_tensor_descriptor(x_ptr, [N], [1], [BLOCK])
    y_desc = tl.make_tensor_descriptor(y_ptr, [N], [1], [BLOCK])
    x = x_desc.load([0])
    y_desc.store([0], x)
    y_desc.store([0], x * 2.0)  # refused


@triton.jit
def stored_in_place_in_a_loop(x_ptr, y_ptr, N, BLOCK: tl.constexpr):
    x_desc = tl.make_tensor_descriptor(x_ptr, [N], [1], [BLOCK])
    y_desc = tl.make_tensor_descriptor(y_ptr, [N], [1], [BLOCK])
    for i in range(0, N, BLOCK):
        y_desc.store([0], x_desc.load([i]))  # refused


@triton.jit
def scattered(x_ptr, i_ptr, y_ptr, N, BLOCK: tl.constexpr):
    x_desc = tl.make_tensor_descriptor(x_ptr, [N], [1], [BLOCK])
    y_desc = tl.make_tensor_descriptor(y_ptr, [N], [1], [BLOCK])
    y_desc.store([tl.load(i_ptr)], x_desc.load([0]))  # refused


@triton.jit
def descriptor_gather(x_ptr, i_ptr, y_ptr, N, BLOCK: tl.constexpr):
    x_desc = tl.make_tensor_descriptor(x_ptr, [N, N], [N, 1], [1, BLOCK])
    rows = tl.load(i_ptr + tl.arange(0, BLOCK))
    x = x_desc.gather(rows, 0)  # refused
    tl.store(y_ptr + tl.arange(0, BLOCK)[:, None] * BLOCK + tl.arange(0, BLOCK)[None, :], x)


@triton.jit
def blocks_every_other_element(x_ptr, y_ptr, N, BLOCK: tl.constexpr):
    x_desc = tl.make_tensor_descriptor(x_ptr, [N], [1], [BLOCK])
    y_desc = tl.make_tensor_descriptor(y_ptr, [N], [1], [BLOCK])
    for i in range(0, N, 2):  # blocks overlap unless BLOCK <= 2: decided at launch
        y_desc.store([i], tl.sin(x_desc.load([i])))


def test_overlapping_blocks_are_refused_at_launch_and_disjoint_ones_differentiated():
    x = torch.randn(16, dtype=DTYPE)
    y, d_y = poison(torch.empty_like(x)), torch.randn_like(x)
    with pytest.raises(NotDifferentiableError, match="strides 1 and 2 overlap when lane axis 0 has more than 2"):
        backward_launch(blocks_every_other_element, (1,), (x, y, 16), {"BLOCK": 8}, {"y_ptr": d_y})
    got = backward_launch(blocks_every_other_element, (1,), (x, y, 16), {"BLOCK": 2}, {"y_ptr": d_y})
    torch.testing.assert_close(got["x_ptr"], torch.cos(x) * d_y, **TOL)


@pytest.mark.parametrize("kernel, construct", [
    (stored_twice, "a second tl.store to `y_ptr`"),
    (stored_in_place_in_a_loop, "to the same addresses in every iteration"),
    (scattered, "at addresses computed from loaded data"),
    (descriptor_gather, "a tensor descriptor's `gather`"),
])
def test_refusals_name_their_line(kernel, construct):
    with pytest.raises(NotDifferentiableError) as e:
        tritongrad.grad(kernel)
    assert construct in str(e.value)
    assert "# refused" in e.value.source_line


@triton.jit
def shifted_window(x_ptr, y_ptr, N, SHIFT, BLOCK: tl.constexpr):
    """y[j] = x[j - SHIFT] * x[j - SHIFT] (zero where j - SHIFT falls outside x): blocks read at offsets that
    start below 0 or run past N, which a descriptor reads as zeros (its shadow drops their adjoints)."""
    x_desc = tl.make_tensor_descriptor(x_ptr, [N], [1], [BLOCK])
    y_desc = tl.make_tensor_descriptor(y_ptr, [N], [1], [BLOCK])
    start = tl.program_id(0) * BLOCK
    x = x_desc.load([start - SHIFT])
    y_desc.store([start], x * x)


@pytest.mark.parametrize("shift", [2, -4])  # (block offsets 16-byte aligned)
def test_blocks_reaching_outside_the_tensor_read_zeros_and_get_no_gradient_there(shift):
    n = 21
    x = torch.randn(n, dtype=DTYPE)
    y = poison(torch.empty_like(x))
    leaf = x.clone().requires_grad_()
    padded = torch.nn.functional.pad(leaf, (max(shift, 0), max(-shift, 0)))
    window = padded[:n] if shift > 0 else padded[-shift:]
    check(shifted_window, (triton.cdiv(n, 8),), (x, y, n, shift), {"BLOCK": 8}, y, window * window, [leaf],
          ("x_ptr",))
