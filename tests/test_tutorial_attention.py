"""The fused-attention forward as Triton's tutorial writes it: descriptors made on the host
(`TensorDescriptor`) or in the kernel, chosen by an `isinstance(x, tl.tensor_descriptor)` helper that Triton
decides at compile time; the causal mask split into an off-band and an on-band stage; a `tl.range` carrying a
`warp_specialize` option; K read transposed through its descriptor. Wrapped with `tritongrad.op` around
launch code in the tutorial's style and checked in float64 against PyTorch autograd with a head count and a
sequence length that are not powers of two."""

import math

import pytest
import torch
import triton
import triton.language as tl
from conftest import DEVICE

import tritongrad
from tritongrad import NotDifferentiableError

pytestmark = [pytest.mark.skipif(not hasattr(tl, "make_tensor_descriptor"),
                                 reason="this Triton has no tl.make_tensor_descriptor"),
              # (the tutorial's own forward, in half precision, is on the GPU in benchmarks/tutorial_backwards.py)
              pytest.mark.skipif(DEVICE == "cuda", reason="float64 tl.dot accumulators run in the interpreter")]

LOG2E = 1.44269504  # the kernel's own rounding of 1 / ln 2, which the reference's scale folds in


@triton.jit
def as_descriptor(ptr_or_desc, shape, strides, block_shape):
    # host descriptors pass through; a tensor gets its descriptor made here
    if isinstance(ptr_or_desc, tl.tensor_descriptor):
        return ptr_or_desc
    else:
        return tl.make_tensor_descriptor(ptr_or_desc, shape, strides, block_shape)


@triton.jit
def attend_stage(acc, row_sum, row_max, q, k_desc, v_desc, first_row, block_start, scale, rows, cols,
                 SEQ: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, STAGE: tl.constexpr,
                 WS: tl.constexpr, VALUES: tl.constexpr):
    # stage 1: the key blocks left of the diagonal; stage 2: the diagonal block, masked; 3: every block
    if STAGE == 1:
        lo, hi = 0, block_start * BLOCK_M
    elif STAGE == 2:
        lo, hi = block_start * BLOCK_M, (block_start + 1) * BLOCK_M
        lo = tl.multiple_of(lo, BLOCK_M)
    else:
        lo, hi = 0, SEQ
    key_row = first_row + lo
    for start in tl.range(lo, hi, BLOCK_N, warp_specialize=WS):
        start = tl.multiple_of(start, BLOCK_N)
        k_t = k_desc.load([key_row, 0]).T
        s = tl.dot(q, k_t)
        if STAGE == 2:
            keep = rows[:, None] >= (start + cols[None, :])
            s = s * scale + tl.where(keep, 0, -1.0e6)
            new_max = tl.maximum(row_max, tl.max(s, 1))
            s -= new_max[:, None]
        else:
            new_max = tl.maximum(row_max, tl.max(s, 1) * scale)
            s = s * scale - new_max[:, None]
        p = tl.math.exp2(s)
        shrink = tl.math.exp2(row_max - new_max)
        row_sum = row_sum * shrink + tl.sum(p, 1)
        acc = acc * shrink[:, None]
        v = v_desc.load([key_row, 0])
        acc = tl.dot(p.to(VALUES), v, acc)
        row_max = new_max
        key_row += BLOCK_N
    return acc, row_sum, row_max


@triton.jit
def attention_forward(sm_scale, M, Z, H, desc_q, desc_k, desc_v, desc_o, SEQ, HEAD_DIM: tl.constexpr,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, STAGE: tl.constexpr, warp_specialize: tl.constexpr,
                      VALUES: tl.constexpr, ACC: tl.constexpr):
    tl.static_assert(BLOCK_N <= HEAD_DIM)
    block_start = tl.program_id(0)
    head = tl.program_id(1)
    batch_of = head // H
    head_of = head % H
    total_rows = Z * H * SEQ
    desc_q = as_descriptor(desc_q, [total_rows, HEAD_DIM], [HEAD_DIM, 1], [BLOCK_M, HEAD_DIM])
    desc_k = as_descriptor(desc_k, [total_rows, HEAD_DIM], [HEAD_DIM, 1], [BLOCK_N, HEAD_DIM])
    desc_v = as_descriptor(desc_v, [total_rows, HEAD_DIM], [HEAD_DIM, 1], [BLOCK_N, HEAD_DIM])
    desc_o = as_descriptor(desc_o, [total_rows, HEAD_DIM], [HEAD_DIM, 1], [BLOCK_M, HEAD_DIM])
    first_row = batch_of * (SEQ * H) + head_of * SEQ
    q_row = first_row + block_start * BLOCK_M
    rows = block_start * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    row_max = tl.zeros([BLOCK_M], dtype=ACC) - float("inf")
    row_sum = tl.zeros([BLOCK_M], dtype=ACC) + 1.0
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=ACC)
    scale = sm_scale
    scale *= 1.44269504
    q = desc_q.load([q_row, 0])
    if STAGE & 1:
        acc, row_sum, row_max = attend_stage(acc, row_sum, row_max, q, desc_k, desc_v, first_row, block_start,
                                             scale, rows, cols, SEQ, BLOCK_M, BLOCK_N, 4 - STAGE, warp_specialize,
                                             VALUES)
    if STAGE & 2:
        acc, row_sum, row_max = attend_stage(acc, row_sum, row_max, q, desc_k, desc_v, first_row, block_start,
                                             scale, rows, cols, SEQ, BLOCK_M, BLOCK_N, 2, warp_specialize, VALUES)
    row_max += tl.math.log2(row_sum)
    acc = acc / row_sum[:, None]
    tl.store(M + head * SEQ + rows, row_max)
    desc_o.store([q_row, 0], acc.to(VALUES))


BLOCK = 16


def launch(q, k, v, causal, sm_scale, host, warp_specialize):
    """The tutorial's host code: descriptors over the (Z * H * SEQ, HEAD_DIM) rows on the host, or the tensors
    themselves for the kernel to describe."""
    z, h, seq, head_dim = q.shape
    o = torch.full_like(q, float("nan"))
    m = torch.full((z, h, seq), float("nan"), device=q.device, dtype=q.dtype)
    rows = z * h * seq
    if host:
        from triton.tools.tensor_descriptor import TensorDescriptor

        q_, k_, v_, o_ = (TensorDescriptor(t, shape=[rows, head_dim], strides=[head_dim, 1],
                                           block_shape=[BLOCK, head_dim]) for t in (q, k, v, o))
    else:
        q_, k_, v_, o_ = q, k, v, o
    grid = (triton.cdiv(seq, BLOCK), z * h, 1)
    attention_forward[grid](sm_scale, m, z, h, q_, k_, v_, o_, seq, HEAD_DIM=head_dim, BLOCK_M=BLOCK,
                            BLOCK_N=BLOCK, STAGE=3 if causal else 1, warp_specialize=warp_specialize,
                            VALUES=tl.float64, ACC=tl.float64)  # (the tutorial: float16, float32)
    return o


@tritongrad.op
def attention(q, k, v, causal: bool, sm_scale: float, host: bool, warp_specialize: bool):
    return launch(q, k, v, causal, sm_scale, host, warp_specialize)


def reference(q, k, v, causal, sm_scale):
    # the kernel's scale is float32 (a float argument), times its float32 LOG2E, for exp2
    scale = (torch.tensor(sm_scale, dtype=torch.float32) * torch.tensor(LOG2E, dtype=torch.float32)).item()
    s = q @ k.transpose(-1, -2) * (scale * math.log(2))
    if causal:
        n = q.shape[2]
        s = s.masked_fill(~torch.ones(n, n, dtype=torch.bool, device=q.device).tril(), float("-inf"))
    return torch.softmax(s, -1) @ v


def _have_host_descriptors():
    try:
        from triton.tools.tensor_descriptor import TensorDescriptor  # noqa: F401
    except ImportError:
        return False
    return True


def prepared_launches(monkeypatch) -> list:
    """Each derived launch's prepared variant from here on (its write choices and kernels)."""
    from tritongrad.runtime import derive

    seen, real = [], derive.BackwardKernel.launch

    def spy(self, grid, named, output_grads, buffers, prepared, *args, **kwargs):
        seen.append(prepared)
        return real(self, grid, named, output_grads, buffers, prepared, *args, **kwargs)

    monkeypatch.setattr(derive.BackwardKernel, "launch", spy)
    return seen


def modes(prepared) -> dict[str, str]:
    return {p: c.mode.name for p, c in prepared.choices.items()}


def assert_pytorchs_gradients(attend, leaves, q, k, v, causal, g):
    """``attend(q, k, v)`` (q, k, v made of ``leaves``) and the leaves' gradients against the reference's, in float64,
    the upstream gradient drawn from ``g``; a leaf no gradient reaches gets none, or zeros."""
    o = attend(q, k, v)
    want = reference(q, k, v, causal, 0.3)
    torch.testing.assert_close(o, want, rtol=1e-9, atol=1e-9)
    d_o = torch.randn(o.shape, generator=g, dtype=torch.float64)
    got = torch.autograd.grad(o, leaves, d_o, allow_unused=True)
    expected = torch.autograd.grad(want, leaves, d_o, allow_unused=True)
    for name, a, b in zip("qkv", got, expected, strict=True):
        if b is None:
            assert a is None or not a.any(), f"d{name}"
        else:
            torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9, msg=f"d{name}")


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("host, warp_specialize", [(False, False), (True, False), (True, True)])
def test_the_tutorials_attention_forward_gets_pytorchs_gradients(causal, host, warp_specialize):
    if host and not _have_host_descriptors():
        pytest.skip("this Triton has no triton.tools.tensor_descriptor")
    g = torch.Generator().manual_seed(38)
    q, k, v = (torch.randn(2, 3, 48, 16, generator=g, dtype=torch.float64, device="cpu").to(DEVICE).requires_grad_()
               for _ in range(3))
    o = attention(q, k, v, causal, 0.4, host, warp_specialize)
    want = reference(q, k, v, causal, 0.4)
    torch.testing.assert_close(o, want, rtol=1e-9, atol=1e-9)
    d_o = torch.randn(o.shape, generator=g, dtype=torch.float64, device="cpu").to(DEVICE)
    got = torch.autograd.grad(o, (q, k, v), d_o)
    expected = torch.autograd.grad(want, (q, k, v), d_o)
    for name, a, b in zip("qkv", got, expected, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9, msg=f"d{name}")


def test_loop_scheduling_options_do_not_reach_the_derived_loops():
    """`warp_specialize` schedules the forward's loop: the loops derived from it schedule themselves."""
    bwd = tritongrad.grad(attention_forward, constexprs={"STAGE": 3, "warp_specialize": True})
    code = "\n".join(line.split("#")[0] for line in bwd.src.splitlines())  # (comments quote the source)
    # the text is the point (no scheduling option copied): test_the_tutorials_attention_forward_gets_pytorchs_gradients
    # checks this specialization's gradients (host descriptors, warp_specialize, causal)
    assert "tl.range(" in code and "warp_specialize=" not in code


@triton.jit
def copies_if_a_tensor(x_ptr, y_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    if isinstance(x_ptr, tl.tensor):
        tl.store(y_ptr + offs, tl.load(x_ptr + offs))


def test_an_isinstance_test_on_another_type_is_refused_by_name():
    with pytest.raises(NotDifferentiableError, match=r"isinstance\(x_ptr, tl.tensor\)") as e:
        tritongrad.grad(copies_if_a_tensor)
    assert "tl.tensor_descriptor" in str(e.value)


@pytest.mark.parametrize("host", [False, True])
def test_one_tensor_for_keys_and_values_gets_both_gradients(host):
    """K = V: two descriptors (made on the host, or in the kernel) over one tensor; its gradient is both sums."""
    if host and not _have_host_descriptors():
        pytest.skip("this Triton has no triton.tools.tensor_descriptor")
    g = torch.Generator().manual_seed(39)
    q, kv = (torch.randn(2, 3, 48, 16, generator=g, dtype=torch.float64, device="cpu").to(DEVICE).requires_grad_()
             for _ in range(2))
    for causal in (False, True):
        o = attention(q, kv, kv, causal, 0.4, host, False)
        want = reference(q, kv, kv, causal, 0.4)
        torch.testing.assert_close(o, want, rtol=1e-9, atol=1e-9)
        d_o = torch.randn(o.shape, generator=g, dtype=torch.float64, device="cpu").to(DEVICE)
        for got, expected in zip(torch.autograd.grad(o, (q, kv), d_o), torch.autograd.grad(want, (q, kv), d_o),
                                 strict=True):
            torch.testing.assert_close(got, expected, rtol=1e-9, atol=1e-9)


@triton.jit
def attention_one_loop(sm_scale, q_ptr, k_ptr, v_ptr, o_ptr, SEQ, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                       BLOCK_N: tl.constexpr):
    # the tutorial's non-causal forward with its loop in the kernel: keys and values read at a row offset the
    # loop advances (`key_row += BLOCK_N`), the running sum started at 1.0
    first_row = tl.program_id(1) * SEQ
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, HEAD_DIM)
    keys = tl.arange(0, BLOCK_N)
    at = (first_row + rows)[:, None] * HEAD_DIM + cols[None, :]
    q = tl.load(q_ptr + at, mask=(rows < SEQ)[:, None], other=0.0)
    row_max = tl.zeros([BLOCK_M], dtype=tl.float64) - float("inf")
    row_sum = tl.zeros([BLOCK_M], dtype=tl.float64) + 1.0
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float64)
    scale = sm_scale * 1.44269504
    key_row = first_row
    for _block in tl.range(0, SEQ, BLOCK_N):
        block = (key_row + keys)[:, None] * HEAD_DIM + cols[None, :]
        s = tl.dot(q, tl.load(k_ptr + block).T)
        new_max = tl.maximum(row_max, tl.max(s, 1) * scale)
        p = tl.math.exp2(s * scale - new_max[:, None])
        shrink = tl.math.exp2(row_max - new_max)
        row_sum = row_sum * shrink + tl.sum(p, 1)
        acc = tl.dot(p, tl.load(v_ptr + block), acc * shrink[:, None])
        row_max = new_max
        key_row += BLOCK_N
    tl.store(o_ptr + at, acc / row_sum[:, None], mask=(rows < SEQ)[:, None])


@tritongrad.op
def attention_in_one_loop(q, k, v, sm_scale: float):
    z, h, seq, head_dim = q.shape
    o = torch.full_like(q, float("nan"))
    attention_one_loop[(triton.cdiv(seq, BLOCK), z * h)](sm_scale, q, k, v, o, seq, HEAD_DIM=head_dim, BLOCK_M=BLOCK,
                                                         BLOCK_N=BLOCK)
    return o


def test_keys_and_values_get_a_kernel_of_their_own_where_the_forward_keeps_its_state(monkeypatch):
    """dQ is stored, and dK, dV, read by every query block, are summed by a kernel of their own looping over the
    query blocks (the loop interchange), reading the loop's final state the op's forward kept: the key offset the
    loop advances gets its final value in closed form (reverse/loops.py), computed once before the interchanged
    kernel's loop (persistent.py). Forced here by a one-multiprocessor device (the interchanged kernel's programs
    need only fill it)."""
    from tritongrad.runtime import backward_kernel

    monkeypatch.setattr(backward_kernel, "multiprocessors", lambda device: 1)
    seen = prepared_launches(monkeypatch)
    g = torch.Generator().manual_seed(39)
    q, k, v = (torch.randn(1, 2, 80, 16, generator=g, dtype=torch.float64).requires_grad_() for _ in range(3))
    assert_pytorchs_gradients(lambda *qkv: attention_in_one_loop(*qkv, 0.3), (q, k, v), q, k, v, False, g)
    assert [modes(p) for p in seen] == [{"q_ptr": "STORE", "k_ptr": "INTERCHANGE", "v_ptr": "INTERCHANGE"}]


@pytest.mark.parametrize("binding", ["k = v", "q = k = v", "one program"])
def test_the_one_loop_attention_gets_pytorchs_gradients_however_its_tensors_are_bound(binding, monkeypatch):
    """The bindings that take the interchange's launch facts away (one tensor read as keys and values: one buffer
    for two gradients; a single query block and head): the gradients stay PyTorch's."""
    from tritongrad.runtime import backward_kernel

    monkeypatch.setattr(backward_kernel, "multiprocessors", lambda device: 1)
    g = torch.Generator().manual_seed(40)
    shape = (1, 1, 16, 16) if binding == "one program" else (1, 2, 80, 16)
    leaves = [torch.randn(shape, generator=g, dtype=torch.float64).requires_grad_() for _ in range(3)]
    q, k, v = {"k = v": lambda q, k, v: (q, k, k), "q = k = v": lambda q, k, v: (q, q, q)}.get(
        binding, lambda q, k, v: (q, k, v))(*leaves)
    assert_pytorchs_gradients(lambda *qkv: attention_in_one_loop(*qkv, 0.3), leaves, q, k, v, False, g)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("host", [False, True])
def test_the_tutorials_forward_keeps_its_loops_states(host, causal, monkeypatch, poisoned_empty):
    """The loop is in `attend_stage`, an inlined helper (called twice by the causal forward): the op's forward
    keeps each call's final state (augment.py), so the backward recomputes no loop before its reverse ones. Its
    descriptor loads get write facts as pointer loads do: dQ, each element read by one program, is stored (into a
    buffer left unfilled, the query blocks covering it: poisoned here); dK and dV, read by every query block, are
    added through shadow descriptors (a kernel of their own, as a pointer attention gets, measured slower:
    benchmarks/RESULTS.md)."""
    if host and not _have_host_descriptors():
        pytest.skip("this Triton has no triton.tools.tensor_descriptor")
    seen = prepared_launches(monkeypatch)
    g = torch.Generator().manual_seed(41)
    q, k, v = (torch.randn(1, 3, 80, 16, generator=g, dtype=torch.float64).requires_grad_() for _ in range(3))
    assert_pytorchs_gradients(lambda *qkv: attention(*qkv, causal, 0.3, host, False), (q, k, v), q, k, v, causal, g)
    (prepared,) = seen
    assert all(part.saved for part in prepared.variant.parts)  # the forward kept the loops' finals: nothing recomputed
    assert modes(prepared) == {"desc_q": "STORE", "desc_k": "ATOMIC", "desc_v": "ATOMIC"}
    assert prepared.choices["desc_q"].covers


@pytest.mark.parametrize("binding", ["k = v", "q = k = v", "q a slice of a larger tensor"])
@pytest.mark.parametrize("host", [False, True])
def test_the_descriptor_forward_gets_pytorchs_gradients_however_its_tensors_are_bound(host, binding, monkeypatch,
                                                                                     poisoned_empty):
    """dQ is stored through the descriptor's addresses (each query row read by one program), dK and dV added as
    tiles: one tensor read as keys and values (one buffer for two gradients), or as all three (dQ's store then
    lands where dK and dV add: a buffer of its own), and queries that are rows of a larger tensor."""
    if host and not _have_host_descriptors():
        pytest.skip("this Triton has no triton.tools.tensor_descriptor")
    g = torch.Generator().manual_seed(53)
    shape = (1, 3, 48, 16)
    leaves = [torch.randn(shape, generator=g, dtype=torch.float64).requires_grad_() for _ in range(3)]
    if binding == "q a slice of a larger tensor":
        big = torch.randn(1, 5, 48, 16, generator=g, dtype=torch.float64).requires_grad_()
        leaves[0] = big
        q, k, v = big[:, 1:4], leaves[1], leaves[2]
    else:
        q, k, v = {"k = v": lambda q, k, v: (q, k, k), "q = k = v": lambda q, k, v: (q, q, q)}[binding](*leaves)
    seen = prepared_launches(monkeypatch)
    assert_pytorchs_gradients(lambda *qkv: attention(*qkv, False, 0.3, host, False), leaves, q, k, v, False, g)
    assert len(seen) == 1 and modes(seen[0])["desc_k"] == "ATOMIC"


@triton.jit
def attend_keys(acc, row_sum, row_max, q, k_ptr, v_ptr, first_row, scale, cols, keys, SEQ, HEAD_DIM: tl.constexpr,
                BLOCK_N: tl.constexpr):
    # the one-loop attention's loop, in a helper as the tutorial writes it (`_attn_fwd_inner`), through pointers
    key_row = first_row
    for _block in tl.range(0, SEQ, BLOCK_N):
        block = (key_row + keys)[:, None] * HEAD_DIM + cols[None, :]
        s = tl.dot(q, tl.load(k_ptr + block).T)
        new_max = tl.maximum(row_max, tl.max(s, 1) * scale)
        p = tl.math.exp2(s * scale - new_max[:, None])
        shrink = tl.math.exp2(row_max - new_max)
        row_sum = row_sum * shrink + tl.sum(p, 1)
        acc = tl.dot(p, tl.load(v_ptr + block), acc * shrink[:, None])
        row_max = new_max
        key_row += BLOCK_N
    return acc, row_sum, row_max


@triton.jit
def attention_helper_loop(sm_scale, q_ptr, k_ptr, v_ptr, o_ptr, SEQ, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                          BLOCK_N: tl.constexpr):
    first_row = tl.program_id(1) * SEQ
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, HEAD_DIM)
    at = (first_row + rows)[:, None] * HEAD_DIM + cols[None, :]
    q = tl.load(q_ptr + at, mask=(rows < SEQ)[:, None], other=0.0)
    row_max = tl.zeros([BLOCK_M], dtype=tl.float64) - float("inf")
    row_sum = tl.zeros([BLOCK_M], dtype=tl.float64) + 1.0
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float64)
    scale = sm_scale * 1.44269504
    acc, row_sum, row_max = attend_keys(acc, row_sum, row_max, q, k_ptr, v_ptr, first_row, scale, cols,
                                        tl.arange(0, BLOCK_N), SEQ, HEAD_DIM, BLOCK_N)
    tl.store(o_ptr + at, acc / row_sum[:, None], mask=(rows < SEQ)[:, None])


@tritongrad.op
def attention_in_a_helper(q, k, v, sm_scale: float):
    z, h, seq, head_dim = q.shape
    o = torch.full_like(q, float("nan"))
    attention_helper_loop[(triton.cdiv(seq, BLOCK), z * h)](sm_scale, q, k, v, o, seq, HEAD_DIM=head_dim,
                                                            BLOCK_M=BLOCK, BLOCK_N=BLOCK)
    return o


def test_keys_and_values_of_a_loop_in_a_helper_get_a_kernel_of_their_own_with_its_prologue(monkeypatch):
    """The loop in an inlined helper: the forward keeps its state (augment.py), dK and dV get the loop interchange,
    and what each query block's work computes before the loop from that state (dO / l and the row sums of its
    adjoint) a prologue computes once per query block, not each interchanged program for every block: the helper's
    carried values, whose start the online-softmax rewrite rescales (`acc_1 = acc_unscaled * shrink`), have the
    type they were created with (reverse/loops.py dtype_as_written), the running sum's through `zeros + 1.0`."""
    from tritongrad.runtime import backward_kernel

    monkeypatch.setattr(backward_kernel, "multiprocessors", lambda device: 1)
    seen = prepared_launches(monkeypatch)
    g = torch.Generator().manual_seed(40)
    q, k, v = (torch.randn(1, 2, 80, 16, generator=g, dtype=torch.float64).requires_grad_() for _ in range(3))
    assert_pytorchs_gradients(lambda *qkv: attention_in_a_helper(*qkv, 0.3), (q, k, v), q, k, v, False, g)
    (prepared,) = seen
    assert modes(prepared) == {"q_ptr": "STORE", "k_ptr": "INTERCHANGE", "v_ptr": "INTERCHANGE"}
    assert all(part.saved for part in prepared.variant.parts)
    assert [part.prologue is not None for part in prepared.variant.parts] == [False, True]
    assert len(prepared.variant.parts[1].exports.states) == 2  # dO / l and its row sums, both computed once


@triton.jit
def tutorial_stage_through_pointers(acc, l_i, m_i, q, k_ptr, v_ptr, first_row, start_m, qk_scale, offs_m, offs_n,
                                    cols, SEQ, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                                    BLOCK_N: tl.constexpr, STAGE: tl.constexpr):
    # the tutorial's `_attn_fwd_inner` through plain pointers, masked past SEQ
    if STAGE == 1:
        lo, hi = 0, start_m * BLOCK_M
    elif STAGE == 2:
        lo, hi = start_m * BLOCK_M, (start_m + 1) * BLOCK_M
        lo = tl.multiple_of(lo, BLOCK_M)
    else:
        lo, hi = 0, SEQ
    for start_n in range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        keys = start_n + offs_n
        kv = (first_row + keys)[:, None] * HEAD_DIM + cols[None, :]
        k = tl.load(k_ptr + kv, mask=(keys < SEQ)[:, None], other=0.0).T
        qk = tl.dot(q, k)
        if STAGE == 2:
            mask = (offs_m[:, None] >= keys[None, :]) & (keys < SEQ)[None, :]
            qk = qk * qk_scale + tl.where(mask, 0, -1.0e6)
            m_ij = tl.maximum(m_i, tl.max(qk, 1))
            qk -= m_ij[:, None]
        else:
            qk = qk * qk_scale + tl.where((keys < SEQ)[None, :], 0, -1.0e6)
            m_ij = tl.maximum(m_i, tl.max(qk, 1))
            qk = qk - m_ij[:, None]
        p = tl.math.exp2(qk)
        l_ij = tl.sum(p, 1)
        alpha = tl.math.exp2(m_i - m_ij)
        l_i = l_i * alpha + l_ij
        acc = acc * alpha[:, None]
        v = tl.load(v_ptr + kv, mask=(keys < SEQ)[:, None], other=0.0)
        p = p.to(v.dtype)
        acc = tl.dot(p, v, acc)
        m_i = m_ij
    return acc, l_i, m_i


@triton.jit
def tutorial_forward_through_pointers(sm_scale, M, q_ptr, k_ptr, v_ptr, o_ptr, SEQ, HEAD_DIM: tl.constexpr,
                                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, STAGE: tl.constexpr):
    # the tutorial's `_attn_fwd` as it ships (float32 state, exp2 with the scale folded in, the sum started at
    # one, M = m_i + log2(l_i) stored), with plain pointers
    start_m = tl.program_id(0)
    off_hz = tl.program_id(1)
    first_row = off_hz * SEQ
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    cols = tl.arange(0, HEAD_DIM)
    m_i = tl.zeros([BLOCK_M], dtype=tl.float32) - float("inf")
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32) + 1.0
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    qk_scale = sm_scale
    qk_scale *= 1.44269504
    at = (first_row + offs_m)[:, None] * HEAD_DIM + cols[None, :]
    q = tl.load(q_ptr + at, mask=(offs_m < SEQ)[:, None], other=0.0)
    if STAGE & 1:
        acc, l_i, m_i = tutorial_stage_through_pointers(acc, l_i, m_i, q, k_ptr, v_ptr, first_row, start_m, qk_scale,
                                                        offs_m, offs_n, cols, SEQ, HEAD_DIM, BLOCK_M, BLOCK_N,
                                                        4 - STAGE)
    if STAGE & 2:
        acc, l_i, m_i = tutorial_stage_through_pointers(acc, l_i, m_i, q, k_ptr, v_ptr, first_row, start_m, qk_scale,
                                                        offs_m, offs_n, cols, SEQ, HEAD_DIM, BLOCK_M, BLOCK_N, 2)
    m_i += tl.math.log2(l_i)
    acc = acc / l_i[:, None]
    tl.store(M + off_hz * SEQ + offs_m, m_i, mask=offs_m < SEQ)
    tl.store(o_ptr + at, acc.to(o_ptr.dtype.element_ty), mask=(offs_m < SEQ)[:, None])


@tritongrad.op
def tutorial_attention_through_pointers(q, k, v, causal: bool, sm_scale: float):
    z, h, seq, head_dim = q.shape
    o = torch.full_like(q, float("nan"))
    m = torch.full((z, h, seq), float("nan"), dtype=q.dtype, device=q.device)
    tutorial_forward_through_pointers[(triton.cdiv(seq, BLOCK), z * h)](
        sm_scale, m, q, k, v, o, seq, HEAD_DIM=head_dim, BLOCK_M=BLOCK, BLOCK_N=BLOCK, STAGE=3 if causal else 1)
    return o, m


@pytest.mark.interpreter
@pytest.mark.parametrize("interchange", [False, True], ids=["atomics", "a kernel of their own for dK, dV"])
@pytest.mark.parametrize("causal", [False, True])
def test_the_tutorials_float32_state_with_float64_inputs_gets_pytorchs_gradients(causal, interchange, monkeypatch):
    """The tutorial's forward as it ships, its state declared float32, fed float64 in the
    interpreter: the state is float64 there (Triton's promotion), and its tapes, the forward's kept finals and the
    interchange's prologue keep it so (before: rounded, read back as another type, or refused by the prologue).
    The log-sum-exp M it stores is an output too."""
    if interchange:
        from tritongrad.runtime import backward_kernel

        monkeypatch.setattr(backward_kernel, "multiprocessors", lambda device: 1)
    g = torch.Generator().manual_seed(50)
    q, k, v = (torch.randn(1, 2, 37, 16, generator=g, dtype=torch.float64).requires_grad_() for _ in range(3))
    o, m = tutorial_attention_through_pointers(q, k, v, causal, 0.3)
    want = reference(q, k, v, causal, 0.3)
    scale = (torch.tensor(0.3, dtype=torch.float32) * torch.tensor(LOG2E, dtype=torch.float32)).item()
    s = q @ k.transpose(-1, -2) * scale
    if causal:
        s = s.masked_fill(~torch.ones(37, 37, dtype=torch.bool).tril(), float("-inf"))
    want_m = torch.logsumexp(s * math.log(2), -1) / math.log(2)
    torch.testing.assert_close((o, m), (want, want_m), rtol=1e-9, atol=1e-9)
    d_o, d_m = torch.randn(o.shape, generator=g, dtype=torch.float64), torch.randn(m.shape, generator=g,
                                                                                  dtype=torch.float64)
    got = torch.autograd.grad((o, m), (q, k, v), (d_o, d_m))
    expected = torch.autograd.grad((want, want_m), (q, k, v), (d_o, d_m))
    for name, a, b in zip("qkv", got, expected, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9, msg=f"d{name}")


@tritongrad.op
def attention_in_half(q, k, v, causal: bool, sm_scale: float):
    """The tutorial as it ships: float16 through host descriptors, its state float32."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    z, h, seq, head_dim = q.shape
    o = torch.full_like(q, float("nan"))
    m = torch.full((z, h, seq), float("nan"), device=q.device, dtype=torch.float32)
    q_, k_, v_, o_ = (TensorDescriptor(t, shape=[z * h * seq, head_dim], strides=[head_dim, 1],
                                       block_shape=[BLOCK, head_dim]) for t in (q, k, v, o))
    attention_forward[(triton.cdiv(seq, BLOCK), z * h, 1)](
        sm_scale, m, z, h, q_, k_, v_, o_, seq, HEAD_DIM=head_dim, BLOCK_M=BLOCK, BLOCK_N=BLOCK,
        STAGE=3 if causal else 1, warp_specialize=False, VALUES=tl.float16, ACC=tl.float32)
    return o


@pytest.mark.parametrize("causal", [False, True])
def test_the_tutorial_in_half_precision_through_host_descriptors_gets_the_float32_gradients(causal):
    """Float16 inputs, the state float32, N = 48, D = 16 in the interpreter. The running max,
    kept on a tape of the widest type (its start `zeros - inf`), was read back as float64 in the interpreter,
    widening the accumulator's rescaled start; the accumulator's kept final was then read as float64 from the
    float32 the forward wrote (dQ, dK NaN or far off; dV, which does not read the max, right). Compiled, the
    read casts to float32, so an H200 got it right. Against a float32 reference on the same (rounded) inputs."""
    if not _have_host_descriptors():
        pytest.skip("this Triton has no triton.tools.tensor_descriptor")
    g = torch.Generator().manual_seed(52)
    q, k, v = (torch.randn(1, 2, 48, 16, generator=g).half().requires_grad_() for _ in range(3))
    o = attention_in_half(q, k, v, causal, 0.3)
    leaves = [t.detach().float().requires_grad_() for t in (q, k, v)]
    want = reference(*leaves, causal, 0.3)
    torch.testing.assert_close(o.float(), want, rtol=1e-2, atol=2e-3)
    d_o = torch.randn(o.shape, generator=g).half()
    got = torch.autograd.grad(o, (q, k, v), d_o)
    expected = torch.autograd.grad(want, leaves, d_o.float())
    for name, a, b in zip("qkv", got, expected, strict=True):
        torch.testing.assert_close(a.float(), b, rtol=1e-2, atol=1e-2, msg=f"d{name}")
