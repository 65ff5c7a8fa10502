"""Tiles computed transposed (orient.py): a derived kernel whose products read the transpose of a tile it
computed from a product computes that tile's group transposed instead. The kernels against PyTorch autograd
(float64, sizes that are not multiples of the blocks, NaN-poisoned outputs); the pass itself on kernels
written to exercise each rewrite, run before and after in the interpreter."""

import ast

import pytest
import torch
import triton
import triton.language as tl

import tritongrad
from tritongrad.codegen.generate import jit_source
from tritongrad.codegen.orient import orient_tiles
from tritongrad.core import language as tg
from tritongrad.tools.testing import assert_gradients_match, poison

F64 = torch.float64


@triton.jit
def block_attention(q_ptr, k_ptr, v_ptr, o_ptr, M, N, D, scale, BM: tl.constexpr, BN: tl.constexpr,
                    BD: tl.constexpr):
    """Softmax attention of a block of queries over every key (one key block holds them all)."""
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    rn = tl.arange(0, BN)
    rd = tl.arange(0, BD)
    q = tl.load(q_ptr + rm[:, None] * D + rd[None, :], mask=(rm[:, None] < M) & (rd[None, :] < D), other=0.0)
    kv_mask = (rn[:, None] < N) & (rd[None, :] < D)
    k = tl.load(k_ptr + rn[:, None] * D + rd[None, :], mask=kv_mask, other=0.0)
    v = tl.load(v_ptr + rn[:, None] * D + rd[None, :], mask=kv_mask, other=0.0)
    s = tl.dot(q, tl.trans(k)) * scale
    s = tl.where(rn[None, :] < N, s, float("-inf"))
    p = tl.exp(s - tl.max(s, axis=1)[:, None])
    p = p / tl.sum(p, axis=1)[:, None]
    tl.store(o_ptr + rm[:, None] * D + rd[None, :], tl.dot(p, v), mask=(rm[:, None] < M) & (rd[None, :] < D))


def test_block_attention_computes_its_score_tiles_transposed():
    """dK = dS^T Q and dV = P^T dO read S's group transposed; computing it so costs dQ = dS K one transpose."""
    m, n, d, bm = 21, 13, 14, 16  # (compiled products need blocks of 16 or more)
    q, k, v = (torch.randn(s, d, dtype=F64) for s in (m, n, n))
    o = poison(torch.empty(m, d, dtype=F64))
    args, kwargs = (q, k, v, o, m, n, d, 0.5), {"BM": bm, "BN": 16, "BD": 16}  # (a float32 argument)
    grid = (triton.cdiv(m, bm),)
    block_attention[grid](*args, **kwargs)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    want = torch.softmax(leaves[0] @ leaves[1].T * 0.5, dim=1) @ leaves[2]
    torch.testing.assert_close(o, want.detach())
    assert_gradients_match(block_attention, grid, args, kwargs, o, want, leaves, ["q_ptr", "k_ptr", "v_ptr"])
    src = tritongrad.grad(block_attention).src
    assert "(orient.py)" in src and "tl.dot(k, tl.trans(q))" in src
    # dV's and dK's products read P^T and dS^T as computed
    assert "d_v = tl.dot(p_1, d_dot_p_1" in src and "d_k = tl.dot(d_dot_q.to(q.dtype), q)" in src


# -- the pass on its own: a kernel's body before and after, run in the interpreter ----------------------------

KERNEL = '''
@triton.jit
def kernel(x_ptr, w_ptr, u_ptr, b_ptr, y_ptr, z_ptr, r_ptr, M: tl.constexpr, K: tl.constexpr, N: tl.constexpr):
    rm = tl.arange(0, M)
    rk = tl.arange(0, K)
    rn = tl.arange(0, N)
    x = tl.load(x_ptr + rm[:, None] * K + rk[None, :])
    w = tl.load(w_ptr + rk[:, None] * N + rn[None, :])
    u = tl.load(u_ptr + rm[:, None] * N + rn[None, :])
    b = tl.load(b_ptr + rn)
{body}
'''

# s = x w is M x N; its group is read transposed by the products (y), so it is computed as w^T x^T
PAYS = '''
    s = tl.dot(x, w)
    t = tl.where(rm[:, None] >= rn[None, :], s + b, -s) * 0.5
    p = tl.exp(t - tl.max(t, axis=1)[:, None])
    r = tl.sum(p, axis=1)
    q = p / r[:, None] + tl.maximum(u, 0.0) * b[None, :]
    g = tg.sum_grad(r, q, 1, False) + tg.unbroadcast(q, s)
    y = tl.dot(tl.trans(q), u) + tl.dot(tl.trans(g.to(tl.float64)), u)
    tl.store(y_ptr + rn[:, None] * N + rn[None, :], y)
    tl.store(z_ptr + rm[:, None] * N + rn[None, :], q)
    tl.store(r_ptr + rm, r + tl.sum(q, axis=1))
'''

# a tile of the group that is the transpose of another (r = u^T, M == N): read elsewhere as it was
TRANSPOSE_IN_GROUP = '''
    s = tl.dot(x, w)
    r = tl.trans(u)
    q = tl.exp(s * 0.25) + r
    y = tl.dot(tl.trans(q), u) + tl.dot(tl.trans(q * 2.0), u)
    tl.store(y_ptr + rn[:, None] * N + rn[None, :], y)
    tl.store(z_ptr + rm[:, None] * N + rn[None, :], r)
'''

# a reduction keeping its dims by position (c is 1 x N, a tile): the pass must know its rank
KEPT_DIMS = '''
    s = tl.dot(x, w)
    c = tl.sum(s, 0, True)
    q = s * c + tl.max(s, axis=1, keep_dims=True)
    y = tl.dot(tl.trans(q), u)
    tl.store(y_ptr + rn[:, None] * N + rn[None, :], y)
    tl.store(z_ptr + rm[:, None] * N + rn[None, :], q)
    tl.store(r_ptr + rm, tl.sum(q * c, axis=1))
'''

# the same group also read as it is by a product (dQ's role): one transpose either way, left as written
EVEN = '''
    s = tl.dot(x, w)
    p = tl.exp(s * 0.5)
    y = tl.dot(tl.trans(p), u)
    tl.store(y_ptr + rn[:, None] * N + rn[None, :], y)
    tl.store(z_ptr + rm[:, None] * N + rn[None, :], tl.dot(p, tl.trans(u)))
'''

# a tile whose rank the pass cannot know (a helper's result): left as written
UNKNOWN = '''
    s = tl.dot(x, w)
    p = helper(s)
    y = tl.dot(tl.trans(p), u)
    tl.store(y_ptr + rn[:, None] * N + rn[None, :], y)
'''


@triton.jit
def helper(s):
    return tl.exp(s)


def _oriented(body: str, every: bool = False) -> tuple[str, str]:
    """The kernel's source as written and as the pass writes it (``every``: each group it can transpose)."""
    src = KERNEL.format(body=body)
    fn = ast.parse(src).body[0]
    params = [a.arg for a in fn.args.args]
    fn.body = orient_tiles(fn.body, params, lambda text: ast.Expr(ast.Constant(text)), every=every)
    return src, ast.unparse(fn)


M, K, N = 16, 32, 16


def _run(src: str, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    kernel = jit_source(src, "kernel", {"triton": triton, "tl": tl, "tg": tg, "helper": helper})
    outs = [poison(torch.empty(*s, dtype=F64)) for s in ((N, N), (M, N), (M,))]
    kernel[(1,)](*inputs, *outs, M=M, K=K, N=N)
    return outs


def test_a_group_read_transposed_is_computed_transposed():
    src, out = _oriented(PAYS)
    # the product, elementwise operations on transposes, rows and columns swapped, the other reduction axis
    assert "s = tl.dot(tl.trans(w), tl.trans(x))" in out
    assert "tl.where(rm[None, :] >= rn[:, None], s + b[:, None], -s)" in out
    assert "p = tl.exp(t - tl.max(t, axis=0)[None, :])" in out and "r = tl.sum(p, axis=0)" in out
    # a loaded tile in the group is transposed as it is loaded (free: no product computed it)
    assert "u = tl.trans(tl.load(" in out and "q = p / r[None, :] + tl.maximum(u, 0.0) * b[:, None]" in out
    assert "g = tg.sum_grad(r, q, 0, False) + tg.unbroadcast(q, s)" in out
    assert "y = tl.dot(q, tl.trans(u)) + tl.dot(g.to(tl.float64), tl.trans(u))" in out
    assert "tl.store(z_ptr + rm[:, None] * N + rn[None, :], tl.trans(q))" in out  # any other read
    assert "tl.sum(q, axis=0)" in out
    inputs = [torch.randn(*s, dtype=F64) for s in ((M, K), (K, N), (M, N), (N,))]
    for got, want in zip(_run(out, inputs), _run(src, inputs), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_a_transpose_in_a_transposed_group_is_read_as_it_was():
    src, out = _oriented(TRANSPOSE_IN_GROUP)
    assert "r = u" in out and "tl.store(z_ptr + rm[:, None] * N + rn[None, :], tl.trans(r))" in out
    inputs = [torch.randn(*s, dtype=F64) for s in ((M, K), (K, N), (M, N), (N,))]
    for got, want in zip(_run(out, inputs)[:2], _run(src, inputs)[:2], strict=True):  # (r_ptr: not written)
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("body", [EVEN, UNKNOWN])
def test_what_does_not_pay_or_is_not_known_is_left_as_written(body):
    src, out = _oriented(body)
    assert out == ast.unparse(ast.parse(src).body[0])


@pytest.mark.parametrize("body", [PAYS, TRANSPOSE_IN_GROUP, KEPT_DIMS, EVEN, UNKNOWN])
def test_every_group_transposed_computes_the_same(body):
    """The rewrite on its own, whatever it costs: every group the pass can transpose, transposed (the fuzz
    campaign of seed 3309 does the same to every derived kernel)."""
    src, out = _oriented(body, every=True)
    assert "orient.py" in out
    inputs = [torch.randn(*s, dtype=F64) for s in ((M, K), (K, N), (M, N), (N,))]
    want = _run(src, inputs)
    assert torch.isfinite(want[0]).all()
    for got, w in zip(_run(out, inputs), want, strict=True):
        torch.testing.assert_close(got, w, rtol=1e-12, atol=1e-12, equal_nan=True)  # (outputs not written: NaN)
