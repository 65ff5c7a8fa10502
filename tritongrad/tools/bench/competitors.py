"""The implementations ``tritongrad bench`` compares for an example: ours, eager PyTorch, torch.compile and
Liger-Kernel (its ``autograd.Function``, and its forward launcher under ``@tritongrad.op``). Liger-Kernel is
never a dependency: it is imported here, only when installed, and an example it lacks gets a note instead."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

IMPLS = ("tritongrad", "tritongrad-compile", "liger-fwd", "liger", "compile", "eager")
OPTIONAL = ("tritongrad-compile",)  # timed only where asked for (--impl)


# example -> (Liger module, its attribute, attribute -> a callable with the reference's signature).
# `liger`: Liger's hand-written autograd.Function.
LIGER = {
    "rmsnorm": ("liger_kernel.ops.rms_norm", "LigerRMSNormFunction",
                lambda f: lambda x, w, eps=1e-6: f.apply(x, w, eps)),
    "layernorm": ("liger_kernel.ops.layer_norm", "LigerLayerNormFunction",
                  lambda f: lambda x, w, b, eps=1e-5: f.apply(x, w, b, eps)),
    "add_rmsnorm": ("liger_kernel.ops.fused_add_rms_norm", "LigerFusedAddRMSNormFunction",
                    lambda f: lambda x, r, w, eps=1e-6: f.apply(x, r, w, eps)),
    "swiglu": ("liger_kernel.ops.swiglu", "LigerSiLUMulFunction", lambda f: lambda a, b: f.apply(a, b)),
    "geglu": ("liger_kernel.ops.geglu", "LigerGELUMulFunction", lambda f: lambda a, b: f.apply(a, b)),
    "softmax": ("liger_kernel.ops.softmax", "LigerSoftmaxFunction", lambda f: lambda x: f.apply(x)),
    "cross_entropy": ("liger_kernel.ops.cross_entropy", "LigerCrossEntropyFunction",
                      lambda f: lambda logits, target, ignore_index=-100:  # per-row losses, as the example's
                      f.apply(logits, target, None, ignore_index, 0.0, 0.0, "none")[0]),
    "rotary": ("liger_kernel.ops.rope", "LigerRopeFunction",
               lambda f: lambda q, k, cos, sin: f.apply(q, k, cos, sin)),
}

# `liger-fwd`: Liger's forward launcher, which allocates the output and launches Liger's
# forward kernel, wrapped with @tritongrad.op (by `implementations`): the backward is the derived one.
LIGER_FWD = {
    "rmsnorm": ("liger_kernel.ops.rms_norm", "rms_norm_forward",
                lambda f: lambda x, w, eps=1e-6: f(x, w, eps, 0.0, "llama", None)[0]),
    "layernorm": ("liger_kernel.ops.layer_norm", "layer_norm_forward",
                  lambda f: lambda x, w, b, eps=1e-5: f(x, w, b, eps)[0]),
    "swiglu": ("liger_kernel.ops.swiglu", "swiglu_forward", lambda f: lambda a, b: f(a, b)[2]),
    "softmax": ("liger_kernel.ops.softmax", "_softmax_forward", lambda f: lambda x: f(x)[0]),
}

# other spellings of the examples' names
ALIASES = {"rms_norm": "rmsnorm", "layer_norm": "layernorm", "fused_add_rmsnorm": "add_rmsnorm",
           "residual_rmsnorm": "add_rmsnorm", "add_rms_norm": "add_rmsnorm", "crossentropy": "cross_entropy",
           "rope": "rotary", "rotary_embedding": "rotary", "silu_mul": "swiglu", "gelu_mul": "geglu"}


def _canonical(name: str) -> str:
    name = name.lower().replace("-", "_")
    return ALIASES.get(name, name)


def liger_adapter(table: dict, example: str) -> tuple[Callable | None, str]:
    """(callable, "") for the example from a Liger table, or (None, why not): Liger-Kernel is imported
    here, only when installed, and never required."""
    import importlib

    entry = table.get(_canonical(example))
    if entry is None:
        return None, f"Liger-Kernel has no counterpart of {example}"
    module_name, attribute, adapt = entry
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        return None, "liger_kernel is not installed"
    if not hasattr(module, attribute):
        return None, f"liger_kernel {installed_version('liger_kernel') or ''} has no {module_name}.{attribute}"
    return adapt(getattr(module, attribute)), ""


def installed_version(dist: str) -> str | None:
    """The installed distribution's version (recorded beside every number; Liger-Kernel's where installed)."""
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


@dataclass
class Impl:
    """One implementation: its name in IMPLS, how to make its callable, or why it is unavailable."""

    name: str
    make: Callable[[], Callable] | None  # called once per size (torch.compile starts afresh); None: unavailable
    note: str = ""


def implementations(example, requested: Sequence[str] | None, dtype_name: str) -> list[Impl]:
    """The implementations to time for an example (all of IMPLS by default; Liger's where it has the op)."""
    import torch

    reference = getattr(example, "reference", None)
    names = list(requested) if requested else [
        i for i in IMPLS
        if i not in OPTIONAL and (i not in ("liger", "liger-fwd") or getattr(example, "bundled", True)
            and _canonical(example.name) in (LIGER if i == "liger" else LIGER_FWD))
        and (reference is not None or i not in ("compile", "eager"))]
    impls = []
    for name in names:
        if name in ("compile", "eager") and reference is None:
            impls.append(Impl(name, None, f"{example.name} has no `reference` beside it"))
        elif name == "tritongrad":
            dtypes = getattr(example, "dtypes", None)
            if dtypes and getattr(torch, dtype_name) not in dtypes:
                supported = ", ".join(str(d).removeprefix("torch.") for d in dtypes)
                impls.append(Impl(name, None, f"the example supports {supported}"))
            else:
                impls.append(Impl(name, lambda: example.op))
        elif name == "tritongrad-compile":  # the op under torch.compile: Inductor launches forward and backward
            def compiled_op():
                torch._dynamo.reset()
                return torch.compile(example.op, dynamic=False)
            impls.append(Impl(name, compiled_op))
        elif name == "eager":
            impls.append(Impl(name, lambda: example.reference))
        elif name == "compile":
            def compiled():
                torch._dynamo.reset()  # a fresh compile per size: no recompile limit, no dynamic shapes
                return torch.compile(example.reference, dynamic=False)
            impls.append(Impl(name, compiled))
        elif name == "liger":
            fn, note = liger_adapter(LIGER, example.name)
            impls.append(Impl(name, (lambda fn=fn: fn) if fn else None, note))
        elif name == "liger-fwd":
            fn, note = liger_adapter(LIGER_FWD, example.name)
            if fn is not None:
                import tritongrad

                fn.__name__ = fn.__qualname__ = f"liger_{_canonical(example.name)}_forward"
                op = tritongrad.op(fn)
                impls.append(Impl(name, lambda op=op: op))
            else:
                impls.append(Impl(name, None, note))
        else:
            raise ValueError(f"unknown implementation {name!r} (there are: {', '.join(IMPLS)})")
    return impls
