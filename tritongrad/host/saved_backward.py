"""The backward of a named op under torch.compile, from what its saving forward returned (ops/library.py's
``ns::name_saving``: the outputs and the buffers its launches passed between them): the host function runs again
with its launches skipped, its fresh buffers are swapped for the saved ones, and the launches are recorded on a
launch record as in eager mode (``eager_backward``: the opaque ``ns::name_saved_backward``, on real tensors). Not
opaque, the compiled graph launches the derived kernels itself: ``traced_backward`` runs the same backward on fake
tensors (core/device.traced) with each launch issued through ``wrap_triton``, after a rehearsal on real tensors of the
traced layouts (``real_like``) that makes the first backward's checks and tunes its launches. Where the buffers cannot
be matched, the forward launches run again (``recompute_backward``).
"""

from __future__ import annotations

import logging
import os
from typing import Any

import torch

from ..core import device
from ..writes.strategies import span_of
from . import hooks
from .call_tensors import as_tuple
from .configs import current_heuristics
from .kernel_roles import kernel_info
from .launch_record import LaunchRecord

_log = logging.getLogger("tritongrad")
if os.environ.get("TRITONGRAD_LOG"):  # (TRITONGRAD_LOG=info: each op whose compiled backward stays opaque, and why)
    logging.basicConfig()
    _log.setLevel(os.environ["TRITONGRAD_LOG"].upper())


def recompute_backward(fn: Any, name: str, arguments, plans: dict, deterministic: bool):
    def backward(*args):
        *inputs, grads, needs = args
        record = LaunchRecord(name, plans, deterministic)
        with record.recording():
            outputs = as_tuple(fn(*inputs))
        return gradients(record, outputs, inputs, arguments, grads, needs)

    return backward


def gradients(record: LaunchRecord, outputs: tuple, inputs: list, arguments, grads: list, needs: list,
               launches: Any = None) -> list:
    """The needed inputs' gradients from a recorded forward (zeros where none reaches); ``launches``: a
    hooks.Launches wrapping the derived kernels' launches (traced)."""
    diff = [t for t, need in zip(arguments(tuple(inputs), {}).values(), needs, strict=True) if need]
    record.close(outputs, tuple(inputs), {}, arguments, diff_inputs=diff)
    saved, record.saved = tuple(record.saved), None
    result = record.backward(saved, tuple(grads), [True] * len(diff), launches)
    # an op's outputs may not share memory with its arguments or with each other: copied only where they would
    taken = {device.storage_of(a) for a in _tensors([*inputs, saved, grads])}
    found = []
    for t, g in zip(diff, result, strict=True):
        if g is None:
            found.append(torch.zeros_like(t))
            continue
        memory = device.storage_of(g)
        found.append(torch.empty_like(t).copy_(g) if memory in taken else g)
        taken.add(memory)
    return found


def eager_backward(fn: Any, name: str, arguments, plans: dict, deterministic: bool):
    """The backward from the saving forward's outputs and buffers: the host function is run again with its
    launches skipped (for their arguments), its fresh buffers swapped for the saved ones, and the launches
    recorded on a launch record as in eager mode. Where the buffers cannot be matched (an autotuned launch, whose
    config is unknown here; a buffer that is a view of another tensor) the launches are re-run instead."""
    recompute = recompute_backward(fn, name, arguments, plans, deterministic)

    def backward(*args):
        *inputs, saved, grads, needs = args
        found = _saved_record(fn, name, plans, deterministic, inputs, saved)
        if found is None:
            return recompute(*inputs, grads, needs)
        return gradients(*found, inputs, arguments, grads, needs)

    return backward


def _saved_record(fn: Any, name: str, plans: dict, deterministic: bool, inputs: list, saved: list) -> tuple | None:
    """A record of the op's launches on the buffers the saving forward kept: the host function run again with its
    launches skipped (for their arguments), its fresh buffers swapped for the saved ones; with the op's outputs
    among the saved tensors. None where the buffers cannot be matched (``_swaps``)."""
    with hooks.collecting("skip", keep_states=True) as launches:
        fresh = as_tuple(fn(*inputs))
    saved = [t.detach() for t in saved]  # an eager caller's outputs require grad; kernels wrote them
    split = len(saved) - len(launches.kept)
    saved, tapes = saved[:split], saved[split:]
    swaps = _swaps(launches, inputs, fresh, saved)
    if swaps is None or any(t.numel() != k.buffer_size for t, k in zip(tapes, launches.kept.values(), strict=True)):
        return None
    swap = lambda v: swaps.get(id(v), v) if isinstance(v, torch.Tensor) else v  # noqa: E731
    return _recorded(LaunchRecord(name, plans, deterministic), launches, swap, tapes), tuple(saved[:len(fresh)])


def _recorded(record: LaunchRecord, launches: hooks.Launches, swap: Any, tapes: list) -> LaunchRecord:
    """``record`` with the gathered ``launches`` recorded on it, their tensors ``swap``ped for the saved ones, each
    launch that kept state tapes given its saved ``tapes``."""
    kept = dict(zip(launches.kept, tapes, strict=True))
    for i, ((kernel, grid, a, kw), heuristics) in enumerate(zip(launches.calls, launches.heuristics, strict=True)):
        token = current_heuristics.set(heuristics)  # (as the launch ran: its tiles may be re-chosen, configs.py)
        try:
            record.record(kernel, grid, tuple(map(swap, a)), {k: swap(v) for k, v in kw.items()})
        finally:
            current_heuristics.reset(token)
        if i in kept:
            record.launches[-1].saved = launches.kept[i].kept_in(kept[i])[2]
    return record


def traced_backward(fn: Any, name: str, arguments, plans: dict, deterministic: bool, eager: Any, opaque: Any):
    """The saved-buffer backward as a triton_op: while torch.compile traces it, the derived kernels' launches are
    issued through wrap_triton (the compiled graph schedules them); on real tensors, ``eager``. What cannot be
    traced (an autotuned forward, whose config is chosen when the graph runs; index tensors read by a launch
    check; fake tensors reaching something that reads values) keeps the ``opaque`` op in the graph."""
    def backward(*args):
        if not hooks.wrap_triton_enabled():
            return eager(*args)
        try:
            _rehearse(eager, args)
            with device.traced():
                return _traced_gradients(fn, name, arguments, plans, deterministic, *args)
        except Exception as e:  # noqa: BLE001 (the opaque op computes the same gradients, its own way)
            _log.info("tritongrad.op `%s`: the compiled graph calls its backward opaquely: %s", name, e, exc_info=True)
            return opaque(*args)

    return backward


def _traced_gradients(fn: Any, name: str, arguments, plans: dict, deterministic: bool, *args) -> list:
    *inputs, saved, grads, needs = args
    found = _saved_record(fn, name, plans, deterministic, inputs, saved)
    if found is None:
        raise _Untraceable("its forward's buffers cannot be matched with the saved ones (an autotuned launch?)")
    with hooks.collecting("wrap", name) as launches:
        return gradients(*found, inputs, arguments, grads, needs, launches)


class _Untraceable(Exception):
    pass


def _rehearse(eager: Any, args: tuple) -> None:
    """The eager backward once on real tensors laid out as the traced ones (``real_like``): it makes the checks a
    first backward makes (gradient outside the tensors passed: backward.py) and times the launch settings, which
    the traced backward then looks up (tuning.py)."""
    from torch.utils._python_dispatch import _disable_current_modes

    if not any(t.device.type == "cuda" for t in _tensors(args)):  # (compiled kernels run on GPUs only)
        return
    with _disable_current_modes():
        eager(*real_like(args))


def real_like(args: tuple) -> list:
    """``args`` (tensors, lists of them, other values) with each traced tensor replaced by a real one of its dtype,
    device, sizes, strides and offset, views of one traced storage views of one real storage; floating-point
    ones random (standard normal), others zero. Call it with no dispatch mode active."""
    memory: dict[int, torch.Tensor] = {}
    for t in _tensors(args):  # each storage as many bytes as its views reach
        key, end = device.storage_id(t), (t.storage_offset() + span_of(t)) * t.element_size()
        if key not in memory or memory[key].numel() < end:
            memory[key] = torch.zeros(end, dtype=torch.uint8, device=t.device)
    real = {}
    for t in _tensors(args):
        r = torch.empty(0, dtype=t.dtype, device=t.device).set_(
            memory[device.storage_id(t)].untyped_storage(), t.storage_offset(), t.shape, t.stride())
        if t.dtype.is_floating_point:  # (through the span its view reaches: an expanded view overlaps itself)
            r.as_strided((span_of(t),), (1,), t.storage_offset()).normal_()
        real[id(t)] = r
    swap = lambda v: real.get(id(v), v) if isinstance(v, torch.Tensor) else v  # noqa: E731
    return [[swap(u) for u in v] if isinstance(v, list) else swap(v) for v in args]


def _tensors(args: tuple) -> list[torch.Tensor]:
    return [u for v in args for u in (v if isinstance(v, list) else (v,)) if isinstance(u, torch.Tensor)]


def whole(tensors: list) -> list:
    """The tensors that are not views of another."""
    return [t for t in tensors if t._base is None]


def _swaps(launches: hooks.Launches, inputs: list, fresh: tuple, saved: list) -> dict | None:
    """id(fresh tensor) -> the saved one in its place, or None where they cannot be matched."""
    buffers = launches.intermediates(inputs, fresh)
    ours = [*fresh, *buffers]
    if launches.tuned or len(ours) != len(saved) or len(whole(buffers)) != len(buffers):
        return None
    if _overwrites_what_was_read(launches.calls):
        return None
    if any((a.shape, a.stride(), a.dtype) != (b.shape, b.stride(), b.dtype) for a, b in zip(ours, saved, strict=True)):
        return None
    return {id(a): b for a, b in zip(ours, saved, strict=True)}


def _overwrites_what_was_read(calls: list) -> bool:
    """Whether a launch overwrites memory that it or an earlier launch read (an update in place): the saved buffers
    hold what the last launch left, not what each launch read, which its backward recomputes against."""
    read: set[int] = set()
    for kernel, _, args, kwargs in calls:
        info = kernel_info(kernel)
        if info.roles is None:
            return True
        named, _ = info.named_arguments(args, kwargs)
        tensors = {p: device.storage_of(v) for p, v in named.items() if isinstance(v, torch.Tensor)}
        loads = {tensors[p] for p in info.roles.loads if p in tensors}
        if any(tensors[p] in read | loads for p in info.roles.overwrites if p in tensors):
            return True
        read |= loads
    return False
