"""The bundled examples, one module each: a forward kernel written as the Triton tutorials write
them, its ``@tritongrad.op`` launcher, the same computation in plain PyTorch, and an input maker.

A module provides (what ``tritongrad check``, ``tritongrad bench`` and ``tritongrad demo`` read):

- ``<name>`` (or ``OP``): the operator, ``@tritongrad.op("tritongrad_examples::<name>")``;
- ``reference``: the same signature and outputs, in plain PyTorch;
- ``make_inputs(size, device, dtype)``: fresh random inputs (floating-point tensors get gradients);
- ``SIZES`` (small: checked under the interpreter, some not multiples of a block), ``BENCH_SIZES``
  (a GPU's), ``DTYPES`` (what its kernels take);
- ``traffic(size, dtype)``: the fewest bytes one forward and one backward move, ``{"fwd", "bwd"}``;
  ``flops(size)`` where the work is arithmetic (matmul, attention).

Adding an example is a module and its name in ``NAMES``. Without a GPU, set ``TRITON_INTERPRET=1``
before importing this package (kernels are built when their module is imported).
"""

from __future__ import annotations

import importlib
import inspect
import types
from collections.abc import Callable
from dataclasses import dataclass

from triton.runtime.jit import KernelInterface

from ..core.source import unwrap
from .launch import Launch

NAMES = ("sin", "softplus", "gelu", "swiglu", "geglu", "rmsnorm", "layernorm", "add_rmsnorm", "softmax",
         "log_softmax", "cross_entropy", "rotary", "matmul", "flash_attention", "fn1", "linear", "matvec", "gather",
         "transpose")


@dataclass(frozen=True)
class Example:
    name: str
    module: types.ModuleType
    op: Callable  # the @tritongrad.op launcher
    reference: Callable  # the same computation in plain PyTorch
    make_inputs: Callable  # (size, device, dtype) -> inputs
    sizes: tuple  # checked under the interpreter
    bench_sizes: tuple  # timed on a GPU
    traffic: Callable  # (size, dtype) -> {"fwd": bytes, "bwd": bytes}
    flops: Callable | None  # (size) -> {"fwd": flop, "bwd": flop}, for matmul and attention
    kernels: tuple  # the module's forward kernels
    dtypes: tuple  # the dtypes its kernels take


def _example(name: str) -> Example:
    module = importlib.import_module(f".{name}", __name__)
    kernels = getattr(module, "KERNELS", None) or tuple(
        k for k in vars(module).values()
        if isinstance(k, KernelInterface) and unwrap(k).fn.__module__ == module.__name__ and _stores(k))
    return Example(name, module, getattr(module, "OP", None) or getattr(module, name), module.reference,
                   module.make_inputs, tuple(module.SIZES), tuple(module.BENCH_SIZES), module.traffic,
                   getattr(module, "flops", None), kernels, tuple(module.DTYPES))


def _stores(kernel) -> bool:
    """A kernel, not a helper: it stores (helpers return their values)."""
    return "tl.store(" in inspect.getsource(unwrap(kernel).fn)


EXAMPLES: dict[str, Example] = {name: _example(name) for name in NAMES}


def get(name: str) -> Example:
    if name not in EXAMPLES:
        raise KeyError(f"no example `{name}` (there are: {', '.join(EXAMPLES)})")
    return EXAMPLES[name]


__all__ = ["EXAMPLES", "Example", "Launch", "get"]
