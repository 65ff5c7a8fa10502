"""Re-parallelized adjoints (interchange.py): an input every program along a grid axis reads,
at addresses a loop moves, gets a kernel of its own whose programs are the loop's iterations. Each test
against PyTorch autograd in float64 with ragged sizes; buffers the write strategy leaves unfilled are poisoned."""

import pytest
import torch
import triton
import triton.language as tl

import tritongrad
import tritongrad.core.language as tg
from tritongrad.runtime import backward_kernel
from tritongrad.writes.strategies import Mode

F64 = torch.float64


@triton.jit
def matmul_k_loop(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """The tutorial's matmul: a tile of C per program, a loop over K moving both pointer tiles."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + offs_m[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_n[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=c_ptr.dtype.element_ty)  # float32 in the tutorial; float64 here
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        a = tl.load(a_ptrs, mask=(offs_m[:, None] < M) & (offs_k[None, :] < K - k * BLOCK_K), other=0.0)
        b = tl.load(b_ptrs, mask=(offs_k[:, None] < K - k * BLOCK_K) & (offs_n[None, :] < N), other=0.0)
        acc += tl.dot(a, b)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    c = acc.to(c_ptr.dtype.element_ty)
    tl.store(c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn, c,
             mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


@triton.jit
def matmul_bt(a_ptr, b_ptr, c_ptr, M, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """``A @ B.T`` with B stored (N, K) and transposed in the kernel; K counted by a range's step."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=c_ptr.dtype.element_ty)  # float32 in the tutorial; float64 here
    for k0 in range(0, K, BLOCK_K):
        rk = k0 + tl.arange(0, BLOCK_K)
        a = tl.load(a_ptr + rm[:, None] * K + rk[None, :], mask=(rm[:, None] < M) & (rk[None, :] < K), other=0.0)
        b = tl.load(b_ptr + rn[:, None] * K + rk[None, :], mask=(rn[:, None] < N) & (rk[None, :] < K), other=0.0)
        acc += tl.dot(a, tl.trans(b))
    tl.store(c_ptr + rm[:, None] * N + rn[None, :], acc, mask=(rm[:, None] < M) & (rn[None, :] < N))


@triton.jit
def decaying_matmul(a_ptr, b_ptr, c_ptr, M, N, K, BLOCK: tl.constexpr):
    """``acc = acc * 0.5 + a_k @ b_k``: the accumulator is not linear, so iterations depend on each other."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rm = pid_m * BLOCK + tl.arange(0, BLOCK)
    rn = pid_n * BLOCK + tl.arange(0, BLOCK)
    acc = tl.zeros((BLOCK, BLOCK), dtype=tl.float64)
    for k0 in range(0, K, BLOCK):
        rk = k0 + tl.arange(0, BLOCK)
        a = tl.load(a_ptr + rm[:, None] * K + rk[None, :], mask=(rm[:, None] < M) & (rk[None, :] < K), other=0.0)
        b = tl.load(b_ptr + rk[:, None] * N + rn[None, :], mask=(rk[:, None] < K) & (rn[None, :] < N), other=0.0)
        acc = acc * 0.5 + tl.dot(a, b)
    tl.store(c_ptr + rm[:, None] * N + rn[None, :], acc, mask=(rm[:, None] < M) & (rn[None, :] < N))


@pytest.fixture(autouse=True)
def one_multiprocessor(monkeypatch):
    """These matrices are small: on a GPU their few tiles would not fill its multiprocessors, and the
    strategy choice would keep atomics (rightly). Count one, as the interpreter does, to run the kernels of
    their own there too."""
    monkeypatch.setattr(backward_kernel, "multiprocessors", lambda device: 1)


def _matmul_grads(a, b, block=16):
    (M, K), N = a.shape, b.shape[1]
    c = torch.full((M, N), float("nan"), dtype=a.dtype)
    grid = (triton.cdiv(M, block), triton.cdiv(N, block))
    args = dict(a_ptr=a, b_ptr=b, c_ptr=c, M=M, N=N, K=K, stride_am=a.stride(0), stride_ak=a.stride(1),
                stride_bk=b.stride(0), stride_bn=b.stride(1), stride_cm=c.stride(0), stride_cn=c.stride(1),
                BLOCK_M=block, BLOCK_N=block, BLOCK_K=block)
    matmul_k_loop[grid](**args)
    torch.testing.assert_close(c, a @ b)
    g = torch.randn(M, N, dtype=a.dtype)
    bwd = tritongrad.grad(matmul_k_loop)
    return bwd, bwd.choose(args, grid), bwd.gradients(grid, args, {"c_ptr": g}), g


@pytest.mark.parametrize("transpose_a", [False, True])
@pytest.mark.parametrize("transpose_b", [False, True])
def test_matmul_inputs_get_kernels_of_their_own(transpose_a, transpose_b, poisoned_empty):
    M, N, K = 45, 37, 70  # three and three tiles; five blocks of K, the last one ragged
    a = torch.randn(K, M, dtype=F64).t() if transpose_a else torch.randn(M, K, dtype=F64)
    b = torch.randn(N, K, dtype=F64).t() if transpose_b else torch.randn(K, N, dtype=F64)
    bwd, choices, grads, g = _matmul_grads(a, b)
    assert {c.mode for c in choices.values()} == {Mode.INTERCHANGE} and all(c.covers for c in choices.values())
    leaves = [a.clone().requires_grad_(), b.clone().requires_grad_()]
    (leaves[0] @ leaves[1]).backward(g)
    torch.testing.assert_close(grads["a_ptr"], leaves[0].grad)
    torch.testing.assert_close(grads["b_ptr"], leaves[1].grad)


def test_the_derived_kernels_read_as_a_hand_written_matmul_backward():
    bwd = tritongrad.grad(matmul_k_loop)
    parts = bwd.variant(bwd.writes.best()).parts
    # the text is the point (the kernels' shape): test_matmul_inputs_get_kernels_of_their_own checks their gradients
    assert [p.wrt for p in parts] == [("a_ptr",), ("b_ptr",)]
    for part, axis in zip(parts, (1, 0), strict=True):
        assert "atomic_add" not in part.src and "for k in" not in part.src  # no forward loop recomputed
        assert f"k_iteration = tg.grouped_program_id({axis})" in part.src  # (the grid taken in groups)
        assert "for pid_" in part.src and "range(0, programs)" in part.src
    assert "a kernel of its own" in bwd.launch_notes()


@triton.jit
def _grouped_ids(out_ptr):
    n0 = tl.num_programs(0)
    at = (tl.program_id(0) + tl.program_id(1) * n0) * 2  # (the order the GPU starts programs in)
    tl.store(out_ptr + at, tg.grouped_program_id(0))
    tl.store(out_ptr + at + 1, tg.grouped_program_id(1))


@pytest.mark.parametrize("grid", [(11, 5), (8, 3), (3, 7), (1, 4), (17, 1)])
def test_grouped_program_ids_take_every_program_once_in_groups_of_eight(grid):
    n0, n1 = grid
    out = torch.full((n0 * n1, 2), -1, dtype=torch.int32)
    _grouped_ids[grid](out)
    got = [tuple(r) for r in out.tolist()]
    assert sorted(got) == [(i, j) for i in range(n0) for j in range(n1)]  # a bijection of the grid
    want = []  # groups of 8 along axis 0 (fewer in the last), each walked down axis 1 a column at a time
    for first in range(0, n0, 8):
        rows = min(8, n0 - first)
        want += [(first + i, j) for j in range(n1) for i in range(rows)]
    assert got == want


@pytest.mark.slow  # (a long case; the default run stays near 5 minutes)
def test_a_grid_of_more_than_eight_tiles_in_groups(poisoned_empty):
    """11 row tiles: a group of 8 and a ragged one of 3; the gradients as PyTorch's."""
    a, b = torch.randn(16 * 10 + 5, 70, dtype=F64), torch.randn(70, 37, dtype=F64)
    bwd, choices, grads, g = _matmul_grads(a, b)
    assert {c.mode for c in choices.values()} == {Mode.INTERCHANGE}
    assert all("tg.grouped_program_id" in p.src for p in bwd.variant(bwd.writes.best()).parts)
    torch.testing.assert_close(grads["a_ptr"], g @ b.t())
    torch.testing.assert_close(grads["b_ptr"], a.t() @ g)


def test_grouped_kernels_made_self_contained_define_the_helper_inductor_copies():
    """Under torch.compile the derived kernels are launched by Inductor's code, which copies a kernel's helpers by
    the names it reads them under (codegen/generate.py `self_contained`): the grouped order's helper among them."""
    from tritongrad.codegen.generate import jit_src, self_contained

    bwd = tritongrad.grad(matmul_k_loop)
    for part in bwd.variant(bwd.writes.best()).parts:
        contained = self_contained(part.kernel)
        assert "tg." not in jit_src(contained) and "tg_grouped_program_id(0)" in jit_src(contained)
        helper = contained.fn.__globals__["tg_grouped_program_id"]
        assert helper.fn.__name__ == "tg_grouped_program_id" and "tg." not in jit_src(helper)


def test_one_program_along_the_axis_stores_directly(poisoned_empty):
    a, b = torch.randn(45, 70, dtype=F64), torch.randn(70, 9, dtype=F64)  # one program along N
    _, choices, grads, g = _matmul_grads(a, b)
    assert choices["a_ptr"].mode == Mode.STORE and choices["b_ptr"].mode == Mode.INTERCHANGE
    torch.testing.assert_close(grads["a_ptr"], g @ b.t())
    torch.testing.assert_close(grads["b_ptr"], a.t() @ g)


def test_a_transposed_tile_and_a_stepped_range(poisoned_empty):
    M, N, K, block = 33, 41, 50, 16
    a, b = torch.randn(M, K, dtype=F64), torch.randn(N, K, dtype=F64)
    c = torch.full((M, N), float("nan"), dtype=F64)
    grid = (triton.cdiv(M, block), triton.cdiv(N, block))
    args = dict(a_ptr=a, b_ptr=b, c_ptr=c, M=M, N=N, K=K, BLOCK_M=block, BLOCK_N=block, BLOCK_K=block)
    matmul_bt[grid](**args)
    g = torch.randn(M, N, dtype=F64)
    bwd = tritongrad.grad(matmul_bt)
    assert {c.mode for c in bwd.choose(args, grid).values()} == {Mode.INTERCHANGE}
    grads = bwd.gradients(grid, args, {"c_ptr": g})
    torch.testing.assert_close(grads["a_ptr"], g @ b)
    torch.testing.assert_close(grads["b_ptr"], g.t() @ a)


def test_iterations_that_depend_on_each_other_keep_their_lowering():
    M, N, K, block = 20, 35, 40, 16
    a, b = torch.randn(M, K, dtype=F64), torch.randn(K, N, dtype=F64)
    c = torch.full((M, N), float("nan"), dtype=F64)
    grid = (triton.cdiv(M, block), triton.cdiv(N, block))
    args = dict(a_ptr=a, b_ptr=b, c_ptr=c, M=M, N=N, K=K, BLOCK=block)
    decaying_matmul[grid](**args)
    bwd = tritongrad.grad(decaying_matmul)
    assert Mode.INTERCHANGE not in {c.mode for c in bwd.choose(args, grid).values()}
    assert "no kernel of its own" in bwd.launch_notes()
    g = torch.randn(M, N, dtype=F64)
    grads = bwd.gradients(grid, args, {"c_ptr": g})
    leaves = [a.clone().requires_grad_(), b.clone().requires_grad_()]
    acc = torch.zeros(M, N, dtype=F64)
    for k0 in range(0, K, block):
        acc = acc * 0.5 + leaves[0][:, k0:k0 + block] @ leaves[1][k0:k0 + block]
    acc.backward(g)
    torch.testing.assert_close(grads["a_ptr"], leaves[0].grad)
    torch.testing.assert_close(grads["b_ptr"], leaves[1].grad)


def test_an_op_whose_launches_share_an_input_adds_the_second_gradient():
    """Two launches read A: the first writer's kernel stores dA, the second's sums into a buffer of its own
    and adds it (interchanged kernels store their tiles)."""
    block = 16

    @tritongrad.op
    def two_products(a, b1, b2):
        outs = []
        for b in (b1, b2):
            (M, K), N = a.shape, b.shape[1]
            c = torch.empty(M, N, dtype=a.dtype)
            matmul_k_loop[(triton.cdiv(M, block), triton.cdiv(N, block))](
                a, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1),
                BLOCK_M=block, BLOCK_N=block, BLOCK_K=block)
            outs.append(c)
        return outs[0], outs[1]

    a, b1, b2 = (torch.randn(*s, dtype=F64, requires_grad=True) for s in ((38, 51), (51, 35), (51, 40)))
    c1, c2 = two_products(a, b1, b2)
    g1, g2 = torch.randn_like(c1), torch.randn_like(c2)
    got = torch.autograd.grad((c1, c2), (a, b1, b2), (g1, g2))
    want = torch.autograd.grad((a @ b1, a @ b2), (a, b1, b2), (g1, g2))
    for x, y in zip(got, want, strict=True):
        torch.testing.assert_close(x, y)


@triton.jit
def every_other_row(z_ptr, y_ptr, M, R, BM: tl.constexpr):
    """Rows 0, 2, 4... of ``z`` scaled per program along axis 1; the step given by keyword."""
    pid_0 = tl.program_id(0)
    pid_1 = tl.program_id(1)
    rm = pid_0 * BM + tl.arange(0, BM)
    acc = tl.zeros((BM,), dtype=tl.float64)
    for t in tl.range(0, R, step=2):
        acc += tl.load(z_ptr + t * M + rm, mask=rm < M) * (pid_1 + 1)
    tl.store(y_ptr + pid_1 * M + rm, acc, mask=rm < M)


def test_a_range_stepped_by_keyword_runs_its_own_trip_count(poisoned_empty):
    """``tl.range(0, R, step=2)`` runs cdiv(R, 2) iterations: the kernel of z's own has that many programs
    (it once had R: the rows after R got gradient, beyond the tensor a heap corruption)."""
    M, R, block, columns = 13, 5, 8, 3
    z = torch.randn(2 * R, M, dtype=F64)  # rows the forward never reads follow the ones it does
    y = torch.full((columns, M), float("nan"), dtype=F64)
    grid = (triton.cdiv(M, block), columns)
    args = dict(z_ptr=z, y_ptr=y, M=M, R=R, BM=block)
    every_other_row[grid](**args)
    leaf = z.clone().requires_grad_()
    want = leaf[0:R:2].sum(0) * torch.arange(1, columns + 1, dtype=F64)[:, None]
    torch.testing.assert_close(y, want.detach())
    g = torch.randn(columns, M, dtype=F64)
    bwd = tritongrad.grad(every_other_row)
    assert bwd.choose(args, grid)["z_ptr"].mode == Mode.INTERCHANGE
    got = bwd.gradients(grid, args, {"y_ptr": g})["z_ptr"]
    torch.testing.assert_close(got, torch.autograd.grad(want, leaf, g)[0])


@triton.jit
def numbered_by_program_count(z_ptr, y_ptr, M, R, BM: tl.constexpr):
    """Each program's sums stored at a place numbered with ``tl.num_programs(1)``, the axis whose programs
    z's own kernel replaces by the loop's iterations."""
    pid_0 = tl.program_id(0)
    pid_1 = tl.program_id(1)
    rm = pid_0 * BM + tl.arange(0, BM)
    acc = tl.zeros((BM,), dtype=tl.float64)
    for t in range(0, R):
        acc += tl.load(z_ptr + t * M + rm, mask=rm < M) * (pid_1 + 1)
    tl.store(y_ptr + (pid_0 * tl.num_programs(1) + pid_1) * BM + tl.arange(0, BM), acc)


def test_num_programs_of_the_interchanged_axis_is_the_forwards(poisoned_empty):
    """tl.num_programs(1) in z's own kernel is the forward's count, not the loop's trip count (it once
    was, where the backward computed it once before its loop over the forward's programs)."""
    M, R, block, columns = 13, 5, 8, 3
    z = torch.randn(R, M, dtype=F64)
    grid = (triton.cdiv(M, block), columns)
    y = torch.full((grid[0] * columns * block,), float("nan"), dtype=F64)
    args = dict(z_ptr=z, y_ptr=y, M=M, R=R, BM=block)
    numbered_by_program_count[grid](**args)
    g = torch.randn_like(y)
    bwd = tritongrad.grad(numbered_by_program_count)
    assert bwd.choose(args, grid)["z_ptr"].mode == Mode.INTERCHANGE
    got = bwd.gradients(grid, args, {"y_ptr": g})["z_ptr"]
    tiles = g.view(grid[0], columns, block) * torch.arange(1, columns + 1, dtype=F64)[:, None]
    want = tiles.sum(1).reshape(-1)[:M].expand(R, M)  # every row of z gets each column's scaled gradient
    torch.testing.assert_close(got, want)


@triton.jit
def causal_prefix(x_ptr, w_ptr, y_ptr, N, BLOCK: tl.constexpr):
    """``y_i = x_i * sum(w_j for j <= i)`` by blocks: program i's loop stops at its own block (its trip count
    is the program's, as a causal attention's is)."""
    pid = tl.program_id(0)
    rows = pid * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + rows, mask=rows < N, other=0.0)
    acc = tl.zeros((BLOCK,), dtype=tl.float64)
    end = tl.minimum((pid + 1) * BLOCK, N)
    for start in range(0, end, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        w = tl.load(w_ptr + cols, mask=cols < N, other=0.0)
        seen = cols[None, :] <= rows[:, None]
        acc += tl.sum(tl.where(seen, x[:, None] * w[None, :], 0.0), axis=1)
    tl.store(y_ptr + rows, acc, mask=rows < N)


def test_a_loop_that_stops_at_the_programs_own_block(poisoned_empty):
    """w's kernel of its own has a program per block of w (the most any program's loop runs); the forward
    programs whose loop stops before a block add nothing to it, and skip their work (a guard)."""
    N, block = 45, 8  # six blocks, the last one ragged
    x, w = torch.randn(N, dtype=F64), torch.randn(N, dtype=F64)
    y = torch.full((N,), float("nan"), dtype=F64)
    grid = (triton.cdiv(N, block),)
    args = dict(x_ptr=x, w_ptr=w, y_ptr=y, N=N, BLOCK=block)
    causal_prefix[grid](**args)
    leaves = [x.clone().requires_grad_(), w.clone().requires_grad_()]
    want = leaves[0] * torch.cumsum(leaves[1], 0)
    torch.testing.assert_close(y, want.detach())
    bwd = tritongrad.grad(causal_prefix)
    assert bwd.choose(args, grid)["w_ptr"].mode == Mode.INTERCHANGE
    (part,) = [p for p in bwd.variant(bwd.choose(args, grid)).parts if p.wrt == ("w_ptr",)]
    assert "if start_iteration < start_trips:" in part.src and "atomic" not in part.src
    g = torch.randn(N, dtype=F64)
    got = bwd.gradients(grid, args, {"y_ptr": g})
    for name, w_ in zip(("x_ptr", "w_ptr"), torch.autograd.grad(want, leaves, g), strict=True):
        torch.testing.assert_close(got[name], w_)


@pytest.mark.parametrize("body, rounded", [
    # rounded to v's type by both products, through the adjoint's pass-through assignments
    ("v = tl.load(v_ptr + i)\nt = tg.to_float(p, v.dtype)\ng = tg.unbroadcast(x, y)\nh = tg.cast_grad(g, C)\n"
     "a = tl.dot(h.to(v.dtype), w)\nb = tl.dot(u, h.to(t.dtype))", "v_ptr.dtype.element_ty"),
    ("a = x.to(tl.bfloat16)\nb = x.to(tl.bfloat16)", "tl.bfloat16"),
    ("a = x.to(COMPUTE)", "COMPUTE"),  # a constexpr parameter (assigned nowhere)
    ("a = x.to(tl.bfloat16)\nb = x * 2.0", None),  # computed with: its float32 value counts
    ("a = x.to(tl.bfloat16)\nb = x.to(tl.float16)", None),  # two types
    ("g = tg.unbroadcast(x, y)\ng = g * 2.0\na = g.to(tl.bfloat16)", None),  # passed on to a name assigned twice
    ("a = x.to(v.dtype)\nv = tl.load(v_ptr)\nv = tl.load(w_ptr)", None),  # a type the prologue cannot spell
    ("b = tg.unbroadcast(y, x)\na = x.to(tl.bfloat16)", None),  # the reference of an unbroadcast
    ("for i in range(x):\n    a = x.to(tl.bfloat16)", None),  # a loop's bound
    ("for i in range(n):\n    a = x.to(tl.bfloat16)", "tl.bfloat16"),  # a cast inside a loop
])
def test_a_prologue_value_is_kept_in_the_one_type_its_uses_round_it_to(body, rounded):
    import ast

    from tritongrad.reverse.interchange import _rounded_to

    assert _rounded_to("x", ast.parse(body).body, {"v": "v_ptr"}) == rounded
