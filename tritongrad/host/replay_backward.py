"""A replay's backward for one schedule (replay.py): what each step's ``launcher.Launcher`` launches, launched
newest first on the shadows as ``PlannedBackward`` launches it once its backwards are unchecked, without its layers.

The steps' Launchers (kept by an earlier backward of the plan for the replay's non-tensor arguments) are found
once, and the backward is written out as one Python function for the schedule (``StraightLineBackward.src``): the
schedule fixes which outputs have gradients and which inputs need them, the plan every shadow's storage, shape,
dtype and device, each kept launch its values; what is left per call is the tensors. Each statement is what
``PlannedBackward._backward`` and ``Launcher.__call__`` do on that path, in their order (the first maker of a storage's
shadow decides whether it is zero-filled). A kept launch without partial rows, scratch or later adds goes through
its Relauncher (every value Triton binds, where it launches directly) or, in the interpreter, to the kernel on its
grid; one with them through ``PartLaunch.launch``; the state tapes a launch run as its augmented forward kept are
the call's (``kept``). The function (~20 statements for a launch) replaces two loops over generic tuples and a dict
per source per step: a few microseconds of a host-bound step."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from ..core.device import ensure_allocator
from . import backward as op_backward
from . import donation
from .launch_record import current_record
from .shadows import Plan, Shadow, contiguous, stand_in_tensor


class StraightLineBackward:
    """A replay's backward for one schedule as straight-line Python (see the module docstring). ``grad``:
    backward.grad as it was when the Launchers were kept (tests spy on it: another one is another backward).
    ``run(saved, grads, needs, kept)``: the backward, grad mode off (``kept``: per launch run as its augmented
    forward, the state tapes the call kept, replay.FastRecord.kept)."""

    def __init__(self, replay: Any, schedule: tuple, launchers: tuple):
        self.grad = op_backward.grad
        self.backward = op_backward.PlannedBackward(replay.name, replay.plan, replay.recorded, replay.deterministic)
        self.src, namespace = _written(self.backward, schedule, launchers)
        exec(compile(self.src, f"<tritongrad backward of {replay.name}>", "exec"), namespace)  # noqa: S102
        self.run = namespace["run"]

    @staticmethod
    def of(replay: Any, schedule: tuple) -> StraightLineBackward | None | bool:
        """None where a step has no Launcher yet (the first backwards of a plan keep them), False where one is
        never kept (this schedule's backward stays PlannedBackward's)."""
        plan = replay.plan
        if schedule not in plan.checked:
            return None
        launchers = []
        for step in plan.steps(*schedule):
            index = step.launch.index
            launch = replay.recorded[index]  # PlannedBackward._run_step's key (run as its augmented forward: a call's
            keep = (op_backward.grad, replay.deterministic, launch.args, tuple(launch.kwargs.items()), launch.grid,
                    replay.expected[index].augmented, launch.tiles)  # tapes, FastRecord.kept)
            launcher = step.launchers.get(keep)
            if not launcher:
                return None if launcher is None else False
            launchers.append((index, launcher))
        return StraightLineBackward(replay, schedule, tuple(launchers))

    def __call__(self, saved: tuple, grads: tuple, needs: Sequence[bool], kept: dict | None = None) -> list:
        token = current_record.set(None) if current_record.get() is not None else None  # (inside another op's forward)
        try:
            ensure_allocator()
            if torch.is_grad_enabled():  # create_graph=True: the backward is not itself differentiated
                with torch.no_grad():
                    return self.run(saved, grads, needs, kept)
            return self.run(saved, grads, needs, kept)
        finally:
            if token is not None:
                current_record.reset(token)


def _written(backward: Any, schedule: tuple, launchers: tuple) -> tuple[str, dict]:
    """The source of ``run(saved, grads, needs, kept)`` for a schedule, and the namespace its names are bound in."""
    plan: Plan = backward.plan
    needs, present = schedule
    namespace = {"_shadow": _shadow, "_scatter_add": op_backward._scatter_add, "backward": backward, "torch": torch,
                 "_donated": donation.donated}

    def bound(value: Any) -> str:
        name = f"c{len(namespace)}"
        namespace[name] = value
        return name

    lines = ["def run(saved, grads, needs, kept):", "    shadows = {}"]
    first_made = _first_made(plan, launchers)
    kept: set[int] = set()  # the storages whose shadows the function has made so far
    seen: dict[tuple, str] = {}  # (storage, view) -> the local holding that view of its shadow
    for i, (output, given) in enumerate(zip(plan.outputs, present, strict=True)):  # PlannedBackward._backward's
        if output is None or not given:
            continue
        shadow, reused_as, size, dtype, overlapping = output
        indent = "    "
        lines.append(f"    g{i} = grads[{i}]")
        if reused_as is not None:
            reused = f"g{i}" if reused_as == size else f"g{i}.view({bound(reused_as)})"
            lines += [f"    if g{i}.dtype == {bound(dtype)} and g{i}.shape == {bound(size)} and g{i}.is_contiguous():",
                      f"        shadows[{shadow.key}] = {reused}", "    else:"]
            indent = "        "
        # (PlannedBackward._shadow's, zero-filled)
        made = f"_shadow(shadows, {bound(_maker(plan, shadow, True, False))})"
        kept.add(shadow.key)
        if overlapping:
            lines.append(f"{indent}_scatter_add({made}, g{i})")
            continue
        shape, buffer_dtype, device = plan.buffers[shadow.key]
        buffer_dtype = first_made.get(shadow.key, buffer_dtype)
        if math.prod(size) == math.prod(shape):  # a fresh buffer the view covers: the gradient copied in (widened),
            made = f"shadows[{shadow.key}]" if _itself(plan, shadow) else made  # not added to zeros
            lines += [f"{indent}if {shadow.key} not in shadows:",
                      f"{indent}    shadows[{shadow.key}] = torch.empty({bound(shape)}, dtype={bound(buffer_dtype)}, "
                      f"device={bound(device)})",
                      f"{indent}    {made}.copy_(g{i})", f"{indent}else:"]
            indent += "    "
        lines.append(f"{indent}{made}.add_(g{i})")
    for s, (index, launcher) in enumerate(launchers):  # Launcher.__call__'s
        sources: dict[tuple[int, str], str] = {}
        tapes = sorted({name for _, wired in launcher.launches for _, source, name in wired if source == 3})
        if tapes:  # the state tapes this call's augmented forward kept (augment.SavedStates.args)
            lines.append(f"    t{s} = kept[{index}].args")
            sources.update({(3, p): f"t{s}[{p!r}]" for p in tapes})
        for p, slot, stand_in in launcher.from_saved:
            sources[0, p] = name = f"s{s}_{len(sources)}"
            value = f"saved[{slot}]" if slot is not None else bound(stand_in_tensor(stand_in))  # (empty: no memory)
            lines.append(f"    {name} = {value}")
        made = [(2, p, _maker(plan, shadow, fill, own), donor) for p, shadow, fill, own, donor in launcher.buffers]
        made += [(1, o, _maker(plan, shadow, True, False), None) for o, shadow in launcher.outputs]  # (after:
        for source, p, maker, donor in made:  # _launch's)
            sources[source, p] = name = f"s{s}_{len(sources)}"
            key, view, shape, dtype, device, make = maker
            kept.add(key)
            if view is not None:
                if (key, view) in seen:  # (a view made already: the buffer's elements seen alike, in a local)
                    sources[source, p] = seen[key, view]
                    continue
                seen[key, view] = name
                if donor is not None:  # (all of the buffer, reshaped: a saved input's memory where offered it)
                    lines += [f"    if {key} not in shadows:",
                              f"        {name} = _donated(saved, {donor}, {bound(shape)}, {bound(dtype)}, "
                              f"{bound(device)})", f"        if {name} is not None:",
                              f"            shadows[{key}] = {name}"]
                lines.append(f"    {name} = _shadow(shadows, {bound(maker)})")
                continue
            lines += [f"    {name} = shadows.get({key})",  # _shadow, for the storage's own buffer
                      f"    if {name} is None:"]
            indent = "        "
            if donor is not None:  # (a saved input's memory, where this backward was offered it: donation.py)
                lines += [f"        {name} = shadows[{key}] = _donated(saved, {donor}, {bound(shape)}, {bound(dtype)}, "
                          f"{bound(device)})", f"        if {name} is None:"]
                indent = "            "
            lines.append(f"{indent}{name} = shadows[{key}] = {bound(make)}({bound(shape)}, dtype={bound(dtype)}, "
                         f"device={bound(device)})")
        buffers = "{" + ", ".join(f"{p!r}: {sources[2, p]}" for p, *_ in launcher.buffers) + "}"
        for traced, wired in launcher.launches:
            lines += _launch(traced, wired, sources, buffers, backward.deterministic, bound)
    if plan.plain_inputs:  # PlannedBackward._input_grads: the shadows as they are
        found = [f"shadows.get({v.key})" if need else "None" for v, need in zip(plan.input_views, needs, strict=True)]
        lines.append(f"    return [{', '.join(found)}]")
    else:
        lines += _input_grads(plan, needs, kept, seen, bound)
    return "\n".join(lines) + "\n", namespace


def _input_grads(plan: Plan, needs: tuple, kept: set[int], seen: dict, bound: Any) -> list[str]:
    """The statements returning what ``PlannedBackward._input_grads`` returns, decided here as far as the schedule
    decides it (which inputs are needed, which shadows the function made, the views' relations and layouts): each
    input's gradient its shadow seen through its view, or None (not needed, not reached, or an earlier input has its
    elements); the call itself where an input's elements are taken from a later one's or its view overlaps itself."""
    views, relations = plan.input_views, op_backward.input_relations(plan)
    live = [need and v.key in kept for v, need in zip(views, needs, strict=True)]
    for i, (earlier, _) in enumerate(relations):
        if live[i] and any(live[j] for j in earlier):
            live[i] = False
    lines, found = [], []
    for i, (v, shadow) in enumerate(zip(views, plan.input_shadows, strict=True)):
        if not live[i]:
            found.append("None")
            continue
        if any(live[j] for j in relations[i][1]) or shadow.view is not None and torch._debug_has_internal_overlap(
                torch.empty_strided(shadow.view[0], shadow.view[1], device="meta")):
            return ["    return backward._input_grads(shadows, needs)"]
        view = None if _itself(plan, shadow) else shadow.view
        got = f"shadows[{shadow.key}]" if view is None else seen.get((shadow.key, view)) or \
            f"_shadow(shadows, {bound((shadow.key, view, None, None, None, None))})"
        dtype = bound(v.dtype)
        lines += [f"    i{i} = {got}", f"    if i{i}.dtype != {dtype}:", f"        i{i} = i{i}.to({dtype})"]
        found.append(f"i{i}")
    return [*lines, f"    return [{', '.join(found)}]"]


def _launch(traced: Any, wired: tuple, sources: dict, buffers: str, deterministic: bool, bound: Any) -> list[str]:
    """The statements launching a kept launch (variants.PartLaunch) with its tensors from ``sources``: its arguments
    as Launcher.__call__ makes them (the kept values, then the tensors)."""
    args = {k: bound(v) for k, v in traced.args.items()}
    args.update({k: sources[source, name] for k, source, name in wired})
    by_name = "{" + ", ".join(f"{k!r}: {v}" for k, v in args.items()) + "}"
    part, relauncher = traced.part, traced.relauncher
    if part.later_adds or (part.tapes and not part.saved):  # scratch made there
        return [f"    {bound(traced)}.launch({by_name}, {buffers}, {deterministic})"]
    if traced.partials:  # PartLaunch.launch's, without scratch: its rows made, launched, summed into the buffers
        lines = [f"    args = {by_name}"]
        lines += [f"    rows{j} = {bound(r)}.allocate(args, {sources[2, r.input]}.device)"
                  for j, r in enumerate(traced.partials)]
        lines.append(f"    {bound(relauncher)}(args)")
        return lines + [f"    {bound(r)}.sum(rows{j}, {sources[2, r.input]})" for j, r in enumerate(traced.partials)]
    if not relauncher.direct:  # (never direct again: the interpreter's kernels) as the Relauncher would launch it
        return [f"    {bound(part.kernel[traced.grid])}(**{by_name})"]
    name = bound(relauncher)
    if not set(relauncher.names) <= args.keys():  # (a parameter left to its default: by name)
        return [f"    {name}({by_name})"]
    values = "[" + ", ".join(args[n] for n in relauncher.names) + "]"  # every value Triton binds, in its order
    return [f"    if {name}.launch({values}) is None:",  # (its first launch of these alignments: through Triton)
            f"        {name}({by_name})"]


def _first_made(plan: Plan, launchers: tuple) -> dict[int, torch.dtype]:
    """Per storage, the dtype of its shadow as the first launch to use it makes it: an output's gradient is copied
    into a buffer of that dtype (PlannedBackward._shadow of a _Given: an input updated in place there, its own
    dtype)."""
    found: dict[int, torch.dtype] = {}
    for _, launcher in launchers:
        for _, shadow, _, own, _ in launcher.buffers:
            found.setdefault(shadow.key, plan.buffer_dtype(shadow, own))
        for _, shadow in launcher.outputs:
            found.setdefault(shadow.key, plan.buffer_dtype(shadow, False))
    return found


def _maker(plan: Plan, shadow: Shadow, fill: bool, own_dtype: bool) -> tuple:
    """How PlannedBackward._shadow makes a view's shadow in an unchecked backward: (storage key, view, shape, dtype,
    device, torch.empty or torch.zeros)."""
    shape, _, device = plan.buffers[shadow.key]
    make = torch.empty if not fill and plan.all_of_buffer(shadow) else torch.zeros
    return (shadow.key, None if _itself(plan, shadow) else shadow.view, shape, plan.buffer_dtype(shadow, own_dtype),
            device, make)


def _itself(plan: Plan, shadow: Shadow) -> bool:
    """Whether a shadow is its storage's buffer itself (its shape, in order from its first element): no view of it
    to make (PlannedBackward._shadow's as_strided of it is the buffer again)."""
    if shadow.view is None:
        return True
    size, stride, offset = shadow.view
    return offset == 0 and size == tuple(plan.buffers[shadow.key][0]) and contiguous(size, stride)


def _shadow(shadows: dict, made: tuple) -> torch.Tensor:
    key, view, shape, dtype, device, make = made
    buffer = shadows.get(key)
    if buffer is None:
        buffer = shadows[key] = make(shape, dtype=dtype, device=device)
    if view is None:
        return buffer
    size, stride, offset = view
    return buffer.as_strided(size, stride, buffer.storage_offset() + offset)
