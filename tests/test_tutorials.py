"""Kernels as people copy them from Triton's tutorials, written here in the tutorials' style: each
wrapped with `tritongrad.op` around launch code as the tutorial writes it, checked against PyTorch autograd in
float64 with sizes that are not multiples of the blocks, output buffers poisoned."""

import pytest
import torch
import triton
import triton.language as tl
from conftest import DEVICE

import tritongrad

D = torch.float64
# a float64 tl.dot into a float64 accumulator, as these tests write it, is the interpreter's: compiled Triton's dot
# gives float32 unless told otherwise (the tutorials' own kernels, in half precision, are on the GPU in
# benchmarks/tutorial_backwards.py)
float64_dots = pytest.mark.skipif(DEVICE == "cuda", reason="float64 tl.dot accumulators run in the interpreter")


@triton.jit
def row_major_matmul(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    # one program per output tile, tiles numbered along the rows; ragged tiles wrap around (% M, % N) for the
    # loads and are masked off at the store
    pid = tl.program_id(axis=0)
    tiles_n = tl.cdiv(N, BLOCK_N)
    pid_m = pid // tiles_n
    pid_n = pid % tiles_n
    rows = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M
    cols = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
    ks = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + rows[:, None] * stride_am + ks[None, :] * stride_ak
    b_ptrs = b_ptr + ks[:, None] * stride_bk + cols[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float64)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        a = tl.load(a_ptrs, mask=ks[None, :] < K - k * BLOCK_K, other=0.0)
        b = tl.load(b_ptrs, mask=ks[:, None] < K - k * BLOCK_K, other=0.0)
        acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    out_rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    out_cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    c_ptrs = c_ptr + stride_cm * out_rows[:, None] + stride_cn * out_cols[None, :]
    tl.store(c_ptrs, acc, mask=(out_rows[:, None] < M) & (out_cols[None, :] < N))


@tritongrad.op
def matmul(a, b):
    M, K = a.shape
    _, N = b.shape
    c = torch.empty((M, N), device=a.device, dtype=a.dtype)
    grid = lambda meta: (triton.cdiv(M, meta["BLOCK_M"]) * triton.cdiv(N, meta["BLOCK_N"]),)  # noqa: E731
    row_major_matmul[grid](a, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0),
                           c.stride(1), BLOCK_M=16, BLOCK_N=16, BLOCK_K=16)
    return c


@pytest.mark.parametrize("m, k, n", [(40, 30, 37), (33, 20, 48), (16, 5, 3)])
@float64_dots
def test_a_row_major_matmul_with_ragged_tiles_gets_pytorchs_gradients(m, k, n, poisoned_empty):
    """N not a multiple of the block: the store's mask keeps the last tile's lanes past N from reaching the next
    row (refused at launch before, as if masked-off lanes reached an element)."""
    a = torch.randn(m, k, dtype=D, device=DEVICE, requires_grad=True)
    b = torch.randn(k, n, dtype=D, device=DEVICE, requires_grad=True)
    c = matmul(a, b)
    torch.testing.assert_close(c, a.detach() @ b.detach())
    g = torch.randn_like(c)
    got = torch.autograd.grad(c, (a, b), g)
    want = torch.autograd.grad(a @ b, (a, b), g)
    for x, y in zip(got, want, strict=True):
        torch.testing.assert_close(x, y)


@triton.jit
def persistent_softmax(out_ptr, in_ptr, in_row_stride, out_row_stride, n_rows, n_cols, BLOCK: tl.constexpr,
                       STAGES: tl.constexpr):
    # a grid-stride loop: each program takes every num_programs-th row, starting from its own
    first = tl.program_id(0)
    step = tl.num_programs(0)
    for row in tl.range(first, n_rows, step, num_stages=STAGES):
        cols = tl.arange(0, BLOCK)
        mask = cols < n_cols
        x = tl.load(in_ptr + row * in_row_stride + cols, mask=mask, other=-float("inf"))
        shifted = x - tl.max(x, axis=0)
        e = tl.exp(shifted)
        tl.store(out_ptr + row * out_row_stride + cols, e / tl.sum(e, axis=0), mask=mask)


@triton.jit
def strided_by_argument(out_ptr, in_ptr, n_rows, n_cols, PROGRAMS, BLOCK: tl.constexpr):
    # the step a launch argument the host sets to the grid (a kernel launched on as many programs as SMs)
    for row in range(tl.program_id(0), n_rows, PROGRAMS):
        cols = tl.arange(0, BLOCK)
        mask = cols < n_cols
        x = tl.load(in_ptr + row * n_cols + cols, mask=mask, other=0.0)
        tl.store(out_ptr + row * n_cols + cols, x * x, mask=mask)


@tritongrad.op
def softmax_rows(x, programs: int, rows: int):
    """The tutorial's launch: fewer programs than rows, each looping; ``rows`` of ``x``'s rows only."""
    y = torch.zeros_like(x)
    persistent_softmax[(programs, 1, 1)](y, x, x.stride(0), y.stride(0), rows, x.shape[1],
                                         BLOCK=triton.next_power_of_2(x.shape[1]), STAGES=2)
    return y


@tritongrad.op
def squares(x, programs: int, step: int):
    y = torch.empty_like(x)
    strided_by_argument[(programs,)](y, x, x.shape[0], x.shape[1], step, BLOCK=triton.next_power_of_2(x.shape[1]))
    return y


@pytest.mark.parametrize("shape, programs, rows", [((13, 37), 4, 13), ((3, 5), 4, 3), ((16, 9), 4, 13),
                                                    ((7, 20), 1, 7)],
                         ids=["fewer programs", "more programs than rows", "rows left out", "one program"])
def test_a_persistent_softmax_gets_pytorchs_gradients(shape, programs, rows, poisoned_empty):
    """Rows the loop never reaches (``rows`` < the tensor's) get zero gradient: a grid-stride loop's trip count
    is program 0's, a bound, so the loads are not taken to cover the tensor."""
    x = torch.randn(*shape, dtype=D, device=DEVICE, requires_grad=True)
    y = softmax_rows(x, programs, rows)
    want = torch.cat([torch.softmax(x[:rows], -1), torch.zeros_like(x[rows:])])
    torch.testing.assert_close(y, want.detach())
    g = torch.randn_like(y)
    (got,) = torch.autograd.grad(y, (x,), g)
    (expected,) = torch.autograd.grad(want, (x,), g)
    torch.testing.assert_close(got, expected)


def test_a_loop_strided_by_a_launch_argument_is_checked_against_the_grid():
    x = torch.randn(11, 6, dtype=D, device=DEVICE, requires_grad=True)
    (got,) = torch.autograd.grad(squares(x, 3, 3).sum(), (x,))
    torch.testing.assert_close(got, 2 * x.detach())
    with pytest.raises(tritongrad.NotDifferentiableError, match="grid-stride loop over `row`: at this launch lanes "
                                                                "of different programs reach one element"):
        squares(x, 4, 3).sum().backward()  # four programs stepping by three: rows 3, 6, 9 written twice


@triton.jit
def persistent_log_softmax(out_ptr, in_ptr, temperature_ptr, weight_ptr, n_rows, n_cols, BLOCK: tl.constexpr):
    # a learned temperature and a per-column weight, loaded once per program before its loop over rows
    t = tl.load(temperature_ptr)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    w = tl.load(weight_ptr + cols, mask=mask, other=1.0)
    for row in tl.range(tl.program_id(0), n_rows, tl.num_programs(0)):
        x = tl.load(in_ptr + row * n_cols + cols, mask=mask, other=-float("inf")) * w / t
        z = x - tl.max(x, axis=0)
        tl.store(out_ptr + row * n_cols + cols, z - tl.log(tl.sum(tl.exp(z), axis=0)), mask=mask)


@pytest.mark.parametrize("deterministic", [False, True])
def test_a_persistent_log_softmax_with_a_learned_temperature_gets_pytorchs_gradients(deterministic):
    @tritongrad.op(deterministic=deterministic)
    def log_softmax(x, t, w, programs: int):
        y = torch.empty_like(x)
        persistent_log_softmax[(programs,)](y, x, t, w, x.shape[0], x.shape[1],
                                            BLOCK=triton.next_power_of_2(x.shape[1]))
        return y

    x = torch.randn(13, 37, dtype=D, device=DEVICE, requires_grad=True)
    t = (torch.rand(1, dtype=D, device=DEVICE) + 0.5).requires_grad_()
    w = torch.randn(37, dtype=D, device=DEVICE, requires_grad=True)
    y = log_softmax(x, t, w, 4)
    want = torch.log_softmax(x * w / t, -1)
    torch.testing.assert_close(y, want.detach())
    g = torch.randn_like(y)
    for a, b in zip(torch.autograd.grad(y, (x, t, w), g), torch.autograd.grad(want, (x, t, w), g), strict=True):
        torch.testing.assert_close(a, b)


@triton.jit
def leaky_relu(x):
    return tl.where(x >= 0, x, 0.01 * x)


@triton.jit
def grouped_matmul(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                   ACTIVATION: tl.constexpr):
    # tiles visited in groups of GROUP_M rows of tiles (better reuse of B in L2): the program -> tile map goes
    # through //, % and min, a swizzle no sum of program ids spells
    pid = tl.program_id(axis=0)
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    in_group = GROUP_M * tiles_n
    group = pid // in_group
    first_m = group * GROUP_M
    group_rows = min(tiles_m - first_m, GROUP_M)
    pid_m = first_m + ((pid % in_group) % group_rows)
    pid_n = (pid % in_group) // group_rows
    rows = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M
    cols = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
    ks = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + rows[:, None] * stride_am + ks[None, :] * stride_ak
    b_ptrs = b_ptr + ks[:, None] * stride_bk + cols[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float64)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        a = tl.load(a_ptrs, mask=ks[None, :] < K - k * BLOCK_K, other=0.0)
        b = tl.load(b_ptrs, mask=ks[:, None] < K - k * BLOCK_K, other=0.0)
        acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    if ACTIVATION == "leaky_relu":
        acc = leaky_relu(acc)
    out_rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    out_cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    c_ptrs = c_ptr + stride_cm * out_rows[:, None] + stride_cn * out_cols[None, :]
    tl.store(c_ptrs, acc, mask=(out_rows[:, None] < M) & (out_cols[None, :] < N))


def _grouped(a, b, activation, group_m, grid=None):
    M, K = a.shape
    _, N = b.shape
    c = torch.empty((M, N), device=a.device, dtype=a.dtype)
    grid = grid or (lambda meta: (triton.cdiv(M, meta["BLOCK_M"]) * triton.cdiv(N, meta["BLOCK_N"]),))
    grouped_matmul[grid](a, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0),
                         c.stride(1), BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, GROUP_M=group_m, ACTIVATION=activation)
    return c


@pytest.mark.parametrize("activation", ["", "leaky_relu"])
@pytest.mark.parametrize("m, k, n, group_m", [(70, 20, 37, 2), (40, 30, 48, 3), (33, 9, 16, 8)])
@float64_dots
def test_a_matmul_with_grouped_ordering_gets_pytorchs_gradients(m, k, n, group_m, activation, poisoned_empty):
    """The swizzle's program -> tile map is evaluated over the whole grid at launch: distinct programs keep
    distinct tiles (refused at derivation before)."""
    op = tritongrad.op(lambda a, b: _grouped(a, b, activation, group_m))
    a = torch.randn(m, k, dtype=D, device=DEVICE, requires_grad=True)
    b = torch.randn(k, n, dtype=D, device=DEVICE, requires_grad=True)
    c = op(a, b)
    want = a @ b
    if activation:
        want = torch.where(want >= 0, want, 0.01 * want)
    torch.testing.assert_close(c, want.detach())
    g = torch.randn_like(c)
    for x, y in zip(torch.autograd.grad(c, (a, b), g), torch.autograd.grad(want, (a, b), g), strict=True):
        torch.testing.assert_close(x, y)


@triton.jit
def tile_of(tile, in_group, tiles_m, GROUP_M: tl.constexpr):
    # the grouped ordering, as the persistent tutorial factors it out: a tile number -> (tile row, tile column)
    group = tile // in_group
    first_m = group * GROUP_M
    group_rows = min(tiles_m - first_m, GROUP_M)
    return first_m + (tile % group_rows), (tile % in_group) // group_rows


@triton.jit
def persistent_matmul(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                      NUM_SMS: tl.constexpr, SUBTILE: tl.constexpr):
    # NUM_SMS programs walk the tiles (tile = start, start + NUM_SMS, ...); the epilogue finds its tile again from a
    # counter of its own, and with SUBTILE stores the tile's two column halves apart
    start = tl.program_id(axis=0)
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    tiles = tiles_m * tiles_n
    tile_c = start - NUM_SMS
    ks = tl.arange(0, BLOCK_K)
    in_group = GROUP_M * tiles_n
    for tile in tl.range(start, tiles, NUM_SMS, flatten=True):
        pid_m, pid_n = tile_of(tile, in_group, tiles_m, GROUP_M)
        rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        rows = tl.where(rows < M, rows, 0)  # ragged tiles read row 0 (stored nowhere)
        cols = tl.where(cols < N, cols, 0)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float64)
        for kk in range(k_tiles):
            offs_k = kk * BLOCK_K + ks
            a = tl.load(a_ptr + rows[:, None] * stride_am + offs_k[None, :] * stride_ak,
                        mask=ks[None, :] < K - kk * BLOCK_K, other=0.0)
            b = tl.load(b_ptr + offs_k[:, None] * stride_bk + cols[None, :] * stride_bn,
                        mask=ks[:, None] < K - kk * BLOCK_K, other=0.0)
            acc = tl.dot(a, b, acc)
        tile_c += NUM_SMS
        pid_m, pid_n = tile_of(tile_c, in_group, tiles_m, GROUP_M)
        out_rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        if SUBTILE:
            halves = tl.permute(tl.reshape(acc, (BLOCK_M, 2, BLOCK_N // 2)), (0, 2, 1))
            left, right = tl.split(halves)
            out_cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N // 2)
            tl.store(c_ptr + stride_cm * out_rows[:, None] + stride_cn * out_cols[None, :], left,
                     mask=(out_rows[:, None] < M) & (out_cols[None, :] < N))
            out_cols = out_cols + BLOCK_N // 2
            tl.store(c_ptr + stride_cm * out_rows[:, None] + stride_cn * out_cols[None, :], right,
                     mask=(out_rows[:, None] < M) & (out_cols[None, :] < N))
        else:
            out_cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
            tl.store(c_ptr + stride_cm * out_rows[:, None] + stride_cn * out_cols[None, :], acc,
                     mask=(out_rows[:, None] < M) & (out_cols[None, :] < N))


@tritongrad.op
def persistent_mm(a, b, num_sms: int, subtile: bool, programs: int | None = None):
    M, K = a.shape
    _, N = b.shape
    c = torch.full((M, N), float("nan"), device=a.device, dtype=a.dtype)
    tiles = triton.cdiv(M, 16) * triton.cdiv(N, 16)
    grid = (programs or min(num_sms, tiles),)  # the tutorial's: no more programs than tiles
    persistent_matmul[grid](a, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0),
                            c.stride(1), BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, GROUP_M=2, NUM_SMS=num_sms,
                            SUBTILE=subtile)
    return c


@pytest.mark.parametrize("subtile", [False, True])
@pytest.mark.parametrize("m, k, n, num_sms", [(37, 45, 29, 3), (50, 20, 70, 4), (20, 9, 16, 1), (33, 17, 40, 64)])
@float64_dots
def test_the_persistent_matmul_gets_pytorchs_gradients(m, k, n, num_sms, subtile, poisoned_empty):
    """Tiles walked by a grid-stride loop, swizzled by a helper from the loop's index and from a counter of the
    epilogue's own: the tile map is evaluated per program and iteration at launch."""
    a = torch.randn(m, k, dtype=D, device=DEVICE, requires_grad=True)
    b = torch.randn(k, n, dtype=D, device=DEVICE, requires_grad=True)
    c = persistent_mm(a, b, num_sms, subtile)
    want = a @ b
    torch.testing.assert_close(c, want.detach())
    g = torch.randn_like(c)
    for x, y in zip(torch.autograd.grad(c, (a, b), g), torch.autograd.grad(want, (a, b), g), strict=True):
        torch.testing.assert_close(x, y)


@float64_dots
def test_a_persistent_matmul_launched_with_more_programs_than_its_step_is_refused_at_the_launch():
    a = torch.randn(37, 20, dtype=D, device=DEVICE, requires_grad=True)
    b = torch.randn(20, 29, dtype=D, device=DEVICE, requires_grad=True)
    c = persistent_mm(a, b, 3, False, programs=5)  # programs 0 and 3 both take tile 3
    with pytest.raises(tritongrad.NotDifferentiableError, match="compute the same"):
        c.sum().backward()


@triton.jit
def persistent_matmul_descriptors(a_ptr, b_ptr, c_ptr, M, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                                  BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, NUM_SMS: tl.constexpr,
                                  EPILOGUE_SUBTILE: tl.constexpr, SECOND_AT: tl.constexpr):
    # the persistent tutorial's descriptor kernel: B given as (N, K), its tiles transposed for the dot; with
    # EPILOGUE_SUBTILE the tile's two column halves are stored apart (the second at SECOND_AT columns on)
    a_desc = tl.make_tensor_descriptor(a_ptr, shape=[M, K], strides=[K, 1], block_shape=[BLOCK_M, BLOCK_K])
    b_desc = tl.make_tensor_descriptor(b_ptr, shape=[N, K], strides=[K, 1], block_shape=[BLOCK_N, BLOCK_K])
    c_desc = tl.make_tensor_descriptor(c_ptr, shape=[M, N], strides=[N, 1],
                                       block_shape=[BLOCK_M, BLOCK_N if not EPILOGUE_SUBTILE else BLOCK_N // 2])
    start = tl.program_id(axis=0)
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    tiles = tiles_m * tiles_n
    tile_c = start - NUM_SMS
    in_group = GROUP_M * tiles_n
    for tile in tl.range(start, tiles, NUM_SMS, flatten=True):
        pid_m, pid_n = tile_of(tile, in_group, tiles_m, GROUP_M)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float64)
        for kk in range(tl.cdiv(K, BLOCK_K)):
            a = a_desc.load([pid_m * BLOCK_M, kk * BLOCK_K])
            b = b_desc.load([pid_n * BLOCK_N, kk * BLOCK_K])
            acc = tl.dot(a, b.T, acc)
        tile_c += NUM_SMS
        pid_m, pid_n = tile_of(tile_c, in_group, tiles_m, GROUP_M)
        if EPILOGUE_SUBTILE:
            left, right = tl.split(tl.permute(tl.reshape(acc, (BLOCK_M, 2, BLOCK_N // 2)), (0, 2, 1)))
            c_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N], left)
            c_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N + SECOND_AT], right)
        else:
            c_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N], acc)


@tritongrad.op
def persistent_mm_descriptors(a, b_t, num_sms: int, subtile: bool, second_at: int = 8):
    M, K = a.shape
    N = b_t.shape[0]
    c = torch.full((M, N), float("nan"), device=a.device, dtype=a.dtype)
    grid = (min(num_sms, triton.cdiv(M, 16) * triton.cdiv(N, 16)),)
    persistent_matmul_descriptors[grid](a, b_t, c, M, N, K, BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, GROUP_M=2,
                                        NUM_SMS=num_sms, EPILOGUE_SUBTILE=subtile, SECOND_AT=second_at)
    return c


@pytest.mark.skipif(not hasattr(tl, "make_tensor_descriptor"), reason="this Triton has no tl.make_tensor_descriptor")
@pytest.mark.parametrize("subtile", [False, True])
@float64_dots
def test_the_persistent_matmul_through_descriptors_gets_pytorchs_gradients(subtile, poisoned_empty):
    a = torch.randn(37, 48, dtype=D, device=DEVICE, requires_grad=True)
    b_t = torch.randn(40, 48, dtype=D, device=DEVICE, requires_grad=True)
    c = persistent_mm_descriptors(a, b_t, 3, subtile)
    want = a @ b_t.T
    torch.testing.assert_close(c, want.detach())
    g = torch.randn_like(c)
    for x, y in zip(torch.autograd.grad(c, (a, b_t), g), torch.autograd.grad(want, (a, b_t), g), strict=True):
        torch.testing.assert_close(x, y)


@pytest.mark.skipif(not hasattr(tl, "make_tensor_descriptor"), reason="this Triton has no tl.make_tensor_descriptor")
@float64_dots
def test_halves_stored_through_a_descriptor_into_each_other_are_refused():
    a = torch.randn(37, 48, dtype=D, device=DEVICE, requires_grad=True)
    b_t = torch.randn(40, 48, dtype=D, device=DEVICE, requires_grad=True)
    c = persistent_mm_descriptors(a, b_t, 3, True, second_at=4)  # the right half over half the left (16-byte aligned)
    with pytest.raises(tritongrad.NotDifferentiableError, match="second tl.store"):
        c.sum().backward()


@triton.jit
def halves(x_ptr, y_ptr, n, SHIFT: tl.constexpr, BLOCK: tl.constexpr):
    # rows of n (their stride): a tile of 2 * BLOCK columns stored as two halves, the second SHIFT further on,
    # each masked by the row's end (a ragged last tile would reach into the next row)
    row = tl.program_id(0) * n
    cols = tl.program_id(1) * 2 * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + row + cols, tl.load(x_ptr + row + cols, mask=cols < n) * 2.0, mask=cols < n)
    right = tl.load(x_ptr + row + cols + BLOCK, mask=cols + BLOCK < n)
    tl.store(y_ptr + row + cols + SHIFT, right * 3.0, mask=cols + SHIFT < n)


@pytest.mark.parametrize("shift, apart", [(8, True), (7, False)])
def test_halves_of_a_tile_stored_apart_are_told_apart_by_their_masks(shift, apart, poisoned_empty):
    """The second half's mask is the first's moved by the shift: read as one bound over both stores (the
    persistent tutorial's EPILOGUE_SUBTILE), so a ragged last tile is no overlap; a shift into the first half is."""
    def launch(x):
        y = torch.full_like(x, float("nan"))
        halves[(x.shape[0], triton.cdiv(x.shape[1], 16))](x, y, x.shape[1], SHIFT=shift, BLOCK=8)
        return y

    x = torch.randn(3, 45, dtype=D, device=DEVICE, requires_grad=True)
    y = tritongrad.op(launch)(x)
    if not apart:
        with pytest.raises(tritongrad.NotDifferentiableError, match="second tl.store"):
            y.sum().backward()
        return
    want = torch.where(torch.arange(45, device=DEVICE) % 16 < 8, 2.0, 3.0).to(D)
    torch.testing.assert_close(y, x.detach() * want)
    g = torch.randn_like(y)
    (got,) = torch.autograd.grad(y, (x,), g)
    torch.testing.assert_close(got, g * want)


# -- the persistent matmul and tiles stored in halves, called as users call them: one tensor twice, views of one
# storage, expanded and transposed operands, one program, more programs than tiles. Each leaf's gradient against
# autograd on plain PyTorch through the same views, in float64.

def assert_bound(op, reference, leaves, build):
    """``op`` and ``reference`` on the tensors ``build`` makes of fresh copies of ``leaves``: the same value and the
    same gradient of every leaf (autograd maps the views' gradients to their leaves)."""
    ours = [x.detach().clone().requires_grad_() for x in leaves]
    theirs = [x.detach().clone().requires_grad_() for x in leaves]
    got, want = op(*build(*ours)), reference(*build(*theirs))
    torch.testing.assert_close(got, want.detach())
    g = torch.randn_like(want)
    for name, x, y in zip("abcdef", torch.autograd.grad(got, ours, g), torch.autograd.grad(want, theirs, g),
                          strict=False):
        torch.testing.assert_close(x, y, msg=lambda m, name=name: f"leaf {name}: {m}")


def randn(*shape):
    return torch.randn(*shape, dtype=D, device=DEVICE)


MATMUL_BINDINGS = {  # leaves, how the matmul's A and B are made from them (then the launch: NUM_SMS, programs)
    "A @ A": (lambda: [randn(29, 29)], lambda a: (a, a), (3, None)),
    "A @ A.T": (lambda: [randn(37, 20)], lambda a: (a, a.t()), (3, None)),
    "two row slices of one buffer": (lambda: [randn(37 + 20, 20)], lambda base: (base[:37], base[37:]), (3, None)),
    "two flat slices of one buffer": (lambda: [randn(37 * 20 + 20 * 29)],
                                      lambda base: (base[:740].view(37, 20), base[740:].view(20, 29)), (3, None)),
    "overlapping slices": (lambda: [randn(50, 20)], lambda base: (base[:37], base[30:]), (3, None)),
    "interleaved views": (lambda: [randn(33, 33, 2)], lambda base: (base[..., 0], base[..., 1]), (3, None)),
    "B expanded (stride 0)": (lambda: [randn(37, 20), randn(1, 29)], lambda a, v: (a, v.expand(20, 29)), (3, None)),
    "A a column expanded": (lambda: [randn(37, 1), randn(20, 29)], lambda v, b: (v.expand(37, 20), b), (3, None)),
    "A a row of B, expanded": (lambda: [randn(20, 20)], lambda b: (b[:1].expand(37, 20), b), (3, None)),
    "A transposed": (lambda: [randn(20, 37), randn(20, 29)], lambda a_t, b: (a_t.t(), b), (3, None)),
    "B a slice of a wider buffer": (lambda: [randn(37, 20), randn(22, 33)], lambda a, b: (a, b[1:21, 2:31]),
                                    (3, None)),
    "one program": (lambda: [randn(37, 20), randn(20, 29)], lambda a, b: (a, b), (1, None)),
    "more programs than tiles": (lambda: [randn(37, 20), randn(20, 29)], lambda a, b: (a, b), (11, 11)),
    "one program, A @ A.T": (lambda: [randn(37, 20)], lambda a: (a, a.t()), (1, None)),
}


@pytest.mark.parametrize("subtile", [False, True])
@pytest.mark.parametrize("binding", list(MATMUL_BINDINGS))
@float64_dots
def test_the_persistent_matmul_gets_pytorchs_gradients_however_its_operands_are_bound(binding, subtile,
                                                                                       poisoned_empty):
    """One storage for A and B (written by both adjoints: each into a buffer of its own, added after), views that
    overlap or interleave, stride 0 (atomic adds), strides the launch passes, a grid of one program and one of more
    programs than tiles (those past the tiles run no iteration)."""
    leaves, build, (num_sms, programs) = MATMUL_BINDINGS[binding]
    assert_bound(lambda a, b: persistent_mm(a, b, num_sms, subtile, programs), lambda a, b: a @ b, leaves(), build)


def _descriptor_launch(a, b_t, num_sms, subtile, programs=None):
    M, K = a.shape
    N = b_t.shape[0]
    c = torch.empty((M, N), device=a.device, dtype=a.dtype)
    grid = (programs or min(num_sms, triton.cdiv(M, 16) * triton.cdiv(N, 16)),)
    persistent_matmul_descriptors[grid](a, b_t, c, M, N, K, BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, GROUP_M=2,
                                        NUM_SMS=num_sms, EPILOGUE_SUBTILE=subtile, SECOND_AT=8)
    return c


@tritongrad.op
def persistent_mm_any_layout(a, b_t, num_sms: int, subtile: bool, programs: int | None = None):
    """The descriptors are made in the kernel with row-major strides: the launcher makes its operands contiguous,
    as users do (a copy for a transposed or expanded operand, the tensor itself otherwise)."""
    return _descriptor_launch(a.contiguous(), b_t.contiguous(), num_sms, subtile, programs)


DESCRIPTOR_BINDINGS = {  # leaves, how A and B^T are made from them (N and K even: descriptors' 16-byte strides)
    "A @ A.T (one tensor twice)": (lambda: [randn(38, 48)], lambda a: (a, a), (3, None)),
    "two row slices of one buffer": (lambda: [randn(37 + 40, 48)], lambda base: (base[:37], base[37:]), (3, None)),
    "overlapping slices": (lambda: [randn(41, 48)], lambda base: (base[:37], base[3:]), (3, None)),
    "B^T expanded (stride 0)": (lambda: [randn(37, 48), randn(1, 48)], lambda a, v: (a, v.expand(40, 48)),
                                (3, None)),
    "A transposed": (lambda: [randn(48, 37), randn(40, 48)], lambda a_t, b: (a_t.t(), b), (3, None)),
    "one program": (lambda: [randn(37, 48), randn(40, 48)], lambda a, b: (a, b), (1, None)),
    "more programs than tiles": (lambda: [randn(37, 48), randn(40, 48)], lambda a, b: (a, b), (11, 11)),
}


@pytest.mark.skipif(not hasattr(tl, "make_tensor_descriptor"), reason="this Triton has no tl.make_tensor_descriptor")
@pytest.mark.parametrize("subtile", [False, True])
@pytest.mark.parametrize("binding", list(DESCRIPTOR_BINDINGS))
@float64_dots
def test_the_persistent_matmul_through_descriptors_gets_pytorchs_gradients_however_its_operands_are_bound(
        binding, subtile, poisoned_empty):
    leaves, build, (num_sms, programs) = DESCRIPTOR_BINDINGS[binding]
    assert_bound(lambda a, b_t: persistent_mm_any_layout(a, b_t, num_sms, subtile, programs), lambda a, b_t: a @ b_t.T,
                 leaves(), build)


@triton.jit
def walk_by_the_grid(x_ptr, y_ptr, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr,
                     SHORT: tl.constexpr):
    # the persistent walk stepping by the grid's size, tl.num_programs(0) written where it is used: in the loop's
    # range and in the epilogue's counter (SHORT: the counter one program short of the loop's step)
    start = tl.program_id(axis=0)
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    in_group = GROUP_M * tiles_n
    tile_c = start - (tl.num_programs(0) - SHORT)
    for tile in tl.range(start, tiles_m * tiles_n, tl.num_programs(0), flatten=True):
        pid_m, pid_n = tile_of(tile, in_group, tiles_m, GROUP_M)
        rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        x = tl.load(x_ptr + rows[:, None] * N + cols[None, :], mask=(rows[:, None] < M) & (cols[None, :] < N))
        tile_c += tl.num_programs(0) - SHORT
        pid_m, pid_n = tile_of(tile_c, in_group, tiles_m, GROUP_M)
        rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        tl.store(y_ptr + rows[:, None] * N + cols[None, :], tl.sin(x) * 2.0,
                 mask=(rows[:, None] < M) & (cols[None, :] < N))


def walked(programs, short=0):
    @tritongrad.op
    def walk(x):
        y = torch.empty_like(x)
        walk_by_the_grid[(programs,)](x, y, x.shape[0], x.shape[1], BLOCK_M=8, BLOCK_N=8, GROUP_M=2, SHORT=short)
        return y

    return walk


@pytest.mark.parametrize("programs", [1, 3, 20, 25])
def test_an_epilogue_counter_stepping_by_tl_num_programs_gets_pytorchs_gradients(programs, poisoned_empty):
    """``tile_c += tl.num_programs(0)`` in the loop: the grid's size, the same in every iteration, so the counter
    is the loop's index again (refused before, as if the tile reached the program id only through `//`, where
    ``step = tl.num_programs(0)`` named before the loop passed). 20 tiles: one program, fewer, as many, more."""
    x = randn(37, 29).requires_grad_()
    y = walked(programs)(x)
    torch.testing.assert_close(y, 2 * torch.sin(x.detach()))
    g = torch.randn_like(y)
    torch.testing.assert_close(torch.autograd.grad(y, x, g)[0], 2 * torch.cos(x.detach()) * g)


def test_an_epilogue_counter_one_program_short_of_the_loops_step_is_refused_where_a_program_walks_two_tiles():
    x = randn(37, 29).requires_grad_()
    y = walked(20, short=1)(x)  # every program one tile: the counter's first value is the tile
    torch.testing.assert_close(torch.autograd.grad(y.sum(), x)[0], 2 * torch.cos(x.detach()))
    y = walked(3, short=1)(x)  # program 0's second tile is stored at tile 2, which program 2 stores too
    with pytest.raises(tritongrad.NotDifferentiableError, match="compute the same"):
        y.sum().backward()


@triton.jit
def halves_of_a_product(x_ptr, w_ptr, y_ptr, n, stride_xm, stride_xn, stride_wm, stride_wn, SHIFT: tl.constexpr,
                        BLOCK: tl.constexpr):
    # x * w over rows of n, read at the strides the launch passes: a tile of 2 * BLOCK columns stored as two halves
    # into a row-major y, the second (scaled by 3) SHIFT further on, each masked by the row's end
    row = tl.program_id(0)
    cols = tl.program_id(1) * 2 * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * stride_xm + cols * stride_xn, mask=cols < n)
    w = tl.load(w_ptr + row * stride_wm + cols * stride_wn, mask=cols < n)
    tl.store(y_ptr + row * n + cols, x * w, mask=cols < n)
    x = tl.load(x_ptr + row * stride_xm + (cols + BLOCK) * stride_xn, mask=cols + BLOCK < n)
    w = tl.load(w_ptr + row * stride_wm + (cols + BLOCK) * stride_wn, mask=cols + BLOCK < n)
    tl.store(y_ptr + row * n + cols + SHIFT, x * w * 3.0, mask=cols + SHIFT < n)


def halved_product(shift=8, extra=0, deterministic=False):
    """The op: a program per row and per 16 columns (``extra`` programs more along the columns, all masked off)."""
    @tritongrad.op(deterministic=deterministic)
    def product(x, w):
        y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        halves_of_a_product[(x.shape[0], triton.cdiv(x.shape[1], 16) + extra)](
            x, w, y, x.shape[1], x.stride(0), x.stride(1), w.stride(0), w.stride(1), SHIFT=shift, BLOCK=8)
        return y

    return product


def halved_reference(x, w):
    return x * w * torch.where(torch.arange(x.shape[1], device=x.device) % 16 < 8, 1.0, 3.0).to(x.dtype)


HALVES_BINDINGS = {  # leaves, how x and w are made from them, programs more than the columns need
    "x * x": (lambda: [randn(3, 45)], lambda x: (x, x), 0),
    "x * x.T": (lambda: [randn(20, 20)], lambda x: (x, x.t()), 0),
    "two row slices of one buffer": (lambda: [randn(6, 45)], lambda base: (base[:3], base[3:]), 0),
    "rows overlapping": (lambda: [randn(4, 45)], lambda base: (base[:3], base[1:]), 0),
    "columns overlapping": (lambda: [randn(3, 50)], lambda base: (base[:, :45], base[:, 5:]), 0),
    "interleaved views": (lambda: [randn(3, 45, 2)], lambda base: (base[..., 0], base[..., 1]), 0),
    "w a row expanded (stride 0)": (lambda: [randn(3, 45), randn(1, 45)], lambda x, w: (x, w.expand(3, 45)), 0),
    "w a column expanded": (lambda: [randn(3, 45), randn(3, 1)], lambda x, w: (x, w.expand(3, 45)), 0),
    "w a row of x, expanded": (lambda: [randn(3, 45)], lambda x: (x, x[1:2].expand(3, 45)), 0),
    "x transposed": (lambda: [randn(45, 3), randn(3, 45)], lambda x_t, w: (x_t.t(), w), 0),
    "one program": (lambda: [randn(1, 13), randn(1, 13)], lambda x, w: (x, w), 0),
    "more programs than tiles": (lambda: [randn(3, 45), randn(3, 45)], lambda x, w: (x, w), 2),
}


@pytest.mark.parametrize("binding, deterministic", [(b, d) for b in HALVES_BINDINGS for d in (False, True)
                                                    if not (d and "expanded" in b)])
def test_halves_of_a_tile_stored_apart_get_pytorchs_gradients_however_the_inputs_are_bound(binding, deterministic,
                                                                                           poisoned_empty):
    """The halves' stores checked apart whatever the loads read: one tensor twice, overlapping and interleaved
    views, a transposed one, one program, programs past the columns; deterministic too, but for an expanded input,
    which it refuses (below): only atomic adds could write its gradient."""
    leaves, build, extra = HALVES_BINDINGS[binding]
    assert_bound(halved_product(extra=extra, deterministic=deterministic), halved_reference, leaves(), build)


@pytest.mark.parametrize("binding", [b for b in HALVES_BINDINGS if "expanded" in b])
def test_an_expanded_input_of_the_halves_is_refused_with_deterministic(binding):
    leaves, build, extra = HALVES_BINDINGS[binding]
    x, w = build(*[t.requires_grad_() for t in leaves()])
    with pytest.raises(tritongrad.NotDifferentiableError, match=r"`w_ptr` with deterministic=True: .*reaches one "
                       r"element from several positions \(expanded, stride 0\)"):
        halved_product(deterministic=True)(x, w).sum().backward()


@pytest.mark.parametrize("shift", [7, 0, 16])
def test_halves_stored_into_each_other_or_the_next_tile_are_refused_however_the_inputs_are_bound(shift):
    """A shift into the first half, onto it, or onto the next tile's first half: both stores write one element.
    Refused at the launch (or, onto it, at derivation) with one tensor twice as with two."""
    same = randn(3, 45).requires_grad_()
    for x, w in ((randn(3, 45).requires_grad_(), randn(3, 45).requires_grad_()), (same, same)):
        with pytest.raises(tritongrad.NotDifferentiableError, match="second tl.store"):
            halved_product(shift=shift)(x, w).sum().backward()


@triton.jit
def clamped_rows(x_ptr, y_ptr, LAST, BLOCK: tl.constexpr):
    row = min(tl.program_id(0), LAST)  # programs past LAST all write row LAST
    cols = tl.arange(0, BLOCK)
    tl.store(y_ptr + row * BLOCK + cols, tl.load(x_ptr + tl.program_id(0) * BLOCK + cols) * 2.0)


def test_a_swizzle_that_sends_two_programs_to_one_tile_is_refused_at_the_launch():
    def launch(x, programs, last):
        y = torch.zeros(((last + 1) * 4,), dtype=x.dtype, device=x.device)
        clamped_rows[(programs,)](x, y, last, BLOCK=4)
        return y

    op = tritongrad.op(launch)
    x = torch.randn(20, dtype=D, device=DEVICE, requires_grad=True)
    (got,) = torch.autograd.grad(op(x, 5, 4).sum(), (x,))  # each program its own row: fine
    torch.testing.assert_close(got, torch.full_like(x, 2.0))
    with pytest.raises(tritongrad.NotDifferentiableError, match="compute the same"):
        op(x, 5, 2).sum().backward()


NONE = tl.constexpr(0)


@triton.jit
def kl_divergence(y_ptr, target_ptr, loss_ptr, n_cols, eps, BLOCK: tl.constexpr, REDUCTION: tl.constexpr):
    # one kernel for every reduction mode: per element, or summed per row (a constexpr chooses the store, and the
    # pointer's advance through a conditional expression)
    pid = tl.program_id(0)
    y_ptr += pid * n_cols
    target_ptr += pid * n_cols
    loss_ptr += pid * n_cols if REDUCTION == NONE else pid
    row_sum = tl.zeros([], dtype=y_ptr.dtype.element_ty)  # (as wide as the data: 0.0 is float32)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < n_cols
        y = tl.load(y_ptr + cols, mask=mask, other=0.0)
        t = tl.load(target_ptr + cols, mask=mask, other=0.0)
        loss = t * (tl.log(tl.maximum(t, eps)) - y)
        if REDUCTION == NONE:
            tl.store(loss_ptr + cols, loss, mask=mask)
        else:
            row_sum += tl.sum(loss, axis=0)
    if REDUCTION != NONE:
        tl.store(loss_ptr, row_sum)


@triton.jit
def kl_divergence_runtime_mode(y_ptr, target_ptr, loss_ptr, n_cols, eps, reduction, BLOCK: tl.constexpr):
    # the mode a runtime argument: two stores to one output at addresses that meet, never both at one launch
    pid = tl.program_id(0)
    row_sum = tl.zeros([], dtype=y_ptr.dtype.element_ty)  # (as wide as the data: 0.0 is float32)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < n_cols
        y = tl.load(y_ptr + pid * n_cols + cols, mask=mask, other=0.0)
        t = tl.load(target_ptr + pid * n_cols + cols, mask=mask, other=0.0)
        loss = t * (tl.log(tl.maximum(t, eps)) - y)
        if reduction == 0:
            tl.store(loss_ptr + pid * n_cols + cols, loss, mask=mask)
        else:
            row_sum += tl.sum(loss, axis=0)
    if reduction >= 1:
        tl.store(loss_ptr + pid, row_sum)


@pytest.mark.parametrize("runtime", [False, True], ids=["constexpr mode", "runtime mode"])
@pytest.mark.parametrize("reduction", [0, 1])
def test_a_kl_divergence_with_a_store_per_mode_gets_pytorchs_gradients(reduction, runtime, poisoned_empty):
    @tritongrad.op
    def kl(y, target, reduction: int):
        rows, cols = y.shape
        loss = torch.empty((rows, cols) if reduction == 0 else (rows,), dtype=y.dtype, device=y.device)
        if runtime:
            kl_divergence_runtime_mode[(rows,)](y, target, loss, cols, 1e-10, reduction, BLOCK=16)
        else:
            kl_divergence[(rows,)](y, target, loss, cols, 1e-10, BLOCK=16, REDUCTION=reduction)
        return loss

    y = torch.randn(5, 37, dtype=D, device=DEVICE).log_softmax(-1).requires_grad_()
    target = torch.randn(5, 37, dtype=D, device=DEVICE).softmax(-1)
    loss = kl(y, target, reduction)
    want = target * (target.clamp_min(1e-10).log() - y)
    want = want if reduction == 0 else want.sum(-1)
    torch.testing.assert_close(loss, want.detach())
    g = torch.randn_like(loss)
    torch.testing.assert_close(torch.autograd.grad(loss, (y,), g)[0], torch.autograd.grad(want, (y,), g)[0])


@triton.jit
def two_modes_that_overlap(x_ptr, y_ptr, mode, BLOCK: tl.constexpr):
    cols = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + cols)
    if mode >= 1:
        tl.store(y_ptr + cols, x * 2.0)
    if mode >= 2:
        tl.store(y_ptr + (BLOCK - 1 - cols), x * 3.0)  # (reversed: the two stores meet)


def test_stores_of_two_modes_that_both_run_at_a_launch_are_refused_there():
    def launch(x, mode):
        y = torch.zeros_like(x)
        two_modes_that_overlap[(1,)](x, y, mode, BLOCK=8)
        return y

    op = tritongrad.op(launch)
    x = torch.randn(8, dtype=D, device=DEVICE, requires_grad=True)
    (got,) = torch.autograd.grad(op(x, 1).sum(), (x,))
    torch.testing.assert_close(got, torch.full_like(x, 2.0))
    with pytest.raises(tritongrad.NotDifferentiableError, match="both run at this launch"):
        op(x, 2).sum().backward()


@triton.jit
def layer_norm_forward(X, Y, W, B, Mean, Rstd, stride, N, eps, BLOCK_SIZE: tl.constexpr):
    # the tutorial's shape: row pointers advanced in place, the mean, the variance and the output each in a loop of
    # their own over the row, the mean and 1/std stored beside the output
    row = tl.program_id(0)
    Y += row * stride
    X += row * stride
    mean = 0
    partial_sums = tl.zeros([BLOCK_SIZE], dtype=X.dtype.element_ty)
    for off in range(0, N, BLOCK_SIZE):
        cols = off + tl.arange(0, BLOCK_SIZE)
        partial_sums += tl.load(X + cols, mask=cols < N, other=0.)
    mean = tl.sum(partial_sums, axis=0) / N
    partial_squares = tl.zeros([BLOCK_SIZE], dtype=X.dtype.element_ty)
    for off in range(0, N, BLOCK_SIZE):
        cols = off + tl.arange(0, BLOCK_SIZE)
        x = tl.load(X + cols, mask=cols < N, other=0.)
        x = tl.where(cols < N, x - mean, 0.)
        partial_squares += x * x
    rstd = 1 / tl.sqrt(tl.sum(partial_squares, axis=0) / N + eps)
    tl.store(Mean + row, mean)
    tl.store(Rstd + row, rstd)
    for off in range(0, N, BLOCK_SIZE):
        cols = off + tl.arange(0, BLOCK_SIZE)
        mask = cols < N
        w = tl.load(W + cols, mask=mask)
        b = tl.load(B + cols, mask=mask)
        x = tl.load(X + cols, mask=mask, other=0.)
        tl.store(Y + cols, (x - mean) * rstd * w + b, mask=mask)


@tritongrad.op
def tutorial_layer_norm(x, weight, bias, eps: float):
    y = torch.empty_like(x)
    x_arg = x.reshape(-1, x.shape[-1])
    m, n = x_arg.shape
    mean = torch.empty((m,), dtype=x.dtype, device=x.device)
    rstd = torch.empty((m,), dtype=x.dtype, device=x.device)
    layer_norm_forward[(m,)](x_arg, y, weight, bias, mean, rstd, x_arg.stride(0), n, eps, BLOCK_SIZE=16)
    return y


def test_the_tutorials_layer_norm_forward_gets_pytorchs_gradients(poisoned_empty):
    x = torch.randn(3, 7, 37, dtype=D, device=DEVICE, requires_grad=True)
    w = torch.randn(37, dtype=D, device=DEVICE, requires_grad=True)
    b = torch.randn(37, dtype=D, device=DEVICE, requires_grad=True)
    y = tutorial_layer_norm(x, w, b, 1e-5)
    want = torch.nn.functional.layer_norm(x, (37,), w, b, 1e-5)
    torch.testing.assert_close(y, want)
    g = torch.randn_like(y)
    for name, got, expected in zip("xwb", torch.autograd.grad(y, (x, w, b), g),
                                   torch.autograd.grad(want, (x, w, b), g), strict=True):
        torch.testing.assert_close(got, expected, msg=f"d{name}")


@triton.jit
def seeded_dropout(x_ptr, output_ptr, n_elements, p, seed, BLOCK_SIZE: tl.constexpr):
    # the low-memory dropout: the mask is never stored, but made again from the seed and each element's offset
    offsets = tl.program_id(axis=0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    x = tl.load(x_ptr + offsets, mask=mask)
    keep = tl.rand(seed, offsets) > p
    tl.store(output_ptr + offsets, tl.where(keep, x / (1 - p), 0.0), mask=mask)


@tritongrad.op
def dropout(x, p: float, seed: int):
    out = torch.empty_like(x)
    n = x.numel()
    seeded_dropout[(triton.cdiv(n, 16),)](x, out, n, p, seed, BLOCK_SIZE=16)
    return out


def test_the_tutorials_seeded_dropout_gets_the_gradient_of_the_mask_it_drew(poisoned_empty):
    x = torch.randn(101, dtype=D, device=DEVICE, requires_grad=True)
    out = dropout(x, 0.25, 1234)
    kept = out.detach() != 0
    assert 0.5 < kept.double().mean() < 0.95  # (a mask was drawn; each element kept with probability 3/4)
    torch.testing.assert_close(out, torch.where(kept, x.detach() / 0.75, 0.0))
    g = torch.randn_like(out)
    (got,) = torch.autograd.grad(out, x, g)
    torch.testing.assert_close(got, torch.where(kept, g / 0.75, 0.0))
    torch.testing.assert_close(dropout(x, 0.25, 1234), out)  # the same seed, the same mask


@triton.jit
def conv1x1_nchw(x_ptr, w_ptr, y_ptr, NB, C, K, H, W, BLOCK: tl.constexpr, BC: tl.constexpr):
    # an im2col-style 1x1 convolution: each lane a pixel of the flattened (n, h, w) index, split with // and %
    # into the NCHW output's batch, row and column; a program per block of pixels and output channel
    pid = tl.program_id(0)
    k = tl.program_id(1)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    n = offs // (H * W)
    hw = offs % (H * W)
    h = hw // W
    w = hw % W
    cs = tl.arange(0, BC)
    in_range = offs < NB * H * W
    x = tl.load(x_ptr + n[:, None] * (C * H * W) + cs[None, :] * (H * W) + (h * W + w)[:, None],
                mask=in_range[:, None] & (cs < C)[None, :], other=0.0)
    weights = tl.load(w_ptr + k * C + cs, mask=cs < C, other=0.0)
    tl.store(y_ptr + n * (K * H * W) + k * (H * W) + h * W + w, tl.sum(x * weights[None, :], axis=1), mask=in_range)


@tritongrad.op
def conv1x1(x, weight):
    nb, c, h, w = x.shape
    k = weight.shape[0]
    y = torch.empty((nb, k, h, w), dtype=x.dtype, device=x.device)
    conv1x1_nchw[(triton.cdiv(nb * h * w, 16), k)](x, weight, y, nb, c, k, h, w, BLOCK=16, BC=8)
    return y


def test_a_convolution_storing_nchw_from_split_lane_indices_gets_pytorchs_gradients(poisoned_empty):
    """A lane index split into (n, h, w) by // and %, and the pixel digit split again: each digit with its own
    stride (refused before, as if the pixel digit folded lanes)."""
    x = torch.randn(2, 5, 3, 7, dtype=D, device=DEVICE, requires_grad=True)
    weight = torch.randn(4, 5, dtype=D, device=DEVICE, requires_grad=True)
    y = conv1x1(x, weight)
    want = torch.einsum("nchw,kc->nkhw", x, weight)
    torch.testing.assert_close(y, want)
    g = torch.randn_like(y)
    for got, expected in zip(torch.autograd.grad(y, (x, weight), g), torch.autograd.grad(want, (x, weight), g),
                             strict=True):
        torch.testing.assert_close(got, expected)


@triton.jit
def pixels_to_rows(x_ptr, y_ptr, NB, H, W, row_stride, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    n = offs // (H * W)
    hw = offs % (H * W)
    x = tl.load(x_ptr + offs, mask=offs < NB * H * W)
    tl.store(y_ptr + n * (H * row_stride) + (hw // W) * row_stride + hw % W, x * 2.0, mask=offs < NB * H * W)


@tritongrad.op
def spaced_rows(x, row_stride: int):
    nb, h, w = x.shape
    y = torch.zeros(nb * h * row_stride + w, dtype=x.dtype, device=x.device)
    pixels_to_rows[(triton.cdiv(x.numel(), 16),)](x, y, nb, h, w, row_stride, BLOCK=16)
    return y


def test_split_lane_indices_are_checked_apart_with_the_launchs_strides():
    x = torch.randn(2, 3, 5, dtype=D, device=DEVICE, requires_grad=True)
    for row_stride in (5, 7):
        y = spaced_rows(x, row_stride)
        g = torch.randn_like(y)
        (got,) = torch.autograd.grad(y, x, g)
        at = (torch.arange(2, device=DEVICE)[:, None, None] * 3 * row_stride
              + torch.arange(3, device=DEVICE)[None, :, None] * row_stride + torch.arange(5, device=DEVICE))
        torch.testing.assert_close(got, 2 * g[at])
    y = spaced_rows(x, 4)  # rows of 5 pixels 4 apart: a row's last pixel is the next row's first
    with pytest.raises(tritongrad.NotDifferentiableError, match="two lanes or programs reach one element"):
        y.backward(torch.ones_like(y))


@triton.jit
def digit_of_a_digit_alone(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    r = offs % 4
    x = tl.load(x_ptr + offs, mask=offs < n)
    tl.store(y_ptr + (offs // 4) * 4 + r + 2 * (r // 2), x, mask=offs < n)  # lanes 2 and 4 both write element 4


def test_a_digit_split_again_without_its_partner_is_refused():
    """`(offs % 4) // 2` alone folds lanes: it was taken as a constant (the address then seemed to keep lanes apart)
    and the derived backward gave two lanes the gradient of one element."""
    with pytest.raises(tritongrad.NotDifferentiableError, match=r"\(\(lane axis 0\) % 4\) // 2` without the other"):
        tritongrad.grad(digit_of_a_digit_alone)


@triton.jit
def varlen_softmax_kernel(x_ptr, y_ptr, cu_seqlens, BLOCK: tl.constexpr):
    # one program per sequence of a packed batch, its bounds read from cu_seqlens; the mask spelled on the address
    seq = tl.program_id(0)
    start = tl.load(cu_seqlens + seq)
    end = tl.load(cu_seqlens + seq + 1)
    cols = tl.arange(0, BLOCK)
    mask = start + cols < end
    x = tl.load(x_ptr + start + cols, mask=mask, other=-float("inf"))
    e = tl.exp(x - tl.max(x, 0))
    tl.store(y_ptr + start + cols, e / tl.sum(e, 0), mask=mask)


@tritongrad.op
def varlen_softmax(x, cu_seqlens):
    y = torch.empty_like(x)
    varlen_softmax_kernel[(cu_seqlens.numel() - 1,)](x, y, cu_seqlens, BLOCK=16)
    return y


@pytest.mark.parametrize("lengths", [[3, 5, 0, 4], [3, 0, 0, 7], [4, 2, 6]])
def test_a_varlen_softmax_masked_on_its_address_gets_pytorchs_gradients(lengths, poisoned_empty):
    """`start + cols < end` bounds each program's stores to its own sequence (refused at launch before,
    "programs 2 and 3 write one element", as if every program wrote a whole block from its start); an empty
    sequence writes nothing."""
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device=DEVICE)
    x = torch.randn(int(cu[-1]), dtype=D, device=DEVICE, requires_grad=True)
    y = varlen_softmax(x, cu)
    want = torch.cat([torch.softmax(part, 0) for part in torch.split(x, lengths)])
    torch.testing.assert_close(y, want)
    g = torch.randn_like(y)
    torch.testing.assert_close(torch.autograd.grad(y, x, g)[0], torch.autograd.grad(want, x, g)[0])


def test_sequences_whose_bounds_overlap_are_refused_at_the_launch():
    cu = torch.tensor([0, 5, 3, 9], dtype=torch.int32, device=DEVICE)  # the third sequence starts inside the first
    x = torch.randn(9, dtype=D, device=DEVICE, requires_grad=True)
    y = varlen_softmax(x, cu)
    with pytest.raises(tritongrad.NotDifferentiableError, match="programs 0 and 2"):
        y.backward(torch.ones_like(y))


@triton.jit
def scaled_row_tiles(x_ptr, w_ptr, z_ptr, y_ptr, M, K, BM: tl.constexpr, BK: tl.constexpr, TILES_M: tl.constexpr):
    # row tiles in a grid-stride loop, column tiles on the grid's second axis: one scale and shift per row tile,
    # read by every column tile
    col_tile = tl.program_id(1)
    for row_tile in range(tl.program_id(0), TILES_M, tl.num_programs(0)):
        rm = row_tile * BM + tl.arange(0, BM)
        rk = col_tile * BK + tl.arange(0, BK)
        mask = (rm[:, None] < M) & (rk[None, :] < K)
        x = tl.load(x_ptr + rm[:, None] * K + rk[None, :], mask=mask, other=0.0)
        tl.store(y_ptr + rm[:, None] * K + rk[None, :], x * tl.load(w_ptr + row_tile) + tl.load(z_ptr + row_tile),
                 mask=mask)


@tritongrad.op
def scale_row_tiles(x, w, z, programs: int):
    y = torch.empty_like(x)
    scaled_row_tiles[(programs, triton.cdiv(x.shape[1], 8))](x, w, z, y, x.shape[0], x.shape[1], BM=8, BK=8,
                                                            TILES_M=triton.cdiv(x.shape[0], 8))
    return y


@pytest.mark.parametrize("programs", [2, 3, 4])
def test_a_grid_stride_loop_with_a_ragged_last_round_gets_pytorchs_gradients(programs):
    """3 row tiles over 2 programs: program 1 runs one iteration fewer than program 0. The scale's and shift's own
    kernel (one program per iteration) took program 0's count for every program: a phantom iteration stored 0
    into the element after the shift (found by the fuzzer's persistent family, seed 3903)."""
    x = torch.randn(23, 18, dtype=D, device=DEVICE, requires_grad=True)
    packed = torch.randn(7, dtype=D, device=DEVICE, requires_grad=True)
    w, z = packed[:3], packed[3:6]  # z's neighbour is the packed tensor's last element
    y = scale_row_tiles(x, w, z, programs)
    rows = torch.arange(23, device=DEVICE) // 8
    want = x * w[rows, None] + z[rows, None]
    torch.testing.assert_close(y, want)
    g = torch.randn_like(y)
    for got, expected in zip(torch.autograd.grad(y, (x, packed), g), torch.autograd.grad(want, (x, packed), g),
                             strict=True):
        torch.testing.assert_close(got, expected)


@triton.jit
def pairs_to_halves(x_ptr, y_ptr, M, K, HALF, BM: tl.constexpr, BK: tl.constexpr):
    # a ragged (BM, BK) tile of a row-major (M, K) tensor, its flat index split into pairs: the even elements to
    # the first half of y, the odd ones to the second
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    rk = tl.arange(0, BK)
    mask = (rm[:, None] < M) & (rk[None, :] < K)
    flat = rm[:, None] * K + rk[None, :]
    x = tl.load(x_ptr + flat, mask=mask)
    tl.store(y_ptr + (flat % 2) * HALF + flat // 2, x * 3.0, mask=mask)


def test_a_split_of_a_ragged_tile_counts_only_the_lanes_that_store():
    """14 x 3 in 16 x 8 tiles: the masked-off lanes' flat indices run past M * K; counted, the quotient seemed to
    reach into the second half (refused at launch before)."""
    x = torch.randn(14, 3, dtype=D, device=DEVICE, requires_grad=True)

    @tritongrad.op
    def halves(x):
        y = torch.full((42,), float("nan"), dtype=x.dtype, device=x.device)
        pairs_to_halves[(1,)](x, y, 14, 3, 21, BM=16, BK=8)
        return y

    y = halves(x)
    flat = x.reshape(-1)
    torch.testing.assert_close(y, torch.cat([flat[0::2], flat[1::2]]) * 3.0)
    g = torch.randn_like(y)
    (got,) = torch.autograd.grad(y, x, g)
    torch.testing.assert_close(got.reshape(-1), torch.stack([g[:21], g[21:]], 1).reshape(-1) * 3.0)
