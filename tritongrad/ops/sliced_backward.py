"""The backward of an op's call that vmap ran one slice at a time, inside a grad transform: ``vmap(grad(f))``,
per-sample gradients (forward_mode.py's ``_ForwardMode.vmap`` made a call per slice, so the batched call itself has
no launches to differentiate).

The backward is an ``autograd.Function`` of the saved tensors and the incoming gradients, so that vmap hands its
``vmap`` them unbatched with their batch dimensions: each slice's call then runs its own backward (forward_mode's
``_Call.vjp``) on its slices, and the gradients are stacked. A derivative of these gradients in turn is refused.
"""

from __future__ import annotations

from typing import Any

import torch
from torch._functorch.autograd_function import custom_function_call


def sliced_backward(call: Any, saved: list, grads: tuple, needs: tuple) -> list:
    """The gradients of ``call``'s tensor arguments (None where it gives none), given its saved tensors (its
    tensor arguments, then its outputs, as the transforms see them) and its outputs' gradients ``grads``."""
    per_slice = _PerSlice(call, (len(call.positions), len(saved) - len(call.positions)), needs)
    found = custom_function_call(_SlicedBackward, per_slice, *saved, *grads)  # (under vmap: never a plain apply)
    result: list = [None] * len(call.positions)
    for i, g in zip(per_slice.reached, found, strict=True):
        result[i] = g
    return result


class _PerSlice:
    """What the backward of one batched call takes besides tensors: the call (its ``slices``), how many saved
    tensors are its arguments and outputs, which arguments need gradients; ``reached`` once its ``vmap`` ran."""

    def __init__(self, call: Any, counts: tuple[int, int], needs: tuple):
        self.call, self.counts, self.needs = call, counts, needs
        self.reached: list[int] = []  # the arguments given a gradient


class _SlicedBackward(torch.autograd.Function):
    @staticmethod
    def forward(per_slice, *tensors):  # (not reached: vmap batched the call's outputs, which are among the tensors)
        raise per_slice.call.error("its backward per slice of a batch found no batch")

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        ctx.per_slice = inputs[0]

    @staticmethod
    def backward(ctx, *grads):
        raise ctx.per_slice.call.error("a derivative of gradients per slice of a batch (of torch.func.vmap over grad, "
                                       "vjp or jacrev) is not yet supported: differentiate each sample's loss, or "
                                       "take the per-sample second derivatives outside vmap")

    @staticmethod
    def vmap(info, in_dims, per_slice, *tensors):
        count, outputs = per_slice.counts
        rows = []
        for b, call in enumerate(per_slice.call.slices):
            given = [t if d is None else t.select(d, b) for t, d in zip(tensors, in_dims[1:], strict=True)]
            rows.append(call.vjp(given[:count], given[count:count + outputs], tuple(given[count + outputs:]),
                                 per_slice.needs))
        per_slice.reached = [i for i, g in enumerate(rows[0]) if g is not None]
        return stacked([[row[i] for i in per_slice.reached] for row in rows])


def stacked(rows: list) -> tuple[tuple[torch.Tensor, ...], tuple[int, ...]]:
    """A Function's ``vmap`` result from its rows (per slice, its outputs): each output stacked, batched along 0."""
    columns = tuple(torch.stack(column) for column in zip(*rows, strict=True))
    return columns, (0,) * len(columns)
