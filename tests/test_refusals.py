"""Every construct tritongrad cannot differentiate is refused with file, line and a hint.

Each kernel marks the line that must be named with a `# refused` comment.
"""

import inspect

import pytest
import torch
import triton
import triton.language as tl

import tritongrad
from tritongrad import NotDifferentiableError
from tritongrad.tools.testing import backward_launch


def marked_line(kernel) -> int:
    fn = kernel.fn
    lines, first = inspect.getsourcelines(fn)
    hits = [first + i for i, text in enumerate(lines) if text.rstrip().endswith("# refused")]
    assert len(hits) == 1, "mark exactly one line"
    return hits[0]


def not_a_triton_function(x):
    return x * 2


@triton.jit
def store_overwritten(x_ptr, y_ptr, T, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    for t in range(T):
        tl.store(y_ptr + offs, tl.load(x_ptr + t * BLOCK + offs))  # refused


@triton.jit
def store_repeats(x_ptr, y_ptr, T, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    for t in range(T):
        tl.store(y_ptr + (t % 2) * BLOCK + offs, tl.load(x_ptr + t * BLOCK + offs))  # refused


@triton.jit
def loop_local_after_loop(x_ptr, y_ptr, T, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    for t in range(T):
        x = tl.load(x_ptr + t * BLOCK + offs)
    tl.store(y_ptr + offs, x)  # refused


@triton.jit
def loop_over_tensor(x_ptr, y_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for i in tl.arange(0, 4):  # refused
        acc += tl.load(x_ptr + i * BLOCK + offs)
    tl.store(y_ptr + offs, acc)


@triton.jit
def break_out(x_ptr, y_ptr, T, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for t in range(T):
        acc += tl.load(x_ptr + t * BLOCK + offs)
        break  # refused
    tl.store(y_ptr + offs, acc)


@triton.jit
def while_loop(x_ptr, y_ptr, N, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs)
    i = 0
    while i < N:  # refused
        x = x * 2
        i += 1
    tl.store(y_ptr + offs, x)


@triton.jit
def float_modulo(x_ptr, y_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs)
    y = x % 3.0  # refused
    tl.store(y_ptr + offs, y)


@triton.jit
def plain_python_call(x_ptr, y_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs)
    y = not_a_triton_function(x)  # refused
    tl.store(y_ptr + offs, y)


@triton.jit
def no_rule(x_ptr, y_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs)
    y = tl.sort(x)  # refused
    tl.store(y_ptr + offs, y)


@triton.jit
def in_place(x_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs + 1)  # a neighbour's element, which another lane overwrites: # refused
    tl.store(x_ptr + offs, x * 2)


@triton.jit
def atomic_max_output(x_ptr, y_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs)
    tl.atomic_max(y_ptr + offs, x)  # refused


@triton.jit
def pointer_from_memory(ptrs_ptr, y_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    p = tl.load(ptrs_ptr).to(tl.pointer_type(tl.float32))
    x = tl.load(p + offs)  # refused
    tl.store(y_ptr + offs, x)


@triton.jit
def with_statement(x_ptr, y_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    with open("f"):  # refused
        x = tl.load(x_ptr + offs)
    tl.store(y_ptr + offs, x)


@triton.jit
def max_with_indices(x_ptr, y_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs)
    m, i = tl.max(x, 0, return_indices=True)  # refused
    tl.store(y_ptr, m)


@triton.jit
def _helper_with_a_while_loop(x):
    while tl.sum(x, 0) > 1.0:  # refused
        x = x * 0.5
    return x


@triton.jit
def calls_bad_helper(x_ptr, y_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs)
    tl.store(y_ptr + offs, _helper_with_a_while_loop(x))


@triton.jit
def stores_twice(x_ptr, y_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs)
    tl.store(y_ptr + offs, x)
    tl.store(y_ptr + offs, x * 2)  # refused


@triton.jit
def scatter_store(x_ptr, idx_ptr, y_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    idx = tl.load(idx_ptr + offs)
    x = tl.load(x_ptr + offs)
    tl.store(y_ptr + idx, x)  # refused


@triton.jit
def store_and_accumulate(x_ptr, y_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs)
    tl.store(y_ptr + offs, x)  # refused
    tl.atomic_add(y_ptr + offs, x)


@triton.jit
def descriptor_parameter(x_desc, y_ptr, BLOCK: tl.constexpr):
    x = x_desc.load([0])  # refused
    tl.store(y_ptr + tl.arange(0, BLOCK), x)


@triton.jit
def lanes_folded(x_ptr, y_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(y_ptr + offs // 2, tl.load(x_ptr + offs))  # refused


@triton.jit
def lanes_broadcast(x_ptr, y_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs[:, None] * BLOCK + offs[None, :])
    tl.store(y_ptr + offs[None, :] + tl.zeros([BLOCK, BLOCK], dtype=tl.int32), x)  # refused


@triton.jit
def lanes_same_stride(x_ptr, y_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs[:, None] * BLOCK + offs[None, :])
    tl.store(y_ptr + offs[:, None] + offs[None, :], x)  # refused


@triton.jit
def lanes_overlapping_strides(x_ptr, y_ptr):
    rows, cols = tl.arange(0, 4), tl.arange(0, 8)
    x = tl.load(x_ptr + rows[:, None] * 8 + cols[None, :])
    tl.store(y_ptr + rows[:, None] * 4 + cols[None, :], x)  # refused


@triton.jit
def program_plus_lane(x_ptr, y_ptr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) + tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs))  # refused


@triton.jit
def program_quotient(x_ptr, y_ptr, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    x = tl.load(x_ptr + pid * BLOCK + tl.arange(0, BLOCK))
    tl.store(y_ptr + (pid // 2) * BLOCK + tl.arange(0, BLOCK), x)  # refused


@triton.jit
def loop_index_times_zero(x_ptr, y_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    for i in range(3):
        x = tl.load(x_ptr + i * BLOCK + offs)
        tl.store(y_ptr + offs + i * 0, x)  # refused


@triton.jit
def loop_windows_overlap(x_ptr, y_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    for i in range(3):
        x = tl.load(x_ptr + i * BLOCK + offs)
        tl.store(y_ptr + offs + i, x)  # refused


@triton.jit
def loop_step_overlaps(x_ptr, y_ptr):
    offs = tl.arange(0, 4)
    for i in range(0, 6, 2):
        x = tl.load(x_ptr + i * 4 + offs)
        tl.store(y_ptr + offs + i, x)  # refused


REFUSED = [
    (loop_index_times_zero, "may repeat between iterations"),
    (program_quotient, "only through `// 2`"),
    (lanes_folded, "through `//`, `%`"),
    (lanes_broadcast, "does not change along axis 0"),
    (lanes_same_stride, "lane axis 0 and lane axis 1 have the same stride"),
    (lanes_overlapping_strides, "strides 1 and 4 overlap when lane axis 1 has 8 lanes"),
    (descriptor_parameter, "a descriptor made outside the kernel"),
    (store_overwritten, "same addresses in every iteration"),
    (store_repeats, "may repeat between iterations"),
    (loop_local_after_loop, "assigned inside the loop"),
    (loop_over_tensor, "`for` loop over"),
    (break_out, "`break`"),
    (while_loop, "`while` loop"),
    (float_modulo, "`%`"),
    (plain_python_call, "not_a_triton_function"),
    (no_rule, "sort"),
    (in_place, "no store of the same address and mask follows it"),
    (atomic_max_output, "atomic_max"),
    (pointer_from_memory, "pointer"),
    (with_statement, "With"),
    (max_with_indices, "unpacking"),
    (stores_twice, "second tl.store"),
    (scatter_store, "computed from loaded data"),
    (store_and_accumulate, "both stored and accumulated"),
]


@pytest.mark.parametrize("kernel, construct", REFUSED, ids=[k.fn.__name__ for k, _ in REFUSED])
def test_refusal_names_file_line_and_construct(kernel, construct):
    with pytest.raises(NotDifferentiableError) as info:
        tritongrad.grad(kernel)
    err = info.value
    assert err.file == __file__
    assert err.line == marked_line(kernel), str(err)
    assert construct in err.construct, str(err)
    assert err.hint, "every refusal carries a hint"
    assert f"{__file__}:{err.line}" in str(err)


def test_refusal_inside_a_helper_names_the_helper_line():
    with pytest.raises(NotDifferentiableError) as info:
        tritongrad.grad(calls_bad_helper)
    assert info.value.line == marked_line(_helper_with_a_while_loop)


def test_kernel_without_source_is_refused(tmp_path):
    src = "def k(x_ptr, y_ptr):\n    tl.store(y_ptr, tl.load(x_ptr))\n"
    scope = {"tl": tl}
    exec(compile(src, "<generated>", "exec"), scope)
    try:
        kernel = triton.jit(scope["k"])
    except (OSError, ValueError):
        pytest.skip("this Triton reads the source when the kernel is defined, and refuses there")
    with pytest.raises(NotDifferentiableError, match="source cannot be found"):
        tritongrad.grad(kernel)


@triton.jit
def scale(x_ptr, y_ptr, idx_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    i = tl.load(idx_ptr + offs)
    x = tl.load(x_ptr + i)
    tl.store(y_ptr + offs, x * 2.0, mask=offs < n)


@pytest.mark.parametrize("wrt, outputs, message", [
    (("z_ptr",), None, "not a parameter"),
    (("y_ptr",), None, "never loads"),
    (None, ("x_ptr",), "never stores"),
    (("x_ptr", "x_ptr"), None, "^wrt names `x_ptr` twice$"),
    (None, ("y_ptr", "y_ptr"), "^outputs names `y_ptr` twice$"),
    (("n",), None, r"wrt names `n`, which kernel `scale` does not use as a pointer \(its pointer parameters: x_ptr, "
                   r"y_ptr, idx_ptr\)"),
    (None, "BLOCK", "outputs names `BLOCK`, which kernel `scale` does not use as a pointer"),
])
def test_wrong_wrt_or_outputs_are_named(wrt, outputs, message):
    with pytest.raises(ValueError, match=message):
        tritongrad.grad(scale, wrt=wrt, outputs=outputs)


def test_one_name_may_be_a_string():
    assert tritongrad.grad(scale, wrt="x_ptr", outputs="y_ptr").wrt == ("x_ptr",)
    assert tritongrad.grad(scale, wrt="x_ptr") is tritongrad.grad(scale, wrt=("x_ptr",))
    with pytest.raises(TypeError, match="wrt names parameters by their names"):
        tritongrad.grad(scale, wrt=(0,))


def test_index_pointer_is_not_differentiated_by_default():
    assert tritongrad.grad(scale).wrt == ("x_ptr",)


@triton.jit
def same_address_in_every_program(x_ptr, y_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs)
    tl.store(y_ptr + offs, x * 3.0)


def test_programs_overwriting_each_other_are_refused_at_launch():
    bwd = tritongrad.grad(same_address_in_every_program)
    x, y, dy = torch.randn(16, dtype=torch.float64), torch.empty(16, dtype=torch.float64), torch.randn(16)
    dx = torch.zeros(16, dtype=torch.float64)
    with pytest.raises(NotDifferentiableError, match="4 programs along axis 0"):
        bwd[(4,)](x, y, dy.double(), dx, BLOCK=16)
    bwd[(1,)](x, y, dy.double(), dx, BLOCK=16)  # one program: every element written once
    torch.testing.assert_close(dx, 3.0 * dy.double())


@pytest.mark.parametrize("kernel, grid, sizes, meta", [
    (loop_windows_overlap, (1,), (24, 10), {"BLOCK": 8}),
    (loop_step_overlaps, (1,), (12, 8), {}),
    (program_plus_lane, (2,), (9, 9), {"BLOCK": 8}),
])
def test_overlaps_that_depend_on_the_launch_are_refused_there(kernel, grid, sizes, meta):
    """Iterations or programs whose stores overlap: whether they do depends on trip counts and the grid
    (one program, one iteration would be fine), so the backward's launch refuses them, naming the line."""
    x, y = torch.randn(sizes[0], dtype=torch.float64), torch.zeros(sizes[1], dtype=torch.float64)
    with pytest.raises(NotDifferentiableError, match="two lanes or programs reach one element") as info:
        backward_launch(kernel, grid, (x, y), meta, {"y_ptr": torch.randn_like(y)})
    assert info.value.line == marked_line(kernel)


def test_a_single_program_may_store_where_a_second_would_overlap():
    x = torch.randn(8, dtype=torch.float64)
    y = torch.zeros(8, dtype=torch.float64)
    d_y = torch.randn_like(y)
    got = backward_launch(program_plus_lane, (1,), (x, y), {"BLOCK": 8}, {"y_ptr": d_y})
    torch.testing.assert_close(got["x_ptr"], d_y)


# -- an op refuses at its call, not at .backward() -----------------------------------------------------------------


@triton.jit
def running_max(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.atomic_max(y_ptr + offs * 0, tl.load(x_ptr + offs, mask=mask, other=0.0), mask=mask)  # refused


@triton.jit
def scatter_twice(x_ptr, idx_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    i = tl.load(idx_ptr + offs, mask=mask, other=0)
    tl.store(y_ptr + i, tl.load(x_ptr + offs, mask=mask) * 2.0, mask=mask)  # refused


@triton.jit
def max_or_copy(x_ptr, y_ptr, n, MAX: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    if MAX:
        tl.atomic_max(y_ptr + offs * 0, x, mask=mask)  # refused
    else:
        tl.store(y_ptr + offs, x, mask=mask)


@tritongrad.op
def maximum(x):
    y = torch.full((1,), float("-inf"), dtype=x.dtype, device=x.device)
    running_max[(triton.cdiv(x.numel(), 32),)](x, y, x.numel(), BLOCK=32)
    return y


@tritongrad.op
def scatter(x, idx):
    y = torch.zeros_like(x)
    scatter_twice[(triton.cdiv(x.numel(), 32),)](x, idx, y, x.numel(), BLOCK=32)
    return y


@tritongrad.op
def max_or_copy_op(x, take_max: bool):
    y = torch.full((x.numel(),), float("-inf"), dtype=x.dtype, device=x.device)
    max_or_copy[(triton.cdiv(x.numel(), 32),)](x, y, x.numel(), MAX=take_max, BLOCK=32)
    return y


@pytest.fixture
def derivations(monkeypatch):
    """The kernels an op's calls and backwards derive (through host/backward.py's grad)."""
    found = []
    real = tritongrad.host.backward.grad

    def spy(kernel, *args, **kwargs):
        found.append(kernel.fn.__name__)
        return real(kernel, *args, **kwargs)

    monkeypatch.setattr(tritongrad.host.backward, "grad", spy)
    return found


@pytest.mark.parametrize(("op", "kernel", "construct", "hint"), [
    (maximum, running_max, "`atomic_max` of a differentiated value", "only tl.store and tl.atomic_add outputs"),
    (scatter, scatter_twice, "a tl.store to `y_ptr` at addresses computed from loaded data", "use tl.atomic_add"),
], ids=["atomic_max", "scatter"])
def test_an_op_refuses_at_its_call_when_an_input_requires_grad(op, kernel, construct, hint, device, derivations):
    x = torch.randn(45, dtype=torch.float64, device=device)
    args = (torch.randperm(45, device=device),) if op is scatter else ()
    for _ in range(2):  # the second call is refused from what the first derived
        with pytest.raises(NotDifferentiableError) as info:
            op(x.clone().requires_grad_(), *args)
        e = info.value
        assert (e.file, e.line) == (__file__, marked_line(kernel)) and construct in e.construct and hint in e.hint
        assert f"needed to differentiate launch #1 (`{kernel.fn.__name__}`) of tritongrad.op" in e.__notes__[0]
        assert len(e.__notes__) == 1
    assert derivations == [kernel.fn.__name__]
    op(x, *args)  # nothing requires grad: no backward, nothing derived
    with torch.no_grad():
        op(x.clone().requires_grad_(), *args)
    assert derivations == [kernel.fn.__name__]


def test_a_refusal_of_one_specialization_comes_at_its_call(device):
    x = torch.randn(45, dtype=torch.float64, device=device, requires_grad=True)
    max_or_copy_op(x, False).sum().backward()
    torch.testing.assert_close(x.grad, torch.ones_like(x))
    with pytest.raises(NotDifferentiableError, match="`atomic_max` of a differentiated value") as info:
        max_or_copy_op(x, True)
    assert info.value.line == marked_line(max_or_copy)


def test_an_op_derives_once_at_its_first_call(device, derivations):
    """The call derives what the backward launches: later calls and backwards derive nothing."""
    @tritongrad.op
    def copy(x):
        y = torch.empty_like(x)
        max_or_copy[(triton.cdiv(x.numel(), 32),)](x, y, x.numel(), MAX=False, BLOCK=32)
        return y

    x = torch.randn(45, dtype=torch.float64, device=device, requires_grad=True)
    y = copy(x)
    assert derivations == ["max_or_copy"]
    for _ in range(2):
        y.sum().backward()
        y = copy(x)
    assert derivations == ["max_or_copy"]
    torch.testing.assert_close(x.grad, torch.full_like(x, 2.0))
