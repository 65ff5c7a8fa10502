"""An input read at one address by several loops over one range (a chunked layer norm's mean, variance and
normalize passes): the backward writes each element's gradient once, in the last reversed loop, the other loops'
adjoints computed again there (reverse/rereads.py). Checked against PyTorch autograd in float64, rows longer than
a block and not a multiple of it, with the bindings users pass; where the adjoints cannot be computed again (a
loop carrying nonlinear state), the loads are written apart, as before."""

import pytest
import torch
import triton
import triton.language as tl
from conftest import DEVICE

import tritongrad

D = torch.float64


@triton.jit
def chunked_layer_norm(x_ptr, w_ptr, b_ptr, y_ptr, stride_x, stride_y, n, eps, BLOCK: tl.constexpr):
    # one program per row, the row read three times in blocks: its mean, its variance, then the output
    row = tl.program_id(0)
    x_row = x_ptr + row * stride_x
    total = tl.zeros([BLOCK], dtype=tl.float64)
    for start in range(0, n, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        total += tl.load(x_row + cols, mask=cols < n, other=0.0)
    mean = tl.sum(total, axis=0) / n
    squares = tl.zeros([BLOCK], dtype=tl.float64)
    for start in range(0, n, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        centred = tl.where(cols < n, tl.load(x_row + cols, mask=cols < n, other=0.0) - mean, 0.0)
        squares += centred * centred
    rstd = 1.0 / tl.sqrt(tl.sum(squares, axis=0) / n + eps)
    for start in range(0, n, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < n
        x = tl.load(x_row + cols, mask=mask, other=0.0)
        w = tl.load(w_ptr + cols, mask=mask)
        b = tl.load(b_ptr + cols, mask=mask)
        tl.store(y_ptr + row * stride_y + cols, (x - mean) * rstd * w + b, mask=mask)


@tritongrad.op
def layer_norm(x, w, b):
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    chunked_layer_norm[(x.shape[0],)](x, w, b, y, x.stride(0), y.stride(0), x.shape[1], 1e-5, BLOCK=16)
    return y


def reference(x, w, b):
    return torch.nn.functional.layer_norm(x, x.shape[-1:], w, b, 1e-5)


def compare(y, want, *leaves):
    """The op's output and each leaf's gradient against PyTorch's, for one random output gradient."""
    torch.testing.assert_close(y, want)
    g = torch.randn_like(y)
    for i, (got, expected) in enumerate(zip(torch.autograd.grad(y, leaves, g), torch.autograd.grad(want, leaves, g),
                                            strict=True)):
        torch.testing.assert_close(got, expected, msg=f"the gradient of leaf {i}")


def check(x, w, b, *leaves):
    compare(layer_norm(x, w, b), reference(x, w, b), *leaves)


def test_the_three_loads_of_a_row_are_written_once_as_a_store():
    bwd = tritongrad.grad(chunked_layer_norm, wrt=("x_ptr", "w_ptr", "b_ptr"), outputs=("y_ptr",))
    # the text is the point (the loads merged into one store): test_a_chunked_layer_norm_gets_pytorchs_gradients
    # checks this kernel's gradients
    x_part = next(src for src in bwd.src.split("@triton.jit") if "d_x_ptr" in src)
    assert x_part.count("tl.store(d_x_row") == 1, x_part
    assert "tl.atomic_add(d_x_row" not in x_part
    assert "recomputed here" in x_part


@pytest.mark.parametrize("rows, n", [(5, 37), (3, 100), (2, 16), (4, 5)])
def test_a_chunked_layer_norm_gets_pytorchs_gradients(rows, n, poisoned_empty):
    x = (0.3 + 2 * torch.randn(rows, n, dtype=D, device=DEVICE)).requires_grad_()
    w = torch.randn(n, dtype=D, device=DEVICE, requires_grad=True)
    b = torch.randn(n, dtype=D, device=DEVICE, requires_grad=True)
    check(x, w, b, x, w, b)


def test_rows_of_a_wider_buffer(poisoned_empty):
    """A view whose rows are further apart than they are long: the gradient's buffer has the view's strides."""
    wide = torch.randn(6, 50, dtype=D, device=DEVICE, requires_grad=True)
    w = torch.randn(37, dtype=D, device=DEVICE, requires_grad=True)
    b = torch.randn(37, dtype=D, device=DEVICE, requires_grad=True)
    check(wide[:, 5:42], w, b, wide, w, b)


def test_every_row_one_expanded_row(poisoned_empty):
    """Stride 0 between rows: every program reads (and writes the gradient of) one row, so its elements are added
    atomically, once per program, not stored."""
    row = torch.randn(1, 37, dtype=D, device=DEVICE, requires_grad=True)
    w = torch.randn(37, dtype=D, device=DEVICE, requires_grad=True)
    b = torch.randn(37, dtype=D, device=DEVICE, requires_grad=True)
    check(row.expand(5, 37), w, b, row, w, b)


def test_the_weight_a_row_of_the_input_and_the_bias_the_weight(poisoned_empty):
    """Views of one storage: the weight is the input's first row, the bias the weight itself."""
    x = torch.randn(5, 37, dtype=D, device=DEVICE, requires_grad=True)
    check(x, x[0], x[0], x)


def test_views_of_one_buffer_for_input_weight_and_bias(poisoned_empty):
    buffer = torch.randn(6 * 37, dtype=D, device=DEVICE, requires_grad=True)
    x, w, b = buffer[:4 * 37].view(4, 37), buffer[4 * 37:5 * 37], buffer[5 * 37:]
    check(x, w, b, buffer)


def test_one_row(poisoned_empty):
    x = torch.randn(1, 23, dtype=D, device=DEVICE, requires_grad=True)
    w = torch.randn(23, dtype=D, device=DEVICE, requires_grad=True)
    b = torch.randn(23, dtype=D, device=DEVICE, requires_grad=True)
    check(x, w, b, x, w, b)


@triton.jit
def product_then_scale(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    # the first loop carries a product (nonlinear state): its adjoint changes every iteration, so the second
    # loop's loads cannot be written with the first's
    row = tl.program_id(0)
    product = tl.full([BLOCK], 1.0, dtype=tl.float64)
    for start in range(0, n, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        product *= tl.load(x_ptr + row * n + cols, mask=cols < n, other=1.0)
    scale = tl.sum(product, axis=0)
    for start in range(0, n, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + row * n + cols, mask=cols < n, other=0.0)
        tl.store(y_ptr + row * n + cols, x * scale, mask=cols < n)


def test_a_loop_carrying_nonlinear_state_writes_its_loads_apart(poisoned_empty):
    bwd = tritongrad.grad(product_then_scale, wrt=("x_ptr",), outputs=("y_ptr",))
    assert "nonlinear" in bwd.not_merged["x_ptr"]
    x = (1 + 0.1 * torch.randn(3, 37, dtype=D, device=DEVICE)).requires_grad_()
    blocks = torch.nn.functional.pad(x, (0, 48 - 37), value=1.0).view(3, 3, 16)
    want = x * blocks.prod(1).sum(-1, keepdim=True)

    @tritongrad.op
    def op(x):
        y = torch.empty_like(x)
        product_then_scale[(x.shape[0],)](x, y, x.shape[1], BLOCK=16)
        return y

    compare(op(x), want, x)


@triton.jit
def shifted_reread(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    # the second loop reads each element's neighbour: not the first loop's address, so nothing is merged
    row = tl.program_id(0)
    total = tl.zeros([BLOCK], dtype=tl.float64)
    for start in range(0, n, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        total += tl.load(x_ptr + row * (n + 1) + cols, mask=cols < n, other=0.0)
    mean = tl.sum(total, axis=0) / n
    for start in range(0, n, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + row * (n + 1) + cols + 1, mask=cols < n, other=0.0)
        tl.store(y_ptr + row * n + cols, x - mean, mask=cols < n)


def test_loads_of_other_addresses_are_not_merged(poisoned_empty):
    bwd = tritongrad.grad(shifted_reread, wrt=("x_ptr",), outputs=("y_ptr",))
    assert "recomputed here" not in bwd.src
    x = torch.randn(4, 38, dtype=D, device=DEVICE, requires_grad=True)
    want = x[:, 1:] - x[:, :-1].mean(-1, keepdim=True)

    @tritongrad.op
    def op(x):
        y = torch.empty(x.shape[0], x.shape[1] - 1, dtype=x.dtype, device=x.device)
        shifted_reread[(x.shape[0],)](x, y, x.shape[1] - 1, BLOCK=16)
        return y

    compare(op(x), want, x)


@triton.jit
def rows_by_ticket(x_ptr, counter_ptr, y_ptr, n, BLOCK: tl.constexpr):
    # each loop reads the row its own ticket numbers: the two addresses read alike as text, not in value
    first = tl.atomic_add(counter_ptr, 1)  # refused: the backward would need the ticket again
    total = tl.zeros([BLOCK], dtype=tl.float64)
    for start in range(0, n, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        total += tl.load(x_ptr + first * n + cols, mask=cols < n, other=0.0)
    scale = tl.sum(total, axis=0)
    second = tl.atomic_add(counter_ptr, 1)
    for start in range(0, n, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + second * n + cols, mask=cols < n, other=0.0)
        tl.store(y_ptr + cols, x * scale, mask=cols < n)


def test_addresses_from_an_atomics_result_are_refused_naming_it():
    """The backward cannot run an atomic again (it would change the counter and get another ticket): refused at
    derivation, where the derived kernel read a name it never assigned (a NameError at the launch)."""
    with pytest.raises(tritongrad.NotDifferentiableError, match="the result of `tl.atomic_add` .`first`.") as e:
        tritongrad.grad(rows_by_ticket, wrt=("x_ptr",), outputs=("y_ptr",))
    assert e.value.line == rows_by_ticket.fn.__code__.co_firstlineno + 3


@triton.jit
def add_then_layer_norm(x_ptr, r_ptr, y_ptr, stride_x, stride_r, n, eps, BLOCK: tl.constexpr):
    # two inputs read by all three passes: two loads merged per input
    row = tl.program_id(0)
    total = tl.zeros([BLOCK], dtype=tl.float64)
    for start in range(0, n, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        total += (tl.load(x_ptr + row * stride_x + cols, mask=cols < n, other=0.0)
                  + tl.load(r_ptr + row * stride_r + cols, mask=cols < n, other=0.0))
    mean = tl.sum(total, axis=0) / n
    squares = tl.zeros([BLOCK], dtype=tl.float64)
    for start in range(0, n, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        s = (tl.load(x_ptr + row * stride_x + cols, mask=cols < n, other=0.0)
             + tl.load(r_ptr + row * stride_r + cols, mask=cols < n, other=0.0))
        centred = tl.where(cols < n, s - mean, 0.0)
        squares += centred * centred
    rstd = 1.0 / tl.sqrt(tl.sum(squares, axis=0) / n + eps)
    for start in range(0, n, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        s = (tl.load(x_ptr + row * stride_x + cols, mask=cols < n, other=0.0)
             + tl.load(r_ptr + row * stride_r + cols, mask=cols < n, other=0.0))
        tl.store(y_ptr + row * n + cols, (s - mean) * rstd, mask=cols < n)


def add_then_norm(deterministic=False):
    @tritongrad.op(deterministic=deterministic)
    def op(x, r):
        y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        add_then_layer_norm[(x.shape[0],)](x, r, y, x.stride(0), r.stride(0), x.shape[1], 1e-5, BLOCK=16)
        return y

    return op


@pytest.mark.parametrize("binding", ["apart", "r is x", "r a row of x", "x expanded", "deterministic"])
def test_two_inputs_read_by_every_pass(binding, poisoned_empty):
    """x and r each written once (two merge points), bound apart, to one tensor, r to one row of x expanded, x to
    one row expanded (atomics), and deterministic (stores)."""
    x = torch.randn(4, 37, dtype=D, device=DEVICE, requires_grad=True)
    r = torch.randn(4, 37, dtype=D, device=DEVICE, requires_grad=True)
    args, leaves = {"apart": ((x, r), (x, r)), "r is x": ((x, x), (x,)), "r a row of x": ((x, x[1:2].expand(4, 37)),
                    (x,)), "x expanded": ((x[:1].expand(4, 37), r), (x, r)), "deterministic": ((x, r), (x, r))}[binding]
    compare(add_then_norm(binding == "deterministic")(*args),
            torch.nn.functional.layer_norm(args[0] + args[1], (37,), eps=1e-5), *leaves)


def test_deterministic_refuses_an_expanded_input_read_by_every_pass():
    x = torch.randn(1, 37, dtype=D, device=DEVICE, requires_grad=True)
    r = torch.randn(4, 37, dtype=D, device=DEVICE, requires_grad=True)
    with pytest.raises(tritongrad.NotDifferentiableError, match="`x_ptr` with deterministic=True"):
        y = add_then_norm(True)(x.expand(4, 37), r)
        torch.autograd.grad(y, (x, r), torch.ones_like(y))


@triton.jit
def grid_stride_layer_norm(x_ptr, y_ptr, rows, n, eps, BLOCK: tl.constexpr):
    # the three passes inside a loop over rows, a program per few rows: merged in the row loop's body
    for row in tl.range(tl.program_id(0), rows, tl.num_programs(0)):
        total = tl.zeros([BLOCK], dtype=tl.float64)
        for start in range(0, n, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            total += tl.load(x_ptr + row * n + cols, mask=cols < n, other=0.0)
        mean = tl.sum(total, axis=0) / n
        squares = tl.zeros([BLOCK], dtype=tl.float64)
        for start in range(0, n, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            centred = tl.where(cols < n, tl.load(x_ptr + row * n + cols, mask=cols < n, other=0.0) - mean, 0.0)
            squares += centred * centred
        rstd = 1.0 / tl.sqrt(tl.sum(squares, axis=0) / n + eps)
        for start in range(0, n, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            x = tl.load(x_ptr + row * n + cols, mask=cols < n, other=0.0)
            tl.store(y_ptr + row * n + cols, (x - mean) * rstd, mask=cols < n)


@pytest.mark.parametrize("programs", [3, 1])
def test_the_passes_inside_a_grid_stride_loop_over_rows(programs, poisoned_empty):
    assert "recomputed here" in tritongrad.grad(grid_stride_layer_norm).src

    @tritongrad.op
    def op(x):
        y = torch.empty_like(x)
        grid_stride_layer_norm[(programs,)](x, y, x.shape[0], x.shape[1], 1e-5, BLOCK=16)
        return y

    x = torch.randn(7, 37, dtype=D, device=DEVICE, requires_grad=True)
    compare(op(x), torch.nn.functional.layer_norm(x, (37,), eps=1e-5), x)


def test_derivation_asks_what_it_can_write_before_compiling(monkeypatch):
    # which strategies the backward body can be written with is asked of reverse/ before the write plans are made
    # (reverse/feasibility.py: the body written, not compiled): derivation compiles the kernels of the variant a
    # launch gets and no others (it compiled a trial kernel per merge and per kernel of its own it could make)
    from tritongrad.codegen import generate
    from tritongrad.runtime import derive
    from tritongrad.writes.strategies import Choice, Mode

    compiled, compile_kernel = [], generate.compile_kernel
    monkeypatch.setattr(generate, "compile_kernel", lambda src, name, program: (
        compiled.append(name), compile_kernel(src, name, program))[1])
    derive.clear_cache()
    bwd = tritongrad.grad(chunked_layer_norm)
    assert bwd.writes.inputs["x_ptr"].rereads and not bwd.not_merged  # merged
    variants = [bwd.variant(bwd.writes.best())]  # (already derived: nothing compiled again)
    if not any(part.wrt == bwd.wrt for part in variants[0].parts):  # and one naming every shadow, as the calling
        variants.append(bwd.variant({p: Choice(Mode.ATOMIC) for p in bwd.wrt}))  # convention does
    assert sorted(compiled) == sorted(k.fn.__name__ for v in variants for part in v.parts
                                      for k in (part.kernel, part.prologue) if k is not None)
