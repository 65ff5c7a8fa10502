"""``@tritongrad.op``: a PyTorch operator with autograd, from a host function that launches Triton kernels.

    @tritongrad.op                       # or @tritongrad.op("mylib::scale") for a torch.library op
    def scale(x, w):
        y = torch.empty_like(x)
        scale_kernel[(triton.cdiv(x.numel(), 256),)](x, w, y, x.numel(), BLOCK=256)
        return y

The function takes tensors and Python scalars, allocates its outputs, launches any number
of kernels (plain ``@triton.jit``, ``@triton.autotune``, ``@triton.heuristics``; kernels
are not changed) and returns a tensor or a tuple of tensors. A bare op's arguments and results
are pytrees: tensors inside lists, tuples, ``*args`` and dicts are arguments like any other
(a dict of tensors may be returned). Forward mode (``torch.func.jvp``, dual tensors) runs the
launches as their tangent kernels (forward_mode.py).

Forward: the function runs as written while its launches are recorded (a launch record:
``tritongrad.host.launch_record``). The checks below and the backward's layout are worked out once per
kind of call (the kernels launched, the tensors' layouts) and reused by later calls of that
kind, which read tensor metadata only: no AST work, nothing that waits for the device.
Under ``torch.no_grad`` it just runs.

Backward: each launch's backward is derived with ``tritongrad.grad``, specialised to the
inputs that need gradients (built on first use, cached), and launched in reverse order
against shadow memory keyed by storage. A buffer one launch writes and a later one reads
passes the gradient from the later launch's backward to the earlier one's. Only tensors
kernels read (inputs and intermediate buffers) are saved for the backward; modifying one
in place before the backward raises, as for any autograd node. Empty tensors give zero
gradients (a launch of no program is not differentiated).

Refusals come at the call: the first call of a kind with an input that requires grad derives the
backward kernels already (those of a backward of every input and float output; once per kind of
call and value of the kernels' decisive constexprs, and the backward launches them), so a kernel
that cannot be differentiated is refused where the op is called, with the refusal's file, line
and hint. Refusals that depend on a launch's values (strides, index contents) come at the first
backward. An op whose kernels have no derivative, called on inputs that require grad for other
reasons: call it under ``torch.no_grad()``.

Autotuning: the backward of an autotuned (or heuristics-driven) launch is launched with
the config that forward launch used: its constexprs, ``num_warps`` and ``num_stages``; on a GPU,
an autotuned launch's backward, and that of a kernel declaring configs its result does not depend
on (``tritongrad.backward_configs``), runs under whichever of them is fastest (host/configs.py).

Hazards: the backward recomputes each launch against memory as the op left it, so a launch
that overwrites memory an earlier launch (or the same launch through another argument)
read, or that overwrites with ``tl.store`` what an earlier launch wrote, is refused with
an error naming both launches. Overlap is exact: views of one buffer that interleave without
sharing an element (its column halves) are apart. Kernels may not write to tensors
that require grad. Double backward raises. Forward mode (``torch.func.jvp``, ``jacfwd``, dual tensors) runs the
launches as their tangent kernels (forward_mode.py).

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
  Called eagerly, the backward differentiates the launches recorded in the forward. Four ops are registered:

  - ``ns::name``: a ``torch.library.triton_op``. While torch.compile traces it, each launch
    ``kernel[grid](...)`` of the host function is issued as ``wrap_triton(kernel)[grid](...)``
    (``hooks.collecting("wrap")``), so Inductor sees the kernels (an autotuner as one, tuned by
    Inductor). Called through ``torch.ops`` without a launch record, its backward is ``ns::name_backward``,
    which re-runs the forward launches first (as activation checkpointing would).
  - ``ns::name_saving``: what a compiled graph calls: the same forward, returning its outputs and
    the buffers its launches pass between them (whole tensors the op neither takes nor returns), so
    the graph saves them. Its backward ``ns::name_saved_backward`` runs the host function with its
    launches skipped (for their arguments), swaps its fresh buffers for the saved ones, and launches
    the derived kernels from that launch record: the forward launches do not run again.

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
  Otherwise the compiled backward is ``ns::name_traced_backward``, a triton_op whose derived kernels'
  launches Inductor traces; what cannot be traced (a launch check reading index tensors, anything the
  trace raises) keeps the opaque ``ns::name_saved_backward``, which runs on real tensors (host/saved_backward.py).
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from triton.runtime.jit import KernelInterface

from ..core.errors import OpError
from ..core.source import unwrap
from ..host import hooks
from . import forward_mode
from .autograd_function import arguments_of, recorded_call, transformed
from .library import check_name, named_op, opaque_default


def op(fn: Any = None, /, *, deterministic: bool = False, opaque: bool | None = None):
    """Make a host function that launches Triton kernels a differentiable PyTorch operator.

    The host function allocates its outputs, launches any number of kernels (``@triton.jit``,
    ``@triton.autotune``, ``@triton.heuristics``; the kernels are not changed) and returns what
    they wrote. tritongrad records the launches and, for the backward, launches the backward
    kernels it derives from each (``tritongrad.grad``) in reverse order::

        @triton.jit
        def scale_kernel(x_ptr, w_ptr, y_ptr, n, BLOCK: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            mask = offs < n
            x = tl.load(x_ptr + offs, mask=mask)
            tl.store(y_ptr + offs, x * tl.load(w_ptr + offs, mask=mask), mask=mask)

        @tritongrad.op                   # bare; @tritongrad.op("mylib::scale") for a named op
        def scale(x, w):
            y = torch.empty_like(x)
            scale_kernel[(triton.cdiv(x.numel(), 256),)](x, w, y, x.numel(), BLOCK=256)
            return y

        scale(x, w).sum().backward()     # x.grad, w.grad from the derived backward kernel

    Forms:

    - ``@op`` (bare) or ``@op(deterministic=True)``: the function through an ``autograd.Function``.
      Its arguments and results are pytrees: every tensor inside lists, tuples, ``*args`` and dicts
      is an input like any other, and it may return a tensor or lists, tuples and dicts of them.
      PyTorch operations in the function (``x.contiguous()``, a loss summed after a kernel) are
      differentiated through; a launch may update a tensor in place.
    - ``@op("namespace::name")`` (named): also registered with ``torch.library`` (a ``triton_op``
      torch.compile traces into), so ``torch.compile(fullgraph=True)`` and
      ``torch.library.opcheck`` work. One tensor per parameter, positional parameters only; the
      schema comes from the annotations (an unannotated parameter is a Tensor, or its default's
      type; the return a Tensor unless annotated, e.g. ``-> tuple[torch.Tensor, torch.Tensor]``).
      Its kernels may write only tensors it allocates, and it returns only tensors its launches wrote.

    Options: ``deterministic=True`` gives bitwise-identical gradients from run to run (no atomic
    additions; a load whose gradient only an atomic addition could write is refused, naming it).
    ``opaque`` (named ops): True registers a plain ``custom_op`` torch.compile does not trace into;
    the default is True only under Triton's interpreter or with ``TRITONGRAD_OPAQUE_OPS=1``.

    Returns the wrapped function (``functools.wraps``): called with grad enabled, its outputs carry
    the derived backward; under ``torch.no_grad`` the function just runs. Forward mode
    (``torch.func.jvp``, ``jacfwd``, dual tensors) runs the launches as their tangent kernels.
    A named op's function has the registered op as ``.op``.

    Raises:

    - ``OpError`` (a ``RuntimeError``), at decoration: ``fn`` is a kernel rather than its launcher,
      or not callable; a named op's name is not ``"namespace::name"`` or is registered by another
      function, or a parameter holds tensors in a container. ``TypeError`` there: a named op's
      parameter is not positional, or has no annotation and a default of no known type.
    - ``NotDifferentiableError``, at the first call of a kind with an input that requires grad: a
      kernel uses a construct that cannot be differentiated (file, line, construct and a hint).
    - ``OpError`` at a call, naming the launch and argument: a kernel writes a tensor that requires
      grad (other than a bare op's in-place update of a tensor with a history), a launch overwrites
      memory an earlier launch read or wrote, an argument requires grad but no launch reads it as a
      tensor, a named op's output no launch wrote, CPU tensors outside the interpreter, tensors on
      several devices; ``TypeError``: a non-tensor passed where the kernel takes a pointer.
    - At the backward: ``NotDifferentiableError`` where the launch's own values (strides, grid,
      index tensors) let two programs or lanes store to one element; ``StrayWriteError`` (an
      ``OpError``) where a launch read memory outside the elements of a tensor it was passed (sizes
      or strides the host function got wrong); ``OpError`` for a double backward the derived kernels
      cannot give.

    Every error tritongrad raises of its own is a ``tritongrad.TritongradError``. docs/errors.md
    says what to do about each; docs/calling-convention.md what an op may take, return and keep.
    """
    if isinstance(fn, str):
        check_name(fn)
        return lambda f: named_op(_host_function(f), fn, deterministic, opaque_default() if opaque is None else opaque)
    if fn is None:
        return lambda f: bare_op(_host_function(f), deterministic)
    return bare_op(_host_function(fn), deterministic)


def _host_function(fn: Any) -> Any:
    """``fn``, refused where it is a kernel rather than the host function that launches it."""
    if isinstance(fn, KernelInterface):
        name = getattr(unwrap(fn).fn, "__name__", "kernel")
        raise OpError(f"tritongrad.op wraps a host function that launches kernels, not a kernel: `{name}` is a Triton "
                      f"kernel. Write the launcher (`def {name}_op(x): y = torch.empty_like(x); {name}[grid](x, y, "
                      f"...); return y`) and decorate that; for the kernel's own backward kernel, use "
                      f"tritongrad.grad({name})")
    if not callable(fn):
        raise OpError(f"tritongrad.op wraps a host function, got {type(fn).__name__} {fn!r}")
    return fn


def bare_op(fn: Any, deterministic: bool = False) -> Any:
    """``@op`` without a name: ``fn`` through a launch record and an ``autograd.Function`` (autograd_function.py), or
    as it is under ``torch.no_grad`` and inside another op's launch record (which records its launches)."""
    hooks.install()
    name = getattr(fn, "__qualname__", None) or type(fn).__qualname__
    recorded = recorded_call(fn, name, {}, arguments_of(fn), deterministic)

    @functools.wraps(fn)
    def call(*args, **kwargs):
        if transformed():  # forward mode, torch.func's grad transforms and vmap: forward_mode.py; functionalize
            found = forward_mode.transformed_call(fn, fn.__qualname__, args, kwargs, True, recorded)  # refused (even
            if found is not None:  # under no_grad: tangents flow there too)
                return found
        if not torch.is_grad_enabled() or hooks.active():  # inference, or inside another op's launch record
            return fn(*args, **kwargs)
        return recorded(*args, **kwargs)

    return call
