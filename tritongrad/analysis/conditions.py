"""Conditions on a launch's arguments: what derivation could not decide, as data the launcher evaluates.

A condition is built at derivation from integer expressions (launch_values.Expr) over the
kernel's parameters, the grid and loop trip counts, and evaluated on each launch's
arguments (no generated source, nothing ``eval``-ed). It prints as it reads, for
``tritongrad show``.

- :class:`Apart`: ``sum(c_i * x_i)`` over ``0 <= x_i < extent_i`` takes each value once
  (lanes, programs and iterations of a store reach distinct elements; see lanes.py).
- :class:`AtLeast`, :class:`AtMost`: one expression is at least another, at most a number.
- :class:`Covers`: a store's addresses are exactly a tensor's elements (writes/strategies.py: an input's
  gradient may then be stored, not added, into a buffer left unfilled).
- :class:`All`: every one of several conditions.
- :class:`ProgramsApart`: distinct programs compute distinct values of a swizzle (``pid_m``, ``pid_n`` of a
  grouped ordering), none negative: evaluated over the whole grid, so those values may be coordinates of Apart.
- index_ranges.RangesApart: stores whose addresses come from loaded indices (``dst = tl.load(perm +
  row)``, ``start = tl.load(cu_seqlens + pid)``): each program's range of addresses, read off the
  index tensors the launch passes, is apart from every other program's. It reads tensor contents,
  so it runs on every launch (on the device: a strided view of the indices, a sort, one sync).

Apart, AtLeast, AtMost and ProgramsApart read only scalars and the grid: the launcher caches their verdict per
launch shape (``cacheable``); Covers (a tensor's layout) and RangesApart (its contents) are not.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from ..core.ir import Origin
from .launch_values import Expr, LaunchValues, Unreadable


@dataclass(frozen=True)
class Apart:
    """``sum(c_i * x_i)`` over ``0 <= x_i < extent_i`` takes each value once (see :func:`apart`).

    ``coordinates``: ``(c_i, extent_i)``; ``bounds``: from a mask, ``(members, limit, mask coefficients)``:
    over the lanes that store, the members' part of the sum stays within ``limit``."""

    coordinates: tuple[tuple[Expr, Expr], ...]
    bounds: tuple[tuple[tuple[int, ...], Expr, tuple[Expr, ...]], ...] = ()
    names_of: tuple[str, ...] = ()  # each coordinate's name, for printing

    def holds(self, launch: LaunchValues) -> bool:
        coordinates = [(c.evaluate(launch), e.evaluate(launch)) for c, e in self.coordinates]
        bounds = [(members, limit.evaluate(launch), [c.evaluate(launch) for c in coefficients])
                  for members, limit, coefficients in self.bounds]
        return apart(coordinates, bounds)

    cacheable = True  # reads scalars and the grid only

    def violation(self, launch: LaunchValues) -> str | None:
        """None where it holds, else which coordinate lands within what the smaller ones span."""
        coordinates = [(c.evaluate(launch), e.evaluate(launch)) for c, e in self.coordinates]
        bounds = [(members, limit.evaluate(launch), [c.evaluate(launch) for c in coefficients])
                  for members, limit, coefficients in self.bounds]
        failed = apart_failure(coordinates, bounds)
        if failed is None:
            return None
        i, step, span, below = failed
        names = self.names_of or tuple(f"x{i}" for i in range(len(self.coordinates)))
        spanning = " and ".join(names[j] for j in below if coordinates[j][1] > 1)
        if not spanning:
            return f"{names[i]} moves by {step}: its values meet"
        return f"{names[i]} moves by {step}, within the {span + 1} elements {spanning} span"

    def names(self) -> set[str]:
        exprs = [e for pair in self.coordinates for e in pair]
        exprs += [e for _, limit, coefficients in self.bounds for e in (limit, *coefficients)]
        return set().union(*[e.names() for e in exprs])

    def substitute(self, replace: Callable[[str], Expr | None]) -> Apart:
        return Apart(tuple((c.substitute(replace), e.substitute(replace)) for c, e in self.coordinates),
                     tuple((m, limit.substitute(replace), tuple(c.substitute(replace) for c in coefficients))
                           for m, limit, coefficients in self.bounds), self.names_of)

    def __str__(self) -> str:
        names = self.names_of or tuple(f"x{i}" for i in range(len(self.coordinates)))
        terms = ", ".join(f"{name} (stride {c}, {e} values)" for name, (c, e) in zip(names, self.coordinates,
                                                                                      strict=True))
        masks = "; ".join(f"the mask keeps {' + '.join(names[i] for i in members)} within {limit}"
                          for members, limit, _ in self.bounds)
        return f"distinct elements for {terms}" + (f"; {masks}" if masks else "")


@dataclass(frozen=True)
class AtLeast:
    """``larger >= smaller``."""

    larger: Expr
    smaller: Expr

    cacheable = True

    def holds(self, launch: LaunchValues) -> bool:
        return self.larger.evaluate(launch) >= self.smaller.evaluate(launch)

    def violation(self, launch: LaunchValues) -> str | None:
        return None if self.holds(launch) else ""

    def names(self) -> set[str]:
        return self.larger.names() | self.smaller.names()

    def substitute(self, replace: Callable[[str], Expr | None]) -> AtLeast:
        return AtLeast(self.larger.substitute(replace), self.smaller.substitute(replace))

    def __str__(self) -> str:
        return f"{self.larger} >= {self.smaller}"


@dataclass(frozen=True)
class AtMost:
    """``value <= limit``."""

    value: Expr
    limit: int

    cacheable = True  # reads scalars and the grid only

    def holds(self, launch: LaunchValues) -> bool:
        return self.value.evaluate(launch) <= self.limit

    def violation(self, launch: LaunchValues) -> str | None:
        return None if self.holds(launch) else ""

    def names(self) -> set[str]:
        return self.value.names()

    def substitute(self, replace: Callable[[str], Expr | None]) -> AtMost:
        return AtMost(self.value.substitute(replace), self.limit)

    def __str__(self) -> str:
        return f"{self.value} <= {self.limit}"


@dataclass(frozen=True)
class Covers:
    """The addresses ``sum(c_i * x_i)`` (``0 <= x_i < extent_i``, within the mask's bounds) are exactly the
    elements of the tensor passed as ``tensor`` (offsets from its first element, in its sizes and strides)."""

    coordinates: tuple[tuple[Expr, Expr], ...]
    bounds: tuple[tuple[tuple[int, ...], Expr, tuple[Expr, ...]], ...]
    tensor: str

    cacheable = False  # reads a tensor's layout

    def violation(self, launch: LaunchValues) -> str | None:
        return None if self.holds(launch) else ""

    def holds(self, launch: LaunchValues) -> bool:
        t = launch.value(self.tensor)
        coordinates = [(c.evaluate(launch), e.evaluate(launch)) for c, e in self.coordinates]
        if any(m.evaluate(launch) <= 0 for _, _, mask in self.bounds for m in mask):
            return False  # a bound in address units needs the mask's coefficients positive
        bounds = [(members, limit.evaluate(launch)) for members, limit, _ in self.bounds]
        return covers(coordinates, bounds, list(zip(t.stride(), t.shape, strict=True)))

    def names(self) -> set[str]:
        exprs = [e for pair in self.coordinates for e in pair] + [e for _, limit, cs in self.bounds
                                                                  for e in (limit, *cs)]
        return {self.tensor}.union(*[e.names() for e in exprs])

    def substitute(self, replace: Callable[[str], Expr | None]) -> Covers:  # (a mask's coefficients too: a
        return Covers(tuple((c.substitute(replace), e.substitute(replace)) for c, e in self.coordinates),  # temp's
                      tuple((m, limit.substitute(replace), tuple(c.substitute(replace) for c in cs))  # `SEQ * H`)
                            for m, limit, cs in self.bounds), self.tensor)

    def __str__(self) -> str:
        return f"the addresses cover every element of `{self.tensor}`"


@dataclass(frozen=True)
class All:
    """Every one of ``conditions`` (none: always)."""

    conditions: tuple = ()

    @property
    def cacheable(self) -> bool:
        return all(c.cacheable for c in self.conditions)

    def holds(self, launch: LaunchValues) -> bool:
        return all(c.holds(launch) for c in self.conditions)

    def violation(self, launch: LaunchValues) -> str | None:
        for c in self.conditions:
            why = c.violation(launch)
            if why is not None:
                return why
        return None

    def names(self) -> set[str]:
        return set().union(*[c.names() for c in self.conditions])

    def substitute(self, replace: Callable[[str], Expr | None]) -> All:
        return All(tuple(c.substitute(replace) for c in self.conditions))

    def __str__(self) -> str:
        return " and ".join(f"({c})" for c in self.conditions) if self.conditions else "always"


@dataclass(frozen=True)
class ProgramsApart:
    """Distinct programs of the grid give distinct tuples of ``values`` (the program coordinates of an address,
    each an expression over the program ids), none negative: what lets ``Apart`` take a value a program computes
    (a swizzle: forms.ProgramValue) for a coordinate. Where a value reads a grid-stride loop's index (a persistent
    kernel's tile), distinct iterations of one program too. Evaluated over the whole grid on the host (up to
    MAX_PROGRAMS programs or iterations: a larger grid cannot be read, so it does not hold)."""

    values: tuple[Expr, ...]
    names_of: tuple[str, ...] = ()

    cacheable = True  # reads scalars and the grid only

    def holds(self, launch: LaunchValues) -> bool:
        return self.violation(launch) is None

    def violation(self, launch: LaunchValues) -> str | None:
        import torch

        try:
            every = launch.over_the_launch(Expr("tuple", self.values))
        except Unreadable as e:  # a grid too large to read program by program: not shown
            return f"{e} cannot be read program by program"
        ids = torch.stack(every.every_program, 1)  # one row per program (and iteration of a loop a value reads)
        loops = every.every_index or {}

        def program(row: int) -> str:
            return f"program {tuple(ids[row].tolist())}" + "".join(f" at {k} = {int(v[row])}" for k, v in loops.items())

        names = self.names_of or tuple(str(v) for v in self.values)
        columns = []
        for name, value in zip(names, self.values, strict=True):
            v = value.evaluate(every)
            v = v.to(torch.int64) if isinstance(v, torch.Tensor) else torch.full((len(ids),), int(v))
            if bool((v < 0).any()):
                return f"{program(int((v < 0).nonzero()[0]))} has {name} < 0"
            columns.append(v)
        rows = torch.stack(columns, 1)
        _, inverse, counts = torch.unique(rows, dim=0, return_inverse=True, return_counts=True)
        if bool((counts > 1).any()):
            first, second = (inverse == int((counts > 1).nonzero()[0])).nonzero()[:2, 0].tolist()
            both = (f"programs {tuple(ids[first].tolist())} and {tuple(ids[second].tolist())}" if not loops else
                    f"{program(first)} and {program(second)}")
            return f"{both} compute the same {', '.join(names)}: {tuple(rows[first].tolist())}"
        return None

    def names(self) -> set[str]:
        return set().union(*[v.names() for v in self.values])

    def substitute(self, replace: Callable[[str], Expr | None]) -> ProgramsApart:
        return ProgramsApart(tuple(v.substitute(replace) for v in self.values), self.names_of)

    def __str__(self) -> str:
        names = self.names_of or tuple(str(v) for v in self.values)
        return f"each program has its own {', '.join(names)} (none negative), over the whole grid"


class Condition(Protocol):
    """What a launch check is made of (the classes here; index_ranges.RangesApart)."""

    cacheable: bool  # reads scalars and the grid only: its verdict cached per launch shape

    def holds(self, launch: LaunchValues) -> bool: ...
    def violation(self, launch: LaunchValues) -> str | None: ...  # None: it holds; else what is wrong ("": no more)
    def names(self) -> set[str]: ...
    def substitute(self, replace: Callable[[str], Expr | None]) -> Condition: ...


@dataclass(frozen=True)
class LaunchCheck:
    """A condition on the launch's arguments under which the derived kernel is right; a launch where it is
    false is refused with ``construct`` and ``hint``. Where it cannot be evaluated (a value the launch does
    not give), ``fallback`` is refused if set, else the launch passes."""

    condition: Condition
    construct: str
    hint: str
    where: Origin | None
    fallback: str | None = None

    def failure(self, launch: LaunchValues) -> str | None:
        """What to refuse this launch for (None: it may run)."""
        try:
            why = self.condition.violation(launch)
        except Exception:  # a value it cannot read: what could be said without the launch
            return self.fallback
        return None if why is None else f"{self.construct}: {why}" if why else self.construct

    def __str__(self) -> str:
        at = f"line {self.where.line}: " if self.where is not None else ""
        return f"{at}{self.condition}"


def covers(coordinates: list[tuple[int, int]], bounds: list[tuple[tuple[int, ...], int]],
           dims: list[tuple[int, int]]) -> bool:
    """Whether ``sum(c_i * x_i)`` over ``0 <= x_i < extent_i``, where each bound's members' part stays within its
    limit, is exactly ``{sum(stride_j * y_j) : 0 <= y_j < size_j}`` for ``dims`` = ``(stride_j, size_j)`` (a sufficient
    test: both sides are brought to a canonical mixed-radix form and compared).

    A bound's members must chain as the digits of one number (each coefficient the last one times its extent),
    so that the bound cuts that number's range: ``pid * BLOCK + lane < n`` is the range ``[0, n)``."""
    if any(c <= 0 for c, e in coordinates if e > 1):
        return False
    coordinates = list(coordinates)
    bounded: set[int] = set()
    for members, limit in bounds:
        if limit < 0:  # no lane is left
            coordinates.append((1, 0))
            continue
        if bounded & set(members):
            return False
        bounded |= set(members)
        chain = sorted((i for i in members if coordinates[i][1] > 1), key=lambda i: coordinates[i][0])
        if not chain:
            continue
        c0, extent = coordinates[chain[0]][0], coordinates[chain[0]][1]
        for i in chain[1:]:
            if coordinates[i][0] != c0 * extent:
                return False
            extent *= coordinates[i][1]
        for i in chain:
            coordinates[i] = (0, 1)
        coordinates.append((c0, max(0, min(extent, limit // c0 + 1))))
    nothing, empty = any(e == 0 for _, e in coordinates), any(n == 0 for _, n in dims)
    if nothing or empty:
        return nothing and empty
    return _canonical(coordinates) == _canonical(dims)


def _canonical(dims: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """``(step, count)`` pairs in order of step, those of count 1 dropped, each pair whose step continues the
    previous one's span merged into it."""
    out: list[tuple[int, int]] = []
    for step, count in sorted((s, n) for s, n in dims if n > 1):
        if out and out[-1][0] * out[-1][1] == step:
            out[-1] = (out[-1][0], out[-1][1] * count)
        else:
            out.append((step, count))
    return out


def decided_now(condition: Condition) -> bool | None:
    """A condition's value where it reads no launch value (literal sizes), else None."""
    try:
        return condition.holds(LaunchValues({}, None))
    except Exception:  # a value only the launch gives
        return None


def apart(coordinates: list[tuple[int, int]], bounds: list[tuple[tuple[int, ...], int, list[int]]]) -> bool:
    """Whether ``sum(c_i * x_i)`` takes each value once (see :func:`apart_failure`)."""
    return apart_failure(coordinates, bounds) is None


def apart_failure(coordinates: list[tuple[int, int]], bounds: list[tuple[tuple[int, ...], int, list[int]]]
                  ) -> tuple[int, int, int, list[int]] | None:
    """None where ``sum(c_i * x_i)`` over ``0 <= x_i < extent_i`` takes each value once (a sufficient test).

    ``coordinates``: ``(c_i, extent_i)``; ``bounds``: ``(members, limit, coefficients)`` from the mask, saying
    that over the lanes that store, the members' part of the sum stays within ``limit`` (valid when the
    mask's own coefficients are positive). Taken in order of ``|c_i|``, each coordinate must step over
    everything the smaller ones can span; the first that does not: ``(i, |c_i|, the span, the smaller ones)``."""
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
            return i, abs(coordinates[i][0]), span, list(below)
        below.append(i)
    return None
