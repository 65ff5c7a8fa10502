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
(``tritongrad.tape``). The checks below and the backward's layout are worked out once per
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
- ``@tritongrad.op("ns::name")`` also registers ``ns::name`` (and ``ns::name_backward``)
  with ``torch.library.custom_op``: a fake implementation (the function run on fake
  tensors with launches skipped) and an autograd formula, so ``torch.compile(fullgraph=True)``
  and ``torch.library.opcheck`` work. The op is opaque to Inductor (launches are not
  traced through ``wrap_triton``), which also makes it work under Triton's interpreter.
  Called eagerly, the backward replays the tape recorded in the forward; where no tape
  exists (compiled graphs, direct ``torch.ops`` calls) ``ns::name_backward`` re-runs the
  forward launches first (as activation checkpointing would). Schema types come from the
  annotations; a parameter without one is a Tensor, or the type of its default; the
  return is a Tensor unless annotated (``-> tuple[torch.Tensor, torch.Tensor]``).
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import typing
from typing import Any

import torch

from . import tape as tapes
from .tape import Tape

_stash: contextvars.ContextVar[list | None] = contextvars.ContextVar("tritongrad_stash", default=None)


def op(fn: Any = None, /, *, deterministic: bool = False):
    """Make a host function that launches Triton kernels a differentiable PyTorch operator.

    ``@op`` or ``@op("namespace::name")``; see the module docstring. ``deterministic=True``:
    gradients bitwise identical from run to run (no atomic additions; a load whose gradient
    could only be added atomically is refused at the backward, naming it).
    """
    if isinstance(fn, str):
        return lambda f: _named(f, fn, deterministic)
    if fn is None:
        return lambda f: _bare(f, deterministic)
    return _bare(fn, deterministic)


def _bare(fn: Any, deterministic: bool = False) -> Any:
    tapes.install()
    arguments = _arguments_of(fn)
    function = type(_camel(fn.__name__), (_TapeFunction,), {})  # grad_fn reads <FnNameBackward>
    name, plans = fn.__qualname__, {}  # plans: shared by the op's calls (see tritongrad.tape)

    @functools.wraps(fn)
    def call(*args, **kwargs):
        if not torch.is_grad_enabled() or tapes.active():  # inference, or inside another op's tape
            return fn(*args, **kwargs)
        tape = Tape(name, plans, deterministic)
        with tape:  # records the launches
            result = fn(*args, **kwargs)
        several = isinstance(result, (tuple, list))
        outputs = tuple(result) if several else (result,)
        inputs = tape.close(outputs, args, kwargs, arguments)
        if not inputs:
            return result
        outputs = function.apply(tape, outputs, *inputs)
        return outputs if several else outputs[0]

    return call


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
        return (None, None, *_once(ctx.tape.name, result))


def _camel(name: str) -> str:
    return "".join(part[:1].upper() + part[1:] for part in name.split("_")) or "Op"


def _once(name: str, grads: list) -> tuple:
    """With create_graph=True, gradients that raise a clear error when differentiated again."""
    if not torch.is_grad_enabled():
        return tuple(grads)
    err = torch._C._functions.DelayedError(
        f"tritongrad.op `{name}`: double backward is not supported (the derived backward kernels are "
        "not themselves differentiable)".encode(), len(grads))
    fakes = [g.detach().requires_grad_() if g is not None else None for g in grads]
    out = err(*fakes)
    return out if isinstance(out, tuple) else (out,)


def _as_tuple(result: Any) -> tuple:
    return tuple(result) if isinstance(result, (tuple, list)) else (result,)


def _arguments_of(fn: Any):
    """A function from a call's arguments to its tensor arguments by parameter name (used to
    check a new kind of call, and by named ops)."""
    sig = inspect.signature(fn)

    def arguments(args: tuple, kwargs: dict) -> dict[str, torch.Tensor]:
        bound = sig.bind(*args, **kwargs)
        return {k: v for k, v in bound.arguments.items() if isinstance(v, torch.Tensor)}

    return arguments


# -- named ops -------------------------------------------------------------------------------------


def _named(fn: Any, name: str, deterministic: bool = False) -> Any:
    tapes.install()
    arguments = _arguments_of(fn)
    plans = {}  # shared by the eager forward's tapes and the recomputing backward's (see tritongrad.tape)
    fwd_proto, bwd_proto = _prototypes(fn)
    forward = torch.library.custom_op(name, mutates_args=(), schema=torch.library.infer_schema(
        fwd_proto, mutates_args=()))(_named_impl(fn, name, arguments, plans, deterministic))
    forward.register_fake(_fake(fn))
    backward_op = torch.library.custom_op(name + "_backward", mutates_args=(), schema=torch.library.infer_schema(
        bwd_proto, mutates_args=()))(_recompute_backward(fn, name, arguments, plans, deterministic))
    backward_op.register_fake(_fake_backward)
    setup_context, backward = _autograd(backward_op, name)
    forward.register_autograd(backward, setup_context=setup_context)

    @functools.wraps(fn)
    def call(*args, **kwargs):
        if torch.compiler.is_compiling() or not torch.is_grad_enabled():
            return forward(*args, **kwargs)
        if tapes.active():  # inside another op: its tape records these launches
            return fn(*args, **kwargs)
        token = _stash.set([])  # the forward leaves its tape here for setup_context
        try:
            return forward(*args, **kwargs)
        finally:
            _stash.reset(token)

    call.op, call.backward_op = forward, backward_op  # the torch.library ops
    return call


def _named_impl(fn: Any, name: str, arguments, plans: dict, deterministic: bool):
    def impl(*args, **kwargs):
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
        finally:
            _stash.reset(token)
        stash.append(tape)
        return result

    return impl


def _differentiable(t: torch.Tensor) -> bool:
    return t.requires_grad and t.is_floating_point()


def _fake(fn: Any):
    def fake(*args, **kwargs):
        with tapes.dry_run():
            return fn(*args, **kwargs)

    return fake


def _fake_backward(*args):
    *inputs, _grads, needs = args
    tensors = [a for a in inputs if isinstance(a, torch.Tensor)]
    return [torch.empty_like(t) for t, need in zip(tensors, needs, strict=True) if need]


def _recompute_backward(fn: Any, name: str, arguments, plans: dict, deterministic: bool):
    def backward(*args):
        *inputs, grads, needs = args
        bound = arguments(tuple(inputs), {})
        diff = [t for t, need in zip(bound.values(), needs, strict=True) if need]
        tape = Tape(name, plans, deterministic)
        with tape.recording():
            result = fn(*inputs)
        tape.close(_as_tuple(result), tuple(inputs), {}, arguments, diff_inputs=diff)
        saved, tape.saved = tuple(tape.saved), None
        result = tape.backward(saved, tuple(grads), [True] * len(diff))
        return [torch.zeros_like(t) if g is None else torch.empty_like(t).copy_(g) for t, g in zip(diff, result,
                                                                                                   strict=True)]

    return backward


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
        return _once(name, result)

    return setup_context, backward


_DEFAULT_TYPES = {bool: bool, int: int, float: float, str: str}


def _prototypes(fn: Any) -> tuple[Any, Any]:
    """Stand-in functions whose annotated signatures give the forward's and the backward's schemas."""
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

    def fwd():
        pass

    def bwd():
        pass

    fwd.__signature__ = sig.replace(parameters=params, return_annotation=ret)
    plain = [p.replace(default=inspect.Parameter.empty, kind=inspect.Parameter.POSITIONAL_OR_KEYWORD) for p in params]
    extra = [inspect.Parameter("tg_grads", inspect.Parameter.POSITIONAL_OR_KEYWORD,
                               annotation=list[typing.Optional[torch.Tensor]]),  # noqa: UP045
             inspect.Parameter("tg_needs", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=list[bool])]
    bwd.__signature__ = inspect.Signature([*plain, *extra], return_annotation=list[torch.Tensor])
    return fwd, bwd
