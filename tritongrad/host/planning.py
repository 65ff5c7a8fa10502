"""A new kind of call, checked and planned once, when its launch record closes (``LaunchRecord.close``).

The checks: hazards (a launch overwriting memory an earlier launch, or the same launch through another
argument, read; a ``tl.store`` over what an earlier launch wrote), writes to tensors that require grad,
outputs (tensors the op's launches wrote, not its arguments), and for named ops the origins of what launches
read (arguments, or buffers earlier launches wrote). The plan (``shadows.Plan``): each launch's tensor
parameters and saved-tensor slots, the tensors to differentiate, and the shadows' storages and spans.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ..analysis.in_place import as_left_param
from ..core.errors import OpError, noted
from .call_tensors import CallTensors
from .shadows import LaunchPlan, Plan, View, whole_storages

_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


class Planner:
    """The checks and plan of one new kind of call of the op ``name``. ``launches``: the launch record's recorded
    launches (launch_record.RecordedLaunch); ``segmented``: the record is a segment of a bare op (ops/segments.py),
    whose launches may update a tensor that requires grad in place and whose outputs may be its arguments."""

    def __init__(self, name: str, launches: Sequence[Any], segmented: bool):
        self.name, self.launches, self.segmented = name, launches, segmented

    def error(self, message: str) -> OpError:
        return OpError(f"tritongrad.op `{self.name}`: {message}")

    def plan(self, key: tuple, tensors: CallTensors, outputs: tuple, arguments: dict[str, int]) -> Plan:
        """Check a call whose key is new, and lay out its backward. ``arguments``: the op's
        tensor arguments by name, as positions among the call's tensors."""
        patterns, n_outputs, passed, _, diff, _ = key
        outs = passed[:n_outputs]
        read: dict[int, list[tuple[LaunchPlan, str, View]]] = {}  # storage key -> reads so far
        written: dict[int, list[tuple[LaunchPlan, str, View]]] = {}  # storage key -> writes so far
        slots: dict[int, int] = {}  # tensor position -> index in the saved tensors
        found: dict[int, None] = {}  # positions of the differentiable inputs, in order
        launches = []
        params_of: dict[LaunchPlan, dict[str, int]] = {}  # per launch: tensor parameter -> position
        later = {(k, p): i for *_, earlier in patterns for k, p, i in earlier}  # reads a later launch overwrote
        for launch, (_, positions, names, snapshots, _) in zip(self.launches, patterns, strict=True):
            n = len(positions) - len(names)
            named, _ = launch.info.named_arguments(positions[:n], dict(zip(names, positions[n:], strict=True)))
            params = {p: i for p, i in named.items() if i is not None}  # tensor parameter -> position
            checked = LaunchPlan(launch.info, launch.index, {p: tensors.view(i) for p, i in params.items()})
            launches.append(checked)
            params_of[checked] = params
            known = checked.info.roles is not None
            if known:
                self._hazards(checked, read, written)
            elif any(tensors.requires_grad(i) for i in params.values()):  # (what it reads and writes is unknown)
                raise noted(launch.info.error, f"(needed to differentiate {checked} of tritongrad.op "
                             f"`{self.name}`: a tensor it is passed requires grad)")
            loads, stores = set(checked.params("loads")), set(checked.params("stores"))
            copies = dict(snapshots)  # in place: the launch read the copy taken before it ran
            # in place without a copy: what its loads read, no store changed (launch_record.py): read as it left it
            as_left = set(checked.info.roles.in_place) - set(copies) if known else set()
            copies.update({p: i for (k, p), i in later.items() if k == launch.index})  # before a later one did
            for p, i in params.items():
                in_place = p in copies or p in as_left
                if known and p in stores and tensors.requires_grad(i) and not (in_place and self.segmented):
                    raise self.error(f"{checked} writes to `{p}`, a tensor that requires grad (an input of the op?); "
                                     "kernels of an op may write only to buffers the op allocates"
                                     + (" (torch.library registers autograd for functional operators only, so a "
                                        "named op may not update its arguments; a bare @tritongrad.op may update such "
                                        "a tensor in place)" if in_place else ""))
                if p in copies:
                    checked.slots[p] = slots.setdefault(copies[p], len(slots))
                    if diff is None and tensors.requires_grad(i) and checked.views[p].dtype.is_floating_point:
                        found.setdefault(i)
                    continue
                if p in loads:
                    slots.setdefault(i, len(slots))
                    if diff is None and tensors.requires_grad(i) and checked.views[p].dtype.is_floating_point:
                        found.setdefault(i)
                checked.slots[p] = slots.get(i)  # saved slot, or None: written only, never read back
            for p in checked.params("reloaded") if known else ():  # read back what it stored: the tensor as it
                name = as_left_param(p, launch.info.params)  # left it, or the copy taken before a later launch wrote it
                checked.as_left[name] = slots.setdefault(later.get((launch.index, name), params[p]), len(slots))
                if (launch.index, name) not in later:
                    read.setdefault(checked.views[p].key, []).append((checked, name, checked.views[p]))
            for p in stores:
                written.setdefault(checked.views[p].key, []).append((checked, p, checked.views[p]))
            if known:  # unknown roles: hazards are not checked (the launch fails if it needs a backward)
                for p in loads - set(copies):  # (what an in-place launch read is in its copy)
                    read.setdefault(checked.views[p].key, []).append((checked, p, checked.views[p]))
        for checked in launches:  # outputs whose values the backward reads back: saved, unless written again
            roles = checked.info.roles
            # a statistic only from an output at least as wide as float32 and as the floats the launch reads (the
            # type it computes in, as far as the record can tell: a float64 input's statistic in float32 is rounded)
            widest = max([4, *(v.dtype.itemsize for p, v in checked.views.items()
                               if p in roles.loads and v.dtype.is_floating_point)]) if roles is not None else 8
            for p in (roles.read_back | roles.read_back_exact) & set(checked.views) if roles is not None else ():
                key, dtype = checked.views[p].key, checked.views[p].dtype
                exact = dtype in (torch.float32, torch.float64) and dtype.itemsize >= widest
                if (written[key][-1][0] is checked and checked.slots.get(p) is None
                        and (exact if p in roles.read_back_exact else dtype in _FLOATS)):
                    checked.slots[p] = slots.setdefault(params_of[checked][p], len(slots))
                    checked.kept = checked.kept | {p}
        self._check_outputs(outputs, outs, arguments, tensors, written)
        if self.segmented and diff is None:  # a written buffer that has a history: written in place only (other
            # writes refused above), each launch's backward zeroes the shadow where it stored and adds what it
            # loaded, so the shadow is then its old values' gradient, which goes to that history (ops/segments.py)
            found.update(dict.fromkeys(i for i, out in zip(outs, outputs, strict=True) if tensors.requires_grad(i)
                                       and tensors.view(i).dtype.is_floating_point and out._base is None))
            # (not a view of one returned: its node's output too, ops/segments.py; the buffer's gradient covers it)
        if diff is None:
            diff = tuple(found)
        else:
            self._check_origins(launches, tuple(arguments.values()), tensors, written)
        input_views = [tensors.view(i) for i in diff]
        output_views = [tensors.view(i) for i in outs]
        views = [v for launch in launches for v in launch.views.values()] + output_views + input_views
        storages = self._storages(views)
        constants = tuple(i for i, v in enumerate(output_views) if not v.dtype.is_floating_point)
        loaded = [launch.views[p] for launch in launches for p in launch.params("loads")]
        unread = tuple(name for name, i in arguments.items() if tensors.requires_grad(i) and tensors.view(i).key
                       and not any(tensors.view(i).overlaps(v) for v in loaded))  # (key 0: no element to read)
        return Plan(tuple(launches), tuple(slots), diff, tuple(input_views), tuple(output_views), storages,
                    whole_storages(storages, views), constants, unread)

    def _hazards(self, launch: LaunchPlan, read: dict, written: dict) -> None:
        """Refuse what recomputing the launches against final memory would get wrong."""
        for p in launch.params("stores"):
            v = launch.views[p]
            for q in launch.params("loads"):
                if q != p and launch.views[q].overlaps(v):
                    raise self._hazard(launch, q, "reads", launch, p)
            for other, q, u in read.get(v.key, ()):
                if u.overlaps(v):
                    raise self._hazard(other, q, "reads", launch, p)
            if p in launch.info.roles.overwrites and p not in launch.info.roles.in_place:  # (tl.atomic_add onto
                # earlier results accumulates; an in-place update reads them, and its backward passes their gradient)
                for other, q, u in written.get(v.key, ()):
                    if u.overlaps(v):
                        raise self._hazard(other, q, "writes", launch, p)

    def _hazard(self, first: LaunchPlan, p: str, verb: str, second: LaunchPlan, q: str) -> OpError:
        why = ("the backward recomputes each launch against memory as the op left it, so it would read the new values"
               if verb == "reads" else f"the backward of {first} would take the gradient of what {second} wrote")
        return self.error(f"{second} overwrites `{q}`, memory that {first} {verb} through `{p}`: {why}. Write to a "
                          "fresh buffer instead")

    def _check_outputs(self, outputs: tuple, outs: tuple, arguments: dict[str, int], tensors: CallTensors,
                       written: dict) -> None:
        for i, (out, position) in enumerate(zip(outputs, outs, strict=True)):
            if position is None:
                raise self.error(f"output #{i} is a {type(out).__name__}; an op returns tensors (a named op a tensor "
                                 "or a tuple of them; a bare @tritongrad.op also lists, tuples and dicts of them)")
            v = tensors.view(position)
            for name, arg in arguments.items():  # (a bare op's segments may update an argument in place: dirty)
                if v.key and v.key == tensors.view(arg).key and not self.segmented:
                    raise self.error(f"output #{i} shares memory with the argument `{name}` (it is that argument "
                                     "or a view of it); an op must return tensors it allocates")
            if v.key and v.key not in written:
                raise self.error(f"output #{i} was not written by any kernel launch of the op (made by a PyTorch "
                                 "operation?); a named op's autograd formula covers its kernels only: compute it "
                                 "with a kernel, or outside the op (a bare @tritongrad.op takes PyTorch operations "
                                 "on its launches' results)")

    def _check_origins(self, launches: list[LaunchPlan], args: tuple, tensors: CallTensors, written: dict) -> None:
        """Named ops run below autograd: a tensor made from the inputs by PyTorch inside would be a silent constant."""
        known = {tensors.view(i).key for i in args} | set(written)
        for launch in launches:
            for p in launch.params("inputs"):
                v = launch.views[p]
                if v.key and v.key not in known and v.dtype.is_floating_point:
                    raise self.error(
                        f"{launch} reads `{p}`, a tensor that is neither an argument of the op nor written by an "
                        "earlier launch (made by a PyTorch operation, e.g. .contiguous()?). A named op cannot see "
                        "such operations; do them outside the op, or pass the tensor in as an argument")

    def _storages(self, views: list[View]) -> dict[int, tuple[torch.dtype, int, int]]:
        """Storage key -> (dtype, lo, hi): the float storages and the element spans their shadows cover."""
        spans: dict[int, tuple[torch.dtype, int, int]] = {}
        for v in views:
            if not v.key or not v.dtype.is_floating_point:
                continue
            lo, hi = v.span
            if v.key in spans:
                dtype, a, b = spans[v.key]
                if dtype != v.dtype:
                    raise self.error(f"tensors of dtypes {dtype} and {v.dtype} share memory; their gradients "
                                     "cannot share a shadow")
                lo, hi = min(lo, a), max(hi, b)
            spans[v.key] = (v.dtype, lo, hi)
        return spans
