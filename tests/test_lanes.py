"""checks.apart, the launch-time test that a store's lanes and programs reach distinct elements:
whenever it says so, brute force agrees (it may be cautious, never wrong)."""

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from tritongrad.analysis.conditions import apart

coordinates = st.lists(st.tuples(st.integers(-12, 12), st.integers(1, 5)), min_size=1, max_size=4)


@st.composite
def stores(draw):
    coords = draw(coordinates)
    bounds = []
    positive = [i for i, (c, _) in enumerate(coords) if c > 0]
    for _ in range(draw(st.integers(0, 2)) if positive else 0):  # masks bounding coordinates' part of the address
        members = tuple(sorted(draw(st.sets(st.sampled_from(positive), min_size=1))))
        limit = draw(st.integers(0, sum(coords[j][0] * (coords[j][1] - 1) for j in members)))
        bounds.append((members, limit, [coords[j][0] for j in members]))
    return coords, bounds


def distinct(coords, bounds) -> bool:
    seen = set()
    for x in itertools.product(*[range(e) for _, e in coords]):
        if any(sum(coords[j][0] * x[j] for j in members) > limit for members, limit, _ in bounds):
            continue  # masked off
        address = sum(c * xi for (c, _), xi in zip(coords, x, strict=True))
        if address in seen:
            return False
        seen.add(address)
    return True


@settings(max_examples=400, deadline=None, derandomize=True)
@given(stores())
def test_apart_is_never_wrong(store):
    coords, bounds = store
    if apart(coords, bounds):
        assert distinct(coords, bounds)


def test_apart_takes_row_major_tiles_with_ragged_masks():
    # rows of 13 (stride 13) in blocks of 16 lanes masked to the 13 columns, 5 programs: apart
    assert apart([(1, 16), (13, 5)], [((0,), 12, [1])])
    # the same with a row stride of 1 (a transposed tensor read as rows): programs overlap
    assert not apart([(1, 16), (1, 5)], [((0,), 12, [1])])


def test_a_launch_check_is_data_that_reads_and_evaluates_on_the_launch():
    import tritongrad
    from tritongrad.analysis.launch_values import LaunchValues
    from tritongrad.examples import rmsnorm

    (check,) = tritongrad.grad(rmsnorm.rmsnorm_fwd).launch_checks
    assert str(check).endswith("distinct elements for lane axis 0 (stride 1, BLOCK values), tl.program_id(0) "
                               "(stride stride, num_programs(0) values); the mask keeps lane axis 0 within N - 1")
    rows = {"BLOCK": 64, "N": 45}
    assert check.condition.holds(LaunchValues({**rows, "stride": 45}, (7,)))  # contiguous rows
    assert not check.condition.holds(LaunchValues({**rows, "stride": 20}, (7,)))  # rows overlap
    assert check.condition.holds(LaunchValues({**rows, "stride": 20}, (1,)))  # one program: nothing to overlap
    assert "# Checked on each launch's arguments" in tritongrad.grad(rmsnorm.rmsnorm_fwd).launch_notes()


@st.composite
def boxes(draw):
    """Coordinates and masks like a kernel's (steps that often chain, bounds on chains), and a tensor's layout."""
    coords, bounds = [], []
    for _ in range(draw(st.integers(1, 3))):
        step = draw(st.sampled_from([1, 2, 3, 4, 6, 8, 12]))
        coords.append((step, draw(st.integers(1, 4))))
    if draw(st.booleans()):
        members = tuple(sorted(draw(st.sets(st.integers(0, len(coords) - 1), min_size=1))))
        bounds.append((members, draw(st.integers(-1, 30))))
    steps = st.sampled_from([1, 2, 3, 4, 6, 8, 12])
    dims = [(draw(steps), draw(st.integers(0, 4))) for _ in range(draw(st.integers(1, 2)))]
    return coords, bounds, dims


def reached(coords, bounds) -> set:
    found = set()
    for x in itertools.product(*[range(e) for _, e in coords]):
        if all(sum(coords[j][0] * x[j] for j in members) <= limit for members, limit in bounds):
            found.add(sum(c * xi for (c, _), xi in zip(coords, x, strict=True)))
    return found


def elements(dims) -> set:
    indices = itertools.product(*[range(n) for _, n in dims])
    return {sum(s * y for (s, _), y in zip(dims, ys, strict=True)) for ys in indices}


@settings(max_examples=600, deadline=None, derandomize=True)
@given(boxes())
def test_covers_is_never_wrong(box):
    from tritongrad.analysis.conditions import covers

    coords, bounds, dims = box
    if covers(coords, bounds, dims):
        assert reached(coords, bounds) == elements(dims)


def test_covers_a_ragged_1d_launch_and_rows_with_a_masked_tail():
    from tritongrad.analysis.conditions import covers

    assert covers([(1, 64), (64, 4)], [((0, 1), 199)], [(1, 200)])  # 4 programs of 64 lanes over 200 elements
    assert not covers([(1, 64), (64, 3)], [((0, 1), 199)], [(1, 200)])  # too few programs
    assert covers([(1, 64), (45, 7)], [((0,), 44)], [(45, 7), (1, 45)])  # 7 rows of 45 in blocks of 64
    assert not covers([(1, 64), (50, 7)], [((0,), 44)], [(45, 7), (1, 45)])  # a row stride that skips elements


def test_covers_writes_a_masks_coefficients_over_the_parameters_too():
    """A mask's coefficient that is a kernel temporary (`SEQ * H`, hoisted into `SEQ_times_H`) is written out as the
    coordinates and limits are: evaluated at a launch, not refused as unreadable (which counted as not covering)."""
    from tritongrad.analysis.conditions import Covers
    from tritongrad.analysis.launch_values import Expr

    seq_h = Expr.name("SEQ_times_H")
    found = Covers(((Expr.const(1), Expr.name("N")),), (((0,), Expr.name("N") - Expr.const(1), (seq_h,)),), "x")
    written = found.substitute(lambda name: Expr.name("SEQ") * Expr.name("H") if name == "SEQ_times_H" else None)
    assert "SEQ_times_H" in found.names() and "SEQ_times_H" not in written.names()
    assert written.bounds[0][2] == (Expr.name("SEQ") * Expr.name("H"),)


@st.composite
def ranges(draw):
    """A store's coordinates and mask bounds whose limits differ program by program (read from indices)."""
    programs = draw(st.integers(1, 4))
    coords = draw(coordinates)
    positive = [i for i, (c, _) in enumerate(coords) if c > 0]
    bounds = []
    for _ in range(draw(st.integers(0, 2)) if positive else 0):
        members = tuple(sorted(draw(st.sets(st.sampled_from(positive), min_size=1))))
        top = sum(coords[j][0] * (coords[j][1] - 1) for j in members)
        limits = [draw(st.integers(-1, top)) for _ in range(programs)]
        bounds.append((members, limits))
    base = [draw(st.integers(-20, 20)) for _ in range(programs)]
    return programs, coords, bounds, base


@settings(max_examples=300, deadline=None, derandomize=True)
@given(ranges())
def test_store_ranges_hold_every_address_a_program_writes(store):
    """checks.StoreRange (what RangesApart compares between programs): each program's addresses lie within
    its range, and a program said to store nothing writes nothing."""
    import torch

    from tritongrad.analysis.conditions import Apart
    from tritongrad.analysis.index_ranges import StoreRange
    from tritongrad.analysis.launch_values import Expr, LaunchValues

    programs, coords, bounds, base = store
    values = {"base": torch.tensor(base), **{f"L{i}": torch.tensor(limits) for i, (_, limits) in enumerate(bounds)}}
    rest = Apart(tuple((Expr.const(c), Expr.const(e)) for c, e in coords),
                 tuple((members, Expr.name(f"L{i}"), tuple(Expr.const(coords[j][0]) for j in members))
                       for i, (members, _) in enumerate(bounds)))
    low, high, stores = StoreRange(Expr.name("base"), Expr.const(0), rest).bounds_of(LaunchValues(values, (programs,)),
                                                                                     programs)
    for p in range(programs):
        written = [base[p] + sum(c * xi for (c, _), xi in zip(coords, x, strict=True))
                   for x in itertools.product(*[range(e) for _, e in coords])
                   if all(sum(coords[j][0] * x[j] for j in members) <= limits[p] for members, limits in bounds)]
        if written:
            assert bool(stores[p]) and int(low[p]) <= min(written) and max(written) <= int(high[p])
