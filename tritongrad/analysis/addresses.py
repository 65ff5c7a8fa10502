"""Addresses as affine forms in the coordinates of a lane, a program and the loops around it.

An integer (or pointer) tile's value is read as ``sum(c_i * lane_i) + sum(c_p * program_id(p))
+ sum(c_l * i_l) + const``, where ``lane_i`` is the lane's index along axis ``i`` of the tile
(what ``tl.arange`` gives, spread by ``[:, None]``), ``i_l`` the index of a loop around it
(times its step; a carried ``ptrs += BLOCK`` counts as one too), and a program id may also
appear through its digits (``pid // H`` and ``pid % H``, as attention kernels split batch and
head). A coefficient is an integer times runtime or compile-time scalars (``BLOCK``,
``stride``). A lane index through anything but ``+ - *`` and shape operations (``offs // 2``,
``tl.where``) makes the form non-affine: no proof of anything. Other operations on program ids
(a swizzled matmul order) only lose their coordinate.

lanes.py reads store addresses with these forms (may two lanes write one element?); a mask's
``e < B`` conjuncts bound the coordinates (``mask_bounds``). What a form leaves out, the part
of a value that depends on no coordinate (``half`` in ``out + half + cols``), is its offset
(``address_offsets``): a polynomial in scalar names, so two stores at one output can be told
apart (``out + cols`` and ``out + half + cols`` differ by ``half``).
"""

from __future__ import annotations

import ast
import collections
import operator

from ..core.ir import arguments, axis_of, definitions, loops, op_of, range_bounds, statements, target_of
from ..core.operations import OPERATIONS, kinds, operation_of
from ..core.per_kind import PerKind
from .flow import program_axes
from .forms import (
    Coefficient,
    Digit,
    Form,
    Lane,
    LoopIndex,
    ProgramDigit,
    ProgramId,
    form_of_terms,
)
from .launch_values import UNKNOWN_TRIP, Expr
from .scalars import divisor_text, iteration_values, program_value, scalar_expr, starts_at_zero


def address_forms(body: list[ast.stmt], shapes: dict, trips: dict[LoopIndex, Expr] | None = None,
                params: frozenset[str] = frozenset(), program_trips: dict[LoopIndex, Expr] | None = None,
                bounded_trips: set[LoopIndex] | None = None) -> dict[str, Form]:
    """The form of every integer or pointer name computed from lane indices, program ids or loop indices.

    A loop's index is a coordinate (:class:`LoopIndex`) whose coefficient is the range's step; so is a
    carried variable advanced by a loop-invariant amount each iteration (``ptrs += BLOCK``): its form is
    its initial value's plus the loop coordinate times that amount. A range whose bounds move with the
    program ids alike (``range(pid * R, pid * R + R)``) also gives its index their coordinates, so programs
    that run different iterations are told apart. ``trips`` receives each loop coordinate's trip count as
    an expression over the kernel's parameters (for the launch checks); ``program_trips`` those that also
    depend on the program ids (a causal attention's loop stops at its query block), as expressions over
    the parameters and ``Expr("program_id", (axis,))`` (interchange.py gives such a loop's iterations to
    the grid: the launch takes the most any program runs). A grid-stride loop (``range(pid, n, step)``) gives its
    index the start's program coordinates too; its ``trips`` entry is the most any program runs (program 0's), a
    bound, not each program's count: ``bounded_trips`` receives its coordinate (so no check takes the bound for
    the iterations every program runs: the loads cover the tensor)."""
    forms: dict[str, Form] = {}
    pinned: dict[str, tuple[ast.expr, LoopIndex, Coefficient]] = {}  # carried name -> (init, loop, step)
    in_loop: set[int] = set()  # the carried names' definitions inside their loops: replaced by the above
    starts: dict[str, Form] = {}  # forms of carried names' definitions before their loops
    defs = definitions(body)
    axes_of = program_axes(body)
    for node in loops(body):
        key = LoopIndex(node.target.id)
        forms[node.target.id] = form_of_terms({key: _range_step(node)}, 0)
        if trips is not None:
            trips[key] = Expr("trips", tuple(scalar_expr(a, defs) for a in range_bounds(node)))
            if not trips[key].names() <= params:  # a count the launch cannot read (loaded): taken as huge,
                trips[key] = Expr.const(UNKNOWN_TRIP)  # which apart() accepts only where it cannot matter
        for c in node.tg.carried:
            step = _advance(c, node, forms)
            if step is not None:
                pinned[c.name] = (c.init, key, step)
                in_loop |= {id(s) for s in statements(node.body) if target_of(s) == c.name}
    loop_indices = dict(forms)
    iterating = iteration_values(body, defs, pinned, params)
    for _ in range(3):  # loop-carried names feed their own definitions: a few passes settle them
        previous, forms = forms, dict(loop_indices)
        seen = collections.ChainMap(forms, previous)  # this pass's forms, the last pass's for names not yet met
        for node in loops(body):
            moved = _moving_range(node.iter, previous) or _program_strided_range(node, previous)
            if moved is not None:
                index = loop_indices[node.target.id]
                forms[node.target.id] = form_of_terms({**moved.coefficients, **index.coefficients}, 0)
        for name, (init, key, step) in pinned.items():
            start = starts.get(name) if isinstance(init, ast.Name) and init.id == name else (
                seen.get(init.id) if isinstance(init, ast.Name) else None)
            start = start or form_of_terms({}, 0)
            forms[name] = form_of_terms({**start.coefficients, key: step}, start.rank, start.affine)
        defined: set[str] = set()
        for s in statements(body):
            t = target_of(s)
            if t is None or id(s) in in_loop:
                continue
            if t in pinned:
                starts[t] = _form_of(s, seen, shapes, defs) or form_of_terms({}, 0)
                continue
            new = program_value(t, _form_of(s, seen, shapes, defs), axes_of.get(t, set()), _rank(ast.Name(t), shapes),
                                defs, params, iterating)
            old = forms.get(t) if t in defined else None
            if old is not None and new is not None and old != new:
                new = Form(old.terms, old.rank, False)  # two definitions disagree: no proof
            defined.add(t)
            if new is not None:
                forms[t] = new
    ids = {n for n, ds in defs.items()
           if any(not isinstance(d, ast.For) and operation_of(op_of(d)).coordinate == "program" for d in ds)}

    def no_program(name: str) -> Expr | None:
        return Expr.const(0) if name in ids else None

    def program(name: str) -> Expr | None:
        found = [d for d in defs.get(name, []) if name in ids and not isinstance(d, ast.For)]
        axis = (op_of(found[0]).args or [None])[0] if len(found) == 1 else None
        ok = isinstance(axis, ast.Constant) and isinstance(axis.value, int)
        return Expr("program_id", (axis.value,)) if ok else None

    def last(name: str) -> Expr | None:  # the last program along the id's axis
        return None if program(name) is None else Expr("grid", program(name).args) - Expr.const(1)

    if trips is not None:
        for node in loops(body):
            strided = None if _moving_range(node.iter, forms) else _program_strided_range(node, forms)
            if strided is not None and bounded_trips is not None:
                bounded_trips.add(LoopIndex(node.target.id))
            if _moving_range(node.iter, forms) or strided is not None:  # its count: the most any program runs
                count = Expr("trips", tuple(scalar_expr(a, defs) for a in range_bounds(node)))
                ends = (count.substitute(no_program),) + ((count.substitute(last),) if strided is not None and any(
                    c[0] <= 0 or c[1] for _, c in strided.terms) else ())  # (`pid * BLOCK`: the first or the last)
                count = Expr("max", ends) if len(ends) > 1 else ends[0]
                trips[LoopIndex(node.target.id)] = count if count.names() <= params else Expr.const(UNKNOWN_TRIP)
            elif program_trips is not None and trips[LoopIndex(node.target.id)] == Expr.const(UNKNOWN_TRIP):
                count = Expr("trips", tuple(scalar_expr(a, defs) for a in range_bounds(node))).substitute(program)
                if count.names() <= params:
                    program_trips[LoopIndex(node.target.id)] = count
    return forms


def _moving_range(call: ast.Call, forms: dict[str, Form]) -> Form | None:
    """The program-id part of a range's start when its stop has the same (``range(pid * R, pid * R + R)``)."""
    if len(call.args) < 2 or any(k.arg in ("start", "stop") for k in call.keywords):
        return None
    start, stop = (forms.get(a.id) if isinstance(a, ast.Name) else None for a in call.args[:2])
    if start is None or stop is None or not start.terms or start.terms != stop.terms or not start.affine or not (
            stop.affine) or any(not isinstance(k, ProgramId) for k, _ in start.terms):
        return None
    return start


def _program_strided_range(node: ast.For, forms: dict[str, Form]) -> Form | None:
    """The program-id part of a range's start where only the start moves with the program ids, each by a positive
    literal, or along one axis by any scalar (``range(pid * BLOCK, n, tl.num_programs(0) * BLOCK)``: a grid-stride
    loop, each program taking every step-th block from its own). The first program (or, the scalar's sign unknown,
    the first or the last: a count is monotone in the start) runs the most iterations: it bounds every program's."""
    start, stop, step = range_bounds(node)
    found = forms.get(start.id) if isinstance(start, ast.Name) else None
    if found is None or not found.terms or not found.affine or any(not isinstance(k, ProgramId) or (
            len(found.terms) > 1 and (c[0] <= 0 or c[1])) for k, c in found.terms):
        return None  # (along several axes, each by a positive literal: program 0 starts lowest)
    if any(isinstance(a, ast.Name) and a.id in forms and forms[a.id].terms for a in (stop, step)):
        return None  # the stop or step moves too
    return found


def _range_step(node: ast.For) -> Coefficient:
    _, _, step = range_bounds(node)
    if isinstance(step, ast.Constant) and isinstance(step.value, int):
        return (step.value, ())
    return (1, (ast.unparse(step),))


def _advance(carried, node: ast.For, forms) -> Coefficient | None:
    """The amount a carried variable grows by each iteration (``c_next = c + amount``), if loop-invariant."""
    if not isinstance(carried.next, ast.Name):
        return None
    defs = [s for s in statements(node.body) if target_of(s) == carried.next.id]
    if len(defs) != 1 or operation_of(op_of(defs[0])).on_host is not operator.add:
        return None
    a, b = op_of(defs[0]).args[:2]
    other = b if isinstance(a, ast.Name) and a.id == carried.name else a if (
        isinstance(b, ast.Name) and b.id == carried.name) else None
    if other is None or (isinstance(other, ast.Name) and other.id in forms):
        return None
    if isinstance(other, ast.Name) and not _invariant_in(other.id, node):
        return None  # computed in the loop from what changes between iterations
    return _product(other, forms, node)


def _product(atom: ast.expr, forms: dict, node: ast.For, depth: int = 0) -> Coefficient | None:
    """A scalar as an integer times names, through the products the loop's body computes it by
    (``BLOCK_K_times_stride_ak = BLOCK_K * stride_ak`` is ``(1, (BLOCK_K, stride_ak))``)."""
    if isinstance(atom, ast.Name) and depth < 8:
        inside = [s for s in node.body if target_of(s) == atom.id]
        if len(inside) == 1 and operation_of(op_of(inside[0])).on_host is operator.mul:
            factors = [_product(a, forms, node, depth + 1) for a in op_of(inside[0]).args[:2]]
            if None not in factors:
                (n1, s1), (n2, s2) = factors
                return (n1 * n2, tuple(sorted(s1 + s2)))
    return _scalar(atom, forms)


def _invariant_in(name: str, node: ast.For, depth: int = 0) -> bool:
    """Whether ``name`` has one value in every iteration of the loop: assigned outside it, or in its body
    (not in a branch) by integer arithmetic on such values (``BLOCK_K * stride_ak``, hoisted there) or as the
    grid's size (``tile_c += tl.num_programs(0)``)."""
    if name == node.target.id:
        return False
    inside = [s for s in statements(node.body) if target_of(s) == name]
    if not inside:
        return True
    if depth > 8 or len(inside) != 1 or not any(s is inside[0] for s in node.body):
        return False
    op = op_of(inside[0])
    if operation_of(op).coordinate == "programs":
        return True
    return operation_of(op).on_host is not None and all(
        _invariant_in(a.id, node, depth + 1) for a in op.args if isinstance(a, ast.Name))


def _rank(atom: ast.expr, shapes: dict) -> int | None:
    if isinstance(atom, ast.Name):
        shape = shapes.get(atom.id)
        return len(shape) if shape is not None else None
    return 0


def _form_of(stmt: ast.stmt, forms: dict[str, Form], shapes: dict, defs: dict | None = None) -> Form | None:
    """The statement's form, or None when it computes from no lane index or program id."""
    op = op_of(stmt)
    operation = operation_of(op)
    if operation.coordinate == "lane":
        return form_of_terms({Lane(0): (1, ())}, 1)
    if operation.coordinate == "program":
        axis = axis_of(op)
        return form_of_terms({ProgramId(axis): (1, ())}, 0) if axis is not None else None
    inputs = [forms.get(a.id) if isinstance(a, ast.Name) else None for a in op.args]
    if not any(inputs):
        return None
    rank = _rank(ast.Name(stmt.targets[0].id), shapes)
    if rank is None or not all(f.affine for f in inputs if f):
        return _opaque(inputs, rank)
    if operation.lanes == "same":
        return inputs[0]
    rule = FORMS.get(op.kind)
    return rule(stmt, op, inputs, rank, forms, shapes, defs) if rule else _opaque(inputs, rank)


# The form of an operation's result from its operands' (``inputs``: each one's form, None for a scalar; all affine),
# given its statement, its Op, its result's rank, the forms so far, the shapes and the definitions.
FORMS = PerKind("an address's affine form through an operation (addresses.py)", unknown=(  # opaque, or a fact's
    "copy pos to cast program_id num_programs arange multiple_of max_contiguous max_constancy "  # lanes, coordinate
    "truediv pow exp exp2 log log2 sqrt sqrt_rn rsqrt sin cos sigmoid erf abs tanh log1p expm1 fpow fma div_rn fdiv "
    "maximum minimum where clamp sum softmax max min cumsum cumprod dot reshape view item linear_scan split join lt "
    "le gt ge eq ne and_ or_ xor lshift rshift invert not_ is_ is_not in_ not_in boolop ifexp zeros zeros_like full "
    "cdiv floor ceil argmax argmin umulhi rand randn randint rand4x randn4x randint4x static_assert device_assert "
    "static_print device_print debug_barrier print stop_gradient load store atomic_add atomic_max atomic_min "
    "atomic_and atomic_or atomic_xor atomic_xchg atomic_cas desc_load desc_store desc_atomic_add "
    "make_tensor_descriptor xor_sum reduce"))


@FORMS.register("floordiv", quotient=True)
@FORMS.register("mod", quotient=False)
def _digit(stmt, op, inputs, rank, forms, shapes, defs, quotient):
    if inputs[1] is None and len(inputs[0].terms) == 1 and all(
            isinstance(k, ProgramId) and c == (1, ()) for k, c in inputs[0].terms):
        # a digit of a program id (`pid // H`, `pid % H`): both together keep programs apart
        (pid, _), = inputs[0].terms
        return form_of_terms({ProgramDigit(pid.axis, ast.unparse(op.args[1]), quotient): (1, ())}, rank)
    if inputs[1] is None and _scalar(op.args[1], forms) is not None and any(
            isinstance(k, (Lane, Digit)) for k, _ in inputs[0].terms) and defs is not None and starts_at_zero(
            op.args[0], defs):
        # a digit of a tile of indices counting from zero (`offs // HW`, `offs % HW`; of a digit: `hw // W`)
        dividend = _shift(inputs[0], rank)
        return form_of_terms({Digit(dividend, divisor_text(op.args[1], defs), quotient): (1, ())}, rank)
    return _opaque(inputs, rank)


@FORMS.register("add", negate=False)
@FORMS.register("sub", negate=True)
def _sum(stmt, op, inputs, rank, forms, shapes, defs, negate):
    return _add(inputs, rank, negate)


@FORMS.register("neg")
def _negated(stmt, op, inputs, rank, forms, shapes, defs):
    return _scale(inputs[0], (-1, ()))


@FORMS.register("mul")
def _times(stmt, op, inputs, rank, forms, shapes, defs):
    a, b = op.args[:2]
    fa, fb = inputs[:2]
    if fa is not None and fb is not None:
        return _opaque(inputs, rank)
    form, scalar = (fa, b) if fa is not None else (fb, a)
    factor = _scalar(scalar, forms)
    if factor is None or _rank(scalar, shapes) not in (0, None):
        return _opaque(inputs, rank)
    return _shift(_scale(form, factor), rank)


@FORMS.register("subscript expand_dims broadcast_to trans permute")  # (the kinds whose lanes are "moved")
def _moves_lanes(stmt, op, inputs, rank, forms, shapes, defs):
    return _reshaped(op.kind, op, inputs[0], rank, arguments(stmt))


def _opaque(inputs: list[Form | None], rank: int | None) -> Form:
    """A value computed from the inputs by an operation that may fold lanes together; program ids
    through it are dropped (``pid // H`` is common and harmless), lane indices make it non-affine, a digit of
    them too (``(offs % HW) // 2`` folds lanes: dropped, two lanes would seem one element apart)."""
    lanes = any(isinstance(k, (Lane, Digit)) for f in inputs if f for k, _ in f.terms) or any(
        f is not None and not f.affine for f in inputs)
    return form_of_terms({}, rank or 0, affine=not lanes)


def _scalar(atom: ast.expr, forms: dict) -> Coefficient | None:
    if isinstance(atom, ast.Constant) and isinstance(atom.value, int) and not isinstance(atom.value, bool):
        return (atom.value, ())
    if isinstance(atom, ast.Name) and atom.id not in forms:
        return (1, (atom.id,))
    if isinstance(atom, ast.Name) and not forms[atom.id].terms and forms[atom.id].affine:
        return (1, (atom.id,))  # a scalar computed from program ids through // or %: opaque, lane-free
    return None


def _scale(form: Form, factor: Coefficient) -> Form:
    n, symbols = factor
    return form_of_terms({k: (c * n, tuple(sorted(s + symbols))) for k, (c, s) in form.terms}, form.rank, form.affine)


def _shift(form: Form, rank: int) -> Form:
    """``form`` broadcast to ``rank`` dimensions (new leading axes)."""
    d = rank - form.rank
    if d < 0:
        return Form(form.terms, rank, False)
    if d == 0:
        return form
    return _moved(form, lambda a: a + d, rank)


def _moved(form: Form, axis_of, rank: int) -> Form:
    """``form`` with its lane axes (those digits are taken of too) moved to ``axis_of(axis)`` in a tile of ``rank``."""
    def move(key):
        if isinstance(key, Lane):
            return Lane(axis_of(key.axis))
        if isinstance(key, Digit):
            return Digit(_moved(key.dividend, axis_of, rank), key.divisor, key.quotient)
        return key

    return form_of_terms({move(k): c for k, c in form.terms}, rank, form.affine)


def _add(inputs: list[Form | None], rank: int, negate: bool) -> Form:
    total: dict = {}
    for i, form in enumerate(inputs[:2]):
        if form is None:
            continue
        form = _shift(form, rank)
        for key, (c, s) in form.terms:
            c = -c if negate and i == 1 else c
            if key in total:
                c0, s0 = total[key]
                if s0 != s:
                    return Form(tuple(total.items()), rank, False)
                c = c0 + c
            total[key] = (c, s)
    return form_of_terms(total, rank, all(f.affine for f in inputs if f))


def _reshaped(kind: str, op, form: Form, rank: int, bound: dict) -> Form:
    """``form`` as an operation moving lanes to other axes (``lanes="moved"``) places it in a tile of ``rank``."""
    return RESHAPED.get(kind, _permuted)(op, form, rank, bound)


RESHAPED = PerKind("where an operation moving lanes puts an address's axes (addresses.py)",
                   unknown=set(OPERATIONS) - set(kinds(lanes="moved")))


@RESHAPED.register("subscript")
def _subscripted(op, form: Form, rank: int, bound: dict) -> Form:
    index = op.kwargs["index"]
    parts = index.elts if isinstance(index, ast.Tuple) else [index]
    kept = [i for i, p in enumerate(parts) if not (isinstance(p, ast.Constant) and p.value is None)]
    # the axes the index names, then those after it (`x[None]` keeps x's axes after the new one)
    return _moved(form, lambda a: kept[a] if a < len(kept) else len(parts) + a - len(kept), rank)


@RESHAPED.register("expand_dims")
def _expanded(op, form: Form, rank: int, bound: dict) -> Form:
    axis = bound.get("axis")
    if not (isinstance(axis, ast.Constant) and isinstance(axis.value, int)):
        return Form(form.terms, rank, False)
    at = axis.value % rank
    return _moved(form, lambda a: a + (a >= at), rank)


@RESHAPED.register("broadcast_to")
def _broadcast(op, form: Form, rank: int, bound: dict) -> Form:
    return _moved(form, lambda a: a + rank - form.rank, rank)


@RESHAPED.register("trans permute")
def _permuted(op, form: Form, rank: int, bound: dict) -> Form:
    dims = bound.get("dims")
    elts = dims.elts if isinstance(dims, (ast.Tuple, ast.List)) else []
    if len(elts) == 1 and isinstance(elts[0], (ast.Tuple, ast.List)):
        elts = elts[0].elts
    order = [e.value for e in elts if isinstance(e, ast.Constant)] or list(range(rank))[::-1]
    if len(order) != rank:
        return Form(form.terms, rank, False)
    return _moved(form, order.index, rank)


def enclosing_loops(body: list[ast.stmt], around: tuple[LoopIndex, ...] = ()) -> dict[int, tuple[LoopIndex, ...]]:
    """For each flat statement, the coordinates of the loops around it."""
    found = {}
    for stmt in body:
        if isinstance(stmt, ast.For):
            found.update(enclosing_loops(stmt.body, (*around, LoopIndex(stmt.target.id))))
        elif isinstance(stmt, ast.If):
            for block in (stmt.body, stmt.orelse):
                found.update(enclosing_loops(block, around))
        else:
            found[id(stmt)] = around
    return found


def descriptor_form(offsets: list[ast.expr], forms: dict[str, Form], strides: list[ast.expr] | None = None) -> Form:
    """The form of a descriptor block's addresses: along each dimension, its offset's coordinates plus
    the lane index, times that dimension's stride: a symbol of its own, so dimensions stay apart (a store's
    lanes), or, given ``strides`` (the descriptor's, each a literal or a parameter's name), the strides
    themselves, which a launch gives (a load's adjoint written through the descriptor, input_facts.py: the
    lanes it reads past a dimension's end are not read, so counting them apart is only cautious)."""
    terms: dict = {}
    rank = len(offsets)
    for d, offset in enumerate(offsets):
        if strides is None:
            stride = (1, (f"<stride {d}>",))
        elif isinstance(strides[d], ast.Constant) and type(strides[d].value) is int:
            stride = (strides[d].value, ())
        else:
            stride = (1, (strides[d].id,))
        form = forms.get(offset.id) if isinstance(offset, ast.Name) else None
        if form is not None and not form.affine:
            return Form((), rank, False)
        for key, (c, s) in (form.terms if form else ()):
            if key in terms:
                return Form((), rank, False)
            terms[key] = (c * stride[0], tuple(sorted((*s, *stride[1]))))
        terms[Lane(d)] = stride
    return form_of_terms(terms, rank)


def descriptor_made(name: str, defs: dict[str, list[ast.stmt]]) -> ast.stmt | None:
    """The ``tl.make_tensor_descriptor`` statement the descriptor ``name`` comes from, through copies (definitions
    alike, as in both branches of an ``if``, count as one); None where its definitions differ or make none."""
    for _ in range(64):
        found = defs.get(name, [])
        if not found or not all(isinstance(d, ast.Assign) for d in found) or len(
                {ast.dump(d.value) for d in found}) != 1:
            return None
        op = op_of(found[0])
        if operation_of(op).sign == 1 and op.args and isinstance(op.args[0], ast.Name):  # a copy
            name = op.args[0].id
            continue
        return found[0] if operation_of(op).descriptor == "made" else None
    return None


def descriptor_load_form(stmt: ast.stmt, forms: dict[str, Form], defs: dict[str, list[ast.stmt]],
                         params: list[str]) -> Form | None:
    """The form of a descriptor load's addresses through its descriptor's strides (``descriptor_form``); None
    where a stride is neither a literal nor a parameter (a value no launch gives)."""
    made = descriptor_made(arguments(stmt)["pointer"].id, defs)
    strides = arguments(made).get("strides") if made is not None else None
    if not isinstance(strides, (ast.List, ast.Tuple)) or not all(
            (isinstance(x, ast.Name) and x.id in params) or (isinstance(x, ast.Constant) and type(x.value) is int)
            for x in strides.elts):
        return None
    return descriptor_form(arguments(stmt)["offsets"].elts, forms, strides.elts)


def descriptor_base(name: str, defs: dict[str, list[ast.stmt]]) -> str:
    """The name of the pointer the descriptor ``name`` is made over ("" where it is not a name)."""
    made = descriptor_made(name, defs)
    base = arguments(made).get("base") if made is not None else None
    return base.id if isinstance(base, ast.Name) else ""
