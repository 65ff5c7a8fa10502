"""Checking derived gradients against PyTorch.

``backward_launch`` runs the derived backward of one forward launch the way the
calling convention asks (output shadows hold the incoming gradients, input shadows
start at zero, float32 for low-precision inputs); ``poison`` fills a buffer with
NaN so an element a kernel forgets to write cannot pass a test.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from ..core.source import unwrap
from ..host.kernel_roles import kernel_info
from ..runtime.augment import SavedStates, keeping
from ..runtime.derive import grad
from ..runtime.variants import shadow_dtype


def poison(t: torch.Tensor) -> torch.Tensor:
    """Fill ``t`` with NaN (or the largest value for integer tensors), in place."""
    return t.fill_(float("nan") if t.is_floating_point() else torch.iinfo(t.dtype).max)


def shadow_like(t: torch.Tensor) -> torch.Tensor:
    """A zero-filled gradient buffer with ``t``'s sizes and strides (float32 for half types)."""
    return torch.empty_strided(t.size(), t.stride(), dtype=shadow_dtype(t.dtype), device=t.device).zero_()


def bind_launch(kernel: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """A forward launch's arguments by parameter name (the forward's defaults applied)."""
    sig = inspect.signature(unwrap(kernel).fn)
    bound = sig.bind_partial(*args, **{k: v for k, v in kwargs.items() if k in sig.parameters})
    bound.apply_defaults()
    return dict(bound.arguments)


def forward_keeping_state(kernel: Any, grid: Any, args: Sequence[Any], kwargs: Mapping[str, Any]
                          ) -> SavedStates | None:
    """Run the augmented forward of ``kernel[grid](*args, **kwargs)`` (augment.py: the kernel as written, also
    keeping its nonlinear loops' states for the backward), as an op's forward does; it writes the launch's
    outputs. Returns the tapes it kept (for ``backward_launch(..., saved=)``), or None, having launched nothing,
    where the kernel has no augmented forward or the launch keeps no tapes."""
    named = bind_launch(kernel, args, kwargs)
    found = keeping(unwrap(kernel), named, tuple(grid(named) if callable(grid) else grid))
    if found is None:
        return None
    augmented_kernel, extra, saved = found
    options = {k: v for k, v in kwargs.items() if k not in named}
    augmented_kernel[grid](**named, **options, **extra)
    return saved


def backward_launch(kernel: Any, grid: Any, args: Sequence[Any], kwargs: Mapping[str, Any],
                    grads: Mapping[str, torch.Tensor], wrt: Sequence[str] | None = None,
                    outputs: Sequence[str] | None = None, deterministic: bool = False,
                    saved: SavedStates | None = None) -> dict[str, torch.Tensor]:
    """Gradients of one forward launch ``kernel[grid](*args, **kwargs)``.

    ``grads`` maps each output pointer parameter to the gradient of the loss with
    respect to the tensor passed there. Returns the gradients of the ``wrt`` tensors,
    each in its tensor's dtype (BackwardKernel.gradients: written as its write strategy chose).
    ``saved``: the tapes ``forward_keeping_state`` kept for this launch.
    """
    named = bind_launch(kernel, args, kwargs)
    if wrt is None:  # the float tensors the kernel only reads (in any specialization)
        roles = kernel_info(unwrap(kernel)).roles
        if roles is not None:
            wrt = tuple(p for p in named if p in roles.inputs and getattr(named[p], "is_floating_point", bool)())
    bwd = grad(kernel, wrt, outputs or (tuple(grads) if grads else None), deterministic=deterministic,
               constexprs=named)
    named.update({k: v for k, v in kwargs.items() if k not in named})  # launch options: num_warps, ...
    output_grads = {}
    for output in bwd.outputs:
        if output not in grads:
            raise ValueError(f"no gradient given for output `{output}`")
        tensor = named[output]
        output_grads[output] = shadow_like(tensor).copy_(grads[output].expand_as(tensor))
    got = bwd.gradients(grid, named, output_grads, saved)
    return {w: got[w].to(named[w].dtype) for w in bwd.wrt}


def assert_gradients_match(kernel: Any, grid: Any, args: Sequence[Any], kwargs: Mapping[str, Any],
                           out: torch.Tensor, want: torch.Tensor, leaves: Sequence[torch.Tensor],
                           names: Sequence[str], tol: float = 1e-10, d_out: torch.Tensor | None = None) -> None:
    """The derived gradients of one launch against torch autograd's on a reference.

    ``out`` is the output tensor in ``args``; ``want`` the reference's value of it, computed
    from ``leaves`` (the inputs passed as the parameters ``names``). The upstream gradient is
    random unless given.
    """
    d_out = torch.randn_like(out) if d_out is None else d_out
    output = next(p for p, a in zip(unwrap(kernel).arg_names, args, strict=False) if a is out)
    got = backward_launch(kernel, grid, args, kwargs, {output: d_out})
    for name, w in zip(names, torch.autograd.grad(want, leaves, d_out), strict=True):
        torch.testing.assert_close(got[name], w, rtol=tol, atol=tol, msg=lambda m, n=name: f"d_{n}: {m}")
