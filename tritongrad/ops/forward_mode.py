"""Forward mode through an op: ``torch.func.jvp``, ``torch.func.jacfwd`` and ``torch.autograd.forward_ad`` dual
tensors, for bare and named ops.

A call in forward mode (``active``) runs as an ``autograd.Function`` of its tensor arguments (``call``): its forward
runs the host function on the plain tensors with its launches recorded (``hooks.collecting``); its ``jvp`` runs
those launches in order as their tangent kernels (runtime/tangent_kernel.py) against tangent memory per storage
(``TangentMemory``, as shadows.py lays out the backward's shadow memory): an argument's tangent is written into its
storage's, and a buffer one launch writes and a later one reads carries the tangent from the one to the other. That
run is an ``autograd.Function`` of the tangents of its own, whose ``vmap`` runs it per tangent: ``jacfwd``'s
batched tangents. Each tangent kernel computes the forward's values again and stores them to scratch memory (the
forward's launches wrote them already, and later launches read those; an atomic add would add twice, and a
recompiled kernel may round otherwise).

Refused, naming the launch (OpError): a launch updating a tensor in place, one overwriting memory an earlier launch
read, and a launch reading (or an op returning) a float tensor its host function made with PyTorch operations
(their tangents are not followed), a batched primal (vmap over the inputs of a call in forward mode). A named op is
differentiated so through its Python function; torch.library takes no forward-mode formula, so a call through
``torch.ops`` is not."""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch
import torch.autograd.forward_ad as forward_ad
from torch._functorch.autograd_function import custom_function_call
from torch.utils import _pytree as pytree

from ..core.bounded import Bounded
from ..core.errors import OpError
from ..core.source import unwrap
from ..frontend.specialize import plain_value
from ..host import hooks
from ..host.kernel_roles import kernel_info
from ..runtime.derivation import decisive_constexprs, hashable
from ..runtime.tangent_kernel import jvp as tangent_kernel
from .autograd_function import refuse_transforms


def active(args: tuple, kwargs: dict) -> bool:
    """Whether a call is differentiated in forward mode: under ``torch.func.jvp`` (``jacfwd``), or with a dual
    tensor among its arguments."""
    if torch._C._are_functorch_transforms_active():
        from torch._C._functorch import TransformType
        from torch._functorch.pyfunctorch import retrieve_all_functorch_interpreters

        return any(i.key() == TransformType.Jvp for i in retrieve_all_functorch_interpreters())
    if forward_ad._current_level < 0:
        return False
    leaves = pytree.tree_leaves((args, kwargs))
    return any(isinstance(t, torch.Tensor) and forward_ad.unpack_dual(t).tangent is not None for t in leaves)


def transformed_call(fn: Any, name: str, args: tuple, kwargs: dict, bare: bool) -> Any:
    """A call under a dual level or a torch.func transform (autograd_function.transformed): in forward mode where a
    tangent reaches its arguments (not inside another op, whose launch record takes its launches), else None once
    ``refuse_transforms`` has let it through. The bare and the named op's one path."""
    if not hooks.active() and active(args, kwargs):
        return call(fn, name, args, kwargs)
    refuse_transforms(name, args, kwargs, bare=bare)
    return None


def call(fn: Any, name: str, args: tuple, kwargs: dict) -> Any:
    """``fn(*args, **kwargs)`` with its outputs' tangents from the tangent kernels of its launches."""
    leaves, spec = pytree.tree_flatten((args, kwargs))
    positions = [i for i, v in enumerate(leaves) if isinstance(v, torch.Tensor)]
    call = _Call(fn, name, leaves, spec, positions)
    outputs = _apply(_ForwardMode, call, *[leaves[i] for i in positions])
    return pytree.tree_unflatten(list(outputs), call.result_spec)


class _Call:
    """One call in forward mode: the host function and its arguments, then what its forward launched."""

    def __init__(self, fn: Any, name: str, leaves: list, spec: Any, positions: list[int]):
        self.fn, self.name, self.leaves, self.spec, self.positions = fn, name, leaves, spec, positions
        self.inputs: tuple[torch.Tensor, ...] = ()
        self.outputs: tuple[torch.Tensor, ...] = ()
        self.launches: list[tuple] = []
        self.result_spec: Any = None

    def forward(self, tensors: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        leaves = list(self.leaves)
        for i, t in zip(self.positions, tensors, strict=True):
            leaves[i] = t
        args, kwargs = pytree.tree_unflatten(leaves, self.spec)
        with hooks.collecting("run", self.name) as launches:
            result = self.fn(*args, **kwargs)
        outputs, self.result_spec = pytree.tree_flatten(result)
        if not all(isinstance(o, torch.Tensor) for o in outputs):
            raise OpError(f"tritongrad.op `{self.name}`: in forward mode an op returns tensors only")
        self.inputs, self.outputs, self.launches = tuple(tensors), tuple(outputs), launches.calls
        return tuple(o.detach() if any(o is t for t in tensors) else o for o in outputs)

    def error(self, message: str) -> OpError:
        return OpError(f"tritongrad.op `{self.name}` in forward mode: {message}")

    def tangents(self, tangents: tuple[torch.Tensor | None, ...]) -> tuple[torch.Tensor, ...]:
        """The outputs' tangents: the launches run as their tangent kernels (see the module's docstring)."""
        memory = TangentMemory(self)
        given = [(x, t) for x, t in zip(self.inputs, tangents, strict=True) if t is not None and x.is_floating_point()]
        for x in self.inputs:
            memory.argument(x)
        for x, t in given:
            memory.put(x, t)
        shared = Counter(_storage(x) for x, _ in given)
        for x, t in given:  # (after all are written: arguments sharing memory; a check reads back, a host sync)
            if shared[_storage(x)] > 1 or torch._debug_has_internal_overlap(x) != 0:
                memory.check(x, t)
        read: dict[int, str] = {}  # storage -> the launch that read it first
        for index, (kernel, grid, args, kwargs) in enumerate(self.launches):
            self.run_tangent(memory, read, index, kernel, grid, args, kwargs)
        found = []
        for o in self.outputs:
            if not memory.holds(o) and o.is_floating_point():
                raise self.error(f"an output is a tensor no launch wrote ({_layout(o)}): made with PyTorch operations "
                                 "in the host function, whose tangents forward mode does not yet follow")
            found.append(memory.view(o) if memory.holds(o) else torch.zeros_like(o))
        return tuple(t.clone() for t in found)  # (the tangent memory is the call's own)

    def run_tangent(self, memory: TangentMemory, read: dict, index: int, kernel: Any, grid: Any, args: tuple,
                    kwargs: dict) -> None:
        info = kernel_info(kernel)
        launch = f"launch {index} (`{info.name}`)"
        named, options = info.named_arguments(args, kwargs)
        named = {**info.defaults, **named}
        roles = info.roles
        if roles is None:  # the analysis refused the kernel: jvp raises the refusal, with its line
            tangent_kernel(kernel)
            raise info.error
        tensors = {p: v for p, v in named.items() if isinstance(v, torch.Tensor)}
        for p in sorted(roles.in_place & set(tensors)):
            raise self.error(f"{launch} updates `{p}` in place: forward mode does not yet take in-place updates")
        for p in sorted(roles.stores & set(tensors)):
            if _storage(tensors[p]) in read:
                raise self.error(f"{launch} overwrites `{p}`, which {read[_storage(tensors[p])]} read")
        for p in sorted(roles.loads & set(tensors)):
            if tensors[p].is_floating_point() and not memory.holds(tensors[p]) and p in roles.inputs:
                raise self.error(f"{launch} reads `{p}`, a tensor neither an argument of the op nor written by an "
                                 "earlier launch: made with PyTorch operations in the host function, whose tangents "
                                 "forward mode does not yet follow")
            read.setdefault(_storage(tensors[p]), launch)
        found = _specialized(kernel, named)
        named = {p: (memory.scratch(v) if p in roles.stores and isinstance(v, torch.Tensor) else v)
                 for p, v in named.items()}
        tangents = {t: memory.view(tensors[p]) for p, t in found.tangent_params.items() if p in tensors}
        found.kernel[grid](**named, **tangents, **options)  # (named: every parameter, defaults included)


# (a kernel's function, the values of its constexprs that decide an `if`) -> its tangent kernel for them
_tangent_kernels: dict[tuple, Any] = Bounded()


def _specialized(kernel: Any, named: dict) -> Any:
    """The tangent kernel a launch with these arguments runs (``TangentKernel.for_launch``'s), found once per kernel
    and specialization: a repeated call neither derives nor looks up twice, nor binds its arguments again."""
    jit_fn = unwrap(kernel)
    try:
        key = (jit_fn.fn, tuple(hashable(plain_value(named[k])) if k in named else _MISSING
                                for k in decisive_constexprs(jit_fn)))
        found = _tangent_kernels.get(key)
    except TypeError:  # (an unhashable value: derived as it is)
        key = found = None
    if found is None:
        found = tangent_kernel(kernel).for_launch(named)
        if key is not None:
            _tangent_kernels[key] = found
    return found


_MISSING = object()


class TangentMemory:
    """Tangent memory per storage: a zero-filled buffer as long as the storage, each tensor's tangent the same
    strided view of it as the tensor is of its storage (a view's tangent is the tangent's view)."""

    def __init__(self, call: _Call):
        self.call = call
        self.buffers: dict[int, torch.Tensor] = {}
        self.arguments: set[int] = set()

    def argument(self, x: torch.Tensor) -> None:
        self.arguments.add(_storage(x))

    def holds(self, x: torch.Tensor) -> bool:
        return _storage(x) in self.buffers or _storage(x) in self.arguments

    def view(self, x: torch.Tensor) -> torch.Tensor:
        key = _storage(x)
        buffer = self.buffers.get(key)
        if buffer is None:
            buffer = self.buffers[key] = torch.zeros(_elements(x), dtype=x.dtype, device=x.device)
        if buffer.dtype != x.dtype:
            raise self.call.error(f"launches read one storage as {buffer.dtype} and as {x.dtype}")
        return buffer.as_strided(x.size(), x.stride(), x.storage_offset())

    def scratch(self, x: torch.Tensor) -> torch.Tensor:
        """Zeros laid out as ``x`` in memory of their own (where a tangent kernel stores the forward's values)."""
        return torch.zeros(_elements(x), dtype=x.dtype, device=x.device).as_strided(
            x.size(), x.stride(), x.storage_offset())

    def put(self, x: torch.Tensor, t: torch.Tensor) -> None:
        """``x``'s tangent written into its storage's tangent memory (``check``, once all are: read back, for
        elements ``x`` reads twice (stride 0) or that another argument shares must have one tangent)."""
        t = t.to(x.dtype).expand(x.shape)
        if 0 not in x.stride():  # (the usual argument: no dimension to narrow)
            self.view(x).copy_(t)
            return
        index = tuple(slice(0, 1) if s == 0 and n > 1 else slice(None) for s, n in zip(x.stride(), x.shape,
                                                                                        strict=True))
        self.view(x)[index].copy_(t[index])

    def check(self, x: torch.Tensor, t: torch.Tensor) -> None:
        if not torch.equal(self.view(x), t.to(x.dtype).expand(x.shape)):
            raise self.call.error(f"an argument ({_layout(x)}) shares memory with itself (stride 0) or another "
                                  "argument, and the tangents given for the shared elements differ")


def _storage(x: torch.Tensor) -> int:
    return x.untyped_storage().data_ptr()


def _elements(x: torch.Tensor) -> int:
    return x.untyped_storage().nbytes() // x.element_size()


def _layout(x: torch.Tensor) -> str:
    return f"{x.dtype}, sizes {tuple(x.shape)}"


def _apply(function: type, call: _Call, *tensors: Any) -> Any:
    """``function.apply(call, *tensors)`` past ``Function.apply``'s binding of default arguments (inspect.signature:
    tens of microseconds a call; these forwards have none): what it does next, ``custom_function_call`` under a
    torch.func transform, else ``_FunctionBase.apply`` (which calls ``setup_context`` too)."""
    if torch._C._are_functorch_transforms_active():
        return custom_function_call(function, call, *tensors)
    return _BASE_APPLY[function](call, *[_unwrap_if_dead(t) if isinstance(t, torch.Tensor) else t for t in tensors])


class _ForwardMode(torch.autograd.Function):
    """A call in forward mode: the forward runs the host function; ``jvp`` runs its launches' tangent kernels."""

    @staticmethod
    def forward(call: _Call, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return call.forward(tensors)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        ctx.call = inputs[0]

    @staticmethod
    def jvp(ctx, _call, *tangents):
        return _apply(_Tangents, ctx.call, *tangents)

    @staticmethod
    def backward(ctx, *grads):
        raise OpError(f"tritongrad.op `{ctx.call.name}`: a call made in forward mode (torch.func.jvp, jacfwd, dual "
                      "tensors) is not differentiated in reverse mode too: torch.func.hessian (jacfwd over jacrev) "
                      "and a backward of a jvp's outputs take the op's backward in forward mode, which needs the "
                      "tangents of its derived backward kernels and of the PyTorch operations between them (partial "
                      "sums, buffers it makes): not yet supported. For second derivatives use reverse over reverse "
                      "(torch.autograd.functional.hessian or hvp, torch.autograd.grad with create_graph=True); else "
                      "differentiate in one mode")

    @staticmethod
    def vmap(info, in_dims, call, *tensors):
        raise OpError(f"tritongrad.op `{call.name}`: vmap over the inputs of a call in forward mode is not supported "
                      "(jacfwd, whose tangents are batched, is)")


class _Tangents(torch.autograd.Function):
    """A call's launches run as tangent kernels, a function of the input tangents (``vmap``: one run
    per tangent, for jacfwd)."""

    @staticmethod
    def forward(call: _Call, *tangents):
        return call.tangents(tangents)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        pass

    @staticmethod
    def vmap(info, in_dims, call, *tangents):
        rows = []
        for b in range(info.batch_size):
            rows.append(call.tangents(tuple(t if d is None or t is None else t.select(d, b)
                                            for t, d in zip(tangents, in_dims[1:], strict=True))))
        stacked = tuple(torch.stack(column) for column in zip(*rows, strict=True))
        return stacked, (0,) * len(stacked)


_BASE_APPLY = {f: super(torch.autograd.Function, f).apply for f in (_ForwardMode, _Tangents)}  # (the C++ apply)
_unwrap_if_dead = torch._C._functorch.unwrap_if_dead
