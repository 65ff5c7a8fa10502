"""An op's call as autograd nodes: the host function runs with its launches recorded (a launch record, or, for a bare
op that mixes in PyTorch operations, one per segment: segments.py), and its outputs come out of an
``autograd.Function`` whose backward is the record's (host/backward.py). A bare op always takes this path; a named op
called eagerly on plain tensors takes it too (library.py). Also the checks that no argument requiring grad is
cut off from the outputs, and gradients that refuse a second differentiation.
"""

from __future__ import annotations

import collections
import contextvars
import inspect
from typing import Any

import torch
import torch.autograd.forward_ad as _forward_ad

from ..core.bounded import Bounded
from ..core.device import recording
from ..core.errors import NotDifferentiableError, OpError
from ..host import donation
from ..host.backward import checks
from ..host.call_tensors import as_tuple, is_container, tensor_leaves
from ..host.launch_record import LaunchRecord, current_record, recording_backward
from ..host.remake import Remake
from ..host.replay import FastRecord, Replays
from .refusals import forward_mode_error, refuse_batched_gradients
from .segments import Segments

_unwrap_if_dead = torch._C._functorch.unwrap_if_dead
_set_creation_meta = torch._C._autograd._set_creation_meta
_DEFAULT_VIEW = torch._C._autograd.CreationMeta.DEFAULT


def recorded_call(fn: Any, name: str, plans: dict, arguments, deterministic: bool, named: bool = False,
               hidden_reads: bool = True) -> Any:
    """``fn`` with its launches recorded (a launch record) and its outputs made the outputs of an
    ``autograd.Function`` whose backward differentiates the record; ``plans`` are shared by the op's calls
    (see tritongrad.host.launch_record). ``named``: as a registered op sees it, the differentiable inputs are the
    op's own tensor arguments (a launch reading a tensor PyTorch made inside is refused, as it is
    when the op is compiled). ``hidden_reads``: ``fn`` may read a tensor unseen (a pointer table), so an argument
    requiring grad that the outputs are cut off from is refused; False for tritongrad's own backward run as an op
    (backward_as_op), which reads only through its launches: such an argument (an incoming gradient its derived
    kernels do not read) has no gradient."""
    function = type(_camel(fn.__name__), (_LaunchRecordFunction,), {})  # grad_fn reads <FnNameBackward>
    segment = type(_camel(fn.__name__), (_SegmentFunction,), {})
    replays = Replays(name, plans, deterministic, function, named)  # calls made again (host/replay.py)
    apply_function, apply_segment = _fast_apply(function), _fast_apply(segment)

    def segment_node(record: LaunchRecord, written: list, views: list, inputs: list) -> list:
        at = {id(b): j for j, b in enumerate(written)}
        shapes = tuple((at[id(v._base)], v.shape, v.stride(), v.storage_offset()) for v in views)
        made = donation.apply(apply_segment, record, len(written), shapes, *written, *inputs)[len(written):]
        for m in made:  # an in-place update of one later is as of any view (CopySlices over the buffer's history,
            _set_creation_meta(m, _DEFAULT_VIEW)  # whose gradient the node takes as the view's), not refused
        return made

    def call(*args, **kwargs):
        segments = None
        if named:  # its launches recorded, or replayed (host/replay.py)
            record, result = replays.call(fn, args, kwargs)
            if record is None:
                return result
        else:  # PyTorch operations on what launches wrote make segments (segments.py)
            passed = arguments(args, kwargs)
            before = _histories(passed)  # (a launch may update an argument in place)
            segments = Segments(name, plans, deterministic, args, kwargs, arguments, segment_node, replays, passed)
            token = current_record.set(segments.record)
            try:
                try:
                    result = fn(*args, **kwargs)
                except BaseException:
                    segments.disarm()
                    segments.release()
                    raise
                if segments.finish(result):
                    result = segments.returned(result)
                    segments.release()
                    if hidden_reads and segments.unread != set():  # (an argument no launch read: a hidden read?)
                        _check_reached(name, passed, as_tuple(result), histories=before)
                    return result
            finally:
                current_record.reset(token)
            record = segments.record
        several = isinstance(result, (tuple, list))
        outputs = tuple(result) if several else (result,)
        diff = [t for t in arguments(args, kwargs).values() if differentiable(t)] if named else None
        inputs = None
        if type(record) is FastRecord:  # a bare op's one-node call, as a replay's: its outputs where the replay's lay
            inputs = record.close(outputs, args, kwargs)
            if inputs is None:
                record = record.fallen  # (its launches recorded as a first call's)
        try:
            if inputs is None:
                inputs = record.close(outputs, args, kwargs, arguments, diff_inputs=diff)
        finally:
            if segments is not None:
                segments.release()
                record.boundary = None
        if named:
            refuse_unread(name, record.plan.unread)
        if not inputs:
            if hidden_reads:
                _check_reached(name, arguments(args, kwargs), outputs)
            return result
        outputs = donation.apply(apply_function, record, outputs, *inputs)
        if record.plan.unread and hidden_reads:
            _check_reached(name, arguments(args, kwargs), outputs, record.plan.unread)
        return outputs if several else outputs[0]

    return call


def _fast_apply(function: type) -> Any:
    """``function.apply`` past ``Function.apply``'s Python (microseconds a call) where no torch.func transform is
    active: what it does then, the Function defining no ``setup_context`` (its tensors' dead functorch wrappers
    unwrapped, then ``_FunctionBase.apply``); under a transform, ``function.apply`` itself."""
    apply = super(torch.autograd.Function, function).apply

    def call(*args: Any) -> Any:
        if torch._C._are_functorch_transforms_active():
            return function.apply(*args)
        return apply(*[_unwrap_if_dead(a) if isinstance(a, torch.Tensor) else a for a in args])

    return call


def refuse_unread(name: str, unread: tuple[str, ...]) -> None:
    """A named op's arguments that require grad must be read by its launches (its autograd formula covers them)."""
    if unread:
        raise OpError(_UNREAD.format(name=name, arg=unread[0]))


def _check_reached(name: str, named: dict[str, torch.Tensor], outputs: tuple, candidates: tuple | None = None,
                   histories: dict | None = None) -> None:
    """Refuse a call whose outputs are cut off from an argument that requires grad (of ``candidates``: those no
    launch reads; None: every one): autograd must lead from the outputs back to it, else its gradient would be
    silently missing (a tensor whose address the kernel reads from a pointer table or a host descriptor).
    ``histories``: the arguments' autograd nodes before the call (``_histories``), for those a launch updated in
    place: their nodes now are the op's, and the history their old values' gradient must reach is the one they had,
    or their base's (a segment's node takes a view's base, segments.py)."""
    waiting = [(k, t) for k, t in named.items() if differentiable(t) and (candidates is None or k in candidates)]
    if not waiting:
        return
    wanted = {k: histories[k] if histories and k in histories else (
        t.grad_fn if t.grad_fn is not None else _accumulator(t),) for k, t in waiting}
    reached = _autograd_ancestors([o for o in output_tensors(outputs) if o.requires_grad],
                                  [tuple(n for n in nodes if n is not None) for nodes in wanted.values()])
    for k, nodes in wanted.items():
        if not any(n in reached for n in nodes):
            raise OpError(_UNREAD.format(name=name, arg=k))


def _histories(named: dict[str, torch.Tensor]) -> dict[str, tuple]:
    """The autograd nodes of the arguments with a history (not leaves, whose node no call may change), and of their
    bases, as they are before the host function runs."""
    return {k: (t.grad_fn, t._base.grad_fn if t._base is not None else None) for k, t in named.items()
            if t.grad_fn is not None}


_UNREAD = ("tritongrad.op `{name}`: the argument `{arg}` requires grad, but no kernel launch reads it as a tensor "
           "argument (is its address in a pointer table, or in a structure of the op's own?): tritongrad "
           "cannot see such reads, and its gradient would be silently missing. Pass the tensor itself to the kernel "
           "(or a TensorDescriptor over it: descriptors are differentiated), or detach it if the op does not use it")


def _autograd_ancestors(tensors: list, wanted: Any) -> set:
    """The autograd nodes the tensors' values come from (their graph, walked back to its leaves), breadth first,
    or those found until each of ``wanted`` is: a node, or a tuple of nodes of which one is enough (an argument's
    node before the call and its base's). The arguments' nodes lie next to the outputs': a model's whole graph
    behind them is not walked on every call."""
    seen: set = set()
    queue = collections.deque(t.grad_fn for t in tensors if t.grad_fn is not None)
    queue += [a for t in tensors if (a := _accumulator(t)) is not None]
    completes: dict = {}  # node -> which of wanted it finds
    left = set()
    for g, nodes in enumerate(wanted):
        left.add(g)
        for n in nodes if isinstance(nodes, tuple) else (nodes,):
            completes.setdefault(n, []).append(g)
    while queue and left:
        node = queue.popleft()
        if node in seen:
            continue
        seen.add(node)
        if node in completes:
            left.difference_update(completes[node])
        queue += [n for n, _ in node.next_functions if n is not None]
    return seen


def _accumulator(t: torch.Tensor) -> Any:
    """A leaf's AccumulateGrad node (None where it is no leaf requiring grad)."""
    if not t.requires_grad or t.grad_fn is not None:
        return None
    with torch.enable_grad():
        return t.view_as(t).grad_fn.next_functions[0][0]


class _LaunchRecordFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, record, outputs, *inputs):
        ctx.record = record
        # version counters: in-place changes before backward raise (of what a derived kernel reads: kept_for_backward)
        ctx.save_for_backward(*record.plan.kept_for_backward(record.saved))
        ctx.donating = donation.saving(record.plan)  # (saved through host/donation.py's hooks)
        record.saved = None  # the record keeps no tensors: outputs would otherwise hold themselves alive
        ctx.set_materialize_grads(False)
        if record.plan.constants:
            ctx.mark_non_differentiable(*[outputs[i] for i in record.plan.constants])
        return outputs

    @staticmethod
    def jvp(ctx, *tangents):  # forward mode (an input with a tangent that requires grad too): not yet derived
        raise forward_mode_error(ctx.record.name)

    @staticmethod
    def backward(ctx, *grads):
        saved = ctx.saved_tensors  # (unpacked on each read)
        needs = ctx.needs_input_grad[2:]
        if torch.is_grad_enabled() and differentiated_again(saved, grads):  # create_graph: double backward
            return (None, None, *backward_as_op(ctx.record, saved, grads, needs))
        return (None, None, *_backward(ctx, saved, grads, needs))


def record_of(node: Any) -> Any:
    """The launch record whose backward an autograd node is (an op's call as one node), else None."""
    function = getattr(node, "_forward_cls", None)
    return node.record if isinstance(function, type) and issubclass(function, _LaunchRecordFunction) else None


class _SegmentFunction(torch.autograd.Function):
    """A segment of a host function's launches as one autograd node (segments.py): the buffers they wrote,
    passed in, come out marked dirty, so the tensors the host function holds carry the history; and views of them
    the host function returns (``views``: per view, its buffer's index, sizes, strides, offset), made again here so
    that the node is their history too (the plan's outputs: the buffers, then the views)."""

    @staticmethod
    def forward(ctx, record, count, views, *tensors):
        written = tensors[:count]
        ctx.record, ctx.count = record, count
        ctx.save_for_backward(*record.plan.kept_for_backward(record.saved))
        ctx.donating = donation.saving(record.plan)
        record.saved = None
        ctx.set_materialize_grads(False)
        ctx.mark_dirty(*written)
        outputs = (*written, *[written[j].as_strided(size, stride, offset) for j, size, stride, offset in views])
        if record.plan.constants:
            ctx.mark_non_differentiable(*[outputs[i] for i in record.plan.constants])
        return outputs

    @staticmethod
    def jvp(ctx, *tangents):
        raise forward_mode_error(ctx.record.name)

    @staticmethod
    def backward(ctx, *grads):
        saved, needs = ctx.saved_tensors, ctx.needs_input_grad[3 + ctx.count:]
        if torch.is_grad_enabled() and differentiated_again(saved, grads):  # create_graph: double backward
            return (None, None, None, *[None] * ctx.count, *backward_as_op(ctx.record, saved, grads, needs))
        return (None, None, None, *[None] * ctx.count, *_backward(ctx, saved, grads, needs))


def _backward(ctx: Any, saved: tuple, grads: tuple, needs: tuple) -> list:
    """The record's backward of a node, offered the memory of the saved tensors only it holds (host/donation.py)."""
    slots = donation.offered(ctx.record.plan, saved) if ctx.donating else None
    token = donation.donating.set(slots) if slots else None
    try:
        return ctx.record.backward(saved, grads, needs)
    except (NotImplementedError, RuntimeError) as e:
        refuse_batched_gradients(ctx.record.name, grads, e)
        raise
    finally:
        if token is not None:
            donation.donating.reset(token)


def differentiated_again(saved: tuple, grads: tuple) -> bool:
    return any(isinstance(t, torch.Tensor) and t.requires_grad for t in (*saved, *grads))


def backward_as_op(record: Any, saved: tuple, grads: tuple, needs: tuple, in_forward_mode: Any = None) -> list:
    """The record's backward (create_graph=True) run as a bare op of the tensors it reads (the saved tensors, the
    incoming gradients): its launches of the derived kernels are recorded on a launch record of its own, whose backward
    derives them in turn (reverse over reverse). A kernel tritongrad cannot differentiate again is refused there,
    naming the derived kernel's line. ``in_forward_mode``: ``(name, host function, args, again) -> outputs``, the
    backward op called through forward_mode.py instead (the backward of a call there: torch.func's grad, jacrev,
    hessian), its launches' tangent kernels the backward's tangent, ``again`` the same backward made again in reverse
    mode (a derivative of it: jacrev over jacrev); what cannot be run so is refused."""
    inner = getattr(getattr(record, "plan", None), "inner_saved", None)  # (None: not known, taken as made)
    made = [j for j, t in enumerate(saved) if t.is_floating_point() and t.numel() and not t.requires_grad
            and (inner is None or j in inner)]
    remake = None
    if made:  # its values depend on the inputs, but autograd does not see how: the op's own launches made them, and
        # run again inside the backward op (host/remake.py), so that its record follows that dependence
        remake = Remake.of(record, saved, made) if inner is not None else (
            "its backward reads a buffer the host function made, whose dependence on the inputs the double backward "
            "does not yet follow")
        if isinstance(remake, str):
            if in_forward_mode is not None:
                raise OpError(f"tritongrad.op `{record.name}`: {remake}")
            return list(differentiable_once(record.name, record.backward(saved, grads, needs), (*saved, *grads),
                                            remake))
    if in_forward_mode is None:
        rehearse(record, tuple(t.detach() for t in saved), tuple(g if g is None else g.detach() for g in grads), needs)
    # an incoming gradient made contiguous here, where autograd records the copy (a `.sum()`'s is expanded), not in
    # the op, where the buffer its backward made of it would be an intermediate autograd cannot follow
    grads = tuple(g if g is None or g.is_contiguous() else g.contiguous() for g in grads)
    present = [i for i, g in enumerate(grads) if g is not None]
    deterministic = getattr(record, "deterministic", False)
    name = f"{record.name} (its backward)"
    op = _backward_ops.get((name, deterministic))
    if op is None:  # one bare op per op's backward, its plans and replays kept across calls: a new kind of call is
        # planned (and its first backward checked) once, later ones replayed, as any op's are
        op = _backward_ops[name, deterministic] = recorded_call(
            backward_of, name, {}, arguments_of(backward_of), deterministic, hidden_reads=False)
    def backward_call() -> _BackwardCall:  # (one per call of the backward op: it learns what the call reached)
        return _BackwardCall(record, remake, len(saved), present, len(grads), needs)

    call = backward_call()

    def again(*tensors: torch.Tensor) -> Any:  # this backward made again in reverse mode (a derivative of it in
        token = _backward_call.set(backward_call())  # turn)
        try:
            return op(*tensors)
        finally:
            _backward_call.reset(token)

    token = _backward_call.set(call)
    try:
        args = (*saved, *[grads[i] for i in present])
        found = op(*args) if in_forward_mode is None else in_forward_mode(name, backward_of, args, again)
    except NotDifferentiableError as e:
        if in_forward_mode is not None:
            raise  # a derived kernel not differentiable in turn: gradients that refuse a
        # second differentiation (create_graph=True alone, as for a gradient penalty's first pass, still works)
        reason = f"its derived backward kernel cannot be differentiated in turn: {str(e).splitlines()[0]}"
        return list(differentiable_once(record.name, record.backward(saved, grads, needs), (*saved, *grads), reason))
    finally:
        _backward_call.reset(token)
    found = iter(found if isinstance(found, tuple) else (found,))
    return [next(found) if r else None for r in call.reached]


def rehearse(record: Any, saved: tuple, grads: tuple, needs: tuple) -> None:
    """The record's backward run once on plain tensors where its schedule has not been checked yet, before it runs as
    an op: recorded, it lays no guard bands (host/backward.py), so a launch that read outside a tensor it was passed
    would put gradient outside its shadow memory unchecked; this run refuses it (StrayWriteError) first."""
    plan = getattr(record, "plan", None)
    if plan is not None and checks(plan, needs, [g is not None for g in grads]):
        with torch.no_grad():
            record.backward(saved, grads, needs)


class _BackwardCall:
    """One backward run as an op (``backward_as_op``): the launch record whose backward it is and how its tensors were
    passed; ``reached``, once it ran: which input gradients it computed."""

    def __init__(self, record: Any, remake: Remake | None, count: int, present: list[int], width: int, needs: tuple):
        self.record, self.remake, self.count, self.present, self.width, self.needs = (
            record, remake, count, present, width, needs)
        self.reached: list[bool] = []


# the backward run as an op now (backward_of reads it), and each op's backward as a bare op by (name, deterministic)
_backward_call: contextvars.ContextVar[_BackwardCall] = contextvars.ContextVar("tritongrad_backward_call")
_backward_ops: dict[tuple[str, bool], Any] = Bounded(256)


def backward_of(*tensors: torch.Tensor) -> tuple:
    """The host function of an op's backward run as an op: the saved tensors, then the incoming gradients given."""
    call = _backward_call.get()
    given: list = [None] * call.width
    for i, g in zip(call.present, tensors[call.count:], strict=True):
        given[i] = g
    with recording():  # (each through Triton's run: no direct launch, no timed trials)
        kept = call.remake(tensors[:call.count]) if call.remake is not None else tensors[:call.count]
        # its launches recorded on this op's launch record: the current one once the launches made again ran (a
        # replay's that found them not its replay's has handed over to one recording them as a first call's)
        token = recording_backward.set(current_record.get())
        try:
            result = call.record.backward(kept, tuple(given), call.needs)
        finally:
            recording_backward.reset(token)
    call.reached = [g is not None for g in result]
    return tuple(g for g in result if g is not None)


def _camel(name: str) -> str:
    return "".join(part[:1].upper() + part[1:] for part in name.split("_")) or "Op"


def differentiable_once(name: str, grads: list, read: tuple, reason: str = "") -> tuple:
    """With create_graph=True, gradients that raise a clear error when differentiated again: connected to what the
    backward read (the saved inputs, the incoming gradients), so that a second backward reaches the error rather
    than finding no path and giving zero. ``reason``: why the derived kernels are not differentiated in turn."""
    if not torch.is_grad_enabled():
        return tuple(grads)
    anchors = [t for t in read if isinstance(t, torch.Tensor) and t.requires_grad]
    present = [i for i, g in enumerate(grads) if g is not None]
    if not anchors or not present:
        return tuple(grads)
    found = _NotTwice.apply((name, reason), len(present), *[grads[i] for i in present], *anchors)
    out = list(grads)
    for i, g in zip(present, found, strict=True):
        out[i] = g
    return tuple(out)


class _NotTwice(torch.autograd.Function):
    """The gradients a backward computed, as the outputs of a node whose own backward raises (double backward)."""

    @staticmethod
    def forward(ctx, name, count, *tensors):
        ctx.name, ctx.reason = name
        return tuple(t.clone() for t in tensors[:count])

    @staticmethod
    def backward(ctx, *grads):
        why = ctx.reason or "the derived backward kernels are not themselves differentiated"
        raise OpError(f"tritongrad.op `{ctx.name}`: double backward is not supported ({why}); differentiate once, or "
                      "compute the second derivative another way")


def output_tensors(outputs: tuple) -> list[torch.Tensor]:
    """The tensors among an op's outputs and inside containers among them (a bare op may return a dict)."""
    found = []
    for o in outputs:
        if isinstance(o, torch.Tensor):
            found.append(o)
        elif is_container(o):
            found += [t for _, t in tensor_leaves(o)]
    return found


def transformed() -> bool:
    """Whether a call may be under forward-mode AD (a dual level is open: torch.autograd.forward_ad, torch.func.jvp)
    or a torch.func transform: then ``refuse_transforms`` looks closer. Two reads, on every call."""
    return _forward_ad._current_level >= 0 or torch._C._are_functorch_transforms_active()


def arguments_of(fn: Any):
    """A function from a call's arguments to its tensor arguments by name (used to check a new kind of call, and
    by named ops): each parameter's tensor, and each tensor inside a container it holds (a pytree's leaves: a
    list, a tuple, ``*args``, a dict), named by its path (``ts[0]``, ``args[1]``, ``d['w']``; ``**kwargs``' by
    their keywords), every one an input checked like any other."""
    sig = inspect.signature(fn)
    kinds = [p.kind for p in sig.parameters.values()]
    # the usual call, positional arguments only, named without Signature.bind (microseconds on every call)
    positional = [p.name for p in sig.parameters.values()] if all(
        k == inspect.Parameter.POSITIONAL_OR_KEYWORD for k in kinds) else None
    keywords = next((p.name for p in sig.parameters.values() if p.kind == inspect.Parameter.VAR_KEYWORD), None)

    def arguments(args: tuple, kwargs: dict) -> dict[str, torch.Tensor]:
        if positional is not None and not kwargs and len(args) <= len(positional):
            pairs = zip(positional, args, strict=False)
        else:
            bound = dict(sig.bind(*args, **kwargs).arguments)
            extra = bound.pop(keywords, {}) if keywords else {}  # **kwargs: named by their keywords
            pairs = [*bound.items(), *extra.items()]
        found = {}
        for k, v in pairs:
            if isinstance(v, torch.Tensor):
                found[k] = v
            elif is_container(v):
                found.update((k + path, t) for path, t in tensor_leaves(v))
        return found

    return arguments


def differentiable(t: torch.Tensor) -> bool:
    return t.requires_grad and t.is_floating_point()
