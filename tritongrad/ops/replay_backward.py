"""A replay's backward for one schedule (replay.py): what each step's ``launcher.Launcher`` launches, launched
newest first on the shadows as ``OpBackward`` launches it once its backwards are unchecked, without its layers:
the step's Launcher, kept by an earlier backward of the plan for the replay's non-tensor arguments, found once;
its shadows made from what the plan fixes (storage, shape, dtype, device, zero-filled or not); a kernel with no
partial rows, scratch or later adds launched straight through its Relauncher."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ..core.device import ensure_allocator
from . import backward as op_backward
from .shadows import Plan, Shadow, stand_in_tensor
from .tape import current_tape


class FastBackward:
    """See the module docstring. ``grad``: backward.grad as it was when the Launchers were kept (tests spy on it:
    another one is another backward)."""

    def __init__(self, replay: Any, launchers: tuple):
        plan = replay.plan
        self.grad = op_backward.grad
        self.backward = op_backward.OpBackward(replay.name, plan, replay.recorded, replay.deterministic)
        self.steps = tuple((
            tuple((p, slot, None if slot is not None else stand_in) for p, slot, stand_in in launcher.replayed),
            tuple((o, _maker(plan, s, True, False)) for o, s in launcher.outputs),
            tuple((p, _maker(plan, s, fill, own)) for p, s, fill, own in launcher.buffers),
            tuple(_launch_of(traced, wired) for traced, wired in launcher.launches))
            for launcher in launchers)
        self.plain = plan.plain_inputs
        self.inputs = tuple(v.key for v in plan.input_views)

    @staticmethod
    def of(replay: Any, schedule: tuple) -> FastBackward | None | bool:
        """None where a step has no Launcher yet (the first backwards of a plan keep them), False where one is
        never kept (this schedule's backward stays OpBackward's)."""
        plan = replay.plan
        if schedule not in plan.checked:
            return None
        launchers = []
        for step in plan.steps(*schedule):
            launch = replay.recorded[step.launch.index]  # OpBackward._run_step's key, the launch unaugmented
            keep = (op_backward.grad, replay.deterministic, launch.args, tuple(launch.kwargs.items()), launch.grid,
                    False)
            launcher = step.launchers.get(keep)
            if not launcher:
                return None if launcher is None else False
            launchers.append(launcher)
        return FastBackward(replay, tuple(launchers))

    def __call__(self, saved: tuple, grads: tuple, needs: Sequence[bool]) -> list:
        token = current_tape.set(None) if current_tape.get() is not None else None  # (inside another op's forward)
        try:
            ensure_allocator()
            if torch.is_grad_enabled():  # create_graph=True: the backward is not itself differentiated
                with torch.no_grad():
                    return self._run(saved, grads, needs)
            return self._run(saved, grads, needs)
        finally:
            if token is not None:
                current_tape.reset(token)

    def _run(self, saved: tuple, grads: tuple, needs: Sequence[bool]) -> list:
        """OpBackward._backward's unchecked path, its steps' Launchers inlined."""
        backward = self.backward
        shadows: dict[int, torch.Tensor] = {}
        for output, g in zip(backward.plan.outputs, grads, strict=True):
            if output is None or g is None:
                continue
            shadow, reusable, size, dtype, overlapping = output
            if reusable and g.dtype == dtype and g.shape == size and g.is_contiguous():
                shadows[shadow.key] = g  # derived kernels only read it
            elif overlapping:
                op_backward._scatter_add(backward._shadow(shadows, shadow), g)
            else:
                backward._shadow(shadows, shadow).add_(g)
        deterministic = backward.deterministic
        for replayed, outputs, buffers, launches in self.steps:  # as launcher.Launcher.__call__ (loops, not
            sources = ({}, {}, {})  # comprehensions: each of those is a call)
            from_saved, from_outputs, from_buffers = sources
            for p, slot, stand_in in replayed:
                from_saved[p] = saved[slot] if stand_in is None else stand_in_tensor(stand_in)
            for o, made in outputs:
                from_outputs[o] = _shadow(shadows, made)
            for p, made in buffers:
                from_buffers[p] = _shadow(shadows, made)
            for traced, wired, how, launcher, template, slots in launches:
                if how == _VALUES and launcher.direct:  # every value Triton binds, in its order
                    values = template.copy()
                    for j, source, name in slots:
                        values[j] = sources[source][name]
                    if launcher.launch(values) is not None:
                        continue
                    how = _RELAUNCHER  # (its first launch of these alignments: through Triton)
                args = traced.args.copy()
                for k, source, name in wired:
                    args[k] = sources[source][name]
                if how == _KERNEL:
                    launcher(**args)
                elif how == _PART:
                    traced.launch(args, from_buffers, deterministic)
                else:
                    launcher(args)
        if self.plain:  # OpBackward._input_grads: the shadows as they are
            found = []
            for key, need in zip(self.inputs, needs, strict=True):
                found.append(shadows.get(key) if need else None)
            return found
        return backward._input_grads(shadows, needs)


_VALUES, _RELAUNCHER, _KERNEL, _PART = range(4)  # how _run launches a kept launch


def _launch_of(traced: Any, wired: tuple) -> tuple:
    """A kept launch (variants.PartLaunch) as _run launches it: (it, its wiring, how, the launcher, the values
    Triton binds but its tensors', where those go). A launch with partial rows, scratch or later adds as
    PartLaunch.launch makes them (_PART); else through its Relauncher, given every value in Triton's order where it
    launches directly (_VALUES) or its arguments by name (_RELAUNCHER), or, where that would go through Triton
    anyway (the interpreter), the kernel on its grid (_KERNEL)."""
    part, relauncher = traced.part, traced.relauncher
    if traced.partials or part.later_adds or (part.tapes and not part.saved):
        return traced, wired, _PART, None, None, ()
    if not relauncher.direct:  # (never direct again)
        return traced, wired, _KERNEL, part.kernel[traced.grid], None, ()
    names = {n: j for j, n in enumerate(relauncher.names)}
    given = {k for k, _, _ in wired}
    if not given <= names.keys() or any(n not in traced.args for n in relauncher.names if n not in given):
        return traced, wired, _RELAUNCHER, relauncher, None, ()
    template = [traced.args.get(n) for n in relauncher.names]
    return traced, wired, _VALUES, relauncher, template, tuple((names[k], source, name) for k, source, name in wired)


def _maker(plan: Plan, shadow: Shadow, fill: bool, own_dtype: bool) -> tuple:
    """How OpBackward._shadow makes a view's shadow in an unchecked backward: (storage key, view, shape, dtype,
    device, torch.empty or torch.zeros)."""
    shape, dtype, device = plan.buffers[shadow.key]
    if own_dtype and shadow.view is None:
        dtype = plan.storages[shadow.key][0]
    make = torch.empty if not fill and shadow.view is None else torch.zeros
    return shadow.key, shadow.view, shape, dtype, device, make


def _shadow(shadows: dict, made: tuple) -> torch.Tensor:
    key, view, shape, dtype, device, make = made
    buffer = shadows.get(key)
    if buffer is None:
        buffer = shadows[key] = make(shape, dtype=dtype, device=device)
    if view is None:
        return buffer
    size, stride, offset = view
    return buffer.as_strided(size, stride, buffer.storage_offset() + offset)
