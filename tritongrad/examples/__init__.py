"""Example kernels, each with its host launcher, a PyTorch reference and random inputs.

``EXAMPLES`` lists them for ``tritongrad demo``, which runs :func:`check` on each:
the forward against the reference, and the derived backward against torch autograd.
Without a GPU, set ``TRITON_INTERPRET=1`` before importing this package (kernels
are built when their module is imported).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..testing import backward_launch, poison
from . import (
    cross_entropy,
    flash_attention,
    fn1,
    gather,
    matmul,
    matvec,
    rmsnorm,
    sin,
    softmax,
    softplus,
    swiglu,
    transpose,
)
from .launch import Launch


@dataclass(frozen=True)
class Example:
    name: str
    kernel: object  # the forward @triton.jit kernel
    launch: Callable[..., Launch]  # inputs -> the forward launch, its output allocated
    launcher: Callable[..., torch.Tensor]  # inputs -> output: what a user calls
    reference: Callable[..., torch.Tensor]  # the same computation in plain PyTorch
    make_inputs: Callable[..., tuple[torch.Tensor, ...]]  # (device, dtype) -> fresh random inputs
    params: tuple[str, ...]  # the kernel parameter each input is passed as
    wrt: tuple[str, ...]  # the inputs that carry gradients (what grad() picks by default)


EXAMPLES: list[Example] = [
    Example("sin", sin._sin, sin.sin_launch, sin.triton_sin, sin.reference, sin.make_inputs,
            ("x_ptr",), ("x_ptr",)),
    Example("rmsnorm", rmsnorm.rmsnorm_fwd, rmsnorm.rmsnorm_launch, rmsnorm.rmsnorm, rmsnorm.reference,
            rmsnorm.make_inputs, ("x_ptr", "w_ptr"), ("x_ptr", "w_ptr")),
    Example("softmax", softmax.softmax_kernel, softmax.softmax_launch, softmax.softmax, softmax.reference,
            softmax.make_inputs, ("x_ptr",), ("x_ptr",)),
    Example("softplus", softplus.softplus_kernel, softplus.softplus_launch, softplus.softplus, softplus.reference,
            softplus.make_inputs, ("x_ptr",), ("x_ptr",)),
    Example("swiglu", swiglu.swiglu_kernel, swiglu.swiglu_launch, swiglu.swiglu, swiglu.reference,
            swiglu.make_inputs, ("a_ptr", "b_ptr"), ("a_ptr", "b_ptr")),
    Example("matvec", matvec.fwd_kernel, matvec.matvec_launch, matvec.matvec, matvec.reference,
            matvec.make_inputs, ("w_ptr", "x_ptr"), ("w_ptr", "x_ptr")),
    Example("matmul", matmul.matmul_kernel, matmul.matmul_launch, matmul.matmul, matmul.reference,
            matmul.make_inputs, ("a_ptr", "b_ptr"), ("a_ptr", "b_ptr")),
    Example("transpose", transpose.transpose_scale_kernel, transpose.transpose_scale_launch,
            transpose.transpose_scale, transpose.reference, transpose.make_inputs, ("x_ptr", "s_ptr"),
            ("x_ptr", "s_ptr")),
    Example("gather", gather.gather_kernel, gather.gather_launch, gather.gather, gather.reference,
            gather.make_inputs, ("x_ptr", "idx_ptr", "w_ptr"), ("x_ptr", "w_ptr")),
    Example("fn1", fn1.tr_forward, fn1.tr_forward_launch, fn1.fn1_triton, fn1.reference, fn1.make_inputs,
            ("X", "Y"), ("X", "Y")),
    Example("flash_attention", flash_attention.flash_attention_kernel, flash_attention.flash_attention_launch,
            flash_attention.flash_attention, flash_attention.reference, flash_attention.make_inputs,
            ("q_ptr", "k_ptr", "v_ptr"), ("q_ptr", "k_ptr", "v_ptr")),
    Example("cross_entropy", cross_entropy.cross_entropy_kernel, cross_entropy.cross_entropy_launch,
            cross_entropy.cross_entropy, cross_entropy.reference, cross_entropy.make_inputs,
            ("logits_ptr", "target_ptr"), ("logits_ptr",)),
]


def get(name: str) -> Example:
    for example in EXAMPLES:
        if example.name == name:
            return example
    raise KeyError(f"no example `{name}` (there are: {', '.join(e.name for e in EXAMPLES)})")


def check(example: Example, device: str = "cpu", dtype: torch.dtype = torch.float64) -> dict[str, float]:
    """Largest relative errors of the forward output and of each gradient, against PyTorch.

    The output buffer starts as NaN, so an element the kernel forgets to write shows up;
    the incoming gradient is random. On a GPU, ask for float32 (tl.dot may refuse float64).
    """
    inputs = example.make_inputs(device, dtype)
    launch = example.launch(*inputs)
    poison(launch.out)
    out = launch()
    leaves = [t.detach().clone().requires_grad_(p in example.wrt) for t, p in zip(inputs, example.params, strict=True)]
    expected = example.reference(*leaves)
    errors = {"forward": _relative_error(out, expected)}

    d_out = torch.randn_like(expected)
    got = backward_launch(example.kernel, launch.grid, launch.args, launch.kwargs, {launch.output: d_out},
                          wrt=example.wrt)
    differentiated = [p for p in example.params if p in example.wrt]
    wanted = torch.autograd.grad(expected, [t for t in leaves if t.requires_grad], d_out)
    for name, want in zip(differentiated, wanted, strict=True):
        errors[f"d_{name}"] = _relative_error(got[name], want)
    return errors


def _relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    """max |got - want| / max |want| (NaN anywhere counts as infinitely wrong)."""
    if got.shape != want.shape or not torch.isfinite(got).all():
        return float("inf")
    return ((got - want).abs().max() / want.abs().max().clamp_min(1e-30)).item()


__all__ = ["EXAMPLES", "Example", "Launch", "check", "get"]
