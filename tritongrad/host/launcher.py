"""Repeated backwards: what an unchecked backward launched for a step, kept and launched again with a later
backward's tensors, past the decisions the first one made (backward.py keeps one per step and non-tensor
arguments in ``Step.launchers``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import torch

from ..runtime.relaunch import Relauncher
from .shadows import Step, stand_in_tensor


class Launcher:
    """A step's backward as an unchecked backward launched it, to launch again with a later backward's tensors
    (same plan, schedule and non-tensor arguments): saved tensors, output gradients and gradient buffers put
    where that launch had its own. A repeated backward so skips deciding the derived kernel, its variant,
    settings and arguments again (host-bound steps spent microseconds on each)."""

    def __init__(self, from_saved: tuple, outputs: tuple, buffers: tuple, launches: tuple, deterministic: bool):
        self.from_saved = from_saved  # (parameter, saved slot or None, stand-in) as LaunchPlan.from_saved
        self.outputs = outputs  # (output, its Shadow)
        self.buffers = buffers  # (input, Shadow, zero-filled, own dtype, donor slot) as PlannedBackward._buffers
        self.launches = launches  # (derive.PartLaunch with its non-tensor arguments, (argument, source, name)...)
        self.deterministic = deterministic

    @staticmethod
    def of(step: Step, named: dict, output_grads: dict, buffers_of: tuple, buffers: dict, traced: list,
           deterministic: bool, tapes: dict | None = None) -> Launcher | None:
        """From the launches ``traced`` (derive.PartLaunch) with these tensors (``tapes``: the state tapes the
        forward kept, augment.SavedStates.args, each call's own); None where the launch did what is not traced
        (an interchanged kernel, zeroing an unwritten gradient) or passed a tensor from elsewhere."""
        sources, alike = {}, {}  # id -> (source, name); id -> what makes the tensor the same one on every call
        found = [(named[p], 0, p, ("saved", slot, stand_in)) for p, slot, stand_in in step.launch.from_saved
                 if p in named]  # (a tensor read back where the derived kernel takes none: not passed)
        found += [(t, source, p, ("shadow", step.shadows[p])) for source, tensors in ((1, output_grads), (2, buffers))
                  for p, t in tensors.items()]
        found += [(t, 3, p, ("tape", p)) for p, t in (tapes or {}).items() if isinstance(t, torch.Tensor)]
        for t, source, p, same in found:
            if alike.setdefault(id(t), same) != same:  # one tensor by chance (the upstream gradient passed as an
                return None  # input, or for two outputs): another call's may be two, and go to the wrong place
            sources[id(t)] = (source, p)
        launches = []
        for t in traced:
            if t is None:
                return None
            constant, wired = {}, []
            for k, v in t.args.items():
                if isinstance(v, torch.Tensor):
                    if id(v) not in sources:
                        return None
                    wired.append((k, *sources[id(v)]))
                else:
                    constant[k] = v
            # holding no tensors; launched past Triton's argument binding (relaunch.py)
            launches.append((replace(t, args=constant, relauncher=Relauncher(t.part.kernel, t.grid)), tuple(wired)))
        outputs = tuple((o, step.shadows[o]) for o in output_grads)
        return Launcher(step.launch.from_saved, outputs, buffers_of, tuple(launches), deterministic)

    def __call__(self, saved: tuple, shadows: dict, shadow: Callable, tapes: dict | None = None) -> None:
        """Launch with ``saved`` tensors (and this call's state ``tapes``), making the shadows it writes in
        ``shadows`` (``shadow``: PlannedBackward._shadow), in the order the traced launch made them."""
        buffers = {p: shadow(shadows, s, None, fill, own, (saved, donor) if donor is not None else None)
                   for p, s, fill, own, donor in self.buffers}  # (first: as PlannedBackward._launch)
        sources = ({p: saved[slot] if slot is not None else stand_in_tensor(stand_in)
                    for p, slot, stand_in in self.from_saved},
                   {o: shadow(shadows, s) for o, s in self.outputs}, buffers, tapes)
        for traced, wired in self.launches:
            args = traced.args.copy()
            for k, source, name in wired:
                args[k] = sources[source][name]
            traced.launch(args, sources[2], self.deterministic)
