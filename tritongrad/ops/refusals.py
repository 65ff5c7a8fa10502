"""The calls an op refuses under transforms it does not take, each naming why: forward mode where its kernels' tangents
are not derived (a bare op outside forward_mode.py's path), torch.func transforms whose wrapped tensors have no
memory (functionalize), make_fx tracing of a call in forward mode (torch.func.linearize), and incoming gradients
batched by autograd's own vmap (is_grads_batched)."""

from __future__ import annotations

import torch
import torch.autograd.forward_ad as _forward_ad

from ..core.errors import OpError
from ..host.call_tensors import nested_tensors


def refuse_transforms(name: str, args: tuple, kwargs: dict, bare: bool) -> None:
    """Refuse a call differentiated in forward mode (a tensor among its arguments, containers' too, carries a tangent:
    a dual tensor, torch.func.jvp's, jacfwd's): the kernels' tangents are not derived, and the outputs would come out
    without any (a zero tangent). A bare op also refuses the torch.func transforms forward_mode.py does not take
    (functionalize), whose wrapped tensors have no memory its kernels could be launched on."""
    if _forward_ad._current_level >= 0:
        values = (*args, *kwargs.values())
        tensors = [*[v for v in values if isinstance(v, torch.Tensor)], *nested_tensors(values)[1]]
        if any(_forward_ad.unpack_dual(t).tangent is not None for t in tensors):
            raise forward_mode_error(name)
    if bare and torch._C._are_functorch_transforms_active():
        raise OpError(f"tritongrad.op `{name}`: torch.func transforms other than grad, vjp, jacrev, jvp, jacfwd, "
                      "hessian and vmap (functionalize) are not supported by a bare op: their wrapped tensors have no "
                      "memory its kernels could be launched on. Call it outside the transform, or name the op "
                      "(@tritongrad.op(\"ns::name\")), which torch.library registers")


def refuse_make_fx(name: str) -> None:
    """Refuse a call in forward mode traced by make_fx (torch.func.linearize): its tensors have no memory, and the
    op's kernels launch on real tensors (Triton's launch fails on them, naming none of this)."""
    from torch.fx.experimental.proxy_tensor import get_proxy_mode

    if get_proxy_mode() is not None:
        raise OpError(f"tritongrad.op `{name}`: torch.func.linearize (or make_fx of a torch.func transform) traces the "
                      "call with tensors that have no memory, and the op's kernels launch on real tensors. Call "
                      "torch.func.jvp for each tangent instead, or compile the function (torch.compile)")


def forward_mode_error(name: str) -> OpError:
    return OpError(f"tritongrad.op `{name}`: forward-mode AD (torch.func.jvp, torch.func.jacfwd, "
                   "torch.autograd.forward_ad dual tensors) is not yet supported: tritongrad derives reverse-mode "
                   "backward kernels only, and the outputs would carry no tangent. Use reverse mode "
                   "(torch.autograd.grad, .backward())")


def refuse_batched_gradients(name: str, grads: tuple, error: Exception, tangents: bool = False) -> None:
    """Raise OpError, from ``error`` (raised by a backward; ``tangents``: by a call's tangents in forward mode), where
    the incoming gradients (tangents) were batched by autograd's own vmap (``torch.autograd.grad(...,
    is_grads_batched=True)``; ``torch.autograd.functional.jacobian(vectorize=True)``, its forward-mode strategy too):
    their tensors have no memory for the derived kernels, which failed first. Looked for only after a failure: a
    batched tensor's dispatch keys are read, not its memory."""
    if not any(isinstance(g, torch.Tensor) and "Batched" in str(torch._C._dispatch_keys(g)) for g in grads):
        return
    if tangents:
        raise OpError(f"tritongrad.op `{name}`: its tangents were batched by vmap (torch.autograd.functional.jacobian("
                      "vectorize=True, strategy='forward-mode')), which have no memory its tangent kernels could be "
                      "launched on. Use torch.func.jacfwd, which tritongrad's ops take") from error
    raise OpError(f"tritongrad.op `{name}`: its backward was given gradients batched by vmap "
                  "(torch.autograd.grad(..., is_grads_batched=True), torch.autograd.functional.jacobian("
                  "vectorize=True)), which have no memory its kernels could be launched on. Use "
                  "torch.func.jacrev or torch.func.vmap over torch.func.vjp, which tritongrad's ops take, or "
                  "jacobian(vectorize=False)") from error
