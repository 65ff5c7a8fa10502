"""Whether two lanes of one ``tl.store`` may write the same element.

A store's adjoint hands each lane the gradient of the element it wrote; if two lanes
write one element, only one value stays, and both lanes would get its gradient: a
silent wrong answer. So each output's store address is read as an affine form in the
coordinates of a lane, its program and the loops around it (addresses.py), and the store
is refused when its addresses

- do not vary along an axis of the tile (``y_ptr + offs[None, :]`` stored as a 2-D tile;
  ``y_ptr + offs * 0``): the lanes along it share addresses;
- use two coordinates with the same coefficient (``y_ptr + offs[:, None] + offs[None, :]``,
  or ``pid + tl.arange(0, B)`` across programs);
- use a lane index through anything but ``+ - *`` and shape operations (``offs // 2``,
  ``offs % n``, ``tl.where``): no proof that lanes stay apart;
- use a program id only through its quotient ``pid // H`` (programs sharing it write the
  same elements).

Integer coefficients are checked against the block's extent where it is a number.
What depends on runtime strides, block sizes and the grid (``rows[:, None] * stride +
cols[None, :]``) becomes a launch check (analysis/conditions.py): at each launch, ``apart`` takes the
coordinates in order of stride and requires each to step over all the smaller ones can
span, the mask's bounds included (``cols < N`` limits the columns of a ragged block), so a
transposed tensor passed as rows is refused rather than differentiated wrongly. Stores in
loops are checked without the launch (their strides against the lanes' statically).
Operations on program ids other than their digits (a swizzled matmul order) only lose
their coordinate here; the grid check at launch (runtime/launch_checks.py) still sees them.
"""

from __future__ import annotations

import ast
import dataclasses
from dataclasses import dataclass

from ..core.ir import arguments, construct_origin, definitions, is_none, op_of, refuse, statements, target_of
from ..core.operations import operation_of
from .conditions import All, Apart, AtLeast, Condition, LaunchCheck, ProgramsApart, decided_now
from .forms import (
    Coefficient,
    Coordinate,
    Digit,
    Form,
    Lane,
    LoopIndex,
    ProgramDigit,
    ProgramId,
    ProgramValue,
    form_of_terms,
    lane_axes,
)
from .forms import coefficient_expr as _coefficient  # (read as a launch does)
from .index_ranges import IndexRead, RangesApart, StoreRange
from .launch_values import Expr
from .offsets import Poly, poly, poly_add, poly_expr
from .radix import index_of, undetermined, written_digits
from .scalars import scalar_expr


def with_scalars_written_out(check: LaunchCheck, body: list[ast.stmt]) -> LaunchCheck:
    """``check`` with the kernel's integer temporaries in its condition written over its parameters and
    the grid (``num_programs_1`` -> ``num_programs(1)``), so the launch can evaluate it."""
    return dataclasses.replace(check, condition=scalars_written_out(check.condition, body))


def scalars_written_out(condition: Condition, body: list[ast.stmt]) -> Condition:
    """``condition`` with the kernel's integer temporaries written over its parameters and the grid."""
    defs = definitions(body)

    def expand(name: str) -> Expr | None:
        e = scalar_expr(ast.Name(name), defs)
        return None if e == Expr.name(name) else e

    return condition.substitute(expand)


def _extent(key: Coordinate, shape, trips: dict[LoopIndex, Expr], bounds=()) -> Expr | None:
    """How many values a coordinate takes at a launch (``bounds``: the mask's, which may limit a quotient)."""
    if isinstance(key, Lane):
        return Expr.of_text(shape[key.axis])
    if isinstance(key, LoopIndex):
        return trips.get(key)
    if isinstance(key, Digit):
        divisor = Expr.of_text(key.divisor)
        if not key.quotient:
            return divisor
        top = _span(key.dividend, shape, trips, bounds)
        limits = [limit for form, limit in bounds if form == key.dividend]
        if limits:
            top = limits[0] if top is None else Expr("min", (top, limits[0]))
        return None if top is None else Expr("floordiv", (top, divisor)) + Expr.const(1)
    if isinstance(key, ProgramValue):  # (none negative: ProgramsApart)
        return Expr("most", (key.value,))
    grid = Expr("grid", (key.axis,))
    if isinstance(key, ProgramId):
        return grid
    divisor = Expr.of_text(key.divisor)
    return Expr("cdiv", (grid, divisor)) if key.quotient else Expr("min", (divisor, grid))


def _span(form: Form, shape, trips: dict[LoopIndex, Expr], bounds=()) -> Expr | None:
    """The largest value of a form whose coefficients are not negative (its coordinates all at their last), a part
    a positive multiple of a mask's bounded sum (``rm * K`` under ``rm < M``) at most that multiple of the bound."""
    terms, total = dict(form.terms), None
    for bound_form, limit in bounds:
        keys = [k for k, _ in bound_form.terms]
        ratios = {_ratio(terms[k], c) if k in terms and c[0] > 0 else None for k, c in bound_form.terms}
        if keys and len(ratios) == 1 and None not in ratios and next(iter(ratios))[0] > 0:
            part = _span(form_of_terms({k: terms.pop(k) for k in keys}, form.rank), shape, trips)
            most = _coefficient(next(iter(ratios))) * limit
            term = most if part is None else Expr("min", (part, most))
            total = term if total is None else total + term
    for key, c in terms.items():
        extent = _extent(key, shape, trips)
        if extent is None:
            return None
        term = _coefficient(c) * (extent - Expr.const(1))
        total = term if total is None else total + term
    return total or Expr.const(0)


def _ratio(a: Coefficient, b: Coefficient) -> Coefficient | None:
    """``a / b`` when it is an integer times scalars, else None."""
    rest = list(a[1])
    for s in b[1]:
        if s not in rest:
            return None
        rest.remove(s)
    if b[0] == 0 or a[0] % b[0]:
        return None
    return (a[0] // b[0], tuple(rest))


@dataclass(frozen=True)
class LaunchCoordinates:
    """An address's coordinates with what a launch gives them: each one's coefficient and extent, and the
    mask's bounds on groups of them (``members`` by position, ``limit`` in address units, the mask's own
    coefficients). ``exact``: every bound of the mask is among them."""

    keys: tuple[Coordinate, ...]
    coordinates: tuple[tuple[Expr, Expr], ...]
    bounds: tuple[tuple[tuple[int, ...], Expr, tuple[Expr, ...]], ...]
    exact: bool

    def apart(self, extra: tuple[tuple[str, Expr, Expr], ...] = (), bounds: tuple = ()) -> Apart | All:
        """Distinct elements for distinct coordinates (and ``extra`` ones, ``(name, coefficient, extent)``, with
        ``bounds`` of masks over them too); where a coordinate is a value programs compute, distinct programs with
        distinct such values too."""
        apart = Apart(self.coordinates + tuple((c, e) for _, c, e in extra), self.bounds + tuple(bounds),
                      (*(str(k) for k in self.keys), *(name for name, _, _ in extra)))
        programs = programs_apart(self.keys)
        return apart if programs is None else All((apart, programs))


def programs_apart(keys) -> ProgramsApart | None:
    """Where an address's coordinates include values programs compute (forms.ProgramValue): that distinct programs
    have distinct program coordinates, none negative (None: no such value, the coordinates are the ids)."""
    if not any(isinstance(k, ProgramValue) for k in keys):
        return None
    values, names = [], []
    for k in keys:
        if isinstance(k, ProgramValue):
            values.append(k.value)
        elif isinstance(k, ProgramId):
            values.append(Expr("program_id", (k.axis,)))
        elif isinstance(k, ProgramDigit):
            values.append(Expr("floordiv" if k.quotient else "mod",
                               (Expr("program_id", (k.axis,)), Expr.of_text(k.divisor))))
        else:
            continue
        names.append(str(k))
    return ProgramsApart(tuple(values), tuple(names))


def launch_coordinates(form: Form, shape, bounds: list[tuple[Form, Expr]], trips: dict[LoopIndex, Expr]
                       ) -> LaunchCoordinates | None:
    """The form's coordinates as a launch evaluates them (None: a trip count or a descriptor's strides the
    launch cannot give). Lane axes of one element are left out."""
    keys = [k for k, _ in form.terms if not (isinstance(k, Lane) and shape[k.axis] == "1")]
    if any(s.startswith("<") for _, (_, symbols) in form.terms for s in symbols):
        return None  # a descriptor's: its dimensions' strides are the descriptor's, not arguments
    terms = form.coefficients
    extents = {k: _extent(k, shape, trips, bounds) for k in keys}
    if None in extents.values():
        return None
    coordinates = tuple((_coefficient(terms[k]), extents[k]) for k in keys)
    groups = [bound_group(form, keys, mask_form, limit) for mask_form, limit in bounds]
    return LaunchCoordinates(tuple(keys), coordinates, tuple(g[:3] for g in groups if g is not None),
                             None not in groups)


def bound_group(form: Form, keys, mask_form: Form, limit: Expr):
    """A mask's bound ``mask_form <= limit`` on the address's coordinates ``keys``: ``(members by position, the
    limit in address units, the mask's coefficients, the address's stride per unit of the mask's)``, or None
    where the mask does not move along the address (a coordinate the address lacks, strides not in one ratio)."""
    terms = form.coefficients
    members = [k for k, _ in mask_form.terms]
    ratios = {_ratio(terms[k], c) for k, c in mask_form.terms if k in terms}
    if not members or not set(members) <= set(keys) or len(ratios) != 1 or None in ratios:
        return None
    ratio = _coefficient(next(iter(ratios)))
    return (tuple(keys.index(k) for k in members), Expr("abs", (ratio,)) * limit,
            tuple(_coefficient(c) for _, c in mask_form.terms), ratio)


def apart_whatever_launched(keys, runtime_stride: bool) -> bool:
    """Whether an address's coordinates (``keys``) are apart whatever the launch passes, with nothing to check:
    one coordinate, its stride a literal (a stride the launch gives may be 0: an expanded tensor's), and not a value
    the programs compute (one value may be two programs')."""
    return len(keys) < 2 and not runtime_stride and not any(isinstance(k, ProgramValue) for k in keys)


def launch_check(form: Form, shape, bounds: list[tuple[Form, Expr]], trips: dict[LoopIndex, Expr], construct: str,
                  hint: str, where, extra: tuple[tuple[str, Expr, Expr], ...] = ()) -> LaunchCheck | None:
    """``apart(...)`` over the address's coordinates with the launch's numbers (None when there is nothing
    to decide, or a loop's trip count is not known). ``extra``: more coordinates, ``(name, coefficient,
    extent)``."""
    keys = [k for k, _ in form.terms if not (isinstance(k, Lane) and shape[k.axis] == "1")]
    if not extra and apart_whatever_launched(keys, any(form.coefficients[k][1] for k in keys)):
        return None
    condition = _apart(form, shape, bounds, trips, extra)
    return None if condition is None else LaunchCheck(condition, construct, hint, where)


def _apart(form: Form, shape, bounds: list[tuple[Form, Expr]], trips: dict[LoopIndex, Expr],
           extra: tuple[tuple[str, Expr, Expr], ...] = ()) -> Apart | All | None:
    """The address's coordinates (and ``extra`` ones) with their extents and the mask's bounds (None: a loop's
    trip count is not known, or the strides are a descriptor's)."""
    found = launch_coordinates(form, shape, bounds, trips)
    return None if found is None else found.apart(extra)


def check_store(stmt: ast.stmt, form: Form | None, output: str, shape, around: tuple[LoopIndex, ...] = (),
                bounds: list[tuple[Form, Expr]] = (), trips: dict[LoopIndex, Expr] | None = None,
                grid_stride: frozenset[LoopIndex] = frozenset()) -> list[LaunchCheck]:
    """Refuse a store whose lanes may write one element of ``output`` twice (see the module's docstring);
    return what only the launch's arguments can decide. ``form``: its address's (None: computed from no
    coordinate); ``shape``: its tile's; ``around``: the coordinates of the loops around the store (others
    are fixed values here); ``bounds``: its mask's (``mask_bounds``); ``trips``: the loops' trip counts.
    An overlap that a mask may prevent, or that involves a program id or loop index (whose extent may be
    1), is left to the launch. ``grid_stride``: the grid-stride loops (addresses.py's ``bounded_trips``), whose
    step the refusal names."""
    if form is not None:
        form = form_of_terms({k: c for k, c in form.terms if not isinstance(k, LoopIndex) or k in around}, form.rank,
                     form.affine)
    what = f"a tl.store to `{output}` whose lanes may write the same element"
    hint = ("store at addresses built from tl.arange with + and * (each tile axis with its own stride), "
            "so every lane writes its own element")
    if form is None or shape is None:  # no lane index in the address (a scalar store), or shape unknown
        if form is None and shape and any(d != "1" for d in shape):
            raise refuse(construct_origin(stmt), f"{what}: the address is the same for every lane", hint)
        return []
    if not form.affine:
        raise refuse(construct_origin(stmt), f"{what}: the address uses a lane index through `//`, `%` or another "
                     "operation that may fold lanes together", hint)
    terms = form.coefficients
    digits = [k for k in terms if isinstance(k, Digit)]
    folded = undetermined(digits)
    if folded is not None:
        raise refuse(construct_origin(stmt), f"{what}: the address uses a lane index through `//`, `%` or another "
                     f"operation that may fold lanes together (`{folded[0]}` {folded[1]})",
                     f"{hint}; or split an index into both `x // d` and `x % d`, each with its own stride "
                     "(`x // (H * W)`, `(x // W) % H`, `x % W`: its digits in a mixed radix)")
    covered = {k.axis for k in terms if isinstance(k, Lane)} | {a for d in digits for a in lane_axes(d.dividend)}
    for axis, extent in enumerate(shape):
        if extent != "1" and axis not in covered:
            raise refuse(construct_origin(stmt), f"{what}: the address does not change along axis {axis} of the tile",
                         hint)
    for key in terms:
        if isinstance(key, ProgramDigit) and key.quotient and ProgramId(key.axis) not in terms and (
                ProgramDigit(key.axis, key.divisor, False) not in terms) and not any(
                isinstance(k, ProgramValue) and key.axis in k.axes for k in terms):  # (else: ProgramsApart)
            axis, divisor = key.axis, key.divisor
            raise refuse(construct_origin(stmt), f"a tl.store to `{output}` at addresses using tl.program_id({axis}) "
                         f"only through `// {divisor}`: programs with the same quotient write the same elements",
                         f"use tl.program_id({axis}) itself, or both `// {divisor}` and `% {divisor}` of it")
    bounded = {k for mask_form, _ in bounds for k, _ in mask_form.terms}
    deferred: list[str] = []  # overlaps a mask may prevent: decided at launch

    def problem(message: str, keys) -> None:
        if bounded & set(keys) or any(not isinstance(k, Lane) for k in keys):  # a mask, or an extent at launch
            deferred.append(message)
        else:
            raise refuse(construct_origin(stmt), f"{what}: {message}", hint)

    seen: dict[Coefficient, Coordinate] = {}
    for key, c in terms.items():
        size = (abs(c[0]), c[1])
        if size in seen:
            problem(f"{seen[size]} and {key} have the same stride", (seen[size], key))
        seen[size] = key
    checks = _check_extents(terms, shape, problem, bounded)
    at_launch = launch_check(form, shape, list(bounds), trips or {}, f"{what}: with this launch's strides, sizes "
                              "and grid, two lanes or programs reach one element", hint, construct_origin(stmt))
    if deferred and at_launch is None:
        raise refuse(construct_origin(stmt), f"{what}: {deferred[0]}", hint)
    strided = [k for k in around if k in grid_stride and k in terms]
    if at_launch is not None and strided and any(isinstance(k, (ProgramId, ProgramDigit)) for k in terms):
        at_launch = dataclasses.replace(  # (the condition says which coordinate lands where)
            at_launch, construct=f"a tl.store to `{output}` in the grid-stride loop over `{strided[0].index}`: at "
            "this launch lanes of different programs reach one element: the step shorter than the grid times each "
            "program's block, programs' blocks overlapping, or a program running fewer iterations than the first (the "
            "check takes each to run as many)", hint="step by the grid times each program's block: "
            "`range(pid * BLOCK, n, tl.num_programs(0) * BLOCK)` over elements, `range(pid, n_rows, "
            "tl.num_programs(0))` over rows")
    if at_launch is not None and deferred:
        at_launch = dataclasses.replace(at_launch, fallback=f"{what}: {deferred[0]}")
    if at_launch is not None and any(isinstance(k, ProgramValue) for k in terms):  # a grid too large to read
        at_launch = dataclasses.replace(at_launch, fallback=at_launch.fallback or at_launch.construct)
    split = _digit_checks(stmt, digits, shape, bounds, trips or {}, what, hint)
    if at_launch is not None:  # exact about extents (a grid of one program, one iteration): it decides
        if digits:  # digits' extents assume a dividend that counts from zero: refuse what cannot be read
            at_launch = dataclasses.replace(at_launch, fallback=at_launch.fallback or at_launch.construct)
        return [at_launch, *split]
    return [dataclasses.replace(c, construct=f"{what}: {c.construct}", hint=hint, where=construct_origin(stmt))
            for c in checks] + split


def _digit_checks(stmt: ast.stmt, digits: list[Digit], shape, bounds, trips, what: str, hint: str
                  ) -> list[LaunchCheck]:
    """What makes the digits of a tile of indices ``x`` stand for ``x`` itself (radix.py): every divisor (of digits
    of digits too) at least 1, ``x`` counting up from zero (no negative coefficient) and taking each value once (its
    own coordinates apart). Decided now where the numbers are literal, else at launch (refused where a value cannot
    be read)."""
    checks: list[LaunchCheck] = []
    written = written_digits(digits)
    conditions = [(AtLeast(Expr.of_text(d.divisor), Expr.const(1)), d, f"the divisor `{d.divisor}` < 1")
                  for d in {d.divisor: d for d in written}.values()]
    indices = {index_of(d): d for d in digits}
    conditions += [(AtLeast(_coefficient(c), Expr.const(0)), d, f"`{key}` has the negative stride {_coefficient(c)}")
                   for index, d in indices.items() for key, c in index.terms]
    for condition, digit, why in conditions:
        verdict = decided_now(condition)
        if verdict is False:
            raise refuse(construct_origin(stmt), f"{what}: the digits of `{digit}`: {why}", hint)
        if verdict is None:
            construct = f"{what}: the digits of `{digit}`: {why}"
            checks.append(LaunchCheck(condition, construct, hint, construct_origin(stmt), fallback=construct))
    for index, digit in indices.items():
        construct = f"{what}: the index split in `{digit}` takes one value twice"
        own = launch_check(index, shape, list(bounds), trips, construct, hint, construct_origin(stmt))
        if own is not None:
            checks.append(dataclasses.replace(own, fallback=construct))
    return checks


@dataclass(frozen=True)
class StoreSite:
    """One ``tl.store`` as lanes.py reads it: its address's form and offset (addresses.py), its tile's shape,
    the loops around it and its mask's bounds."""

    stmt: ast.stmt
    form: Form | None
    offset: Poly | None
    shape: tuple | None
    around: tuple[LoopIndex, ...] = ()
    bounds: tuple = ()

    @property
    def local_form(self) -> Form:
        """The form, loops not around the store left out (fixed values here); a scalar address: no terms."""
        if self.form is None:
            return form_of_terms({}, len(self.shape or ()))
        return form_of_terms({k: c for k, c in self.form.terms if not isinstance(k, LoopIndex) or k in self.around},
                             self.form.rank, self.form.affine)


def _check_extents(terms, shape, problem, bounded: set) -> list[LaunchCheck]:
    """Strides that differ by an integer factor must keep a lane axis apart from the coordinates with
    larger ones: each at least the lane axis's extent times its stride. A numeric extent is checked
    here (``problem``), a compile-time one (``BLOCK``) at launch (the condition; the caller completes it)."""
    strides = sorted(((abs(c[0]), c[1], key) for key, c in terms.items()), key=lambda t: (*t[:2], t[2].sort_key))
    checks = []
    for i, (small, symbols, lane) in enumerate(strides):
        if not isinstance(lane, Lane):
            continue
        extent = shape[lane.axis]
        for large, other, key in strides[i + 1:]:
            if other != symbols:
                continue
            overlap = (f"strides {small} and {large} overlap when {lane} has more than "
                       f"{large // small} lanes ({key} moves by {large})")
            if extent.isdigit() and large < int(extent) * small:
                problem(overlap.replace(f"more than {large // small}", extent), (lane, key))
            elif not extent.isdigit() and lane not in bounded:  # a bounded one: apart() decides
                checks.append(LaunchCheck(AtLeast(Expr.const(large), Expr.of_text(extent) * Expr.const(small)),
                                          overlap, "", None))
    return checks




# -- stores at addresses computed from loaded indices ---------------------------------------------------------

def index_reads(body: list[ast.stmt], forms: dict[str, Form], offsets: dict[str, Poly | None], shapes: dict,
                pointer_base: dict[str, str], loaded: set[str]) -> dict[str, tuple[IndexRead, int | None]]:
    """The scalars each program loads from an index tensor, which a launch can read back: an unmasked load,
    defined once, at ``idx_ptr + offset + stride * tl.program_id(axis)`` (or the same element for every
    program: axis None), ``offset`` and ``stride`` computed from no loaded data. Name -> (read, axis)."""
    defs = definitions(body)
    reads = {}
    for stmt in statements(body):
        t = target_of(stmt)
        if operation_of(op_of(stmt)).access != "load" or t is None or len(defs.get(t, [])) != 1 or shapes.get(t) != ():
            continue
        b = arguments(stmt)
        address = b["pointer"].id
        form, offset = forms.get(address, form_of_terms({}, 0)), offsets.get(address)
        if not is_none(b["mask"]) or offset is None or not form.affine or len(form.terms) > 1 or any(
                not isinstance(k, ProgramId) for k, _ in form.terms):
            continue
        param = pointer_base[address]
        element = poly_add(offset, poly({(param,): 1}), -1)
        if {n for names, _ in element for n in names} & (loaded | {param}) or any(
                s in loaded for _, (_, symbols) in form.terms for s in symbols):
            continue
        axis, stride = (form.terms[0][0].axis, _coefficient(form.terms[0][1])) if form.terms else (None, Expr.const(0))
        reads[t] = (IndexRead(t, param, poly_expr(element), stride), axis)
    return reads


def check_data_stores(sites: list[StoreSite], output: str, reads: dict[str, tuple[IndexRead, int | None]],
                      loaded: set[str], trips: dict[LoopIndex, Expr]) -> list[LaunchCheck]:
    """Stores to ``output`` at addresses computed from loaded indices (``out + dst * stride + cols`` with
    ``dst = tl.load(perm_ptr + row)``; ``y + start + cols`` masked by ``cols < end - start``): accepted
    when each address is an index each program loads once (``index_reads``) times a stride, plus an affine
    form of the other coordinates. Each store's lanes are apart by its own check (``check_store``, with
    the indices as constants); this returns the check that programs' ranges are apart, on the index
    tensors each launch passes (checks.RangesApart), which names the colliding index where it fails."""
    what = f"a tl.store to `{output}` at addresses computed from loaded data"
    hint = ("load one index per program (`dst = tl.load(perm_ptr + row)`, `start = tl.load(cu_seqlens_ptr + pid)`) "
            "and store at `out_ptr + dst * stride + cols`; or accumulate with tl.atomic_add instead")
    parts = []
    for site in sites:
        form, at = site.local_form, construct_origin(site.stmt)
        if not form.affine or site.offset is None or site.shape is None:
            raise refuse(at, f"{what}: the address is not an affine form of indices loaded once per program", hint)
        if any(s in loaded for _, (_, symbols) in form.terms for s in symbols):
            raise refuse(at, f"{what}: a lane index or program id is scaled by loaded data", hint)
        base = poly_add(site.offset, poly({(output,): 1}), -1)
        names = {n for names, _ in base for n in names}
        if output in names:
            raise refuse(at, f"{what}: the address is not `{output}` plus offsets", hint)
        unread = sorted(n for n in names & loaded if n not in reads)
        if unread:
            raise refuse(at, f"{what}: `{unread[0]}` is not one index per program loaded from a tensor argument "
                         "(at `idx_ptr + stride * tl.program_id(axis)`, unmasked)", hint)
        parts.append((site, form, base, names & loaded))
    axes = {reads[n][1] for *_, used in parts for n in used} - {None}
    if len(axes) > 1:
        raise refuse(construct_origin(sites[0].stmt), f"{what}: indices loaded along several program axes", hint)
    axis = axes.pop() if axes else 0
    ranges = []
    for site, form, base, _ in parts:
        pid = ProgramId(axis)
        rest = form_of_terms({k: c for k, c in form.terms if k != pid}, form.rank, form.affine)
        apart = _apart(rest, site.shape, list(site.bounds), trips)
        if apart is None:
            raise refuse(construct_origin(site.stmt), f"{what}: a loop's trip count is not known", hint)
        if not isinstance(apart, Apart):  # (its ranges are read per program, not over a swizzle's values)
            raise refuse(construct_origin(site.stmt), f"{what}: and at a value computed from the program ids", hint)
        stride = _coefficient(form.coefficients[pid]) if pid in form.coefficients else Expr.const(0)
        ranges.append(StoreRange(poly_expr(base), stride, apart, _one_index(base, loaded)))
    condition = RangesApart(output, axis, tuple(reads[n][0] for n in sorted(reads) if reads[n][1] in (axis, None)),
                            tuple(ranges))
    construct = f"{what}: two programs write one element, or one writes outside `{output}`"
    return [LaunchCheck(condition, construct, hint, construct_origin(sites[0].stmt),
                        fallback=f"{what}: the indices cannot be read at this launch")]


def _one_index(base: Poly, loaded: set[str]) -> tuple[str, Expr] | None:
    """``(name, c)`` where ``base`` is ``c * name`` for one loaded index (``dst * stride``), plus terms that read
    no loaded data; else None."""
    names = {n for names, _ in base for n in names if n in loaded}
    if len(names) != 1:
        return None
    (name,) = names
    terms = [(m, c) for m, c in base if name in m]
    if any(m.count(name) != 1 for m, _ in terms):
        return None
    return name, poly_expr(poly({tuple(n for n in m if n != name): c for m, c in terms}))
