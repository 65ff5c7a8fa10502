"""``@tritongrad.op``: a PyTorch operator with autograd, from a host function that launches Triton kernels.

    @tritongrad.op                       # or @tritongrad.op("mylib::scale") for a torch.library op
    def scale(x, w):
        y = torch.empty_like(x)
        scale_kernel[(triton.cdiv(x.numel(), 256),)](x, w, y, x.numel(), BLOCK=256)
        return y

The function takes tensors and Python scalars, allocates its outputs, launches any number
of kernels (plain ``@triton.jit``, ``@triton.autotune``, ``@triton.heuristics``; kernels
are not changed) and returns a tensor or a tuple of tensors.

Forward: the function runs as written while its launches are recorded on a tape
(``tritongrad.ops.tape``). The checks below and the backward's layout are worked out once per
kind of call (the kernels launched, the tensors' layouts) and reused by later calls of that
kind, which read tensor metadata only: no AST work, nothing that waits for the device.
Under ``torch.no_grad`` it just runs.

Backward: each launch's backward is derived with ``tritongrad.grad``, specialised to the
inputs that need gradients (built on first use, cached), and launched in reverse order
against shadow memory keyed by storage. A buffer one launch writes and a later one reads
passes the gradient from the later launch's backward to the earlier one's. Only tensors
kernels read (inputs and intermediate buffers) are saved for the backward; modifying one
in place before the backward raises, as for any autograd node.

Autotuning: the backward of an autotuned (or heuristics-driven) launch is launched with
the config that forward launch used: its constexprs, ``num_warps`` and ``num_stages``.

Hazards: the backward replays each launch against memory as the op left it, so a launch
that overwrites memory an earlier launch (or the same launch through another argument)
read, or that overwrites with ``tl.store`` what an earlier launch wrote, is refused with
an error naming both launches. Overlap is judged by each view's address range, so
interleaved views of one buffer count as overlapping. Kernels may not write to tensors
that require grad. Double backward raises.

Arguments: the backward differentiates the launches as they ran, so what the host function
passes (shapes, strides, lengths, dtypes) is its own business. Gradients come in each
input's dtype; integer tensors get none. The first backward of each kind of call refuses a
launch that read memory outside the elements of a tensor it was passed (a length or stride
the host function got wrong, a strided view read as contiguous): that memory's gradient
would have nowhere to go.

Bare and named ops:

- ``@tritongrad.op`` wraps the function in an ``autograd.Function``. PyTorch operations in
  the function before the launches (``x.contiguous()``, tensors captured from outside) are
  tracked by autograd as usual: every tensor a kernel reads that requires grad gets one.
- ``@tritongrad.op("ns::name")`` also registers ``ns::name`` with ``torch.library``, with an
  autograd formula, so ``torch.compile(fullgraph=True)`` and ``torch.library.opcheck`` work.
  Schema types come from the annotations; a parameter without one is a Tensor, or the type
  of its default; the return is a Tensor unless annotated (``-> tuple[torch.Tensor, torch.Tensor]``).
  Called eagerly, the backward replays the tape recorded in the forward. Four ops are registered:

  - ``ns::name``: a ``torch.library.triton_op``. While torch.compile traces it, each launch
    ``kernel[grid](...)`` of the host function is issued as ``wrap_triton(kernel)[grid](...)``
    (``hooks.collecting("wrap")``), so Inductor sees the kernels (an autotuner as one, tuned by
    Inductor). Called through ``torch.ops`` without a tape, its backward is ``ns::name_backward``,
    which re-runs the forward launches first (as activation checkpointing would).
  - ``ns::name_saving``: what a compiled graph calls: the same forward, returning its outputs and
    the buffers its launches pass between them (whole tensors the op neither takes nor returns), so
    the graph saves them. Its backward ``ns::name_saved_backward`` runs the host function with its
    launches skipped (for their arguments), swaps its fresh buffers for the saved ones, and replays
    the derived kernels from that tape: the forward launches do not run again.

  Fallbacks, each explicit: ``opaque=True``, and by default under Triton's interpreter (whose
  kernels are not ``JITFunction`` objects, which ``wrap_triton`` needs), register ``custom_op`` ops
  instead of triton_ops (fake implementation: the host function with launches skipped; still
  saving); a launch ``wrap_triton`` refuses (``num_ctas`` passed at the launch, an autotuner
  with a ``pre_hook``, nested autotuners) raises OpError when torch.compile traces it, saying
  so. ``TRITONGRAD_OPAQUE_OPS=1`` (read at registration) gives the previous behaviour
  (opaque, no saving op: the compiled backward re-runs the forward launches), for comparison.
  ``ns::name_saved_backward`` re-runs the forward launches where the saved buffers cannot stand
  in: an autotuned launch (the config Inductor's tuning chose, which the derived kernel needs, is
  not known there) and a buffer that is a view of a larger allocation (its aliasing would be lost).
  The backward is an opaque ``custom_op`` in every mode: its first call per kind checks gradient
  memory for strays, index checks read tensor contents and launch settings are timed on the
  device, none of which can run on the fake tensors torch.compile traces with.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import os
import typing
from dataclasses import dataclass
from typing import Any

import torch

from ..core.errors import OpError
from . import hooks
from .segments import Segments
from .tape import Tape, current_tape

_stash: contextvars.ContextVar[list | None] = contextvars.ContextVar("tritongrad_stash", default=None)


OPAQUE_ENV = "TRITONGRAD_OPAQUE_OPS"  # "1": every named op is registered opaque (see op's docstring)


def op(fn: Any = None, /, *, deterministic: bool = False, opaque: bool | None = None):
    """Make a host function that launches Triton kernels a differentiable PyTorch operator.

    ``@op`` or ``@op("namespace::name")``; see the module docstring. ``deterministic=True``:
    gradients bitwise identical from run to run (no atomic additions; a load whose gradient
    could only be added atomically is refused at the backward, naming it). ``opaque`` (named
    ops): True registers a plain ``custom_op`` that torch.compile does not trace into; by
    default only under Triton's interpreter or with ``TRITONGRAD_OPAQUE_OPS=1``.
    """
    if isinstance(fn, str):
        return lambda f: _named(f, fn, deterministic, opaque_default() if opaque is None else opaque)
    if fn is None:
        return lambda f: _bare(f, deterministic)
    return _bare(fn, deterministic)


def _bare(fn: Any, deterministic: bool = False) -> Any:
    hooks.install()
    taped = _taped(fn, fn.__qualname__, {}, _arguments_of(fn), deterministic)

    @functools.wraps(fn)
    def call(*args, **kwargs):
        if not torch.is_grad_enabled() or hooks.active():  # inference, or inside another op's tape
            return fn(*args, **kwargs)
        return taped(*args, **kwargs)

    return call


def _taped(fn: Any, name: str, plans: dict, arguments, deterministic: bool, named: bool = False) -> Any:
    """``fn`` with its launches recorded on a tape and its outputs made the outputs of an
    ``autograd.Function`` whose backward replays the tape; ``plans`` are shared by the op's calls
    (see tritongrad.ops.tape). ``named``: as a registered op sees it, the differentiable inputs are the
    op's own tensor arguments (a launch reading a tensor PyTorch made inside is refused, as it is
    when the op is compiled)."""
    function = type(_camel(fn.__name__), (_TapeFunction,), {})  # grad_fn reads <FnNameBackward>
    segment = type(_camel(fn.__name__), (_SegmentFunction,), {})

    def segment_node(tape: Tape, written: list, inputs: list) -> None:
        segment.apply(tape, len(written), *written, *inputs)

    def call(*args, **kwargs):
        if named:
            tape = Tape(name, plans, deterministic)
            with tape:  # records the launches
                result = fn(*args, **kwargs)
        else:  # PyTorch operations on what launches wrote make segments (segments.py)
            segments = Segments(name, plans, deterministic, args, kwargs, arguments, segment_node)
            token = current_tape.set(segments.tape)
            try:
                try:
                    result = fn(*args, **kwargs)
                except BaseException:
                    segments.disarm()
                    raise
                if segments.finish(result):
                    _check_reached(name, arguments(args, kwargs), _as_tuple(result))
                    return result
            finally:
                current_tape.reset(token)
            tape = segments.tape
        several = isinstance(result, (tuple, list))
        outputs = tuple(result) if several else (result,)
        diff = [t for t in arguments(args, kwargs).values() if _differentiable(t)] if named else None
        inputs = tape.close(outputs, args, kwargs, arguments, diff_inputs=diff)
        if named:
            _refuse_unread(name, tape.plan.unread)
        if not inputs:
            _check_reached(name, arguments(args, kwargs), outputs)
            return result
        outputs = function.apply(tape, outputs, *inputs)
        if tape.plan.unread:
            _check_reached(name, arguments(args, kwargs), outputs, tape.plan.unread)
        return outputs if several else outputs[0]

    return call


def _refuse_unread(name: str, unread: tuple[str, ...]) -> None:
    """A named op's arguments that require grad must be read by its launches (its autograd formula covers them)."""
    if unread:
        raise OpError(_UNREAD.format(name=name, arg=unread[0]))


def _check_reached(name: str, named: dict[str, torch.Tensor], outputs: tuple, candidates: tuple | None = None) -> None:
    """Refuse a call whose outputs are cut off from an argument that requires grad (of ``candidates``: those no
    launch reads; None: every one): autograd must lead from the outputs back to it, else its gradient would be
    silently missing (a tensor whose address the kernel reads from a pointer table or a host descriptor)."""
    waiting = [(k, t) for k, t in named.items() if _differentiable(t) and (candidates is None or k in candidates)]
    if not waiting:
        return
    reached = _autograd_ancestors([o for o in outputs if isinstance(o, torch.Tensor) and o.requires_grad])
    for k, t in waiting:
        if (t.grad_fn if t.grad_fn is not None else _accumulator(t)) not in reached:
            raise OpError(_UNREAD.format(name=name, arg=k))


_UNREAD = ("tritongrad.op `{name}`: the argument `{arg}` requires grad, but no kernel launch reads it as a tensor "
           "argument (is its address in a pointer table, or in a TensorDescriptor made on the host?): tritongrad "
           "cannot see such reads, and its gradient would be silently missing. Pass the tensor itself to the kernel "
           "(descriptors made in the kernel with tl.make_tensor_descriptor are differentiated), or detach it if the "
           "op does not use it")


def _autograd_ancestors(tensors: list) -> set:
    """The autograd nodes the tensors' values come from (their graph, walked back to its leaves)."""
    seen: set = set()
    stack = [t.grad_fn for t in tensors if t.grad_fn is not None]
    stack += [a for t in tensors if (a := _accumulator(t)) is not None]
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        stack += [n for n, _ in node.next_functions if n is not None]
    return seen


def _accumulator(t: torch.Tensor) -> Any:
    """A leaf's AccumulateGrad node (None where it is no leaf requiring grad)."""
    if not t.requires_grad or t.grad_fn is not None:
        return None
    with torch.enable_grad():
        return t.view_as(t).grad_fn.next_functions[0][0]


class _TapeFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tape, outputs, *inputs):
        ctx.tape = tape
        ctx.save_for_backward(*tape.saved)  # version counters: in-place changes before backward raise
        tape.saved = None  # the tape keeps no tensors: outputs would otherwise hold themselves alive
        ctx.set_materialize_grads(False)
        if tape.plan.constants:
            ctx.mark_non_differentiable(*[outputs[i] for i in tape.plan.constants])
        return outputs

    @staticmethod
    def backward(ctx, *grads):
        result = ctx.tape.backward(ctx.saved_tensors, grads, ctx.needs_input_grad[2:])
        return (None, None, *_once(ctx.tape.name, result, (*ctx.saved_tensors, *grads)))


class _SegmentFunction(torch.autograd.Function):
    """A segment of a host function's launches as one autograd node (segments.py): the buffers they wrote,
    passed in, come out marked dirty, so the tensors the host function holds carry the history."""

    @staticmethod
    def forward(ctx, tape, count, *tensors):
        written = tensors[:count]
        ctx.tape, ctx.count = tape, count
        ctx.save_for_backward(*tape.saved)
        tape.saved = None
        ctx.set_materialize_grads(False)
        ctx.mark_dirty(*written)
        if tape.plan.constants:
            ctx.mark_non_differentiable(*[written[i] for i in tape.plan.constants])
        return written

    @staticmethod
    def backward(ctx, *grads):
        result = ctx.tape.backward(ctx.saved_tensors, grads, ctx.needs_input_grad[2 + ctx.count:])
        return (None, None, *[None] * ctx.count, *_once(ctx.tape.name, result, (*ctx.saved_tensors, *grads)))


def _camel(name: str) -> str:
    return "".join(part[:1].upper() + part[1:] for part in name.split("_")) or "Op"


def _once(name: str, grads: list, read: tuple) -> tuple:
    """With create_graph=True, gradients that raise a clear error when differentiated again: connected to what the
    backward read (the saved inputs, the incoming gradients), so that a second backward reaches the error rather
    than finding no path and giving zero."""
    if not torch.is_grad_enabled():
        return tuple(grads)
    anchors = [t for t in read if isinstance(t, torch.Tensor) and t.requires_grad]
    present = [i for i, g in enumerate(grads) if g is not None]
    if not anchors or not present:
        return tuple(grads)
    found = _NotTwice.apply(name, len(present), *[grads[i] for i in present], *anchors)
    out = list(grads)
    for i, g in zip(present, found, strict=True):
        out[i] = g
    return tuple(out)


class _NotTwice(torch.autograd.Function):
    """The gradients a backward computed, as the outputs of a node whose own backward raises (double backward)."""

    @staticmethod
    def forward(ctx, name, count, *tensors):
        ctx.name = name
        return tuple(t.clone() for t in tensors[:count])

    @staticmethod
    def backward(ctx, *grads):
        raise OpError(f"tritongrad.op `{ctx.name}`: double backward is not supported (the derived backward kernels "
                      "are not themselves differentiated); differentiate once, or compute the second derivative "
                      "another way")


def _as_tuple(result: Any) -> tuple:
    return tuple(result) if isinstance(result, (tuple, list)) else (result,)


def _arguments_of(fn: Any):
    """A function from a call's arguments to its tensor arguments by parameter name (used to
    check a new kind of call, and by named ops)."""
    sig = inspect.signature(fn)
    kinds = [p.kind for p in sig.parameters.values()]
    # the usual call, positional arguments only, named without Signature.bind (microseconds on every call)
    positional = [p.name for p in sig.parameters.values()] if all(
        k == inspect.Parameter.POSITIONAL_OR_KEYWORD for k in kinds) else None

    def arguments(args: tuple, kwargs: dict) -> dict[str, torch.Tensor]:
        if positional is not None and not kwargs and len(args) <= len(positional):
            return {k: v for k, v in zip(positional, args, strict=False) if isinstance(v, torch.Tensor)}
        bound = sig.bind(*args, **kwargs)
        return {k: v for k, v in bound.arguments.items() if isinstance(v, torch.Tensor)}

    return arguments


# -- named ops -------------------------------------------------------------------------------------


def opaque_default() -> bool:
    """Whether named ops are registered opaque unless told otherwise: under Triton's interpreter
    (its kernels are not ``JITFunction``s, which ``wrap_triton`` needs) or with ``TRITONGRAD_OPAQUE_OPS=1``."""
    return os.environ.get("TRITON_INTERPRET") == "1" or _legacy()


def _legacy() -> bool:
    """``TRITONGRAD_OPAQUE_OPS=1``: named ops as before triton_op (opaque, the compiled backward recomputing)."""
    return os.environ.get(OPAQUE_ENV) == "1"


def _named(fn: Any, name: str, deterministic: bool = False, opaque: bool = True) -> Any:
    hooks.install()
    arguments = _arguments_of(fn)
    plans = {}  # shared by the eager forward's tapes and the backwards' (see tritongrad.ops.tape)
    protos = _prototypes(fn)
    forward = _register(name, protos.forward, _named_impl(fn, name, arguments, plans, deterministic, not opaque),
                        _fake(fn), opaque)
    backward_op = torch.library.custom_op(name + "_backward", mutates_args=(), schema=torch.library.infer_schema(
        protos.backward, mutates_args=()))(_recompute_backward(fn, name, arguments, plans, deterministic))
    backward_op.register_fake(_fake_backward)
    setup_context, backward = _autograd(backward_op, name)
    forward.register_autograd(backward, setup_context=setup_context)
    saving = None
    if not _legacy():  # what torch.compile calls: the forward also returns what its backward reads
        saving = _register(name + "_saving", protos.saving, _saving_impl(fn, name, not opaque), _saving_fake(fn),
                           opaque)
        saved_backward = torch.library.custom_op(
            name + "_saved_backward", mutates_args=(),
            schema=torch.library.infer_schema(protos.saved_backward, mutates_args=()))(
            _saved_backward(fn, name, arguments, plans, deterministic))
        saved_backward.register_fake(_fake_saved_backward)
        setup_context, backward = _saving_autograd(saved_backward, name, protos.outputs)
        saving.register_autograd(backward, setup_context=setup_context)
    several = protos.outputs > 1 or _several(protos.forward)
    taped = _taped(fn, name, plans, arguments, deterministic, named=True)

    @functools.wraps(fn)
    def call(*args, **kwargs):
        if torch.compiler.is_compiling():
            if saving is None or not torch.is_grad_enabled():
                return forward(*args, **kwargs)
            found = saving(*args, **kwargs)
            return tuple(found[:protos.outputs]) if several else found[0]
        if not torch.is_grad_enabled():
            return forward(*args, **kwargs)
        if hooks.active():  # inside another op: its tape records these launches
            return fn(*args, **kwargs)
        if _plain_eager(args, kwargs):  # what the dispatcher would do, without its cost
            return taped(*args, **kwargs)
        token = _stash.set([])  # the forward leaves its tape here for setup_context
        try:
            return forward(*args, **kwargs)
        finally:
            _stash.reset(token)

    call.op, call.backward_op, call.saving_op, call.opaque = forward, backward_op, saving, opaque  # torch.library ops
    return call


def _plain_eager(args: tuple, kwargs: dict) -> bool:
    """An eager call the bare op's ``autograd.Function`` can take in place of the registered op: plain
    tensors, no dispatch mode (fake tensors, FLOP counters), no functorch transform, no profiler (whose
    trace names the op). It saves the dispatcher's ~100 us per forward+backward (benchmarks/RESULTS.md)."""
    if torch._C._len_torch_dispatch_stack() or torch._C._are_functorch_transforms_active() \
            or torch.autograd._profiler_enabled():
        return False
    return all(type(v) in _PLAIN for v in (*args, *kwargs.values()) if isinstance(v, torch.Tensor))


_PLAIN = (torch.Tensor, torch.nn.Parameter)


def _register(name: str, proto: Any, impl: Any, fake: Any, opaque: bool) -> Any:
    """A ``custom_op`` with a fake implementation (opaque), or a ``triton_op``: then the fake implementation
    and the decomposition torch.compile traces are ``impl`` itself, its launches issued through wrap_triton."""
    if opaque:
        op = torch.library.custom_op(name, mutates_args=(), schema=torch.library.infer_schema(proto, mutates_args=()))
        op = op(impl)
        op.register_fake(fake)
        return op
    impl.__signature__ = inspect.signature(proto)  # triton_op infers the schema from it
    return torch.library.triton_op(name, impl, mutates_args=())


def _named_impl(fn: Any, name: str, arguments, plans: dict, deterministic: bool, traced: bool = False):
    def impl(*args, **kwargs):
        if traced and _wrap_triton_enabled():  # torch.compile tracing the triton_op: launches via wrap_triton
            with hooks.collecting("wrap", name):
                return fn(*args, **kwargs)
        stash = _stash.get()
        if stash is None:  # no eager caller waiting for a tape: compiled code, no grad, direct torch.ops calls
            return fn(*args, **kwargs)
        bound = arguments(args, kwargs)
        diff = [t for t in bound.values() if _differentiable(t)]
        if not diff:
            return fn(*args, **kwargs)
        token = _stash.set(None)  # ops inside fn do not take the stash
        try:
            tape = Tape(name, plans, deterministic)
            with tape.recording():
                result = fn(*args, **kwargs)
            tape.close(_as_tuple(result), args, kwargs, arguments, diff_inputs=diff)
            _refuse_unread(name, tape.plan.unread)
        finally:
            _stash.reset(token)
        stash.append(tape)
        return result

    return impl


def _wrap_triton_enabled() -> bool:
    """False while a triton_op runs on real tensors (torch disables wrap_triton there)."""
    from torch._library.triton import is_wrap_triton_enabled

    return is_wrap_triton_enabled()


def _differentiable(t: torch.Tensor) -> bool:
    return t.requires_grad and t.is_floating_point()


def _fake(fn: Any):
    def fake(*args, **kwargs):
        with hooks.dry_run():
            return fn(*args, **kwargs)

    return fake


def _fake_backward(*args):
    *inputs, _grads, needs = args
    tensors = [a for a in inputs if isinstance(a, torch.Tensor)]
    return [torch.empty_like(t) for t, need in zip(tensors, needs, strict=True) if need]


def _recompute_backward(fn: Any, name: str, arguments, plans: dict, deterministic: bool):
    def backward(*args):
        *inputs, grads, needs = args
        tape = Tape(name, plans, deterministic)
        with tape.recording():
            outputs = _as_tuple(fn(*inputs))
        return _gradients(tape, outputs, inputs, arguments, grads, needs)

    return backward


def _gradients(tape: Tape, outputs: tuple, inputs: list, arguments, grads: list, needs: list) -> list:
    """The needed inputs' gradients from a recorded forward (zeros where none reaches)."""
    diff = [t for t, need in zip(arguments(tuple(inputs), {}).values(), needs, strict=True) if need]
    tape.close(outputs, tuple(inputs), {}, arguments, diff_inputs=diff)
    saved, tape.saved = tuple(tape.saved), None
    result = tape.backward(saved, tuple(grads), [True] * len(diff))
    return [torch.zeros_like(t) if g is None else torch.empty_like(t).copy_(g) for t, g in zip(diff, result,
                                                                                               strict=True)]


# -- what torch.compile calls: a forward that returns what its backward reads ----------------------


def _saving_impl(fn: Any, name: str, traced: bool):
    """The op's outputs, then the buffers its launches pass between them (``Launches.intermediates``,
    whole tensors only), so that a compiled graph saves them rather than re-running the launches."""
    def impl(*args):
        with hooks.collecting("wrap" if traced and _wrap_triton_enabled() else "run", name) as launches:
            outputs = _as_tuple(fn(*args))
        return [*outputs, *_whole(launches.intermediates(args, outputs))]

    return impl


def _saving_fake(fn: Any):
    def fake(*args):
        with hooks.collecting("skip") as launches:
            outputs = _as_tuple(fn(*args))
        return [*outputs, *_whole(launches.intermediates(args, outputs))]

    return fake


def _whole(tensors: list) -> list:
    return [t for t in tensors if t._base is None]


def _saved_backward(fn: Any, name: str, arguments, plans: dict, deterministic: bool):
    """The backward from the saving forward's outputs and buffers: the host function is run again with its
    launches skipped (for their arguments), its fresh buffers swapped for the saved ones, and the launches
    recorded on a tape as in eager mode. Where the buffers cannot be matched (an autotuned launch, whose
    config is unknown here; a buffer that is a view of another tensor) the launches are re-run instead."""
    recompute = _recompute_backward(fn, name, arguments, plans, deterministic)

    def backward(*args):
        *inputs, saved, grads, needs = args
        with hooks.collecting("skip") as launches:
            fresh = _as_tuple(fn(*inputs))
        saved = [t.detach() for t in saved]  # an eager caller's outputs require grad; kernels wrote them
        swaps = _swaps(launches, inputs, fresh, saved)
        if swaps is None:
            return recompute(*inputs, grads, needs)
        swap = lambda v: swaps.get(id(v), v) if isinstance(v, torch.Tensor) else v  # noqa: E731
        tape = Tape(name, plans, deterministic)
        for kernel, grid, a, kw in launches.calls:
            tape.record(kernel, grid, tuple(map(swap, a)), {k: swap(v) for k, v in kw.items()})
        return _gradients(tape, tuple(saved[:len(fresh)]), inputs, arguments, grads, needs)

    return backward


def _swaps(launches: hooks.Launches, inputs: list, fresh: tuple, saved: list) -> dict | None:
    """id(fresh tensor) -> the saved one in its place, or None where they cannot be matched."""
    buffers = launches.intermediates(inputs, fresh)
    ours = [*fresh, *buffers]
    if launches.tuned or len(ours) != len(saved) or len(_whole(buffers)) != len(buffers):
        return None
    if any((a.shape, a.stride(), a.dtype) != (b.shape, b.stride(), b.dtype) for a, b in zip(ours, saved, strict=True)):
        return None
    return {id(a): b for a, b in zip(ours, saved, strict=True)}


def _fake_saved_backward(*args):
    *inputs, _saved, grads, needs = args
    return _fake_backward(*inputs, grads, needs)


def _saving_autograd(saved_backward: Any, name: str, count: int):
    def setup_context(ctx, inputs, output):
        ctx.positions = [i for i, a in enumerate(inputs) if isinstance(a, torch.Tensor)]
        ctx.others = [None if isinstance(a, torch.Tensor) else a for a in inputs]
        ctx.save_for_backward(*[inputs[i] for i in ctx.positions], *output)
        ctx.mark_non_differentiable(*output[count:])  # the buffers
        ctx.set_materialize_grads(False)

    def backward(ctx, *grads):
        if len(grads) == 1 and isinstance(grads[0], (list, tuple)):
            grads = grads[0]
        needs = [ctx.needs_input_grad[i] for i in ctx.positions]
        result = [None] * len(ctx.needs_input_grad)
        if not any(needs):
            return tuple(result)
        tensors = ctx.saved_tensors
        args = list(ctx.others)
        for i, t in zip(ctx.positions, tensors, strict=False):
            args[i] = t
        found = iter(saved_backward(*args, list(tensors[len(ctx.positions):]), list(grads[:count]), needs))
        for i, need in zip(ctx.positions, needs, strict=True):
            if need:
                result[i] = next(found)
        return _once(name, result, (*tensors, *grads))

    return setup_context, backward


def _autograd(backward_op: Any, name: str):
    def setup_context(ctx, inputs, output):
        stash = _stash.get()
        ctx.tape = stash.pop() if stash else None
        ctx.positions = [i for i, a in enumerate(inputs) if isinstance(a, torch.Tensor)]
        if ctx.tape is not None:
            ctx.save_for_backward(*ctx.tape.saved)
            ctx.tape.saved = None
            ctx.diff = [_differentiable(inputs[i]) for i in ctx.positions]  # as the forward chose them
            ctx.set_materialize_grads(False)
        else:
            ctx.others = [None if isinstance(a, torch.Tensor) else a for a in inputs]
            ctx.save_for_backward(*[inputs[i] for i in ctx.positions])

    def backward(ctx, *grads):
        needs = [ctx.needs_input_grad[i] for i in ctx.positions]
        result = [None] * len(ctx.needs_input_grad)
        if not any(needs):
            return tuple(result)
        if ctx.tape is not None:
            tape_needs = [need for need, diff in zip(needs, ctx.diff, strict=True) if diff]
            found = iter(ctx.tape.backward(ctx.saved_tensors, grads, tape_needs))
            for i, diff in zip(ctx.positions, ctx.diff, strict=True):
                if diff:
                    result[i] = next(found)
        else:
            args = list(ctx.others)
            for i, t in zip(ctx.positions, ctx.saved_tensors, strict=True):
                args[i] = t
            found = iter(backward_op(*args, list(grads), needs))
            for i, need in zip(ctx.positions, needs, strict=True):
                if need:
                    result[i] = next(found)
        return _once(name, result, (*ctx.saved_tensors, *grads))

    return setup_context, backward


_DEFAULT_TYPES = {bool: bool, int: int, float: float, str: str}


@dataclass(frozen=True)
class _Prototypes:
    """Stand-in functions whose annotated signatures give the schemas of an op's forward, its recomputing
    backward, its saving forward (outputs and buffers in one list) and that one's backward; ``outputs``:
    how many tensors the op returns."""

    forward: Any
    backward: Any
    saving: Any
    saved_backward: Any
    outputs: int


def _several(proto: Any) -> bool:
    return typing.get_origin(inspect.signature(proto).return_annotation) in (tuple, list)


def _prototypes(fn: Any) -> _Prototypes:
    sig = inspect.signature(fn, eval_str=True)
    params = []
    for p in sig.parameters.values():
        if p.kind not in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            raise TypeError(f"tritongrad.op: named ops take positional parameters; `{p.name}` of `{fn.__name__}` "
                            "is not one")
        ann = p.annotation
        if ann is inspect.Parameter.empty:
            if p.default is inspect.Parameter.empty:
                ann = torch.Tensor
            elif p.default is None:
                ann = typing.Optional[torch.Tensor]  # noqa: UP045 (infer_schema wants typing.Optional)
            else:
                ann = _DEFAULT_TYPES.get(type(p.default))
                if ann is None:
                    raise TypeError(f"tritongrad.op: annotate the parameter `{p.name}` of `{fn.__name__}`")
        params.append(p.replace(annotation=ann))
    ret = torch.Tensor if sig.return_annotation is inspect.Signature.empty else sig.return_annotation

    def stand_in(parameters: list, returns: Any) -> Any:
        def proto():
            pass

        proto.__signature__ = inspect.Signature(parameters, return_annotation=returns)
        return proto

    plain = [p.replace(default=inspect.Parameter.empty, kind=inspect.Parameter.POSITIONAL_OR_KEYWORD) for p in params]
    extra = [inspect.Parameter("tg_grads", inspect.Parameter.POSITIONAL_OR_KEYWORD,
                               annotation=list[typing.Optional[torch.Tensor]]),  # noqa: UP045
             inspect.Parameter("tg_needs", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=list[bool])]
    saved = inspect.Parameter("tg_saved", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=list[torch.Tensor])
    outputs = len(typing.get_args(ret)) if typing.get_origin(ret) in (tuple, list) else 1
    return _Prototypes(stand_in(params, ret), stand_in([*plain, *extra], list[torch.Tensor]),
                       stand_in(params, list[torch.Tensor]), stand_in([*plain, saved, *extra], list[torch.Tensor]),
                       outputs)
