"""What a launch's memory gives the write strategies: the facts ``strategies.choose`` reads.

A write strategy (strategies.py) is a contract with two halves: the code it emits, and the facts
about the launch it needs. Facts about the kernel's addresses (lanes, programs and iterations apart,
the tensor covered) are conditions on the launch's scalars (analysis/conditions.py); the facts here are about the
gradient buffers themselves, read off their data pointers, sizes and strides:

- ``written``: a buffer already holds gradient (a later writer of one storage in an op, a caller's
  ``bwd[grid]`` buffer): its adjoints are added, never stored over it.
- ``shared``: a buffer overlaps another differentiated input's (``rmsnorm(x, x[0])``, tied weights,
  ``matmul(x, x.t())``, attention with K = V): two inputs' writes would meet in one kernel, so each such
  input's gradient is written into a buffer of its own and added after the kernels, in a fixed order.
  Views that do not overlap (column slices of packed QKV) are not shared: the test is exact for them.
- ``self_overlapping``: a buffer reaches one element from several positions (a stride-0, expanded
  tensor): only atomic additions are right there.

The overlap test (:func:`overlap`) is exact where it can be decided within a small budget (a bounded
linear Diophantine problem over the two layouts' coordinates, in bytes), and says "overlap" otherwise,
which only costs speed. Its verdicts are cached per pair of layouts and their relative offset.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..analysis.conditions import apart
from ..analysis.launch_values import LaunchValues
from ..core.device import address

BUDGET = 4096  # search steps per overlap question before it answers "may overlap"


@dataclass(frozen=True)
class Layout:
    """Where a tensor's elements lie: the first one's address in bytes (within ``region``: memory that no
    other region's addresses meet), the element size, and the sizes and strides (in elements)."""

    region: Any  # a storage key; None: one address space (data pointers)
    address: int
    itemsize: int
    size: tuple[int, ...]
    stride: tuple[int, ...]

    @staticmethod
    def of(t: Any) -> Layout:
        """A tensor's layout, or a replay's ``View`` (storage key, offset in elements)."""
        if hasattr(t, "data_ptr"):
            return Layout(*address(t), t.element_size(), tuple(t.shape), tuple(t.stride()))
        return Layout(t.key or id(t), t.offset * t.dtype.itemsize, t.dtype.itemsize, tuple(t.size), tuple(t.stride))

    @property
    def empty(self) -> bool:
        return 0 in self.size

    @property
    def span(self) -> tuple[int, int]:
        """The bytes [lo, hi) its elements lie within."""
        lo = hi = self.address
        for n, s in zip(self.size, self.stride, strict=True):
            step = (n - 1) * s * self.itemsize
            lo, hi = (lo + step, hi) if step < 0 else (lo, hi + step)
        return lo, hi + self.itemsize


def overlap(a: Layout, b: Layout) -> bool:
    """Whether two layouts share a byte (exact where decided within :data:`BUDGET` steps, else True)."""
    if a.empty or b.empty or a.region != b.region:
        return False
    (lo_a, hi_a), (lo_b, hi_b) = a.span, b.span
    if hi_a <= lo_b or hi_b <= lo_a:
        return False
    shift = a.address - b.address
    return _meet(a.itemsize, a.size, a.stride, b.itemsize, b.size, b.stride, shift)


@functools.lru_cache(maxsize=4096)
def _meet(item_a: int, size_a: tuple, stride_a: tuple, item_b: int, size_b: tuple, stride_b: tuple,
          shift: int) -> bool:
    """Whether ``shift + sum(a_i x_i) + s == sum(b_j y_j) + t`` for coordinates within their sizes and bytes
    ``s < item_a``, ``t < item_b``: every term brought to a positive coefficient and a range starting at 0,
    then a bounded subset sum (:func:`_reachable`)."""
    terms, target = [], -shift  # sum(a x) + s - sum(b y) - t = -shift
    for n, s in zip(size_a, stride_a, strict=True):
        c = s * item_a
        if n > 1 and c:
            if c < 0:  # x -> n - 1 - x
                target -= c * (n - 1)
                c = -c
            terms.append((c, n - 1))
    terms.append((1, item_a - 1))
    for n, s in zip(size_b, stride_b, strict=True):
        c = -s * item_b
        if n > 1 and c:
            if c < 0:
                target -= c * (n - 1)
                c = -c
            terms.append((c, n - 1))
    target += item_b - 1  # -t -> t' - (item_b - 1)
    terms.append((1, item_b - 1))
    found = _reachable(tuple(terms), target)
    return True if found is None else found


def _reachable(terms: tuple[tuple[int, int], ...], target: int) -> bool | None:
    """Whether ``sum(c_k z_k) == target`` for some ``0 <= z_k <= u_k`` (``terms``: ``(c_k, u_k)``, c_k > 0);
    None where the search would take more than :data:`BUDGET` steps."""
    merged: dict[int, int] = {}
    for c, u in terms:  # equal coefficients add their ranges: z1 + z2 takes every value in [0, u1 + u2]
        if u > 0:
            merged[c] = merged.get(c, 0) + u
    ordered = sorted(merged.items(), reverse=True)  # largest coefficient first: few values of it to try
    tops = [0] * (len(ordered) + 1)  # tops[k]: the largest sum of the terms from k on
    for k in range(len(ordered) - 1, -1, -1):
        tops[k] = tops[k + 1] + ordered[k][0] * ordered[k][1]
    dense = [_dense(ordered[k:]) for k in range(len(ordered))] + [True]
    gcds = [math.gcd(*[c for c, _ in ordered[k:]]) if k < len(ordered) else 0 for k in range(len(ordered) + 1)]
    steps = 0

    @functools.cache
    def search(k: int, rest: int) -> bool:
        nonlocal steps
        steps += 1
        if steps > BUDGET:
            raise _Undecided
        if rest < 0 or rest > tops[k]:
            return False
        if k == len(ordered):
            return rest == 0
        if rest % gcds[k]:
            return False
        if dense[k]:  # every multiple of the gcd up to the top is a sum
            return True
        c, u = ordered[k]
        low = max(0, -(-(rest - tops[k + 1]) // c))
        return any(search(k + 1, rest - c * z) for z in range(min(u, rest // c), low - 1, -1))

    try:
        return search(0, target)
    except _Undecided:
        return None


class _Undecided(Exception):
    pass


def _dense(terms: list[tuple[int, int]]) -> bool:
    """Whether the sums of ``terms`` take every multiple of their gcd from 0 to their largest: in order of
    coefficient, each step at most one past what the smaller ones span."""
    if not terms:
        return True
    g = math.gcd(*[c for c, _ in terms])
    span = 0
    for c, u in sorted(terms):
        if c // g > span + 1:
            return False
        span += (c // g) * u
    return True


def self_overlapping(layout: Layout) -> bool:
    """Whether two positions of one layout reach one element (an expanded, stride-0 tensor)."""
    return _self_overlapping(layout.size, layout.stride)


@functools.lru_cache(maxsize=4096)
def _self_overlapping(size: tuple, stride: tuple) -> bool:
    if 0 in size:
        return False
    coordinates = [(s, n) for n, s in zip(size, stride, strict=True) if n > 1]
    if apart(coordinates, []):
        return False
    if math.prod(n for _, n in coordinates) <= 1 << 16:  # small: count the distinct addresses
        addresses = {0}
        for s, n in coordinates:
            addresses = {a + s * i for a in addresses for i in range(n)}
        return len(addresses) < math.prod(n for _, n in coordinates)
    return True


@dataclass(frozen=True)
class LaunchFacts:
    """Everything a launch gives the choice of write strategy: its scalars and grid (``values``, which the
    write strategies' conditions read), its gradient buffers' facts (see the module's docstring), how many
    programs fill the device (``parallel``), how many bytes partial rows may take (``row_budget``), how many
    programs a persistent kernel may run along an axis (``persistent_programs``: each keeps a partial row) and
    whether loads' adjoints may be kept per program and added after the kernel (``later_adds``: not in a backward
    recorded to be differentiated again, whose derivation cannot read tg.add_later's slots), or stored at addresses
    that follow a program id through a loop's range (``stores_through_ranges``: not there either, whose derivation
    refuses such a store, analysis/stores.py: causal attention's dK and dV with one program of queries)."""

    values: LaunchValues
    written: frozenset[str] = frozenset()
    shared: frozenset[str] = frozenset()
    self_overlapping: frozenset[str] = frozenset()
    parallel: int = 1
    row_budget: int | None = None
    persistent_programs: int = 8
    later_adds: bool = True
    stores_through_ranges: bool = True

    @property
    def memory(self) -> tuple[frozenset[str], frozenset[str], frozenset[str]]:
        """The buffer facts (what a choice cached per launch shape is keyed on, beside the scalars)."""
        return self.written, self.shared, self.self_overlapping


def buffer_facts(buffers: Mapping[str, Any]) -> tuple[frozenset[str], frozenset[str]]:
    """``(shared, self_overlapping)`` of gradient buffers (tensors or replay Views) by input name."""
    layouts = {p: Layout.of(t) for p, t in buffers.items() if t is not None and _is_memory(t)}
    spans = {p: layout.span for p, layout in layouts.items()}
    names = list(layouts)
    shared = set()
    for i, p in enumerate(names):
        for q in names[i + 1:]:  # distinct allocations: their spans are apart, decided here
            if spans[p][0] < spans[q][1] and spans[q][0] < spans[p][1] and overlap(layouts[p], layouts[q]):
                shared |= {p, q}
    return frozenset(shared), frozenset(p for p, lay in layouts.items() if _self_overlapping(lay.size, lay.stride))


def _is_memory(t: Any) -> bool:
    return hasattr(t, "data_ptr") or hasattr(t, "key")


FACTS = (
    "the gradient buffers of the differentiated inputs do not overlap one another (else each input that "
    "overlaps another is written into a buffer of its own, added after the kernels in a fixed order)",
    "no gradient buffer reaches one element from two positions, as an expanded (stride-0) tensor does (else "
    "its gradient is added atomically)",
    "a buffer holding gradient already (an earlier writer of the same memory, a caller's buffer) is added "
    "to, never stored over",
)
