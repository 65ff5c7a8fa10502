"""Host functions that mix kernel launches with PyTorch operations (bare ops).

``loss = per_row.sum() / n`` after a kernel, or ``h * 2`` between two kernels: PyTorch records
such an operation only if the tensor it reads already has an autograd history, and a buffer a
launch wrote has none until the op's autograd node is made. So once a launch has run, the op
watches PyTorch calls (a ``TorchFunctionMode``, pushed after the first launch, popped when the host
function returns). A call that reads memory a launch of the current segment wrote closes the
segment first: its launch record becomes an autograd node whose outputs are the buffers its launches
wrote, marked dirty (``ctx.mark_dirty``), so the very tensor objects the host function holds, and
views of them made earlier, carry the history from then on; later launches start a new segment,
reading those buffers as inputs that require grad. A written buffer that had a history before the segment
(``h = a * 1.0``, then a launch updating ``h[:, 2:8]`` in place) is an input of the node too (host/planning.py):
launches may write such a buffer only in place, and their backwards zero the shadow where they stored and add
the gradient of what they loaded, so its shadow is then the gradient of the values the segment found there,
which goes to that history (the elements the updated view also covers, once: host/backward.py's ``_input_grads``).

Host functions without such calls pay for the watch only between launches (~1 us per PyTorch call
there; none for a single launch) and keep one autograd node for the op, as before. Calls that read
no values (sizes, strides, dtypes, pointers, ``empty_like``) do not close a segment.
Named ops do not segment: a registered operator's autograd formula covers its kernels only, so the
record refuses their PyTorch operations on launch results (say so, and how to restructure).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from ..host.launch_record import LaunchRecord, current_record
from ..host.replay import FastRecord, Replays

_Tensor = torch.Tensor
# calls that read no values: they neither need a history nor close a segment
_METADATA = frozenset({
    _Tensor.size, _Tensor.stride, _Tensor.dim, _Tensor.numel, _Tensor.data_ptr, _Tensor.storage_offset,
    _Tensor.element_size, _Tensor.is_contiguous, _Tensor.untyped_storage, _Tensor.__len__, _Tensor.nelement,
    _Tensor.shape.__get__, _Tensor.dtype.__get__, _Tensor.device.__get__, _Tensor.is_cuda.__get__,
    _Tensor.requires_grad.__get__, _Tensor.ndim.__get__, _Tensor.is_floating_point, _Tensor.get_device,
    torch.empty_like,
})

# calls that may return a view: one that does reads nothing (a segment closing later gives it the history:
# views follow their base's), one that copied (reshape of a strided tensor, an index tensor) is run again
_VIEWS = frozenset(
    getattr(owner, name) for owner in (_Tensor, torch) for name in (
        "__getitem__", "view", "view_as", "reshape", "reshape_as", "t", "transpose", "swapaxes", "permute",
        "movedim", "narrow", "select", "chunk", "split", "tensor_split", "unbind", "unsqueeze", "squeeze",
        "expand", "expand_as", "flatten", "unflatten", "as_strided", "diagonal", "contiguous", "detach")
    if hasattr(owner, name)) | {_Tensor.T.__get__, _Tensor.mT.__get__}


class Segments(TorchFunctionMode):
    """The segments of one call of a bare op; ``record``: the current segment's (see the module docstring).

    ``args``, ``kwargs``, ``arguments``: as ``LaunchRecord.close`` takes them; ``node(record, written, views, inputs)``
    makes a closed segment's autograd node, the ``written`` buffers marked dirty, and returns its outputs of the
    ``views`` (of those buffers: the op's result's, made again as the node's own). ``replays``: the op's
    (host/replay.py), whose record the first segment is on: a replay's (``FastRecord``) or one that learns one.
    ``passed``: ``arguments(args, kwargs)``, the op's tensor arguments by name."""

    def __init__(self, name: str, plans: dict, deterministic: bool, args: tuple, kwargs: dict, arguments: Any,
                 node: Callable[[LaunchRecord, list, list, list], list], replays: Replays | None = None,
                 passed: dict | None = None):
        super().__init__()
        self.name, self.plans, self.deterministic, self.node = name, plans, deterministic, node
        self.args, self.kwargs, self.arguments = args, kwargs, arguments
        self.passed = passed if passed is not None else arguments(args, kwargs)
        if replays is None:
            self.record = self._new_record()
        else:
            self.record = replays.segment_record()
            self.record.boundary = self
        self.written: dict[int, torch.Tensor] = {}  # the current segment's written tensors, by identity
        self.pending: set[int] = set()  # ... their storages' addresses
        self.armed = False
        self.closed = 0  # segments closed so far
        self.made: dict[int, torch.Tensor] = {}  # id of a view the host function returned -> the node's own
        self.unread: set[str] | None = None  # the arguments requiring grad that no closed segment's launch read

    def _new_record(self) -> LaunchRecord:
        record = LaunchRecord(self.name, self.plans, self.deterministic)
        record.boundary = self
        return record

    # -- called by host/hooks.py's launch hook, with torch function handling off -----------------------------

    def launched(self) -> None:
        """After each launch: note what it wrote; the first one arms the watch."""
        for t in self.record.written_by_last():
            self.written.setdefault(id(t), t)
            self.pending.add(_storage(t))
        if not self.armed:
            self.armed = True
            self.__enter__()

    # -- the watch --------------------------------------------------------------------------------------

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if not self.pending or func in _METADATA:
            return func(*args, **kwargs)
        if func in _VIEWS:  # a view (the next launch's argument, say) reads nothing; a copy does (its result is
            result = func(*args, **kwargs)  # looked at first: a view of what a launch wrote reads it)
            if self._reads_pending(result) or not self._reads_pending((args, kwargs)):
                return result
        elif not self._reads_pending((args, kwargs)):
            return func(*args, **kwargs)
        self.close(by_watch=True)
        try:
            return func(*args, **kwargs)
        except RuntimeError as e:
            if "returns multiple views" in str(e):
                e.add_note(f"tritongrad.op `{self.name}`: a launch wrote a view made by unbind, chunk or split, "
                           "which PyTorch will not give a history later; make those views by indexing "
                           "(out[0], out[:, :half])")
            raise

    def _reads_pending(self, value: Any) -> bool:
        if isinstance(value, _Tensor):
            return _storage(value) in self.pending
        if isinstance(value, (tuple, list)):
            return any(self._reads_pending(v) for v in value)
        if isinstance(value, dict):
            return any(self._reads_pending(v) for v in value.values())
        return False

    def close(self, by_watch: bool = False, last: bool = False, result: Any = None) -> None:
        """Make the current segment an autograd node; later launches go to a new launch record (``last``: none come, the
        host function has returned ``result``). ``by_watch``: a PyTorch call reads what its launches wrote (a call of
        several segments: not replayed, host/replay.py)."""
        record, written = self.record, list(self.written.values())
        bases = list({id(b): b for b in (t if t._base is None else t._base for t in written)}.values())
        views = _result_views(result, bases, self.passed) if last else []
        outputs = (*bases, *views)
        inputs = None
        if type(record) is FastRecord:  # a replay's call: its one segment closes when the host function returns
            if not by_watch:
                inputs = record.close(outputs, self.args, self.kwargs, dirty=True)
                record.boundary = None
            if inputs is None:  # not the replay's: its launches recorded as a first call's, without running again
                record = record.fallen or record._fall_back()
        self.written, self.pending = {}, set()
        if not last:  # (the last one's caller resets the current record)
            self.record = self._new_record()
            current_record.set(self.record)
        self.closed += 1
        if inputs is None:
            record.dirty, record.learnable = True, not by_watch  # (what a LearningRecord learns a replay of)
            try:
                inputs = record.close(outputs, self.args, self.kwargs, self.arguments)
            finally:
                record.boundary = None  # (its node keeps the launch record: see release)
        unread = set(record.plan.unread)
        self.unread = unread if self.unread is None else self.unread & unread
        if inputs:
            made = self.node(record, bases, views, inputs)
            self.made = {id(v): m for v, m in zip(views, made, strict=True)}

    def release(self) -> None:
        """Drop what the call held, once its launch records are closed: a node keeps its record, and a record keeping
        these Segments (its ``boundary``) would keep the call's arguments and outputs in a reference cycle, freed only
        by Python's cyclic collector: GPU memory piled up between its runs (gigabytes a training step)."""
        self.args = self.kwargs = self.passed = None
        self.written, self.pending, self.made = {}, set(), {}
        self.record.boundary = None

    def disarm(self) -> None:
        if self.armed:
            self.armed = False
            self.__exit__(None, None, None)

    def finish(self, result: Any) -> bool:
        """When the host function has returned: disarm, and close the last segment if an earlier one was
        closed or an output is not a buffer the launches wrote. False: one node for the whole call (the
        caller's usual path)."""
        self.disarm()
        outputs = result if isinstance(result, (tuple, list)) else (result,)
        whole = all(isinstance(o, _Tensor) and _storage(o) in self.pending for o in outputs) and not any(
            t.requires_grad for t in self.written.values())  # a tensor with a history updated in place: dirty
        if self.closed == 0 and whole:
            return False
        if (self.record.count if type(self.record) is FastRecord else self.record.launches):
            self.close(last=True, result=result)
        return True

    def returned(self, result: Any) -> Any:
        """The host function's result with each view the last segment's node made again in its place."""
        made = self.made
        if not made:
            return result
        if isinstance(result, _Tensor):
            return made.get(id(result), result)
        return type(result)(made.get(id(t), t) for t in result)


def _result_views(result: Any, bases: list, arguments: dict) -> list:
    """The float tensors the host function returns (itself, or in a tuple or list) that are views of buffers the
    last segment wrote: the node gives them out as its own outputs (``base.as_strided``), so that their history is
    the node rather than an ``AsStridedBackward0`` of the buffer's, which would fill a buffer of the buffer's size and
    copy their gradient into it in every backward (rope in place on HF's transposed views of q and k, returned
    transposed back). Not an argument returned as it is (the op returns that very tensor, as an in-place PyTorch
    operation does)."""
    if isinstance(result, _Tensor):
        values = (result,)
    elif type(result) in (tuple, list):
        values = result
    else:
        return []
    ids, passed = {id(b) for b in bases}, {id(t) for t in arguments.values()}
    found = {id(t): t for t in values if isinstance(t, _Tensor) and t._base is not None and id(t._base) in ids
             and id(t) not in passed and t.dtype == t._base.dtype and t.is_floating_point()}
    return list(found.values())


def _storage(t: torch.Tensor) -> int:
    """A tensor's storage, named by its address (the view's, less its offset)."""
    return t.data_ptr() - t.storage_offset() * t.element_size()
