"""Forward mode through an op: ``torch.func.jvp``, ``torch.func.jacfwd`` and ``torch.autograd.forward_ad`` dual
tensors, for bare and named ops.

A call in forward mode (``active``) runs as an ``autograd.Function`` of its tensor arguments (``call``): its forward
runs the host function on the plain tensors with its launches recorded (``hooks.collecting``); its ``jvp`` runs
those launches in order as their tangent kernels (runtime/tangent_kernel.py) against tangent memory per storage
(tangent_memory.py, laid out as shadows.py lays out the backward's shadow memory): an argument's tangent is written
into its storage's, and a buffer one launch writes and a later one reads carries the tangent from the one to the
other. That run is an ``autograd.Function`` of the tangents of its own, whose ``vmap`` runs it per tangent:
``jacfwd``'s batched tangents. Each tangent kernel computes the forward's values again and stores them to scratch
memory (the forward's launches wrote them already, and later launches read those; an atomic add would add twice, and
a recompiled kernel may round otherwise).

Under torch.func's reverse-mode transforms alone (grad, vjp, jacrev: no tangent reaches the call) the Function's
forward is the call in reverse mode itself, whose launch record its backward takes; at first order autograd
differentiates that call as in eager mode. Forward over reverse (``torch.func.hessian``: jacfwd over jacrev; a jvp
of a grad; dual tensors differentiated in reverse mode) reaches the Function's ``backward``: the call is made again
in reverse mode for its launch record, whose backward runs as an op (autograd_function.backward_as_op) called in
forward mode in turn, on the saved inputs and outputs as the transforms see them, so that their tangents go through
the derived kernels' tangent kernels. Its ``vmap`` (jacrev's batched cotangents, a batched primal) makes one call
per slice.

Reverse mode through a tangent J(x) tx (autograd or torch.func's grad and jacrev over a jvp, dual tensors' tangents
differentiated) reaches the tangents' Function, which takes the call's inputs and outputs too (for autograd's links
alone): w.r.t. tx its backward is J^T c, the op's backward; w.r.t. x, d/dx <c, J(x) tx>, by the symmetry of second
derivatives the op's backward run in forward mode along tx (``_Call.tangents_vjp``).

Refused, naming the launch (OpError): an in-place launch, one overwriting what an earlier launch read, and a launch
reading (or an op returning) a float tensor the host function made with PyTorch operations (their tangents are not
followed). A named op is differentiated so through its Python function, not through ``torch.ops``."""

from __future__ import annotations

import weakref
from collections import Counter
from typing import Any

import torch
import torch.autograd.forward_ad as forward_ad
from torch._C._functorch import TransformType, _unwrap_for_grad, _wrap_for_grad
from torch._functorch.autograd_function import custom_function_call
from torch._functorch.pyfunctorch import retrieve_all_functorch_interpreters, temporarily_clear_interpreter_stack
from torch.utils import _pytree as pytree

from ..core.device import storage_of
from ..core.errors import OpError
from ..host import hooks
from ..host.kernel_roles import kernel_info
from ..runtime.tangent_kernel import jvp as tangent_kernel
from .autograd_function import backward_as_op, record_of, rehearse
from .refusals import refuse_batched_gradients, refuse_make_fx, refuse_transforms
from .sliced_backward import sliced_backward, stacked
from .tangent_memory import TangentMemory, layout_of, specialized


def active(args: tuple, kwargs: dict) -> bool:
    """Whether a call is differentiated in forward mode: under ``torch.func.jvp`` (``jacfwd``), or with a dual
    tensor among its arguments."""
    if torch._C._are_functorch_transforms_active():
        return any(i.key() == TransformType.Jvp for i in retrieve_all_functorch_interpreters())
    if forward_ad._current_level < 0:
        return False
    leaves = pytree.tree_leaves((args, kwargs))
    return any(isinstance(t, torch.Tensor) and forward_ad.unpack_dual(t).tangent is not None for t in leaves)


def transformed_call(fn: Any, name: str, args: tuple, kwargs: dict, bare: bool, recorded: Any) -> Any:
    """A call under a dual level or a torch.func transform (autograd_function.transformed): through ``call`` in
    forward mode where a tangent reaches its arguments, and under torch.func's reverse-mode transforms (``taken``);
    not inside another op, whose launch record takes its launches. Else None once ``refuse_transforms`` has let it
    through. The bare and the named op's one path; ``recorded``: the op's call in reverse mode
    (autograd_function.recorded_call), which a backward of the call runs again (``_Call.vjp``)."""
    if not hooks.active() and (active(args, kwargs) or taken(bare)):
        refuse_make_fx(name)
        return call(fn, name, args, kwargs, recorded)
    refuse_transforms(name, args, kwargs, bare=bare)
    return None


def taken(bare: bool) -> bool:
    """Whether torch.func transforms other than forward mode make a call go through ``call``: grad, vjp and jacrev
    (a Grad interpreter on the stack: torch.library's autograd formula of a named op has no ``setup_context``, and a
    bare op's kernels need plain tensors, which ``custom_function_call`` unwraps) and, for a bare op, vmap (one call
    per slice: ``_ForwardMode.vmap``). A named op under vmap alone keeps the dispatcher's per-slice fallback."""
    if not torch._C._are_functorch_transforms_active():
        return False
    kinds = {i.key() for i in retrieve_all_functorch_interpreters()}
    return TransformType.Grad in kinds or (bare and TransformType.Vmap in kinds)


def call(fn: Any, name: str, args: tuple, kwargs: dict, recorded: Any = None, by_record: bool = True) -> Any:
    """``fn(*args, **kwargs)`` with its outputs' tangents from the tangent kernels of its launches (``recorded``: see
    ``transformed_call``; None: a backward of the call is refused). ``by_record``: where no tangent reaches the
    call, its forward is ``recorded`` itself (``_Call.reverse``); not for an op's backward run through here
    (``_Call._in_forward_mode``), whose own call learns what it reached."""
    leaves, spec = pytree.tree_flatten((args, kwargs))
    positions = [i for i, v in enumerate(leaves) if isinstance(v, torch.Tensor)]
    forward = active(args, kwargs)
    call = _Call(fn, name, leaves, spec, positions, recorded, _context(forward),
                 reverse=by_record and recorded is not None and not forward)
    outputs = _apply(_ForwardMode, call, *[leaves[i] for i in positions])
    return pytree.tree_unflatten(list(outputs), call.result_spec)


def _context(forward: bool) -> str:
    """How a call through ``call`` is differentiated (``forward``: in forward mode), as its errors say it."""
    if forward:
        return "in forward mode"
    return "under torch.func.grad (or vjp, jacrev)" if taken(False) else "under torch.func.vmap"


class _Call:
    """One call in forward mode (or under torch.func's reverse-mode transforms: ``taken``): the host function and its
    arguments, then what its forward launched. ``context``: how it is differentiated, for its errors. ``reverse``: no
    tangent reaches it (torch.func.grad, vjp, jacrev alone), so its forward is the call in reverse mode
    (``recorded``), whose launch record its backward takes (``kept``) instead of making the call again."""

    def __init__(self, fn: Any, name: str, leaves: list, spec: Any, positions: list[int], recorded: Any = None,
                 context: str = "in forward mode", reverse: bool = False):
        self.fn, self.name, self.leaves, self.spec, self.positions, self.recorded, self.context, self.reverse = (
            fn, name, leaves, spec, positions, recorded, context, reverse)
        self.kept: tuple[list, list] | None = None  # (reverse) the plain inputs and the outputs of the recorded call
        self.inputs: tuple[torch.Tensor, ...] = ()
        self.outputs: tuple[torch.Tensor, ...] = ()
        self.launches: list[tuple] = []
        self.constants: set[int] = set()
        self.result_spec: Any = None
        self.slices: list[_Call] = []  # (its calls per slice of a batch, where vmap batched its inputs)

    def forward(self, tensors: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        if self.reverse:
            return self._recorded_forward(tensors)
        leaves = list(self.leaves)
        for i, t in zip(self.positions, tensors, strict=True):
            leaves[i] = t
        args, kwargs = pytree.tree_unflatten(leaves, self.spec)
        with hooks.collecting("inner", self.name) as launches:
            result = self.fn(*args, **kwargs)
        outputs, self.result_spec = pytree.tree_flatten(result)
        if not all(isinstance(o, torch.Tensor) for o in outputs):
            raise self.error("an op returns tensors only")
        self.inputs, self.outputs, self.launches = tuple(tensors), tuple(outputs), launches.calls
        self.constants = launches.constants
        return tuple(o.detach() if any(o is t for t in tensors) else o for o in outputs)

    def _recorded_forward(self, tensors: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        """The call in reverse mode on plain tensors (every float input differentiated, as ``vjp`` needs), kept for
        the backward: the forward's launches run once, as an augmented forward where the backward reads its tapes."""
        self.inputs = tuple(tensors)
        plain, made = self._made_again()
        self.kept = plain, made
        self.outputs = tuple(made)
        return tuple(o.detach() for o in made)

    def _made_again(self) -> tuple[list, list]:
        """The call made in reverse mode on plain tensors: its differentiated inputs, its outputs."""
        leaves = list(self.leaves)
        with temporarily_clear_interpreter_stack(), torch.enable_grad():
            # (every float input differentiated: the op keeps what every gradient's kernels read, which the buffers
            # its backward reads are made again from, host/remake.py)
            plain = [x.detach().requires_grad_(x.is_floating_point()) for x in self.inputs]
            for i, x in zip(self.positions, plain, strict=True):
                leaves[i] = x
            args, kwargs = pytree.tree_unflatten(leaves, self.spec)
            outputs, self.result_spec = pytree.tree_flatten(self.recorded(*args, **kwargs))
        if not all(isinstance(o, torch.Tensor) for o in outputs):
            raise self.error("an op returns tensors only")
        return plain, outputs

    def again(self) -> _Call:
        """The same call, before its forward ran (one slice of a batch: ``_ForwardMode.vmap``)."""
        return _Call(self.fn, self.name, self.leaves, self.spec, self.positions, self.recorded, self.context,
                     self.reverse)

    def error(self, message: str) -> OpError:
        return OpError(f"tritongrad.op `{self.name}` {self.context}: {message}")

    def vjp(self, inputs: list, outputs: list, grads: tuple, needs: tuple) -> list:
        """The inputs' gradients given the outputs' (``grads``): the op's backward run as an op in forward mode, so
        that tangents reaching ``inputs``, ``outputs`` and ``grads`` (torch.func.hessian's jacfwd over jacrev) go
        through its derived kernels' tangent kernels. The call is made again in reverse mode on the plain tensors
        for its launch record; the saved tensors that are the call's inputs and outputs are then taken as the
        transform sees them (``inputs``, ``outputs``: with their tangents)."""
        if self.recorded is None:
            raise self.error("a derivative of its backward run in forward mode (a third differentiation: of a "
                             "Hessian, or of a gradient through a tangent) is not yet supported; for second "
                             "derivatives differentiate the op's outputs twice (torch.func.hessian, torch.autograd."
                             "grad with create_graph=True)")
        if self.kept is not None:  # (reverse: made by the forward; a second backward of the call makes it again)
            (plain, made), self.kept = self.kept, None
        else:
            plain, made = self._made_again()
        if not any(_transformed(t) for t in (*inputs, *outputs, *grads)):
            return _first_order(plain, made, grads, needs)
        nodes = {o.grad_fn for o in made if o.grad_fn is not None}
        node = next(iter(nodes), None)
        if len(nodes) != 1 or record_of(node) is None or len(made) != len(grads):
            raise self.error("its backward takes one launch record of the call's launches alone, "
                             "and this call's outputs have other autograd history (PyTorch operations in the host "
                             "function on what its launches wrote)")
        taken = {id(x): i for i, x in enumerate(plain)}
        slots = []  # per input of the node, the call's input it is
        for edge, _ in node.next_functions:
            variable = getattr(edge, "variable", None)
            if variable is None or id(variable) not in taken:
                raise self.error("its backward takes gradients of the call's own tensor arguments "
                                 "only, and a launch reads a tensor made from one by PyTorch operations (such as "
                                 "x.contiguous() of a transposed x): pass the tensor as the launch reads it, or "
                                 "differentiate with torch.autograd.grad")
            slots.append(taken[id(variable)])
        record, wanted = record_of(node), tuple(needs[i] for i in slots)
        with temporarily_clear_interpreter_stack():  # (fresh gradients: only where they land is checked)
            rehearse(record, node.saved_tensors, tuple(g if g is None else torch.randn_like(o)
                                                       for g, o in zip(grads, made, strict=True)), wanted)
        saved = tuple(self._as_transformed(t, plain, inputs, made, outputs) for t in node.saved_tensors)
        found = self._backward_as_op(record, saved, tuple(grads), wanted)
        result: list = [None] * len(plain)
        for i, g in zip(slots, found, strict=True):
            result[i] = g if result[i] is None or g is None else result[i] + g
        return result

    def _backward_as_op(self, record: Any, saved: tuple, grads: tuple, needs: tuple) -> list:
        """The backward as an op in forward mode (autograd_function.backward_as_op): differentiable in turn."""
        try:
            return backward_as_op(record, saved, grads, needs, self._in_forward_mode)
        except OpError as e:
            raise OpError(f"tritongrad.op `{self.name}`: its backward runs in forward mode (torch.func.hessian: "
                          f"jacfwd over jacrev), which does not yet take this call ({e}). For second derivatives "
                          "try reverse over reverse (torch.autograd.functional.hessian or hvp)") from e

    def tangents_vjp(self, inputs: list, tangents: list, outputs: list, found: list, grads: tuple,
                     wrt_tangents: tuple, wrt_inputs: tuple) -> list:
        """Reverse mode through the outputs' tangents ``found`` = J(x) tx (``_Tangents``' backward), given their
        gradients c: the tangents' gradients, J(x)^T c (the op's backward), then the inputs', d/dx <c, J(x) tx>, which
        by the symmetry of second derivatives is the derivative of J(x)^T c along tx: the op's backward in forward
        mode (``vjp``) with the inputs' tangents tx and the outputs' ``found``. ``inputs`` and ``outputs`` as the
        transform sees them, so that a derivative of these gradients in turn reaches them (and is refused there)."""
        needs = tuple(a or b for a, b in zip(wrt_tangents, wrt_inputs, strict=True))
        none = [None] * len(inputs)
        if not any(wrt_inputs):
            found_grads = self.vjp(list(inputs), list(outputs), grads, needs)
            return [*(g if w else None for g, w in zip(found_grads, wrt_tangents, strict=True)), *none]
        floats = [i for i, x in enumerate(inputs) if x is not None and x.is_floating_point()]
        grads = tuple(g if g is None or g.is_contiguous() else g.contiguous() for g in grads)  # (a `.sum()`'s: no
        # dual tensor of expanded memory)
        present = [j for j, g in enumerate(grads) if g is not None]
        reached: list[int] = []

        def backward(*tensors):  # (the float inputs, the outputs, the present gradients)
            given, given_grads, made = list(inputs), list(grads), len(floats) + len(outputs)
            for i, x in zip(floats, tensors, strict=False):
                given[i] = x
            for j, g in zip(present, tensors[made:], strict=True):
                given_grads[j] = g
            gradients = self.vjp(given, list(tensors[len(floats):made]), tuple(given_grads), needs)
            reached[:] = [i for i, g in enumerate(gradients) if g is not None]
            return tuple(gradients[i] for i in reached)

        primals = (*[inputs[i] for i in floats], *outputs, *[grads[j] for j in present])
        directions = (*[torch.zeros_like(inputs[i]) if tangents[i] is None else tangents[i] for i in floats], *found,
                      *[torch.zeros_like(grads[j]) for j in present])  # (the gradients: constants)
        try:
            values, derivatives = _derivative_along(backward, primals, directions)
        except OpError as e:
            raise self.error(f"reverse mode through its tangents w.r.t. its inputs (a second derivative) runs its "
                             f"backward in forward mode, which does not yet take this call ({e})") from e
        result = none + none
        for i, value, derivative in zip(reached, values, derivatives, strict=True):
            result[i] = value if wrt_tangents[i] else None
            result[len(inputs) + i] = derivative if wrt_inputs[i] else None
        return result

    def _as_transformed(self, t: torch.Tensor, plain: list, inputs: list, made: list, outputs: list) -> torch.Tensor:
        """A saved tensor of the call made again, as the transform sees it where it is an input or an output."""
        if not t.numel():
            return t
        pairs = [*zip(plain, inputs, strict=True), *zip(made, outputs, strict=True)]
        layout = (storage_of(t), t.shape, t.stride(), t.storage_offset())
        found = next((y for x, y in pairs if (storage_of(x), x.shape, x.stride(), x.storage_offset()) == layout), None)
        if found is None and any(storage_of(x) == storage_of(t) for x, _ in pairs):
            raise self.error(f"its backward reads a view of an argument or output ({layout_of(t)}) in another "
                             "layout, which its backward in forward mode does not yet take")
        return t if found is None else found

    @staticmethod
    def _in_forward_mode(name: str, fn: Any, args: tuple, again: Any) -> Any:
        return call(fn, name, args, {}, again, by_record=False)

    def tangents(self, tangents: tuple[torch.Tensor | None, ...]) -> tuple[torch.Tensor, ...]:
        """The outputs' tangents: the launches run as their tangent kernels (see the module's docstring)."""
        memory = TangentMemory(self.error)
        given = [(x, t) for x, t in zip(self.inputs, tangents, strict=True) if t is not None and x.is_floating_point()]
        for x in self.inputs:
            memory.argument(x)
        for x, t in given:
            memory.put(x, t)
        shared = Counter(storage_of(x) for x, _ in given)
        for x, t in given:  # (after all are written: arguments sharing memory; a check reads back, a host sync)
            if shared[storage_of(x)] > 1 or torch._debug_has_internal_overlap(x) != 0:
                memory.check(x, t)
        read: dict[int, str] = {}  # storage -> the launch that read it first
        for index, (kernel, grid, args, kwargs) in enumerate(self.launches):
            self.run_tangent(memory, read, index, kernel, grid, args, kwargs)
        found = []
        for o in self.outputs:
            if not memory.holds(o) and o.is_floating_point():
                raise self.error(f"an output is a tensor no launch wrote ({layout_of(o)}): made with PyTorch "
                                 "operations in the host function, whose tangents forward mode does not yet follow")
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
            if storage_of(tensors[p]) in read:
                raise self.error(f"{launch} overwrites `{p}`, which {read[storage_of(tensors[p])]} read")
        for p in sorted(roles.loads & set(tensors)):
            if (tensors[p].is_floating_point() and not memory.holds(tensors[p]) and p in roles.inputs
                    and id(tensors[p]) not in self.constants):
                raise self.error(f"{launch} reads `{p}`, a tensor neither an argument of the op nor written by an "
                                 "earlier launch: made with PyTorch operations in the host function, whose tangents "
                                 "forward mode does not yet follow")
            read.setdefault(storage_of(tensors[p]), launch)
        found = specialized(kernel, named)
        named = {p: (memory.scratch(v) if p in roles.stores and isinstance(v, torch.Tensor) else v)
                 for p, v in named.items()}
        tangents = {t: memory.view(tensors[p]) for p, t in found.tangent_params.items() if p in tensors}
        found.launch(grid, {**named, **tangents}, options)  # (named: every parameter, defaults included)


def _apply(function: type, call: _Call, *tensors: Any) -> Any:
    """``function.apply(call, *tensors)`` past ``Function.apply``'s binding of default arguments (inspect.signature:
    tens of microseconds a call; these forwards have none): what it does next, ``custom_function_call`` under a
    torch.func transform, else ``_FunctionBase.apply`` (which calls ``setup_context`` too)."""
    if torch._C._are_functorch_transforms_active():
        return custom_function_call(function, call, *tensors)
    return _BASE_APPLY[function](call, *[_unwrap_if_dead(t) if isinstance(t, torch.Tensor) else t for t in tensors])


def _tangents_at_one_level(call: _Call, tensors: tuple) -> Any:
    """``_apply(_Tangents, call, *tensors)`` from a jvp rule: under one torch.func.jvp alone, custom_function_call's
    unwrap, apply below the level, wrap again, without its per-call class, pytree and signature work (a quarter of
    func.jvp's host). Nothing at that level differentiates them; autograd below it can (reverse over forward)."""
    interpreters = retrieve_all_functorch_interpreters()
    if len(interpreters) != 1 or interpreters[0].key() != TransformType.Jvp:
        return _apply(_Tangents, call, *tensors)
    level = interpreters[0].level()
    unwrapped = [_unwrap_for_grad(t, level) if isinstance(t, torch.Tensor) else t for t in tensors]
    with torch.enable_grad(), interpreters[0].lower():
        found = _BASE_APPLY[_Tangents](call, *unwrapped)
    return tuple(_wrap_for_grad(t, level) for t in found)


class _ForwardMode(torch.autograd.Function):
    """A call in forward mode: the forward runs the host function; ``jvp`` runs its launches' tangent kernels;
    ``backward`` (torch.func.hessian: jacfwd over jacrev) the op's backward as an op in forward mode (``_Call.vjp``);
    ``vmap`` one call per slice."""

    @staticmethod
    def forward(call: _Call, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return call.forward(tensors)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        ctx.call = inputs[0]
        ctx.primals = inputs[1:]  # (jvp passes them on, so that the tangents' autograd history reaches them; the
        ctx.outputs = [weakref.ref(o) for o in output]  # outputs too, not kept: they hold ctx as their grad_fn)
        ctx.save_for_backward(*inputs[1:], *output)  # (as the transform above sees them: with their tangents)

    @staticmethod
    def jvp(ctx, _call, *tangents):
        outputs = [o() for o in ctx.outputs]
        if any(o is None for o in outputs):  # (not seen: the outputs are alive while their tangents are computed)
            raise ctx.call.error("its outputs were freed before their tangents were computed")
        return _tangents_at_one_level(ctx.call, (*tangents, *ctx.primals, *outputs))

    @staticmethod
    def backward(ctx, *grads):
        saved = [_unwrap_if_dead(t) for t in ctx.saved_tensors]  # (a grad transform's wrappers, dead by now)
        if ctx.call.slices:  # vmap ran the call per slice (vmap(grad(f)): per-sample gradients)
            return (None, *sliced_backward(ctx.call, saved, grads, ctx.needs_input_grad[1:]))
        count = len(ctx.call.inputs)
        return (None, *ctx.call.vjp(saved[:count], saved[count:], grads, ctx.needs_input_grad[1:]))

    @staticmethod
    def vmap(info, in_dims, call, *tensors):
        rows, calls = [], []
        for b in range(info.batch_size):
            calls.append(call.again())
            rows.append(_apply(_ForwardMode, calls[-1], *[t if d is None else t.select(d, b)
                                                         for t, d in zip(tensors, in_dims[1:], strict=True)]))
        call.result_spec, call.slices = calls[0].result_spec, calls
        return stacked(rows)


class _Tangents(torch.autograd.Function):
    """A call's launches run as tangent kernels: a function of the input tangents, linked to the inputs and outputs
    (J(x) tx depends on x). ``backward``: reverse mode through them (``_Call.tangents_vjp``); ``vmap``: jacfwd's."""

    @staticmethod
    def forward(call: _Call, *tensors):
        try:
            return call.tangents(tensors[:len(call.positions)])  # (then the inputs and outputs, for autograd alone)
        except (NotImplementedError, RuntimeError) as e:
            refuse_batched_gradients(call.name, tensors, e, tangents=True)
            raise

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        ctx.call = inputs[0]
        ctx.save_for_backward(*inputs[1:], *output)

    @staticmethod
    def jvp(ctx, *tangents):
        raise ctx.call.error("a derivative in forward mode of its tangents (jacfwd of jacfwd, or of a Hessian) is not "
                             "yet supported: take second derivatives as forward over reverse (torch.func.hessian) or "
                             "reverse over forward (torch.func.jacrev of jacfwd)")

    @staticmethod
    def backward(ctx, *grads):
        count = len(ctx.call.positions)
        saved = [t if t is None else _unwrap_if_dead(t) for t in ctx.saved_tensors]
        needs = ctx.needs_input_grad[1:]
        inputs, outputs, found = saved[count:2 * count], saved[2 * count:-len(grads)], saved[-len(grads):]
        found_grads = ctx.call.tangents_vjp(inputs, saved[:count], outputs, found, grads, needs[:count],
                                            needs[count:2 * count])
        return (None, *found_grads, *[None] * len(outputs))  # (the outputs: data, their dependence through x)

    @staticmethod
    def vmap(info, in_dims, call, *tensors):
        batched = any(d is not None for d in in_dims[1 + len(call.positions):])  # (then the call ran per slice)
        if batched and len(call.slices) != info.batch_size:
            raise call.error("its tangents under vmap of batched inputs found no call per slice of the batch")
        rows = []
        for b in range(info.batch_size):
            rows.append(_apply(_Tangents, call.slices[b] if batched else call,
                               *[t if d is None or t is None else t.select(d, b)
                                 for t, d in zip(tensors, in_dims[1:], strict=True)]))
        return stacked(rows)


def _derivative_along(fn: Any, primals: tuple, directions: tuple) -> tuple[tuple, tuple]:
    """``fn``'s outputs and their derivatives along ``directions`` (forward mode): torch.func.jvp, or inside a dual
    level of torch.autograd.forward_ad, which does not nest, dual tensors of that level made of the plain values."""
    if torch._C._are_functorch_transforms_active() or forward_ad._current_level < 0:
        return torch.func.jvp(fn, primals, directions)
    found = [forward_ad.unpack_dual(o) for o in fn(*[forward_ad.make_dual(forward_ad.unpack_dual(p).primal, d)
                                                     for p, d in zip(primals, directions, strict=True)])]
    return (tuple(o.primal for o in found),
            tuple(torch.zeros_like(o.primal) if o.tangent is None else o.tangent for o in found))


def _first_order(plain: list, made: list, grads: tuple, needs: tuple) -> list:
    """The gradients where nothing differentiates them again (grad, vjp, jacrev alone: ``_transformed``): autograd
    through the call made in reverse mode on plain tensors, as in eager mode (its launch records' nodes, checked as
    an eager backward is, and the PyTorch operations of a bare op's host function), no op made of its backward."""
    pairs = [(o, _plain(g)) for o, g in zip(made, grads, strict=True) if g is not None and o.requires_grad]
    wanted = [i for i, x in enumerate(plain) if needs[i] and x.requires_grad]
    result: list = [None] * len(plain)
    if pairs and wanted:
        with temporarily_clear_interpreter_stack():  # (the buffers the backward makes: plain too)
            found = torch.autograd.grad([o for o, _ in pairs], [plain[i] for i in wanted], [g for _, g in pairs],
                                        allow_unused=True)
        for i, g in zip(wanted, found, strict=True):
            result[i] = g
    return result


def _plain(t: torch.Tensor | None) -> torch.Tensor | None:
    """``t`` without the transforms' wrappers."""
    while t is not None and torch._C._functorch.is_functorch_wrapped_tensor(t):
        t = torch._C._functorch.get_unwrapped(t)
    return t


def _transformed(t: torch.Tensor | None) -> bool:
    """Whether gradients computed from ``t`` take more than plain tensors: ``t`` is batched (vmap, jacrev), tracked
    by a grad or jvp level beyond the one differentiating it now, or, under every transform, by autograd."""
    functorch, levels = torch._C._functorch, 0
    while t is not None and functorch.is_functorch_wrapped_tensor(t):
        if not functorch.is_gradtrackingtensor(t):
            return True
        levels += 1
        t = functorch.get_unwrapped(t)
    return t is not None and (levels > 1 or t.requires_grad)


_BASE_APPLY = {f: super(torch.autograd.Function, f).apply for f in (_ForwardMode, _Tangents)}  # (the C++ apply)
_unwrap_if_dead = torch._C._functorch.unwrap_if_dead
