"""Launch conditions that read the index tensors a launch passes: stores at addresses computed from loaded indices
(``dst = tl.load(perm + row)``, ``start = tl.load(cu_seqlens + pid)``). Each program's range of addresses, read off
the indices (a loop over ``range(start, end, BLOCK)`` included: its trip count per program), must not meet
another's nor leave the output's elements. They read tensor contents, so they run on every launch (on the device: a
strided view of the indices, a sort, one sync), never cached."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .conditions import Apart, apart
from .launch_values import Expr, LaunchValues, Unreadable


@dataclass(frozen=True)
class IndexRead:
    """A scalar each program loads from an index tensor: ``param[offset + stride * p]`` for program ``p``."""

    name: str
    param: str
    offset: Expr
    stride: Expr

    def values(self, launch: LaunchValues, programs: int) -> Any:
        """The values the launch's programs load (a strided view of the tensor passed as ``param``)."""
        import torch

        tensor = launch.value(self.param)
        if not isinstance(tensor, torch.Tensor) or tensor.dtype.is_floating_point:
            raise Unreadable(self.param)
        offset, stride = self.offset.evaluate(launch), self.stride.evaluate(launch)
        return torch.as_strided(tensor, (programs,), (stride,), tensor.storage_offset() + offset).to(torch.int64)

    def __str__(self) -> str:
        stride, offset = str(self.stride), str(self.offset)
        at = "p" if stride == "1" else "" if stride == "0" else f"{stride} * p"
        at = " + ".join(x for x in (offset if offset != "0" else "", at) if x) or "0"
        return f"`{self.name}` = {self.param}[{at}]"


@dataclass(frozen=True)
class StoreRange:
    """The addresses one store writes in program ``p``: ``base + pid_stride * p`` (``base`` may read the
    loaded indices) plus ``sum(c_i * x_i)`` over its other coordinates, as in :class:`Apart`."""

    base: Expr
    pid_stride: Expr
    rest: Apart
    index: tuple[str, Expr] | None = None  # (name, c): base is c * that one loaded index, plus what reads none

    def bounds_of(self, launch: LaunchValues, programs: int) -> tuple[Any, Any, Any]:
        """Per program: the lowest and highest address, and whether it stores at all (mask bounds
        may differ program by program: ``cols < end - start``)."""
        import torch

        pids = torch.arange(programs)
        base = self.base.evaluate(launch) + self.pid_stride.evaluate(launch) * pids
        coordinates = [(c.evaluate(launch), e.evaluate(launch)) for c, e in self.rest.coordinates]
        if any(hasattr(c, "clamp") for c, _ in coordinates):
            raise Unreadable("a stride read from the indices")
        extents = [torch.as_tensor(e, dtype=torch.int64).expand(programs).clone() for _, e in coordinates]
        groups = []
        for members, limit, coefficients in self.rest.bounds:
            limit = torch.as_tensor(limit.evaluate(launch), dtype=torch.int64).expand(programs)
            if all(c.evaluate(launch) > 0 for c in coefficients):
                for j in members:
                    c = abs(coordinates[j][0])
                    if c:
                        extents[j] = extents[j].minimum(limit // c + 1).clamp(min=0)
                groups.append((members, limit))
        low = torch.zeros(programs, dtype=torch.int64)
        high = torch.zeros(programs, dtype=torch.int64)
        grouped: set[int] = set()
        for members, limit in groups:  # a bounded sum of positive terms: within its limit
            if grouped & set(members) or any(coordinates[j][0] < 0 for j in members):
                continue
            grouped |= set(members)
            spans = sum(coordinates[j][0] * (extents[j] - 1).clamp(min=0) for j in members)
            high += spans.minimum(limit.clamp(min=0))
        for j, (c, _) in enumerate(coordinates):
            if j not in grouped:
                span = c * (extents[j] - 1).clamp(min=0)
                low += span.clamp(max=0)
                high += span.clamp(min=0)
        stores = torch.ones(programs, dtype=torch.bool)
        for e in extents:
            stores &= e > 0
        return base + low, base + high, stores


def _last_element(tensor: Any) -> int | None:
    """The largest offset from its first element a tensor's elements reach (-1: none; None: not a tensor)."""
    import torch

    if not isinstance(tensor, torch.Tensor):
        return None
    return sum((n - 1) * s for n, s in zip(tensor.shape, tensor.stride(), strict=True)) if tensor.numel() else -1


@dataclass(frozen=True)
class RangesApart:
    """Programs along ``axis`` write disjoint ranges of ``output``, within its elements, where the addresses of its
    stores (``ranges``, each program's hull over all of them) come from indices loaded per program (``reads``).
    Each store's own lanes are apart by its :class:`Apart` check; this one reads the index tensors, on
    the device: a strided view of each, the ranges sorted, one sync for the verdict."""

    output: str
    axis: int
    reads: tuple[IndexRead, ...]
    ranges: tuple[StoreRange, ...]

    cacheable = False  # reads tensor contents, which change between launches

    def violation(self, launch: LaunchValues) -> str | None:
        import torch

        programs = launch.programs(self.axis)
        needed = set().union(*[e.names() for r in self.ranges for e in (r.base, r.pid_stride)],
                             *[r.rest.names() for r in self.ranges])
        reads = [r for r in self.reads if r.name in needed]
        values = {r.name: r.values(launch, programs) for r in reads}
        device = next(iter(values.values())).device if values else "cpu"
        with torch.device(device):
            at = LaunchValues({**launch.arguments, **values}, launch.grid)
            hulls = [r.bounds_of(at, programs) for r in self.ranges]
        big = torch.iinfo(torch.int64).max
        low = torch.stack([torch.where(s, lo, big) for lo, _, s in hulls]).amin(0)
        high = torch.stack([torch.where(s, hi, -big) for _, hi, s in hulls]).amax(0)
        order = torch.argsort(low)
        stores = low[order] != big
        clash = (low[order][1:] <= high[order][:-1]) & stores[1:]
        last = _last_element(launch.arguments.get(self.output))
        outside = (low != big) & ((low < 0) | (high > last)) if last is not None else torch.zeros_like(low, dtype=bool)
        clashing, out = torch.stack((clash.any(), outside.any())).tolist()  # the one sync

        def element(r: IndexRead, program: int) -> str:
            return f"{r.param}[{int(r.offset.evaluate(launch) + r.stride.evaluate(launch) * program)}]"

        def loaded(*programs: int) -> str:
            return "; ".join(f"`{r.name}` = " + " and ".join(f"{element(r, p)} = {int(values[r.name][p])}"
                                                           for p in programs) for r in reads)

        if out:  # the backward would read and write past the gradient buffers: refused, apart or not
            p = int(outside.nonzero()[0, 0])
            return (f"program {p} (along axis {self.axis}) writes elements {int(low[p])}..{int(high[p])} of "
                    f"`{self.output}`, outside its elements 0..{last}: {loaded(p)}")
        if not clashing:
            return None
        duplicate = self._distinct_indices_apart(at, values, programs)
        if duplicate is None:  # ranges interleave (blocks of columns), but distinct indices keep them apart
            return None
        if duplicate:
            p, q = duplicate
        else:
            k = int(clash.nonzero()[0, 0])
            p, q = sorted((int(order[k]), int(order[k + 1])))
        return (f"programs {p} and {q} (along axis {self.axis}) write overlapping elements of `{self.output}` "
                f"({int(low[p])}..{int(high[p])} and {int(low[q])}..{int(high[q])}): {loaded(p, q)}")

    def _distinct_indices_apart(self, at: LaunchValues, values: dict, programs: int) -> tuple[int, ...] | None:
        """For one store at ``coefficient * index + rest``: None if the programs' indices are distinct and
        ``apart`` holds with the index as one more coordinate (spanning its values); else two programs
        loading one index, if any, or ``()``."""
        if len(self.ranges) != 1 or self.ranges[0].index is None or not programs:
            return ()
        import torch

        store = self.ranges[0]
        name, coefficient = store.index
        v = values[name]
        order = torch.argsort(v)
        same = (v[order][1:] == v[order][:-1]).nonzero()
        if len(same):
            k = int(same[0, 0])
            return tuple(sorted((int(order[k]), int(order[k + 1]))))
        try:
            coordinates = [(int(c.evaluate(at)), int(e.evaluate(at))) for c, e in store.rest.coordinates]
            bounds = [(members, int(limit.evaluate(at)), [int(c.evaluate(at)) for c in cs])
                      for members, limit, cs in store.rest.bounds]
            coordinates += [(int(coefficient.evaluate(at)), int(v.max() - v.min()) + 1)]
            if int(store.pid_stride.evaluate(at)):
                coordinates.append((int(store.pid_stride.evaluate(at)), programs))
        except (TypeError, ValueError, RuntimeError, Unreadable):  # a bound read from the indices: no verdict
            return ()
        return None if apart(coordinates, bounds) else ()

    def holds(self, launch: LaunchValues) -> bool:
        return self.violation(launch) is None

    def names(self) -> set[str]:
        exprs = [e for r in self.reads for e in (r.offset, r.stride)]
        exprs += [e for r in self.ranges for e in (r.base, r.pid_stride)]
        return set().union(*[e.names() for e in exprs], *[r.rest.names() for r in self.ranges], {
            r.param for r in self.reads}) - {r.name for r in self.reads}

    def substitute(self, replace: Callable[[str], Expr | None]) -> RangesApart:
        reads = tuple(IndexRead(r.name, r.param, r.offset.substitute(replace), r.stride.substitute(replace))
                      for r in self.reads)
        ranges = tuple(StoreRange(r.base.substitute(replace), r.pid_stride.substitute(replace),
                                  r.rest.substitute(replace),
                                  r.index and (r.index[0], r.index[1].substitute(replace))) for r in self.ranges)
        return RangesApart(self.output, self.axis, reads, ranges)

    def __str__(self) -> str:
        reads = ", ".join(str(r) for r in self.reads)
        return (f"programs p along axis {self.axis} write disjoint ranges of `{self.output}` "
                f"(read at each launch: {reads})")
