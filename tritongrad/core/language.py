"""Triton helpers that derived kernels call (imported there as ``tg``).

Each one is an adjoint whose shape logic depends on compile-time shapes or dtypes,
so it is written once here rather than spelled out in every derived kernel.

They become ``@triton.jit`` functions on first use, not at import: whether Triton
runs kernels through its interpreter is fixed when a kernel is defined, and
``tritongrad demo`` decides that after importing the package.
"""

import ast
import os
import sys
from dataclasses import dataclass

import triton
import triton.language as tl
from triton.language.extra import libdevice

from .operations import CUSTOM, custom_operation


@dataclass(frozen=True)
class Helper:
    """What the passes over a derived kernel (codegen/, reverse/recompute.py, reverse/interchange.py) know of a
    ``tg`` helper: one entry of :data:`HELPERS` per helper below, nothing assumed of one without."""

    calls: tuple[str, ...] = ()  # helpers it calls (jitted before it)
    shape_only: tuple[int, ...] = ()  # arguments it reads for their shape and type only, by position
    flows: tuple[int, ...] = ()  # arguments whose values flow on through it (into its result or memory)
    writes: bool = False  # writes memory: nothing moves across it, it is not pure
    elementwise: bool = False  # its result is elementwise in its first argument
    rank_like: int | None = None  # the argument whose rank its result has (-1: a scalar)
    shaped_like: bool = False  # an adjoint helper giving a tile the shape of another: elementwise in both
    costly: bool = False  # a reduction or a read of memory: worth computing once where it can be


HELPERS: dict[str, Helper] = {
    "unbroadcast": Helper(calls=("widened",), shape_only=(1,), flows=(0, 1), rank_like=1, shaped_like=True,
                          costly=True),
    "sum_grad": Helper(shape_only=(1,), flows=(0, 1), rank_like=1, shaped_like=True, costly=True),
    "extremum_grad": Helper(rank_like=1, shaped_like=True),
    "extremum_tangent": Helper(costly=True),
    "cast_grad": Helper(flows=(0,), elementwise=True, rank_like=0),
    "zeros_grad": Helper(shape_only=(0,), flows=(0,), rank_like=0, shaped_like=True),
    "widened": Helper(flows=(0,), elementwise=True, rank_like=0),
    "trip_count": Helper(rank_like=-1),
    "zeros_to_sum": Helper(shape_only=(0,), rank_like=0),
    "cumsum_grad": Helper(flows=(0,)),
    "cumprod_grad": Helper(),
    "cumprod_grad_vjp": Helper(),
    "linear_scan_grad": Helper(calls=("cumprod_grad",)),
    "linear_scan_grad_vjp": Helper(calls=("cumprod_grad_vjp",)),
    "split_grad": Helper(calls=("unbroadcast",), shape_only=(1,)),
    "pow_grad": Helper(),
    "tape_row": Helper(),
    "tape_row_wide": Helper(),
    "tape_put": Helper(calls=("tile_offsets",), flows=(2,), writes=True),
    "tape_put_exactly": Helper(calls=("tile_offsets",), flows=(1,), writes=True),
    "tape_get": Helper(calls=("tile_offsets",), rank_like=2, costly=True),
    "tape_get_wide": Helper(calls=("tile_offsets",), rank_like=2, costly=True),
    "add_later": Helper(calls=("program_index", "tile_offsets"), writes=True),
    "program_index": Helper(rank_like=-1),
    "grouped_program_id": Helper(rank_like=-1),
    "tile_offsets": Helper(),
    "stop_gradient": Helper(flows=(0,), elementwise=True, rank_like=0),
    "to_float": Helper(flows=(0,), elementwise=True, rank_like=0),
    "exp": Helper(),
    "softmax": Helper(flows=(0,)),
    "softmax_base_two": Helper(calls=("exp",)),
    "softmax_grad": Helper(flows=(0, 1)),
}
# combine functions the helpers scan with, jitted with them (as `suffix_combine`, ...)
_SCANS_WITH = {"linear_scan_grad": ("suffix_combine", "exclusive_combine"),
               "linear_scan_grad_vjp": ("suffix_combine", "exclusive_combine"),
               "cumprod_grad": ("suffix_combine", "exclusive_product"),
               "cumprod_grad_vjp": ("dual_product", "dual_exclusive_product", "dual_suffix_combine")}
_COMBINES = tuple(sorted({c for combines in _SCANS_WITH.values() for c in combines}))


def helper_of(call: ast.AST) -> Helper | None:
    """The entry of a ``tg.<helper>(...)`` call (None: not a call of a helper)."""
    f = getattr(call, "func", None)
    if isinstance(call, ast.Call) and isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) \
            and f.value.id == "tg":
        return HELPERS.get(f.attr)
    return None


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on")


def __getattr__(name: str):
    if name == "DESCRIPTOR_ATOMICS":  # tensor descriptors' atomic_add: compiled kernels have it, the interpreter not
        return tl.constexpr(not _interpreting())
    if name not in HELPERS:
        raise AttributeError(f"module 'tritongrad.core.language' has no attribute '{name}'")
    for combine in _SCANS_WITH.get(name, ()):
        if combine not in globals():
            globals()[combine] = triton.jit(globals()[f"_{combine}"])
    for helper in HELPERS[name].calls:  # helpers it calls are jitted first
        __getattr__(helper)
    # (tape_get_wide: Triton's interpreter lets a loop's state widen, so there it returns values as kept; decided
    # when first used, after the command line has chosen the interpreter)
    found = "_tape_get_as_kept" if name == "tape_get_wide" and _interpreting() else f"_{name}"
    kernel = triton.jit(globals()[found])
    globals()[name] = kernel
    return kernel


def _unbroadcast(g, ref):
    """Sum ``g`` over the axes ``ref`` was broadcast along, giving it ``ref``'s shape (in float32 at least: a
    half-precision ``g`` is a prologue's value kept rounded, interchange.py). Written with compile-time ifs, up to
    three leading axes and four kept ones, not loops over the ranks: a derived kernel derived again (double backward)
    inlines it, and its branches are differentiated where a loop over `len(g.shape)` was not."""
    if len(g.shape) > len(ref.shape):
        g = tl.sum(widened(g), 0)  # noqa: F821 (jitted lazily)
    if len(g.shape) > len(ref.shape):
        g = tl.sum(widened(g), 0)  # noqa: F821
    if len(g.shape) > len(ref.shape):
        g = tl.sum(widened(g), 0)  # noqa: F821
    if len(ref.shape) > 0:
        if ref.shape[0] == 1:
            if g.shape[0] != 1:
                g = tl.sum(widened(g), 0, keep_dims=True)  # noqa: F821
    if len(ref.shape) > 1:
        if ref.shape[1] == 1:
            if g.shape[1] != 1:
                g = tl.sum(widened(g), 1, keep_dims=True)  # noqa: F821
    if len(ref.shape) > 2:
        if ref.shape[2] == 1:
            if g.shape[2] != 1:
                g = tl.sum(widened(g), 2, keep_dims=True)  # noqa: F821
    if len(ref.shape) > 3:
        if ref.shape[3] == 1:
            if g.shape[3] != 1:
                g = tl.sum(widened(g), 3, keep_dims=True)  # noqa: F821
    return g


def _stop_gradient(x):
    """``x``, whose gradient is not needed (online.py: the final max an online softmax's outputs do not depend
    on)."""
    return x


def _exp(x):
    """``tl.exp(x)``, in float32 as ``tl.exp2(x * log2 e)``: one ``ex2.approx.ftz`` where ``tl.exp`` also
    keeps subnormal results (exponentials.py says where a derived kernel may use it)."""
    if x.dtype == tl.float32:
        return tl.exp2(x * 1.4426950408889634)
    else:
        return tl.exp(x)


def _softmax(z, axis: tl.constexpr):
    """``tl.exp(z) / tl.sum(tl.exp(z), axis)`` (composites.py: a softmax the kernel wrote out, recomputed)."""
    e = tl.exp(z)
    return e / tl.sum(e, axis, keep_dims=True)


def _softmax_base_two(z, axis: tl.constexpr):
    """``softmax(z, axis)`` with the exponential as ``exp`` (above) computes it (exponentials.py)."""
    e = exp(z)  # noqa: F821 (jitted lazily)
    return e / tl.sum(e, axis, keep_dims=True)


def _softmax_grad(g, y, axis: tl.constexpr):
    """Adjoint of ``y = softmax(z)`` along ``axis`` (None: 0, as ``tl.softmax`` reads it): ``y * (g - sum(g * y))``,
    from ``y`` alone."""
    if axis is None:
        return y * (g - tl.sum(g * y, 0, keep_dims=True))
    else:
        return y * (g - tl.sum(g * y, axis, keep_dims=True))


def _to_float(x, dtype: tl.constexpr):
    """``x.to(dtype)``, for a cast that must be to a float type (online.py: a rescaling commutes with it)."""
    tl.static_assert(tl.zeros((1,), tl.int8).to(dtype).dtype.is_floating(),
                     "tritongrad: an online softmax's rescaled values are cast to a type that is not a float type")
    return x.to(dtype)


def _sum_grad(g, x, axis: tl.constexpr, keep_dims: tl.constexpr):
    """Adjoint of ``tl.sum(x, axis)``: every summed element gets the sum's gradient."""
    if axis is not None:
        if not keep_dims:
            g = tl.expand_dims(g, axis)
    else:
        if len(g.shape) > 0:  # kept dims: (1, 1) from tl.sum, (1,) from tl.reduce, which flattens first
            g = tl.sum(tl.reshape(g, (1,)), 0)
    return tl.broadcast_to(g, x.shape)


def _extremum_grad(g, x, out, axis: tl.constexpr, keep_dims: tl.constexpr):
    """Adjoint of ``tl.max`` / ``tl.min``: the gradient is shared evenly among the ties."""
    if axis is not None:
        if not keep_dims:
            g = tl.expand_dims(g, axis)
            out = tl.expand_dims(out, axis)
    hit = x == out
    count = tl.sum(hit.to(tl.float32), axis, keep_dims=True)
    return tl.where(hit, g / count, 0.0)


def _extremum_tangent(t, x, out, axis: tl.constexpr, keep_dims: tl.constexpr):
    """Tangent of ``out = tl.max(x, axis)`` (or ``tl.min``): the mean of ``t`` over the elements equal to ``out``
    (as torch.amax's forward derivative; the adjoint shares the gradient among them alike)."""
    if axis is not None:
        if not keep_dims:
            out = tl.expand_dims(out, axis)
    hit = x == out
    count = tl.sum(hit.to(tl.float32), axis, keep_dims=keep_dims)
    found = tl.sum(tl.where(hit, t, 0.0), axis, keep_dims=keep_dims) / count
    if axis is None:
        if keep_dims:  # out's own kept dims: (1,) where a tl.reduce flattened first (interpreted), tl.sum's not
            found = tl.reshape(found, out.shape)
    return found


def _cast_grad(g, dtype):
    """Adjoint of a cast to ``dtype``, a type known only at compile time (possibly a constexpr, whose
    attributes not every Triton reads through: a one-element probe cast gives a plain type)."""
    if tl.zeros((1,), tl.int8).to(dtype).dtype.is_floating():
        return g
    else:
        return tl.zeros_like(g)


def _zeros_grad(x):
    """A zero adjoint for ``x``, started before a branch or loop that adds to it: x's shape, and
    float32 for half-precision x (adjoints accumulate in float32 or wider)."""
    if x.dtype.primitive_bitwidth < 32:
        return tl.zeros(x.shape, tl.float32)
    else:
        return tl.zeros(x.shape, x.dtype)


def _zeros_to_sum(shadow):
    """Zeros to sum a load's adjoint in over a persistent program's rows, shaped as the ``shadow`` pointer
    tile: in float32 for a half-precision buffer (its sum is rounded once, when it is stored)."""
    if shadow.dtype.element_ty.primitive_bitwidth < 32:
        return tl.zeros(shadow.shape, tl.float32)
    else:
        return tl.zeros(shadow.shape, shadow.dtype.element_ty)


def _widened(x):
    """``x`` in float32 when it is a half type (an output's gradient read from memory), so that the adjoints
    computed from it are float32 or wider, as a hand-written backward computes them."""
    if x.dtype.primitive_bitwidth < 32:
        return x.to(tl.float32)
    else:
        return x


def _trip_count(start, stop, step):
    """How many iterations ``range(start, stop, step)`` runs (none when it is empty), for either sign of step."""
    if step < 0:
        n = tl.cdiv(start - stop, -step)
    else:
        n = tl.cdiv(stop - start, step)
    return n


def _program_index(axis: tl.constexpr = -1, pid=0, programs=1):
    """This program's place in the whole grid, counted along axis 0 first (its slot in per-program buffers).
    With ``axis``: the place of the forward's program ``pid`` along it, of ``programs`` (a backward that loops
    over the forward's programs along that axis)."""
    p0, p1, p2 = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    n0, n1 = tl.num_programs(0), tl.num_programs(1)
    if axis == 0:
        p0, n0 = pid, programs
    elif axis == 1:
        p1, n1 = pid, programs
    elif axis == 2:
        p2 = pid
    return p0 + n0 * (p1 + n1 * p2)


def _grouped_program_id(axis: tl.constexpr, GROUP: tl.constexpr = 8):
    """This program's id along ``axis`` (0 or 1) with a 2-D grid taken in another order: ``GROUP`` programs of
    axis 0 at a time, down all of axis 1. The programs running at once then share the tiles they read along
    both axes (a matmul backward's program reads a row of tiles of one operand and a column of the other): L2
    serves what memory served. The same programs run (the order is a bijection of the grid)."""
    n0 = tl.num_programs(0)
    n1 = tl.num_programs(1)
    linear = tl.program_id(0) + tl.program_id(1) * n0  # (the order the GPU starts them in)
    per_group = GROUP * n1
    first = (linear // per_group) * GROUP
    rows = tl.minimum(n0 - first, GROUP)  # (the last group's may be fewer)
    if axis == 0:
        pid = first + (linear % per_group) % rows
    else:
        pid = (linear % per_group) // rows
    return pid


def _tile_offsets(x):
    """Each element's offset in ``x`` stored densely, row after row (rank 0 to 2)."""
    if len(x.shape) == 0:
        return 0
    elif len(x.shape) == 1:
        return tl.arange(0, x.shape[0])
    else:
        return tl.arange(0, x.shape[0])[:, None] * x.shape[1] + tl.arange(0, x.shape[1])[None, :]


def _tape_row(tape, like, slots, program, dtype: tl.constexpr):
    """Row ``program`` (a place in the grid: program_index) of a loop's state tape (``tape``: raw bytes):
    ``slots`` values of ``like``'s shape and of type ``dtype`` (the state's type as the forward computes it:
    reverse/loops.py's state_type), one program after another along the whole grid."""
    return tape.to(tl.pointer_type(dtype)) + program.to(tl.int64) * slots * like.numel


def _tape_row_wide(tape, like, slots, program):
    """A tape row as :func:`_tape_row`, of the widest type of ``like``'s kind (float64, int64): for a state whose
    source does not say its type (a literal such as ``m = -float("inf")`` may widen in the loop: the interpreter's
    float64 kernels); 8 bytes an element, as its tape is sized (state_tape.StateTape.state_bytes). Stored into
    exactly, read back in the reader's type."""
    if like.dtype.is_floating():
        return tape.to(tl.pointer_type(tl.float64)) + program.to(tl.int64) * slots * like.numel
    else:
        return tape.to(tl.pointer_type(tl.int64)) + program.to(tl.int64) * slots * like.numel


def _tape_put(row, slot, x, mask):
    """Keep ``x`` in slot ``slot`` of a tape row (where ``mask``: a scalar). ``x`` must fit the row's type exactly
    (the state at the loop's start, before a sum widens it, may be narrower): a state of a wider type than its
    tape refuses to compile rather than be rounded."""
    tl.static_assert((tl.zeros((), x.dtype) + tl.zeros((), row.dtype.element_ty)).dtype == row.dtype.element_ty,
                     "tritongrad: a loop's state is of a wider type than its tape")
    if mask:
        tl.store(row + slot * x.numel + tile_offsets(x), x)  # noqa: F821 (jitted lazily)


def _tape_put_exactly(row, x, like):
    """Keep ``x`` in the one slot of a tape row its reader reads as ``like`` (an interchange's prologue: a
    value of another type than the reader expects refuses to compile rather than be rounded)."""
    tl.static_assert(x.dtype == like.dtype, "tritongrad: a prologue's value has another type than its reader's")
    tl.store(row + tile_offsets(x), x)  # noqa: F821 (jitted lazily)


def _tape_get(row, slot, like):
    """The value kept in slot ``slot`` of a tape row (``like``'s shape), in the row's type (the state's)."""
    return tl.load(row + slot * like.numel + tile_offsets(like))  # noqa: F821 (jitted lazily)


def _tape_get_wide(row, slot, like):
    """The value kept in slot ``slot`` of a row of the widest type (tape_row_wide: a state whose type is not
    said), in ``like``'s type: the type a compiled loop keeps its state in."""
    return tl.load(row + slot * like.numel + tile_offsets(like)).to(like.dtype)  # noqa: F821 (jitted lazily)


def _tape_get_as_kept(row, slot, like):
    """:func:`_tape_get_wide` in Triton's interpreter, which lets a loop's state widen (a literal ``0.0`` summing
    float64 values): the value as kept (a float64 tape row)."""
    return tl.load(row + slot * like.numel + tile_offsets(like))  # noqa: F821 (jitted lazily)


def _add_later(values, offsets, base, at, g, mask):
    """Keep a load's adjoint ``g`` and its addresses ``at`` (as element offsets from ``base``, the gradient
    buffer's first element) in this program's slots of ``values`` and ``offsets``: the BackwardKernel adds
    them to the gradient after the kernel (strategies.LaterAdds). Lanes ``mask`` leaves out keep zero."""
    slots = program_index().to(tl.int64) * g.numel + tile_offsets(g)  # noqa: F821 (jitted lazily)
    offset = (tl.cast(at, tl.int64) - tl.cast(base, tl.int64)) // (base.dtype.element_ty.primitive_bitwidth // 8)
    tl.store(values + slots, tl.where(mask, g, 0.0))
    tl.store(offsets + slots, tl.where(mask, offset, 0))


def _cumsum_grad(g, axis: tl.constexpr, reverse: tl.constexpr):
    """Adjoint of ``tl.cumsum``: each element gets the sum of the gradients of the sums it is in."""
    return tl.cumsum(g, axis, reverse=not reverse)


def _cumprod_grad(dy, x, axis: tl.constexpr, reverse: tl.constexpr):
    """Adjoint of ``tl.cumprod``: ``d x_i = sum_{j >= i} dy_j prod_{k <= j, k != i} x_k`` (in the scan's direction),
    the product before ``i`` (an exclusive scan) times ``s_i = dy_i + x_{i+1} s_{i+1}`` (a scan the other way).
    Without dividing by ``x``: exact where it has zeros. Differentiated again (double backward) it is not inlined
    (its scans' combine functions have no rule): its rule is ``cumprod_grad_vjp`` (CUSTOM, at the end)."""
    xc = x + tl.zeros_like(dy)  # (both in the wider type)
    dyc = dy + tl.zeros_like(x)
    ones = tl.full(xc.shape, 1, xc.dtype)
    before = tl.associative_scan((xc, ones), axis, exclusive_product, reverse=reverse)[1]  # noqa: F821 (jitted lazily)
    after = tl.associative_scan((xc, ones, dyc), axis, suffix_combine, reverse=not reverse)[2]  # noqa: F821
    return before * after


def _cumprod_grad_vjp(dy, x, axis: tl.constexpr, reverse: tl.constexpr, out, g):
    """The adjoint of ``cumprod_grad(dy, x) = J^T dy`` (``J``: cumprod's Jacobian at ``x``) for ``g``, the adjoint
    of its result: ``J g`` for ``dy`` (cumprod's tangent along ``g``), ``H g`` for ``x``, where ``H``, symmetric (the
    Hessian of ``dy . cumprod(x)``), is ``cumprod_grad``'s Jacobian in ``x``: its tangent along ``g``, the same scans
    over dual numbers (a value and its tangent, combined by the product rule). No division: exact at zeros, the
    terms between two zeros of one product included."""
    xc = x + tl.zeros_like(dy) + tl.zeros_like(g)
    dyc = dy + tl.zeros_like(xc)
    gc = g + tl.zeros_like(xc)
    ones = tl.full(xc.shape, 1, xc.dtype)
    zeros = tl.zeros(xc.shape, xc.dtype)
    d_dy = tl.associative_scan((xc, gc), axis, dual_product, reverse=reverse)[1]  # noqa: F821 (jitted lazily)
    before = tl.associative_scan((xc, gc, ones, zeros), axis, dual_exclusive_product,  # noqa: F821
                                 reverse=reverse)
    after = tl.associative_scan((xc, gc, ones, zeros, dyc, zeros), axis, dual_suffix_combine,  # noqa: F821
                                reverse=not reverse)
    return d_dy, before[3] * after[4] + before[2] * after[5]


def _exclusive_product(p1, r1, p2, r2):
    """Segments of a product: (the product, the product before the last element), so that ``r`` is the product
    of the elements before each one (its elements: ``(x, 1)``)."""
    return p1 * p2, p1 * r2


def _dual_product(p1, t1, p2, t2):
    """A product and its tangent (the product rule): a scan of ``(x, t)`` is cumprod's tangent along ``t``."""
    return p1 * p2, t1 * p2 + p1 * t2


def _dual_exclusive_product(p1, tp1, r1, tr1, p2, tp2, r2, tr2):
    """``exclusive_product`` over dual numbers: each value with its tangent."""
    return p1 * p2, tp1 * p2 + p1 * tp2, p1 * r2, tp1 * r2 + p1 * tr2


def _dual_suffix_combine(f1, tf1, q1, tq1, v1, tv1, f2, tf2, q2, tq2, v2, tv2):
    """``suffix_combine`` over dual numbers: each value with its tangent."""
    return (f2, tf2, q2 * f1 * q1, tq2 * f1 * q1 + q2 * tf1 * q1 + q2 * f1 * tq1, v2 + q2 * f1 * v1,
            tv2 + tq2 * f1 * v1 + q2 * tf1 * v1 + q2 * f1 * tv1)


def _linear_scan_grad(g_prod, g_h, a, b, prod, h, axis: tl.constexpr, reverse: tl.constexpr):
    """Adjoint of ``prod, h = tl.associative_scan((a, b), axis, combine, reverse)`` for the combine of a
    first-order linear recurrence: ``h_t = a_t h_{t-1} + b_t`` (from ``h_{-1} = 0``), ``prod_t = a_0 ... a_t``
    (t counting in the scan's direction). With ``lam_t = g_h_t + a_{t+1} lam_{t+1}`` (a scan the other way):
    ``d b_t = lam_t`` and ``d a_t = lam_t h_{t-1}`` plus the cumulative product's adjoint. Both shifted terms
    come from scans of their own (no division, exact where a is zero)."""
    g = g_h
    ac = a.to(g.dtype)
    bc = b.to(g.dtype)
    ones = tl.full(ac.shape, 1, g.dtype)
    lam = tl.associative_scan((ac, ones, g), axis, suffix_combine, reverse=not reverse)[2]  # noqa: F821 (jitted lazily)
    h_prev = tl.associative_scan((ac, ones, bc, tl.zeros_like(bc)), axis, exclusive_combine,  # noqa: F821
                                  reverse=reverse)[3]
    d_a = lam * h_prev + cumprod_grad(g_prod.to(g.dtype), ac, axis, reverse)  # noqa: F821
    return d_a, lam


def _linear_scan_grad_vjp(g_prod, g_h, a, b, axis: tl.constexpr, reverse: tl.constexpr, g_a, g_b):
    """The adjoint of ``d_a, lam = linear_scan_grad(g_prod, g_h, a, b)`` for its results' ``g_a``, ``g_b``: (d g_prod,
    d g_h, d a, d b). ``lam`` gets ``U = g_b + g_a h_{t-1}``, carried by the recurrence the forward's way (``mu_t =
    U_t + a_t mu_{t-1}``: d g_h, and ``mu_{t-1} lam_t`` to d a); ``h_{t-1}`` gets ``V = g_a lam``, carried the other way
    (``R_t = V_t + a_t R_{t+1}``: d b is ``R_{t+1}``, d a adds ``R_{t+1} h_{t-1}``); and cumprod_grad_vjp's."""
    zero = tl.zeros_like(g_a) + tl.zeros_like(g_b) + tl.zeros_like(g_h)  # (the widest type)
    ac, ones = a + zero, zero + 1
    lam = tl.associative_scan((ac, ones, g_h + zero), axis, suffix_combine, reverse=not reverse)[2]  # noqa: F821
    h_prev = tl.associative_scan((ac, ones, b + zero, zero), axis, exclusive_combine, reverse=reverse)[3]  # noqa: F821
    mu = tl.associative_scan((ac, ones, g_b + g_a * h_prev, zero), axis, exclusive_combine, reverse=reverse)  # noqa
    r_next = tl.associative_scan((ac, ones, g_a * lam, zero), axis, exclusive_combine, reverse=not reverse)[3]  # noqa
    products = cumprod_grad_vjp(g_prod + zero, ac, axis, reverse, zero, g_a + zero)  # noqa: F821
    return products[0], mu[2], mu[3] * lam + r_next * h_prev + products[1], r_next


def _suffix_combine(f1, q1, v1, f2, q2, v2):
    """Segments of ``lam_t = g_t + a_{t+1} lam_{t+1}`` scanned from the end: (first a, product of the
    others, value). The first argument is the segment nearer the end."""
    return f2, q2 * f1 * q1, v2 + q2 * f1 * v1


def _exclusive_combine(p1, r1, h1, e1, p2, r2, h2, e2):
    """Segments of ``h = a h + b``: (product of the a's, product without the last, h at the end, h before
    the last step), so that ``e`` is the scan's value one step back."""
    return p1 * p2, p1 * r2, h1 * p2 + h2, h1 * r2 + e2


def _split_grad(g, x, half: tl.constexpr):
    """Adjoint of one operand of ``tl.join(a, b)``: its half of ``g``, summed back to its shape."""
    lo, hi = tl.split(g)
    if half == 0:
        d = lo
    else:
        d = hi
    return unbroadcast(d, x)  # noqa: F821 (jitted lazily)


def _pow_grad(g, x, y):
    """Adjoint of libdevice's ``pow(x, y)`` for ``x``: ``g * y * x ** (y - 1)``, zero where ``y`` is zero
    (as torch has it, also at ``x = 0``)."""
    return tl.where(y == 0.0, 0.0, g * y * libdevice.pow(x, y - 1.0))


# cumprod_grad differentiated again (double backward) by its rule, not inlined: the derived kernel's call of
# `tg.cumprod_grad` is a custom operation whose adjoints call `tg.cumprod_grad_vjp` (`tg`: this module)
_VJP = "tg.cumprod_grad_vjp(dy, x, axis, reverse, out, g)"
CUSTOM[_cumprod_grad] = (custom_operation("dy, x, axis, reverse", {"dy": f"{_VJP}[0]", "x": f"{_VJP}[1]"}), "tg",
                         sys.modules[__name__])
# linear_scan_grad alike (a linear recurrence's scan differentiated twice; its two results' adjoints: g0, g1)
_SCAN_VJP = "tg.linear_scan_grad_vjp(g_prod, g_h, a, b, axis, reverse, g0, g1)"
CUSTOM[_linear_scan_grad] = (custom_operation("g_prod, g_h, a, b, prod, h, axis, reverse", {
    p: f"{_SCAN_VJP}[{i}]" for i, p in enumerate(("g_prod", "g_h", "a", "b"))}, results=2), "tg", sys.modules[__name__])
