"""Whether each output's stores keep their lanes, programs, iterations and several stores apart (lanes.py over
addresses.py's forms): refused where they certainly meet, launch checks where the launch decides, and a store
whose address lost a program id as a coordinate refused."""

from __future__ import annotations

import ast
from dataclasses import dataclass

from ..core.errors import NotDifferentiableError
from ..core.ir import (
    address_names,
    arguments,
    child_blocks,
    construct_origin,
    definitions,
    op_of,
    range_bounds,
    refuse,
    structured,
)
from ..core.operations import operation_of
from .addresses import descriptor_form, enclosing_loops
from .conditions import All, Apart, AtLeast, AtMost, Condition, LaunchCheck, decided_now
from .flow import loaded_values, program_axes
from .forms import Form, Lane, LoopIndex, form_of_terms, form_program_axes
from .lanes import (
    LaunchCoordinates,
    StoreSite,
    bound_group,
    check_data_stores,
    check_store,
    index_reads,
    launch_coordinates,
    programs_apart,
)
from .launch_values import UNKNOWN_TRIP, Expr
from .masks import mask_bounds
from .offsets import ZERO, address_offsets, canonical, offset_of, poly, poly_add, poly_expr
from .scalars import scalar_expr


def check_output_stores(body: list[ast.stmt], outputs, stores, shapes, forms, launch_checks, trips, pointer_base,
                        params: frozenset[str] = frozenset(), grid_stride: frozenset = frozenset()
                        ) -> dict[str, set[int]]:
    """Refuse stores whose adjoint would be wrong; return the program axes each output's addresses use.

    A store's adjoint hands the output's gradient to the stored value. That is right only
    when no other store overwrites the element: so each store's lanes write distinct elements,
    several stores to one output (unless in exclusive branches of an ``if``) write disjoint
    addresses, and stores at addresses computed from loaded indices (a scatter) have programs
    whose ranges are apart on the indices each launch passes (lanes.py). Stores repeating an
    address across loop iterations are refused in loops.py. Whether programs overwrite each
    other's elements depends on the grid, checked at launch (runtime/launch_checks.py).
    """
    loaded = loaded_values(body)
    axes_of = program_axes(body)
    paths = _branch_paths(body)
    ifs = {id(n): n for n in structured(body) if isinstance(n, ast.If)}
    around = enclosing_loops(body)
    defs = definitions(body)
    offsets = address_offsets(body, forms)
    reads = None  # scalars loaded from index tensors (lanes.index_reads), where a scatter needs them
    fors = {n.target.id: n for n in structured(body) if isinstance(n, ast.For)}
    store_axes = {}
    for output in outputs:
        plain = [s for s in stores.get(output, []) if operation_of(op_of(s)).memory == "store"]
        if plain and len(plain) < len(stores[output]):
            raise refuse(construct_origin(plain[0]), f"`{output}` both stored and accumulated atomically",
                         "write each output either with tl.store or with tl.atomic_add")
        sites, data = {}, []
        kept: dict[int, set[int]] = {}  # store -> the program axes its address keeps as coordinates
        for s in plain:
            if any(n in loaded for n in address_names(s)):  # a scatter: checked on the loaded indices
                form = forms.get(arguments(s)["pointer"].id)
                if operation_of(op_of(s)).access != "store" or (form is not None and not form.affine):
                    raise refuse(construct_origin(s),
                                 f"a tl.store to `{output}` at addresses computed from loaded data",
                                 "a scatter may write one element twice; use tl.atomic_add to accumulate instead")
                address = arguments(s)["pointer"].id
                bounds = mask_bounds(arguments(s)["mask"], forms, defs, shapes, loaded=True)
                data.append(StoreSite(s, forms.get(address), offset_of(address, offsets, forms), shapes.get(address),
                                      around[id(s)], tuple(bounds)))
            if operation_of(op_of(s)).access == "store":
                address = arguments(s)["pointer"].id
                bounds = mask_bounds(arguments(s)["mask"], forms, defs, shapes)
                sites[id(s)] = StoreSite(s, forms.get(address), offset_of(address, offsets, forms), shapes.get(address),
                                         around[id(s)], tuple(bounds))
                launch_checks += check_store(s, forms.get(address), output, shapes.get(address), around[id(s)],
                                             bounds, trips, grid_stride)
                kept[id(s)] = form_program_axes(forms.get(address))
            else:  # a descriptor's block: its lanes are apart, its offsets may not be
                form = descriptor_form(arguments(s)["offsets"].elts, forms)
                launch_checks += check_store(s, form, output, shapes.get(arguments(s)["pointer"].id), around[id(s)],
                                             trips=trips)
                kept[id(s)] = form_program_axes(form)
        for i, second in enumerate(plain):  # stores that may both run: at disjoint addresses
            for first in plain[:i]:
                if _exclusive(paths[id(first)], paths[id(second)]):
                    continue
                both_blocks = all(operation_of(op_of(s)).descriptor for s in (first, second))
                if not both_blocks and (id(first) not in sites or id(second) not in sites):
                    raise refuse(construct_origin(second), f"a second tl.store to `{output}`",
                                 "store each output once: compute the final value first, or store different outputs")
                try:
                    launch_checks += (check_blocks_apart(first, second, output, forms, offsets, shapes, trips, defs)
                                      if both_blocks else check_stores_apart(sites[id(first)], sites[id(second)],
                                                                             output, trips, frozenset(loaded), defs))
                except NotDifferentiableError:
                    modes = _never_both(paths[id(first)], paths[id(second)], ifs, defs, params)
                    if modes is None:
                        raise
                    construct = (f"a second tl.store to `{output}` (the other on line "
                                 f"{construct_origin(first).line}): both run at this launch, at addresses that may "
                                 "meet")
                    launch_checks.append(LaunchCheck(modes, construct, "store each output once per launch mode",
                                                     construct_origin(second), fallback=construct))
        if data:
            if reads is None:
                reads = index_reads(body, forms, offsets, shapes, pointer_base, loaded)
            counts = _trips_over_indices(fors, defs, trips, params, reads)  # (a sequence's loop: per program)
            (check,) = check_data_stores(data, output, reads, loaded, counts)
            launch_checks.append(check)
            for site in data:  # programs along its axis are checked apart on the indices
                kept[id(site.stmt)].add(check.condition.axis)
        for s in plain:
            _refuse_lost_program_ids(s, output, set().union(*[axes_of.get(n, set()) for n in address_names(s)]),
                                     kept[id(s)], {fors[i.index]: axes_of.get(i.index, set()) for i in around[id(s)]})
        if plain:  # tl.atomic_add outputs accumulate: programs may share elements
            store_axes[output] = set().union(*[axes_of.get(n, set()) for s in plain for n in address_names(s)])
    return store_axes


def _trips_over_indices(fors: dict[str, ast.For], defs: dict, trips: dict[LoopIndex, Expr], params: frozenset[str],
                        reads: dict) -> dict[LoopIndex, Expr]:
    """The loops' trip counts, those the arguments alone cannot give but the scalars each program loads once can
    (``range(start, end, BLOCK)`` with ``start = tl.load(cu_seqlens + pid)``: lanes.index_reads) written over
    them: a scatter's check (index_ranges.RangesApart) reads them per program."""
    found = dict(trips)
    for name, node in fors.items():
        count = Expr("trips", tuple(scalar_expr(a, defs) for a in range_bounds(node)))
        if trips.get(LoopIndex(name)) == Expr.const(UNKNOWN_TRIP) and count.names() <= params | set(reads):
            found[LoopIndex(name)] = count
    return found


def _refuse_lost_program_ids(stmt: ast.stmt, output: str, used: set[int], kept: set[int],
                             loops: dict[ast.For, set[int]]) -> None:
    """A store address computed from a program id by an operation that loses its coordinate (``tl.minimum(pid,
    n)``, ``tl.where``, a loop whose range depends on it other than by moving both bounds alike) may send two
    programs to one element: the checks see no program coordinate there to keep them apart. ``loops``: those
    around the store, with the program axes their ranges read (a range the program ids move other than both
    bounds alike or as a grid-stride loop's start is refused so)."""
    lost = sorted(used - kept)
    through = [loop for loop, axes in loops.items() if lost and lost[0] in axes]
    if through:
        loop = construct_origin(through[-1])
        raise refuse(construct_origin(stmt), f"a tl.store to `{output}` whose address follows "
                     f"tl.program_id({lost[0]}) through the range of the loop on line {loop.line} "
                     f"(`{loop.text.strip()}`): the checks cannot tell that "
                     "two programs' iterations store to different elements",
                     f"loop over tile indices, which the checks keep apart: `for tile in range(tl.program_id("
                     f"{lost[0]}), tl.cdiv(n, BLOCK), tl.num_programs({lost[0]}))` with addresses "
                     "`tile * BLOCK + tl.arange(0, BLOCK)`")
    if lost:
        raise refuse(construct_origin(stmt), f"a tl.store to `{output}` whose address uses "
                     f"tl.program_id({lost[0]}) through an operation that may send two programs to one element "
                     "(tl.minimum, tl.where, a branch)",
                     "build addresses from program ids with + and * only, or with both `pid // n` and `pid % n`")


def _branch_paths(body: list[ast.stmt], path: tuple = ()) -> dict[int, tuple]:
    """For each flat statement, the (if node, branch) pairs it sits under."""
    paths = {}
    for stmt in body:
        if isinstance(stmt, ast.If):
            for branch, block in enumerate(child_blocks(stmt)):
                paths.update(_branch_paths(block, (*path, (id(stmt), branch))))
        elif isinstance(stmt, ast.For):
            paths.update(_branch_paths(stmt.body, path))
        else:
            paths[id(stmt)] = path
    return paths


def _never_both(a: tuple, b: tuple, ifs: dict[int, ast.If], defs: dict, params: frozenset[str]) -> AtMost | None:
    """Where two statements sit under ``if``s on launch scalars alone (a mode: ``if reduction == 0`` in a loop,
    ``if reduction != 0`` after it), the condition that a launch takes at most one of their paths (None: a test
    reads a program id, a loaded value or a local, which programs or iterations may take differently)."""
    if not a and not b:  # neither under an `if`: both always run
        return None
    taken = []
    for node, branch in (*a, *b):
        test = scalar_expr(ifs[node].test, defs)
        if not _launch_scalar(test, params):
            return None
        taken.append(test if branch == 0 else Expr("not_", (test,)))
    both = taken[0]
    for t in taken[1:]:
        both = Expr("mul", (both, t))
    return AtMost(both, 0)


def _launch_scalar(e: Expr, params: frozenset[str]) -> bool:
    """An expression over the kernel's parameters alone (no program id, loaded value or local)."""
    return e.op != "unknown" and not e.program_axes() and e.names() <= params and all(
        _launch_scalar(x, params) for x in e.args if isinstance(x, Expr))


def _exclusive(a: tuple, b: tuple) -> bool:
    """Whether two statements sit in different branches of one ``if``: never both run."""
    branch_of = dict(a)
    return any(node in branch_of and branch_of[node] != branch for node, branch in b)


def check_stores_apart(first: StoreSite, second: StoreSite, output: str, trips: dict[LoopIndex, Expr],
                       loaded: frozenset[str] = frozenset(), defs: dict | None = None) -> list[LaunchCheck]:
    """Two stores to one output that may both run: accepted when their addresses are the same form shifted
    by a constant (``out + cols`` and ``out + half + cols``; ``stats + row * 3 + 1`` and ``+ 2``) and no
    element is written by both (``shifted_apart``). Decided now where every number is known, else at each
    launch; refused where it cannot be shown."""
    what = f"a second tl.store to `{output}` (the other on line {construct_origin(first.stmt).line})"
    hint = ("store each output once, or store its parts at addresses that differ by a constant "
            "(`out + cols` and `out + half + cols`, with `cols < half`)")
    try:
        condition = shifted_apart(first, second, trips, loaded, defs).condition
    except NotShifted as e:
        raise refuse(construct_origin(second.stmt), f"{what}{e}", hint) from None
    construct = f"{what}: with this launch's sizes, both may write one element"
    verdict = decided_now(condition)
    if verdict is False:
        raise refuse(construct_origin(second.stmt), f"{what}: both write one element", hint)
    return [] if verdict else [LaunchCheck(condition, construct, hint, construct_origin(second.stmt),
                                           fallback=construct)]


class NotShifted(Exception):
    """Why two sites' addresses cannot be read as one form shifted by a constant (the text follows a description
    of the second site)."""


@dataclass(frozen=True)
class Shifted:
    """Two sites (stores, or loads: lanes.StoreSite) read as one with a coordinate more, ``which`` (0 at the first,
    1 at the second, stride ``shift``): ``condition`` says its lanes, programs, iterations and ``which`` reach
    distinct elements; ``found``: the first's coordinates under the bounds both masks share."""

    condition: Condition
    found: LaunchCoordinates
    shift: Expr


def shifted_apart(first: StoreSite, second: StoreSite, trips: dict[LoopIndex, Expr],
                  loaded: frozenset[str] = frozenset(), defs: dict | None = None, which: str = "which store"
                  ) -> Shifted:
    """Two sites' addresses as the same form shifted by a constant, read as one site with a coordinate more (which
    one, stride the shift; ``which`` names it), whose lanes, programs and iterations must reach distinct elements.
    A mask the shift moves alike (``cols < N``, ``cols + half < N``: a tile in halves) bounds that coordinate too.
    Raises NotShifted where they cannot be read so."""
    a, b = first.local_form, second.local_form
    if not (a.affine and b.affine) or first.shape is None or second.shape is None:
        raise NotShifted(": their addresses cannot be read as affine forms")
    defs = defs or {}

    def strides(form: Form) -> tuple:  # scalars computed twice alike compare equal
        return tuple((k, canonical(poly({c[1]: c[0]}), defs)) for k, c in form.terms)

    if strides(a) != strides(b) or tuple(first.shape) != tuple(second.shape):
        raise NotShifted(", whose addresses move differently along lanes, programs or loops")
    if first.offset is None or second.offset is None:
        raise NotShifted(": the constant parts of their addresses are not known")
    shift = poly_add(second.offset, first.offset, -1)
    if {n for names, _ in shift for n in names} & loaded:
        raise NotShifted(": the shift between their addresses is computed from loaded data")
    if canonical(shift, defs) == ZERO:
        raise NotShifted(" at the same addresses")
    common = [x for x in first.bounds if x in second.bounds]
    found = launch_coordinates(a, first.shape, common, trips)
    if found is None:
        raise NotShifted(": a loop's trip count is not known")
    moves = poly_expr(shift)
    groups, same_ratio = [], []
    for form, limit in first.bounds:  # `x <= l1` and `x <= l2`: `x + which * (l1 - l2) <= l1` over both sites,
        for other, other_limit in second.bounds:  # where the shift is the address's stride times l1 - l2
            group = bound_group(a, found.keys, form, limit) if other == form and (form, limit) not in common else None
            if group is not None:
                members, most, coefficients, ratio = group
                moved = limit - other_limit
                groups.append(((*members, len(found.keys)), most, (*coefficients, moved)))
                same_ratio += [AtLeast(moves, ratio * moved), AtLeast(ratio * moved, moves),
                               AtLeast(moved, Expr.const(0))]
    condition = found.apart(((which, moves, Expr.const(2)),), tuple(groups))
    if same_ratio:
        condition = All((condition, *same_ratio))
    return Shifted(condition, found, moves)


def check_blocks_apart(first: ast.stmt, second: ast.stmt, output: str, forms: dict, offsets: dict, shapes: dict,
                       trips: dict[LoopIndex, Expr], defs: dict) -> list[LaunchCheck]:
    """Two stores of blocks through one descriptor (the persistent tutorial's EPILOGUE_SUBTILE: a tile's two halves
    at ``[m, n]`` and ``[m, n + BLOCK_N // 2]``): accepted when their offsets are the same forms, one dimension's
    shifted by a constant, and no element is written by both. A descriptor's dimensions do not wrap into each other
    (it clips at its shape), so each dimension's coordinates (the offset's, the block's lanes, which store along the
    shifted one) are weighted past the span of the dimensions after it, and the sum must take each value once."""
    what = f"a second tl.store to `{output}` (the other on line {construct_origin(first).line})"
    hint = "store each block once, or store its parts at offsets one part apart"
    a, b = arguments(first), arguments(second)
    shape = shapes.get(a["pointer"].id)
    if ast.dump(a["pointer"]) != ast.dump(b["pointer"]) or shape is None:
        raise refuse(construct_origin(second), f"{what} through another descriptor", hint)
    dims = []
    for d, (x, y) in enumerate(zip(a["offsets"].elts, b["offsets"].elts, strict=True)):
        fx, fy = (forms.get(v.id, form_of_terms({}, 0)) if isinstance(v, ast.Name) else form_of_terms({}, 0)
                  for v in (x, y))
        ox, oy = (offset_of(v.id, offsets, forms) if isinstance(v, ast.Name) else None for v in (x, y))
        if not (fx.affine and fx == fy) or ox is None or oy is None:
            raise refuse(construct_origin(second),
                         f"{what}, whose offsets move differently along lanes, programs or loops", hint)
        found = launch_coordinates(form_of_terms({**fx.coefficients, Lane(0): (1, ())}, 1), (shape[d],), [], trips)
        if found is None:
            raise refuse(construct_origin(second), f"{what}: a loop's trip count is not known", hint)
        dims.append((found, poly_add(oy, ox, -1)))
    shifted = [d for d, (_, shift) in enumerate(dims) if canonical(shift, defs) != ZERO]
    if len(shifted) != 1:
        raise refuse(construct_origin(second), f"{what} at the same offsets" if not shifted else
                     f"{what}, shifted along two dimensions", hint)
    coordinates, keys, weight = [], [], Expr.const(1)
    for d in reversed(range(len(dims))):
        found, shift = dims[d]
        mine = [(c * weight, e) for c, e in found.coordinates]
        if d == shifted[0]:
            mine.append((poly_expr(shift) * weight, Expr.const(2)))
        coordinates += mine
        keys += found.keys
        span = Expr.const(0)
        for c, e in mine:
            span = span + Expr("abs", (c,)) * (e - Expr.const(1))
        weight = span + weight  # (the next dimension steps over everything this one and the later ones span)
    programs = programs_apart(keys)
    forward = AtLeast(poly_expr(dims[shifted[0]][1]), Expr.const(0))
    condition = All((Apart(tuple(coordinates)), *([programs] if programs else []), forward))
    construct = f"{what}: with this launch's sizes, both may write one element"
    verdict = decided_now(condition)
    if verdict is False:
        raise refuse(construct_origin(second), f"{what}: both write one element", hint)
    return [] if verdict else [LaunchCheck(condition, construct, hint, construct_origin(second), fallback=construct)]
