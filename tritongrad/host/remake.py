"""Buffers a backward reads that the forward's launches made (``Plan.inner_saved``: an RMSNorm's rstd, a layer norm's
mean and rstd), made again for a backward differentiated again.

Their values depend on the op's inputs, but autograd cannot see how. Run as an op (autograd_function.backward_as_op),
the backward first runs again the launches that made them, on fresh buffers, from what the op kept: the op's launch
record then records those launches before the derived kernels that read their results, and its backward differentiates
through both (an rstd's dependence on x through the forward kernel's own derived kernel). Nothing more is kept for a
first-order backward: a tensor those launches read that the op did not keep (no derived kernel reads it,
``Plan.unused``: a layer norm's bias) is a zero-filled stand-in where what they store for the backward is not
computed from it (analysis/dependence.py); else the double backward is refused naming it. Each buffer made again is
compared with the one the forward made (a stand-in's or a fresh buffer's contents that mattered would show there).
"""

from __future__ import annotations

from typing import Any

import torch

from ..core.bounded import Bounded
from ..core.errors import OpError
from ..runtime.derivation import hashable, specialization
from ..runtime.summary import stored_from_in
from .hooks import Launches
from .launch_record import current_record
from .shadows import LaunchPlan, View

_computed_from: dict[tuple, frozenset[str] | None] = Bounded(256)  # (kernel, constexprs, sinks) -> parameters


class Remake:
    """The launches to run again, each with the saved slot of every tensor it reads that the op kept; and per buffer
    made again, its saved slot and where a launch passed it."""

    def __init__(self, name: str, steps: list[tuple[Any, LaunchPlan, dict[str, int]]],
                 made: dict[int, tuple[LaunchPlan, str]]):
        self.name, self.steps, self.made = name, steps, made
        self.spans: dict[int, tuple[int, int]] = {}  # storage key -> the elements [lo, hi) its fresh buffer holds
        for _, lp, kept in steps:
            for p, v in lp.views.items():
                if p not in kept:
                    lo, hi = self.spans.get(v.key, v.span)
                    self.spans[v.key] = (min(lo, v.span[0]), max(hi, v.span[1]))

    @staticmethod
    def of(record: Any, saved: tuple, made: list[int]) -> Remake | str:
        """How to make the saved slots ``made`` again from the other saved tensors, or why they cannot be."""
        plan = record.plan
        replay = getattr(record, "replay", None)  # (a replayed call: replay.py's FastRecord)
        recorded = replay.recorded if replay is not None else record.launches
        passed: dict[int, tuple[LaunchPlan, str]] = {}  # saved slot -> a launch and parameter it was passed to
        for lp in plan.launches:
            for p, j in (*lp.slots.items(), *lp.as_left.items()):
                if j is not None:
                    passed.setdefault(j, (lp, p))
        keys: set[int] = set()
        for j in made:
            lp, p = passed[j]
            key = lp.views[p].key
            if j in lp.as_left.values() or any(m.views[q].key == key for m in plan.launches[lp.index + 1:]
                                               for q in m.params("stores")):
                return (f"its backward reads `{p}` of {lp} as it was before a later launch changed it (a copy the "
                        "op took), which the double backward does not yet make again")
            keys.add(key)
        wanted = set(keys)
        steps = []
        for lp in reversed(plan.launches):  # the launches writing what is needed, and what they read, newest first
            sinks = [p for p in lp.params("stores") if lp.views[p].key in wanted]
            if not sinks:
                continue
            launch = recorded[lp.index]
            why = _not_run_again(lp, launch, sinks)
            if why:
                return f"its backward reads `{sinks[0]}`, which {lp} wrote, {why}"
            steps.append((launch, lp, sinks))
            wanted.update(lp.views[p].key for p in lp.params("loads") if lp.views[p].key)
        steps.reverse()
        written: set[int] = set()
        found = []
        for launch, lp, sinks in steps:
            kept = {}
            for p, v in lp.views.items():
                if v.key in written or p in lp.params("stores"):
                    continue  # a fresh buffer
                slot = lp.slots.get(p)
                if slot is not None and slot not in plan.unused and slot not in made:
                    kept[p] = slot
                elif p in _computed_from_params(launch, sinks):
                    return (f"its backward reads `{sinks[0]}`, which {lp} computed from `{p}`, a tensor the op does "
                            "not keep (its first-order backward does not read it), so the double backward cannot "
                            "make it again")
            written.update(lp.views[p].key for p in lp.params("stores"))
            found.append((launch, lp, kept))
        missing = keys - written
        if missing:
            j = next(j for j in made if passed[j][0].views[passed[j][1]].key in missing)
            return (f"its backward reads `{passed[j][1]}` of {passed[j][0]}, a buffer the host function made with "
                    "PyTorch operations (not a launch), whose dependence on the inputs autograd does not see")
        return Remake(record.name, found, {j: passed[j] for j in made})

    def __call__(self, saved: tuple) -> tuple:
        """``saved`` with each buffer made again: the launches run again (recorded by the launch record of the op the
        backward runs as) on fresh buffers, and on zero-filled stand-ins for what the op did not keep."""
        buffers: dict[int, torch.Tensor] = {}
        launches, written = current_record.get(), set()
        for launch, lp, kept in self.steps:
            named = launch.info.launch_arguments(launch.args, launch.kwargs)
            for p, v in lp.views.items():
                named[p] = saved[kept[p]] if p in kept else self._fresh(buffers, v)
                if p not in kept and v.key not in written and type(launches) is Launches:  # a stand-in: in forward
                    launches.constants.add(id(named[p]))  # mode its tangent is zero (ops/forward_mode.py)
            written.update(lp.views[p].key for p in lp.params("stores"))
            launch.kernel[launch.grid](**named)
        result = list(saved)
        with torch._C.DisableTorchFunction():  # (not a use of what the launches wrote: segments.py)
            for j, (lp, p) in self.made.items():
                result[j] = self._fresh(buffers, lp.views[p])
                if not torch.equal(result[j], saved[j]):
                    raise OpError(f"tritongrad.op `{self.name}`: made again for the double backward, `{p}` of {lp} "
                                  "holds other values than the forward's launch left there (the launch is not "
                                  "deterministic, or it reads what the host function put in the buffer first); "
                                  "differentiate once, or compute the second derivative another way")
        return tuple(result)

    def _fresh(self, buffers: dict[int, torch.Tensor], v: View) -> torch.Tensor:
        """A view of its storage's fresh zero-filled buffer, laid out as the launch's tensor was."""
        lo, hi = self.spans[v.key]
        buffer = buffers.get(v.key)
        if buffer is None:
            buffer = buffers[v.key] = torch.zeros(max(hi - lo, 1), dtype=v.dtype, device=v.device)
        return buffer.as_strided(v.size, v.stride, v.offset - lo)


def _not_run_again(lp: LaunchPlan, launch: Any, sinks: list[str]) -> str:
    """Why a launch cannot run again on fresh buffers ('' where it can)."""
    roles = lp.info.roles
    if roles is None:
        return "a kernel tritongrad cannot read"
    if roles.in_place & set(lp.views) or lp.as_left:
        return "a launch updating a tensor in place, which the double backward does not yet run again"
    if any(p not in roles.overwrites for p in sinks):
        return "adding atomically to what was there before, which the double backward does not yet make again"
    if hasattr(launch.kernel, "tg_source"):
        return "a launch passing host tensor descriptors or one buffer to two pointers, not yet run again"
    return ""


def _computed_from_params(launch: Any, sinks: list[str]) -> frozenset[str]:
    """The parameters what the launch stores through ``sinks`` is computed from (all of them where the kernel cannot
    be read), in the specialization it ran."""
    kernel, info = launch.kernel, launch.info
    named = info.with_defaults(launch.args, launch.kwargs)
    values = specialization(kernel, named)
    key = (kernel.fn, tuple((k, hashable(v)) for k, v in values.items()), tuple(sorted(sinks)))
    found = _computed_from.get(key)
    if found is None:
        try:
            found = stored_from_in(kernel, values, sinks)
        except Exception:  # (not readable: everything it reads counts)
            found = frozenset(info.params)
        _computed_from[key] = found
    return found
