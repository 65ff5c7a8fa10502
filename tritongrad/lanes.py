"""Whether two lanes of one ``tl.store`` may write the same element.

A store's adjoint hands each lane the gradient of the element it wrote; if two lanes
write one element, only one value stays, and both lanes would get its gradient: a
silent wrong answer. So each output's store addresses are read as affine forms in the
coordinates of a lane, ``sum(c_i * lane_i) + sum(c_p * program_id(p)) + sum(c_l * i_l)
+ const``, where ``lane_i`` is the lane's index along axis ``i`` of the tile (what
``tl.arange`` gives, spread by ``[:, None]``) and ``i_l`` the index of a loop around the
store (times its step; a carried ``ptrs += BLOCK`` counts as one too). A coefficient is
an integer times runtime or compile-time scalars (``BLOCK``, ``stride``). A descriptor's
block is a lane tile at its offsets. A store is refused when its addresses

- do not vary along an axis of the tile (``y_ptr + offs[None, :]`` stored as a 2-D tile;
  ``y_ptr + offs * 0``): the lanes along it share addresses;
- use two coordinates with the same coefficient (``y_ptr + offs[:, None] + offs[None, :]``,
  or ``pid + tl.arange(0, B)`` across programs);
- use a lane index through anything but ``+ - *`` and shape operations (``offs // 2``,
  ``offs % n``, ``tl.where``): no proof that lanes stay apart.

Integer coefficients are checked against the block's extent where it is a number.
What depends on runtime strides, block sizes and the grid (``rows[:, None] * stride +
cols[None, :]``) becomes a :class:`LaunchCheck`: at each launch, ``apart`` takes the
coordinates in order of stride and requires each to step over all the smaller ones can
span, the mask's bounds included (``cols < N`` limits the columns of a ragged block), so a
transposed tensor passed as rows is refused rather than differentiated wrongly. Stores in
loops are checked without the launch (their strides against the lanes' statically).
A program id's digits (``pid // H`` and ``pid % H``, as attention kernels split batch and
head) are coordinates too: the quotient
without the remainder (or the id itself) is refused, since programs sharing it would
write the same elements. Other operations on program ids (a swizzled matmul order)
only lose their coordinate here; the grid check at launch (derive.py) still sees them.
"""

from __future__ import annotations

import ast
import collections
import dataclasses
import functools
import re
from dataclasses import dataclass

from .frontend import refuse
from .ir import statements, structured

# a coefficient: an integer times a product of scalar names (sorted)
Coefficient = tuple[int, tuple[str, ...]]

PASS_THROUGH = {"copy", "to", "cast", "multiple_of", "max_contiguous", "max_constancy", "pos"}


@dataclass(frozen=True)
class Form:
    """An integer tile's value as coefficients of lane axes (``("lane", axis)``) and program ids
    (``("pid", axis)``); ``rank`` is the tile's. ``affine=False``: a lane index went through an
    operation that may fold lanes together."""

    terms: tuple[tuple[tuple[str, int], Coefficient], ...]
    rank: int
    affine: bool = True

    @property
    def coefficients(self) -> dict[tuple[str, int], Coefficient]:
        return dict(self.terms)


SCALAR = Form((), 0)


def _form(terms: dict, rank: int, affine: bool = True) -> Form:
    kept = {k: c for k, c in terms.items() if c[0] != 0}
    return Form(tuple(sorted(kept.items())), rank, affine)


def store_forms(body: list[ast.stmt], shapes: dict, op_of, target_of, bind, trips: dict[str, str] | None = None,
                params: frozenset[str] = frozenset()) -> dict[str, Form]:
    """The form of every integer or pointer name computed from lane indices, program ids or loop indices.

    A loop's index is a coordinate (``("loop:i", 0)``) whose coefficient is the range's step; so is a
    carried variable advanced by a loop-invariant amount each iteration (``ptrs += BLOCK``): its form is
    its initial value's plus the loop coordinate times that amount. ``trips`` receives each loop
    coordinate's trip count as a Python expression over the kernel's names (for the launch checks)."""
    forms: dict[str, Form] = {}
    pinned: dict[str, tuple[ast.expr, str, Coefficient]] = {}  # carried name -> (init, loop coordinate, step)
    in_loop: set[int] = set()  # the carried names' definitions inside their loops: replaced by the above
    starts: dict[str, Form] = {}  # forms of carried names' definitions before their loops
    for node in structured(body):
        if isinstance(node, ast.For):
            key = f"loop:{node.target.id}"
            forms[node.target.id] = _form({(key, 0): _range_step(node.iter)}, 0)
            if trips is not None:
                bounds = [_scalar_text(a, body, op_of, target_of) for a in node.iter.args[:3]]
                trips[key] = f"len(range({', '.join(f'({b})' for b in bounds)}))"
                if not _names(trips[key]) <= params:  # a count the launch cannot read (loaded): taken as huge,
                    trips[key] = str(UNKNOWN_TRIP)  # which apart() accepts only where it cannot matter
            for c in node.tg_carried:
                step = _advance(c, node, op_of, target_of, forms)
                if step is not None:
                    pinned[c.name] = (c.init, key, step)
                    in_loop |= {id(s) for s in statements(node.body) if target_of(s) == c.name}
    loop_indices = dict(forms)
    for _ in range(3):  # loop-carried names feed their own definitions: a few passes settle them
        previous, forms = forms, dict(loop_indices)
        seen = collections.ChainMap(forms, previous)  # this pass's forms, the last pass's for names not yet met
        for name, (init, key, step) in pinned.items():
            start = starts.get(name) if isinstance(init, ast.Name) and init.id == name else (
                seen.get(init.id) if isinstance(init, ast.Name) else None)
            start = start or _form({}, 0)
            forms[name] = _form({**start.coefficients, (key, 0): step}, start.rank, start.affine)
        defined: set[str] = set()
        for s in statements(body):
            t = target_of(s)
            if t is None or id(s) in in_loop:
                continue
            if t in pinned:
                starts[t] = _form_of(op_of(s), s, seen, shapes, bind) or _form({}, 0)
                continue
            new = _form_of(op_of(s), s, seen, shapes, bind)
            old = forms.get(t) if t in defined else None
            if old is not None and new is not None and old != new:
                new = Form(old.terms, old.rank, False)  # two definitions disagree: no proof
            defined.add(t)
            if new is not None:
                forms[t] = new
    return forms


UNKNOWN_TRIP = 1 << 40


def _names(text: str) -> set[str]:
    return {n.id for n in ast.walk(ast.parse(text, mode="eval")) if isinstance(n, ast.Name)} - {"len", "range"}


SCALAR_TEXT = {"add": "({0}) + ({1})", "sub": "({0}) - ({1})", "mul": "({0}) * ({1})", "floordiv": "({0}) // ({1})",
               "cdiv": "-(-({0}) // ({1}))", "neg": "-({0})", "copy": "{0}"}


def _scalar_text(atom: ast.expr, body, op_of, target_of, depth: int = 0) -> str:
    """A scalar as a Python expression over the kernel's parameters where it is integer math on them
    (``tl.cdiv(K, BLOCK)``, ``R - 1``), for launch checks; else its name."""
    if isinstance(atom, ast.Name) and depth < 8:
        defs = [s for s in statements(body) if target_of(s) == atom.id]
        if len(defs) == 1 and op_of(defs[0]).kind in SCALAR_TEXT:
            args = [_scalar_text(a, body, op_of, target_of, depth + 1) for a in op_of(defs[0]).args]
            return SCALAR_TEXT[op_of(defs[0]).kind].format(*args)
        if len(defs) == 1 and op_of(defs[0]).kind == "num_programs":
            axis = (op_of(defs[0]).args or [op_of(defs[0]).kwargs.get("axis")])[0]
            if isinstance(axis, ast.Constant) and isinstance(axis.value, int):
                return f"_grid[{axis.value}]"
    return ast.unparse(atom)


def with_scalars_written_out(check: LaunchCheck, body, op_of, target_of) -> LaunchCheck:
    """``check`` with the kernel's integer temporaries in its condition written over its parameters and
    the grid (``num_programs_1`` -> ``_grid[1]``), so the launch can evaluate it."""
    def expand(m: re.Match) -> str:
        text = _scalar_text(ast.Name(m.group(0)), body, op_of, target_of)
        return m.group(0) if text == m.group(0) else f"({text})"

    return dataclasses.replace(check, condition=re.sub(r"\b[A-Za-z_]\w*\b", expand, check.condition))


def _range_step(call: ast.Call) -> Coefficient:
    step = call.args[2] if len(call.args) > 2 else next((k.value for k in call.keywords if k.arg == "step"), None)
    if step is None:
        return (1, ())
    if isinstance(step, ast.Constant) and isinstance(step.value, int):
        return (step.value, ())
    return (1, (ast.unparse(step),))


def _advance(carried, node: ast.For, op_of, target_of, forms) -> Coefficient | None:
    """The amount a carried variable grows by each iteration (``c_next = c + amount``), if loop-invariant."""
    if not isinstance(carried.next, ast.Name):
        return None
    defs = [s for s in statements(node.body) if target_of(s) == carried.next.id]
    if len(defs) != 1 or op_of(defs[0]).kind != "add":
        return None
    a, b = op_of(defs[0]).args[:2]
    other = b if isinstance(a, ast.Name) and a.id == carried.name else a if (
        isinstance(b, ast.Name) and b.id == carried.name) else None
    if other is None or (isinstance(other, ast.Name) and other.id in forms):
        return None
    if isinstance(other, ast.Name) and any(target_of(s) == other.id for s in statements(node.body)):
        return None  # computed in the loop: may change between iterations
    return _scalar(other, forms)


def _rank(atom: ast.expr, shapes: dict) -> int | None:
    if isinstance(atom, ast.Name):
        shape = shapes.get(atom.id)
        return len(shape) if shape is not None else None
    return 0


def _form_of(op, stmt, forms: dict[str, Form], shapes: dict, bind) -> Form | None:
    """The statement's form, or None when it computes from no lane index or program id."""
    kind = op.kind
    if kind == "arange":
        return _form({("lane", 0): (1, ())}, 1)
    if kind == "program_id":
        axis = op.args[0] if op.args else op.kwargs.get("axis")
        if isinstance(axis, ast.Constant) and isinstance(axis.value, int):
            return _form({("pid", axis.value): (1, ())}, 0)
        return None
    inputs = [forms.get(a.id) if isinstance(a, ast.Name) else None for a in op.args]
    if not any(inputs):
        return None
    rank = _rank(ast.Name(stmt.targets[0].id), shapes)
    if rank is None or not all(f.affine for f in inputs if f):
        return _opaque(inputs, rank)
    if kind in PASS_THROUGH:
        return inputs[0]
    if kind in ("floordiv", "mod") and inputs[1] is None and inputs[0].terms and all(
            k == "pid" and c == (1, ()) for (k, _), c in inputs[0].terms) and len(inputs[0].terms) == 1:
        # a digit of a program id (`pid // H`, `pid % H`): both together keep programs apart
        (_, axis), _ = inputs[0].terms[0]
        return _form({(f"pid{'//' if kind == 'floordiv' else '%'}{ast.unparse(op.args[1])}", axis): (1, ())}, rank)
    if kind in ("add", "sub"):
        return _add(inputs, rank, negate=kind == "sub")
    if kind == "neg":
        return _scale(inputs[0], (-1, ()))
    if kind == "mul":
        a, b = op.args[:2]
        fa, fb = inputs[:2]
        if fa is not None and fb is not None:
            return _opaque(inputs, rank)
        form, scalar = (fa, b) if fa is not None else (fb, a)
        factor = _scalar(scalar, forms)
        if factor is None or _rank(scalar, shapes) not in (0, None):
            return _opaque(inputs, rank)
        return _shift(_scale(form, factor), rank)
    if kind in ("subscript", "expand_dims", "broadcast_to", "trans", "permute"):
        return _reshaped(kind, op, inputs[0], rank, bind(stmt))
    return _opaque(inputs, rank)


def _opaque(inputs: list[Form | None], rank: int | None) -> Form:
    """A value computed from the inputs by an operation that may fold lanes together; program ids
    through it are dropped (``pid // H`` is common and harmless), lane indices make it non-affine."""
    lanes = any(k[0] == "lane" for f in inputs if f for k, _ in f.terms) or any(
        f is not None and not f.affine for f in inputs)
    return _form({}, rank or 0, affine=not lanes)


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
    return _form({k: (c * n, tuple(sorted(s + symbols))) for k, (c, s) in form.terms}, form.rank, form.affine)


def _shift(form: Form, rank: int) -> Form:
    """``form`` broadcast to ``rank`` dimensions (new leading axes)."""
    d = rank - form.rank
    if d < 0:
        return Form(form.terms, rank, False)
    return _form({(k, a + d if k == "lane" else a): c for (k, a), c in form.terms}, rank, form.affine)


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
    return _form(total, rank, all(f.affine for f in inputs if f))


def _reshaped(kind: str, op, form: Form, rank: int, bound: dict) -> Form:
    lanes = {a: c for (k, a), c in form.terms if k == "lane"}
    others = {key: c for key, c in form.terms if key[0] != "lane"}
    if kind == "subscript":
        index = op.kwargs["index"]
        parts = index.elts if isinstance(index, ast.Tuple) else [index]
        kept = [i for i, p in enumerate(parts) if not (isinstance(p, ast.Constant) and p.value is None)]
        moved = {kept[a]: c for a, c in lanes.items() if a < len(kept)}
    elif kind == "expand_dims":
        axis = bound.get("axis")
        if not (isinstance(axis, ast.Constant) and isinstance(axis.value, int)):
            return Form(form.terms, rank, False)
        at = axis.value % rank
        moved = {a + (a >= at): c for a, c in lanes.items()}
    elif kind == "broadcast_to":
        moved = {a + rank - form.rank: c for a, c in lanes.items()}
    else:  # trans / permute
        dims = bound.get("dims")
        elts = dims.elts if isinstance(dims, (ast.Tuple, ast.List)) else []
        if len(elts) == 1 and isinstance(elts[0], (ast.Tuple, ast.List)):
            elts = elts[0].elts
        order = [e.value for e in elts if isinstance(e, ast.Constant)] or list(range(rank))[::-1]
        if len(order) != rank:
            return Form(form.terms, rank, False)
        moved = {order.index(a): c for a, c in lanes.items()}
    return _form({**others, **{("lane", a): c for a, c in moved.items()}}, rank, form.affine)


def enclosing_loops(body: list[ast.stmt], loops: tuple[str, ...] = ()) -> dict[int, tuple[str, ...]]:
    """For each flat statement, the loop coordinates (``"loop:i"``) of the loops around it."""
    found = {}
    for stmt in body:
        if isinstance(stmt, ast.For):
            found.update(enclosing_loops(stmt.body, (*loops, f"loop:{stmt.target.id}")))
        elif isinstance(stmt, ast.If):
            for block in (stmt.body, stmt.orelse):
                found.update(enclosing_loops(block, loops))
        else:
            found[id(stmt)] = loops
    return found


@dataclass(frozen=True)
class LaunchCheck:
    """A condition on the launch's arguments (Python over parameter names) under which a store's
    coordinates stay apart; the derived kernel refuses a launch where it is false."""

    condition: str
    construct: str
    hint: str
    where: object  # frontend.Origin of the store
    fallback: str | None = None  # what to refuse with when the condition cannot be evaluated

    @functools.cached_property
    def code(self):
        return compile(self.condition, "<tritongrad launch check>", "eval")


def apart(coordinates: list[tuple[int, int]], bounds: list[tuple[tuple[int, ...], int, list[int]]]) -> bool:
    """Whether ``sum(c_i * x_i)`` over ``0 <= x_i < extent_i`` takes each value once (a sufficient test).

    ``coordinates``: ``(c_i, extent_i)``; ``bounds``: ``(members, limit, coefficients)`` from the mask, saying
    that over the lanes that store, the members' part of the sum stays within ``limit`` (valid when the
    mask's own coefficients are positive). Taken in order of ``|c_i|``, each coordinate must step over
    everything the smaller ones can span."""
    coordinates = list(coordinates)
    for members, limit, mask_coefficients in bounds:  # each term of a bounded sum of positive terms is bounded
        if all(c > 0 for c in mask_coefficients):
            for j in members:
                c, e = coordinates[j]
                if c != 0:
                    coordinates[j] = (c, max(0, min(e, limit // abs(c) + 1)))
    order = sorted((i for i, (_, e) in enumerate(coordinates) if e > 1), key=lambda i: abs(coordinates[i][0]))
    below = [i for i, (_, e) in enumerate(coordinates) if e <= 1]  # one value each: they span nothing
    for i in order:
        grouped: set[int] = set()
        span = 0
        for members, limit, mask_coefficients in bounds:
            if set(members) <= set(below) and not grouped & set(members) and all(c > 0 for c in mask_coefficients):
                span += min(sum(abs(coordinates[j][0]) * (coordinates[j][1] - 1) for j in members), limit)
                grouped |= set(members)
        span += sum(abs(coordinates[j][0]) * (coordinates[j][1] - 1) for j in below if j not in grouped)
        if abs(coordinates[i][0]) <= span:
            return False
        below.append(i)
    return True


def mask_bounds(mask: ast.expr, forms: dict[str, Form], defs: dict, op_of, shapes: dict, bind
                ) -> list[tuple[Form, str]]:
    """The conjuncts ``e < B`` (``e <= B``, ``B > e``) of a store's mask where ``e`` is exactly a sum of
    coordinates (no constant part) and ``B`` a scalar: ``(e's form in the mask's axes, B - 1 as text)``."""
    if not isinstance(mask, ast.Name) or len(defs.get(mask.id, [])) != 1 or not hasattr(defs[mask.id][0], "tg_op"):
        return []
    stmt = defs[mask.id][0]
    op = op_of(stmt)
    rank = _rank(mask, shapes)
    if rank is None:
        return []
    if op.kind in ("and_", *PASS_THROUGH, "subscript", "expand_dims", "broadcast_to", "trans", "permute"):
        parts = op.args[:2] if op.kind == "and_" else op.args[:1]
        found = []
        for part in parts:
            for form, limit in mask_bounds(part, forms, defs, op_of, shapes, bind):
                if op.kind in ("subscript", "expand_dims", "broadcast_to", "trans", "permute"):
                    form = _reshaped(op.kind, op, form, rank, bind(stmt))
                found.append((_shift(form, rank), limit))
        return found
    if op.kind not in ("lt", "le", "gt", "ge"):
        return []
    e, bound = op.args[:2] if op.kind in ("lt", "le") else op.args[1::-1]
    lane_free = isinstance(bound, ast.Constant) or (isinstance(bound, ast.Name) and bound.id not in forms)
    if not (isinstance(e, ast.Name) and e.id in forms and forms[e.id].affine and lane_free
            and _starts_at_zero(e, defs, op_of)):
        return []
    inclusive = op.kind in ("le", "ge")
    return [(forms[e.id], ast.unparse(bound) if inclusive else f"{ast.unparse(bound)} - 1")]


def _starts_at_zero(atom: ast.expr, defs: dict, op_of) -> bool:
    """Whether a coordinate sum has no constant part: built from ``tl.arange(0, ...)`` and program ids (a
    carried ``cols += BLOCK`` too: its steps are the loop's coordinate)."""
    if isinstance(atom, ast.Constant):
        return atom.value == 0
    if not isinstance(atom, ast.Name):
        return False
    loops = [d for d in defs.get(atom.id, []) if isinstance(d, ast.For)]
    if loops:  # a loop's index: from a range starting at 0
        args = loops[0].iter.args
        return len(loops) == 1 and (len(args) == 1 or (isinstance(args[0], ast.Constant) and args[0].value == 0))
    own = [d for d in defs.get(atom.id, []) if not (op_of(d).kind == "add" and any(
        isinstance(a, ast.Name) and a.id == atom.id for a in op_of(d).args[:2]))]  # not `cols = cols + BLOCK`
    if len(own) != 1:
        return False
    op = op_of(own[0])
    if op.kind == "arange":
        return isinstance(op.args[0], ast.Constant) and op.args[0].value == 0
    if op.kind == "program_id":
        return True
    if op.kind == "add":
        return all(_starts_at_zero(a, defs, op_of) for a in op.args[:2])
    if op.kind == "mul":
        return any(_starts_at_zero(a, defs, op_of) for a in op.args[:2])
    if op.kind in PASS_THROUGH or op.kind in ("subscript", "expand_dims", "broadcast_to"):
        return _starts_at_zero(op.args[0], defs, op_of)
    return False


def _text(c: Coefficient) -> str:
    return " * ".join([str(c[0]), *c[1]])


def _extent(key: tuple[str, int], shape, trips: dict[str, str]) -> str | None:
    kind, axis = key
    if kind == "lane":
        return f"({shape[axis]})"
    if kind.startswith("loop:"):
        return trips.get(kind)
    if kind == "pid":
        return f"_grid[{axis}]"
    divisor = kind[5:] if kind.startswith("pid//") else kind[4:]
    return f"-(-_grid[{axis}] // ({divisor}))" if kind.startswith("pid//") else f"min(({divisor}), _grid[{axis}])"


def _ratio(a: Coefficient, b: Coefficient) -> str | None:
    """``a / b`` as text when it is an integer times scalars, else None."""
    rest = list(a[1])
    for s in b[1]:
        if s not in rest:
            return None
        rest.remove(s)
    if b[0] == 0 or a[0] % b[0]:
        return None
    return _text((a[0] // b[0], tuple(rest)))


def _launch_check(form: Form, shape, bounds: list[tuple[Form, str]], trips: dict[str, str], construct: str,
                  hint: str, where) -> LaunchCheck | None:
    """``apart(...)`` over the address's coordinates with the launch's numbers (None when there is nothing
    to decide, or a loop's trip count is not known)."""
    keys = [k for k, _ in form.terms if not (k[0] == "lane" and shape[k[1]] == "1")]
    if len(keys) < 2:
        return None
    if any(s.startswith("<") for _, (_, symbols) in form.terms for s in symbols):
        return None  # a descriptor's: its dimensions' strides are the descriptor's, not arguments
    terms = form.coefficients
    extents = {k: _extent(k, shape, trips) for k in keys}
    if None in extents.values():
        return None
    coordinates = ", ".join(f"({_text(terms[k])}, {extents[k]})" for k in keys)
    groups = []
    for mask_form, limit in bounds:
        members = [k for k, _ in mask_form.terms]
        if not members or not set(members) <= set(keys):
            continue
        ratios = {_ratio(terms[k], c) for k, c in mask_form.terms}
        if len(ratios) != 1 or None in ratios:
            continue
        (ratio,) = ratios
        indices = tuple(keys.index(k) for k in members)
        groups.append(f"({indices}, abs({ratio}) * ({limit}), [{', '.join(_text(c) for _, c in mask_form.terms)}])")
    condition = f"_apart([{coordinates}], [{', '.join(groups)}])"
    return LaunchCheck(condition, construct, hint, where)


def check_store(stmt: ast.stmt, form: Form | None, output: str, shape, loops: tuple[str, ...] = (),
                bounds: list[tuple[Form, str]] = (), trips: dict[str, str] | None = None) -> list[LaunchCheck]:
    """Refuse a store whose lanes may write one element of ``output`` twice (see the module's docstring);
    return what only the launch's arguments can decide. ``form``: its address's (None: computed from no
    coordinate); ``shape``: its tile's; ``loops``: the coordinates of the loops around the store (others
    are fixed values here); ``bounds``: its mask's (``mask_bounds``); ``trips``: the loops' trip counts.
    An overlap that a mask may prevent, or that involves a program id or loop index (whose extent may be
    1), is left to the launch."""
    if form is not None:
        form = _form({k: c for k, c in form.terms if not k[0].startswith("loop:") or k[0] in loops}, form.rank,
                     form.affine)
    what = f"a tl.store to `{output}` whose lanes may write the same element"
    hint = ("store at addresses built from tl.arange with + and * (each tile axis with its own stride), "
            "so every lane writes its own element")
    if form is None or shape is None:  # no lane index in the address (a scalar store), or shape unknown
        if form is None and shape and any(d != "1" for d in shape):
            raise refuse(stmt.tg_where, f"{what}: the address is the same for every lane", hint)
        return []
    if not form.affine:
        raise refuse(stmt.tg_where, f"{what}: the address uses a lane index through `//`, `%` or another "
                     "operation that may fold lanes together", hint)
    terms = form.coefficients
    for axis, extent in enumerate(shape):
        if extent != "1" and ("lane", axis) not in terms:
            raise refuse(stmt.tg_where, f"{what}: the address does not change along axis {axis} of the tile", hint)
    for kind, axis in terms:
        if kind.startswith("pid//") and ("pid", axis) not in terms and (f"pid%{kind[5:]}", axis) not in terms:
            raise refuse(stmt.tg_where, f"a tl.store to `{output}` at addresses using tl.program_id({axis}) "
                         f"only through `// {kind[5:]}`: programs with the same quotient write the same elements",
                         f"use tl.program_id({axis}) itself, or both `// {kind[5:]}` and `% {kind[5:]}` of it")
    bounded = {k for mask_form, _ in bounds for k, _ in mask_form.terms}
    deferred: list[str] = []  # overlaps a mask may prevent: decided at launch

    def problem(message: str, keys) -> None:
        if bounded & set(keys) or any(k != "lane" for k, _ in keys):  # a mask, or an extent known at launch
            deferred.append(message)
        else:
            raise refuse(stmt.tg_where, f"{what}: {message}", hint)

    seen: dict[Coefficient, tuple[str, int]] = {}
    for key, c in terms.items():
        size = (abs(c[0]), c[1])
        if size in seen:
            problem(f"{_name(seen[size])} and {_name(key)} have the same stride", (seen[size], key))
        seen[size] = key
    checks = _check_extents(terms, shape, problem, bounded)
    at_launch = _launch_check(form, shape, list(bounds), trips or {}, f"{what}: with this launch's strides, sizes "
                              "and grid, two lanes or programs reach one element", hint, stmt.tg_where)
    if deferred and at_launch is None:
        raise refuse(stmt.tg_where, f"{what}: {deferred[0]}", hint)
    if at_launch is not None and deferred:
        at_launch = dataclasses.replace(at_launch, fallback=f"{what}: {deferred[0]}")
    if at_launch is not None:  # exact about extents (a grid of one program, one iteration): it decides
        return [at_launch]
    return [dataclasses.replace(c, construct=f"{what}: {c.construct}", hint=hint, where=stmt.tg_where)
            for c in checks]


def descriptor_form(offsets: list[ast.expr], forms: dict[str, Form]) -> Form:
    """The form of a descriptor block's addresses: along each dimension, its offset's coordinates plus
    the lane index, times that dimension's stride (a symbol of its own, so dimensions stay apart)."""
    terms: dict = {}
    rank = len(offsets)
    for d, offset in enumerate(offsets):
        stride = f"<stride {d}>"
        form = forms.get(offset.id) if isinstance(offset, ast.Name) else None
        if form is not None and not form.affine:
            return Form((), rank, False)
        for key, (c, s) in (form.terms if form else ()):
            if key in terms:
                return Form((), rank, False)
            terms[key] = (c, tuple(sorted((*s, stride))))
        terms[("lane", d)] = (1, (stride,))
    return _form(terms, rank)


def _check_extents(terms, shape, problem, bounded: set) -> list[LaunchCheck]:
    """Strides that differ by an integer factor must keep a lane axis apart from the coordinates with
    larger ones: each at least the lane axis's extent times its stride. A numeric extent is checked
    here (``problem``), a compile-time one (``BLOCK``) at launch (the condition; the caller completes it)."""
    strides = sorted((abs(c[0]), c[1], key) for key, c in terms.items())
    checks = []
    for i, (small, symbols, (kind, axis)) in enumerate(strides):
        if kind != "lane":
            continue
        extent = shape[axis]
        for large, other, key in strides[i + 1:]:
            if other != symbols:
                continue
            overlap = (f"strides {small} and {large} overlap when {_name((kind, axis))} has more than "
                       f"{large // small} lanes ({_name(key)} moves by {large})")
            if extent.isdigit() and large < int(extent) * small:
                problem(overlap.replace(f"more than {large // small}", extent), ((kind, axis), key))
            elif not extent.isdigit() and (kind, axis) not in bounded:  # a bounded one: apart() decides
                checks.append(LaunchCheck(f"{large} >= ({extent}) * {small}", overlap, "", None))
    return checks


def _name(key: tuple[str, int]) -> str:
    kind, axis = key
    if kind == "lane":
        return f"lane axis {axis}"
    if kind.startswith("loop:"):
        return f"the loop over `{kind[5:]}`"
    return f"tl.program_id({axis}){kind[3:].replace('//', ' // ').replace('%', ' % ')}"
