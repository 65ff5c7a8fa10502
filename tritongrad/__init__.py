"""tritongrad: write the forward Triton kernel, get the backward.

    bwd = tritongrad.grad(kernel)          # a derived backward kernel; bwd.src is its source
    vjp = tritongrad.vjp(tile_fn, wrt=(0, 1))
"""

from .derive import BackwardKernel, grad, vjp
from .errors import NotDifferentiableError

__all__ = ["BackwardKernel", "NotDifferentiableError", "grad", "vjp"]
__version__ = "0.1.0"
