"""Named ops: ``@tritongrad.op("ns::name")`` registered with ``torch.library`` (see torch_op.py's docstring).

``ns::name`` is a ``triton_op`` (its launches issued through ``wrap_triton`` while torch.compile traces it) or,
opaque, a ``custom_op``, with an autograd formula whose backward takes the eager forward's launch record or, without
one, re-runs the forward launches (``ns::name_backward``); ``ns::name_saving`` and ``ns::name_saved_backward`` are
what torch.compile calls, so that the compiled backward runs derived kernels on saved buffers (host/saved_backward.py;
not opaque, ``ns::name_traced_backward`` launches them in the compiled graph). The schemas
come from the host function's annotations (``_prototypes``).
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import os
import re
import types
import typing
import warnings
from dataclasses import dataclass
from typing import Any

import torch
import torch.autograd.forward_ad as _forward_ad

from ..core.errors import OpError
from ..host import hooks
from ..host.call_tensors import as_tuple
from ..host.launch_record import LaunchRecord, current_record
from ..host.saved_backward import eager_backward, recompute_backward, traced_backward, whole
from . import forward_mode
from .autograd_function import (
    arguments_of,
    differentiable,
    differentiable_once,
    recorded_call,
    refuse_unread,
    transformed,
)
from .refusals import refuse_batched_gradients, refuse_transforms

_stash: contextvars.ContextVar[list | None] = contextvars.ContextVar("tritongrad_stash", default=None)


OPAQUE_ENV = "TRITONGRAD_OPAQUE_OPS"  # "1": every named op is registered opaque (see op's docstring)


def opaque_default() -> bool:
    """Whether named ops are registered opaque unless told otherwise: under Triton's interpreter
    (its kernels are not ``JITFunction``s, which ``wrap_triton`` needs) or with ``TRITONGRAD_OPAQUE_OPS=1``."""
    return os.environ.get("TRITON_INTERPRET") == "1" or _legacy()


def _legacy() -> bool:
    """``TRITONGRAD_OPAQUE_OPS=1``: named ops as before triton_op (opaque, the compiled backward recomputing)."""
    return os.environ.get(OPAQUE_ENV) == "1"


_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*::[A-Za-z_][A-Za-z0-9_]*")
# name -> (file, qualified name) of the host function registered under it in this process
_registered: dict[str, tuple[str, str]] = {}


def check_name(name: str) -> None:
    """Refuse, naming the rule, an op name that torch.library would refuse (or read as an overload)."""
    if not _NAME.fullmatch(name):
        raise OpError(f"tritongrad.op({name!r}): a named op's name is \"namespace::name\", both Python identifiers "
                      "(letters, digits and underscores, not starting with a digit; no overload after a dot), as "
                      "torch.library takes it: e.g. \"mylib::swiglu\"")


def _owner(fn: Any) -> tuple[str, str]:
    return getattr(getattr(fn, "__code__", None), "co_filename", ""), getattr(fn, "__qualname__", repr(fn))


def _check_free(name: str, fn: Any) -> None:
    """Refuse a name another host function registered in this process (torch.library would silently replace its
    op). The same function registered again (its module imported again, a test defining it again) takes it."""
    owner = _owner(fn)
    for taken in (name, *(name + suffix for suffix in _SUFFIXES)):
        if _registered.get(taken, owner) != owner:
            file, qualname = _registered[taken]
            raise OpError(f"tritongrad.op(\"{name}\"): `{taken}` is already registered, by `{qualname}` ({file}); "
                          f"registering `{owner[1]}` under it would silently replace that op. Give it another name")


_SUFFIXES = ("_backward", "_saving", "_saved_backward", "_traced_backward")  # the ops registered beside ns::name


def named_op(fn: Any, name: str, deterministic: bool = False, opaque: bool = True) -> Any:
    """``@op("ns::name")``: the ops registered (see the module docstring), and the function that calls them (or,
    eagerly on plain tensors, takes the bare op's path: ``_plain_eager``)."""
    check_name(name)
    protos = _prototypes(fn, name)
    _check_free(name, fn)
    hooks.install()
    arguments = arguments_of(fn)
    plans = {}  # shared by the eager forward's launch records and the backwards' (host/launch_record.py)
    forward = _register(name, protos.forward, _named_impl(fn, name, arguments, plans, deterministic, not opaque),
                        _fake(fn), opaque)
    backward_op = torch.library.custom_op(name + "_backward", mutates_args=(), schema=torch.library.infer_schema(
        protos.backward, mutates_args=()))(recompute_backward(fn, name, arguments, plans, deterministic))
    backward_op.register_fake(_fake_backward)
    setup_context, backward = _autograd(backward_op, name)
    forward.register_autograd(backward, setup_context=setup_context)
    _refuse_forward_mode(forward, name)  # (after register_autograd, which registers a triton_op's Autograd kernel)
    saving = None
    if not _legacy():  # what torch.compile calls: the forward also returns what its backward reads
        saving = _register(name + "_saving", protos.saving, _saving_impl(fn, name, not opaque), _saving_fake(fn),
                           opaque)
        eager = eager_backward(fn, name, arguments, plans, deterministic)
        saved_backward = torch.library.custom_op(
            name + "_saved_backward", mutates_args=(),
            schema=torch.library.infer_schema(protos.saved_backward, mutates_args=()))(eager)
        saved_backward.register_fake(_fake_saved_backward)
        if not opaque:  # the compiled graph launches the derived kernels itself
            traced = traced_backward(fn, name, arguments, plans, deterministic, eager, saved_backward)
            saved_backward = _register(name + "_traced_backward", protos.saved_backward, traced, None, False)
        setup_context, backward = _saving_autograd(saved_backward, name, protos.outputs)
        saving.register_autograd(backward, setup_context=setup_context)
        _refuse_forward_mode(saving, name)
    several = protos.outputs > 1 or _several(protos.forward)
    recorded = recorded_call(fn, name, plans, arguments, deterministic, named=True)

    @functools.wraps(fn)
    def call(*args, **kwargs):
        if torch.compiler.is_compiling():
            if saving is None or not torch.is_grad_enabled():
                return forward(*args, **kwargs)
            found = saving(*args, **kwargs)
            return tuple(found[:protos.outputs]) if several else found[0]
        if transformed():  # forward mode and torch.func's grad transforms: forward_mode.py (torch.library takes no
            found = forward_mode.transformed_call(fn, name, args, kwargs, False, recorded)  # forward-mode formula)
            if found is not None:
                return found
        if not torch.is_grad_enabled():
            return forward(*args, **kwargs)
        if current_record.get() is not None:  # inside another op (hooks.active): its launch record takes these
            return fn(*args, **kwargs)
        if _plain_eager(args, kwargs):  # what the dispatcher would do, without its cost
            return recorded(*args, **kwargs)
        token = _stash.set([])  # the forward leaves its launch record here for setup_context
        try:
            return forward(*args, **kwargs)
        finally:
            _stash.reset(token)

    call.op, call.backward_op, call.saving_op, call.opaque = forward, backward_op, saving, opaque  # torch.library ops
    _registered.update(dict.fromkeys((name, *(name + suffix for suffix in _SUFFIXES)), _owner(fn)))
    return call


def _plain_eager(args: tuple, kwargs: dict) -> bool:
    """An eager call the bare op's ``autograd.Function`` can take in place of the registered op: plain
    tensors, no dispatch mode (fake tensors, FLOP counters), no functorch transform, no profiler (whose
    trace names the op). It saves the dispatcher's ~100 us per forward+backward (benchmarks/RESULTS.md)."""
    if torch._C._len_torch_dispatch_stack() or torch._C._are_functorch_transforms_active() \
            or torch.autograd._profiler_enabled():
        return False
    for v in (*args, *kwargs.values()) if kwargs else args:  # (a loop, not all(...): on every call)
        if isinstance(v, torch.Tensor) and type(v) not in _PLAIN:
            return False
    return True


_PLAIN = (torch.Tensor, torch.nn.Parameter)


def _refuse_forward_mode(op: Any, name: str) -> None:
    """The op's Autograd kernel (torch.library's, whose formula ``register_autograd`` gives) behind a check that
    refuses forward mode: torch.library takes no forward-mode formula, and that kernel passes tangents by, so a
    call through the dispatcher (``torch.ops``, a torch.func transform) would give a zero tangent. Under torch.func's
    grad transforms that formula raises PyTorch's setup_context error: refused naming the op instead."""
    from torch._library.autograd import make_autograd_impl

    kernel = make_autograd_impl(op._opoverload, op)

    def autograd_impl(keyset, *args, **kwargs):
        if _forward_ad._current_level >= 0:
            refuse_transforms(name, args, kwargs, bare=False)
        if forward_mode.taken(bare=False):  # (torch.library's formula has no setup_context: PyTorch's error)
            raise OpError(f"tritongrad.op `{name}`: called through torch.ops under torch.func.grad, vjp or jacrev, "
                          "which torch.library's autograd formula does not support; call the op's Python function "
                          "(the function @tritongrad.op returned), which these transforms differentiate")
        return kernel(keyset, *args, **kwargs)

    with warnings.catch_warnings():  # ("Overriding a previously registered kernel": torch.library's, on purpose)
        warnings.simplefilter("ignore", UserWarning)
        try:
            op._lib.impl(op._name, autograd_impl, "Autograd", with_keyset=True)
        except RuntimeError:  # a torch that refuses to override a Python kernel (2.11): the op's own call still
            return  # refuses forward mode or runs it (forward_mode.py); only a bare torch.ops call is left unchecked
    DISPATCHER_REFUSES_FORWARD_MODE.add(name)


DISPATCHER_REFUSES_FORWARD_MODE: set[str] = set()  # named ops whose torch.ops call refuses forward mode


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
        if traced and hooks.wrap_triton_enabled():  # torch.compile tracing the triton_op: launches via wrap_triton
            with hooks.collecting("wrap", name):
                return fn(*args, **kwargs)
        stash = _stash.get()
        if stash is None:  # no eager caller waiting for a record: compiled code, no grad, direct torch.ops calls
            return fn(*args, **kwargs)
        bound = arguments(args, kwargs)
        diff = [t for t in bound.values() if differentiable(t)]
        if not diff:
            return fn(*args, **kwargs)
        token = _stash.set(None)  # ops inside fn do not take the stash
        try:
            record = LaunchRecord(name, plans, deterministic)
            with record.recording():
                result = fn(*args, **kwargs)
            record.close(as_tuple(result), args, kwargs, arguments, diff_inputs=diff)
            refuse_unread(name, record.plan.unread)
        finally:
            _stash.reset(token)
        stash.append(record)
        return result

    return impl


def _fake(fn: Any):
    def fake(*args, **kwargs):
        with hooks.dry_run():
            return fn(*args, **kwargs)

    return fake


def _fake_backward(*args):
    *inputs, _grads, needs = args
    tensors = [a for a in inputs if isinstance(a, torch.Tensor)]
    return [torch.empty_like(t) for t, need in zip(tensors, needs, strict=True) if need]


# -- what torch.compile calls: a forward that returns what its backward reads ----------------------


def _saving_impl(fn: Any, name: str, traced: bool):
    """The op's outputs, then the buffers its launches pass between them (``Launches.intermediates``,
    whole tensors only), then the state tapes its launches keep for their backward (runtime/augment.py), so that a
    compiled graph saves them rather than re-running the launches."""
    def impl(*args):
        mode = "wrap" if traced and hooks.wrap_triton_enabled() else "run"
        with hooks.collecting(mode, name, keep_states=True) as launches:
            outputs = as_tuple(fn(*args))
        return [*outputs, *whole(launches.intermediates(args, outputs)), *launches.tapes]

    return impl


def _saving_fake(fn: Any):
    def fake(*args):
        with hooks.collecting("skip", keep_states=True) as launches:
            outputs = as_tuple(fn(*args))
        return [*outputs, *whole(launches.intermediates(args, outputs)), *[k.buffer() for k in launches.kept.values()]]

    return fake


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
        return differentiable_once(name, result, (*tensors, *grads))

    return setup_context, backward


def _autograd(backward_op: Any, name: str):
    def setup_context(ctx, inputs, output):
        stash = _stash.get()
        ctx.record = stash.pop() if stash else None
        ctx.positions = [i for i, a in enumerate(inputs) if isinstance(a, torch.Tensor)]
        if ctx.record is not None:
            ctx.save_for_backward(*ctx.record.plan.kept_for_backward(ctx.record.saved))
            ctx.record.saved = None
            ctx.diff = [differentiable(inputs[i]) for i in ctx.positions]  # as the forward chose them
            ctx.set_materialize_grads(False)
        else:
            ctx.others = [None if isinstance(a, torch.Tensor) else a for a in inputs]
            ctx.save_for_backward(*[inputs[i] for i in ctx.positions])

    def backward(ctx, *grads):
        needs = [ctx.needs_input_grad[i] for i in ctx.positions]
        result = [None] * len(ctx.needs_input_grad)
        if not any(needs):
            return tuple(result)
        if ctx.record is not None:
            record_needs = [need for need, diff in zip(needs, ctx.diff, strict=True) if diff]
            try:
                found = iter(ctx.record.backward(ctx.saved_tensors, grads, record_needs))
            except (NotImplementedError, RuntimeError) as e:
                refuse_batched_gradients(name, grads, e)
                raise
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
        return differentiable_once(name, result, (*ctx.saved_tensors, *grads))

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


def _holds_tensors(annotation: Any) -> bool:
    """Whether an annotation is a container of tensors (``list[torch.Tensor]``, ``tuple[Tensor, ...]``,
    ``Optional[list[Tensor]]``), not a tensor or an optional one."""
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return any(_holds_tensors(a) for a in args)
    return any(_mentions_tensor(a) for a in args)


def _mentions_tensor(annotation: Any) -> bool:
    return annotation is torch.Tensor or any(_mentions_tensor(a) for a in typing.get_args(annotation))


def _prototypes(fn: Any, name: str = "") -> _Prototypes:
    sig = inspect.signature(fn, eval_str=True)
    params = []
    for p in sig.parameters.values():
        if p.kind not in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            raise TypeError(f"tritongrad.op: named ops take positional parameters; `{p.name}` of `{fn.__name__}` "
                            "is not one")
        ann = p.annotation
        if _holds_tensors(ann):
            raise OpError(f"tritongrad.op(\"{name}\"): the parameter `{p.name}` of `{fn.__name__}` holds tensors in "
                          f"a container ({ann}); a named op takes "
                          "tensors one per parameter (its autograd formula and the ops torch.compile calls are "
                          "written per tensor argument). Give each tensor a parameter of its own, or use a bare "
                          "@tritongrad.op, which takes tensors in lists, tuples and dicts")
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
