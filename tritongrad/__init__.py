"""tritongrad: write the forward Triton kernel, get the backward.

    bwd = tritongrad.grad(kernel)          # a derived backward kernel; bwd.src is its source
    vjp = tritongrad.vjp(tile_fn, wrt=(0, 1))
    tan = tritongrad.jvp(kernel)           # a derived tangent (forward-mode) kernel; tan.src is its source
    @tritongrad.custom_vjp(helper_bwd)     # a hand-written adjoint for a @triton.jit helper

The names below are imported on first use, so that importing tritongrad does not
import triton: the command line chooses Triton's interpreter (no GPU) first.
"""

import importlib

_EXPORTS = {
    "BackwardKernel": "runtime.derive",
    "backward_configs": "host.configs",
    "custom_vjp": "runtime.custom",
    "grad": "runtime.derive",
    "kept": "tools.memory",
    "jvp": "runtime.tangent_kernel",
    "TangentKernel": "runtime.tangent_kernel",
    "vjp": "runtime.derive",
    "NotDifferentiableError": "core.errors",
    "OpError": "core.errors",
    "TritongradError": "core.errors",
    "op": "ops.torch_op",
    "override": "ops.aten_override",
}

__all__ = sorted(_EXPORTS)
__version__ = "0.1.0"  # the one place: pyproject.toml reads it, `tritongrad --version` prints it


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'tritongrad' has no attribute '{name}'")
    value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted([*globals(), *_EXPORTS])
