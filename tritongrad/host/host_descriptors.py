"""Tensor descriptors made on the host (``triton.tools.tensor_descriptor.TensorDescriptor``) passed to a kernel.

Triton compiles a kernel once per descriptor type (rank, block shape, padding): for that compilation a host
descriptor parameter is the descriptor ``tl.make_tensor_descriptor(base, shape, strides, block_shape)`` would
make in the kernel from the host's fields. So a launch with host descriptors is recorded, derived and its
backward launched as the launch of the kernel's *descriptor view*: the parameter takes the descriptor's tensor,
its sizes and leading strides come as integer parameters after the kernel's own (``desc_q__shape_0``...), and
the kernel's first statement makes the descriptor from them under the parameter's name. From there descriptors
are as the kernel had made them (memory.py gives each a shadow descriptor over its gradient), and the
tutorials' ``isinstance(desc, tl.tensor_descriptor)`` helper takes the branch Triton takes. The forward itself
runs as launched: the descriptors the user made, untouched.
"""

from __future__ import annotations

import ast
import copy
import inspect
import types
from typing import Any

import triton.language as tl

from ..core.source import Source, append_parameters

try:
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # a Triton without host descriptors
    TensorDescriptor = None


def has_host_descriptors(args: tuple, kwargs: dict) -> bool:
    """Whether a launch passes a host descriptor (checked on every launch: kept to a type test per argument)."""
    if TensorDescriptor is None:
        return False
    return any(type(v) is TensorDescriptor for v in args) or any(type(v) is TensorDescriptor
                                                                 for v in kwargs.values())


def descriptor_view(kernel: Any, args: tuple, kwargs: dict) -> tuple[Any, tuple, dict]:
    """The launch as that of the kernel's descriptor view: (view, arguments, keyword arguments), each host
    descriptor replaced by its tensor, its sizes and leading strides passed by keyword."""
    params = list(inspect.signature(kernel.fn).parameters)
    named = {**dict(zip(params, args, strict=False)), **kwargs}
    found = [(p, v) for p, v in named.items() if type(v) is TensorDescriptor]
    spec = tuple((p, len(v.shape), tuple(int(b) for b in v.block_shape), v.padding) for p, v in found)
    view = _views.get((kernel.fn, spec))
    if view is None:
        view = _views[(kernel.fn, spec)] = _view(kernel, spec)
    args = tuple(v.base if type(v) is TensorDescriptor else v for v in args)
    kwargs = {k: v.base if type(v) is TensorDescriptor else v for k, v in kwargs.items()}
    for p, d in found:
        kwargs.update({f"{p}__shape_{i}": int(n) for i, n in enumerate(d.shape)})
        kwargs.update({f"{p}__stride_{i}": int(s) for i, s in enumerate(d.strides[:-1])})
    return view, args, kwargs


_views: dict[tuple, Any] = {}  # (kernel function, descriptor types) -> its descriptor view


def _view(kernel: Any, spec: tuple) -> Any:
    """The kernel object whose source (``tg_source``, read by ``Source.of``) and signature are the view's."""
    source = Source.of(kernel)
    tree = copy.deepcopy(source.tree)
    added, preamble = [], []
    for param, rank, block, padding in spec:
        sizes = [f"{param}__shape_{i}" for i in range(rank)]
        strides = [f"{param}__stride_{i}" for i in range(rank - 1)]
        added += sizes + strides
        padded = "" if padding == "zero" else f", padding_option={padding!r}"
        text = (f"{param} = tritongrad_tl.make_tensor_descriptor({param}, shape=[{', '.join(sizes)}], "
                f"strides=[{', '.join([*strides, '1'])}], block_shape={list(block)}{padded})")
        statement = ast.parse(text).body[0]
        for node in ast.walk(statement):  # errors name the kernel's `def` line
            node.lineno, node.col_offset = tree.lineno, tree.col_offset
        preamble.append(statement)
    extra = None if tree.args.defaults else inspect.Parameter.empty  # (as append_parameters gives them)
    append_parameters(tree, added)
    tree.body[:0] = preamble
    view = copy.copy(kernel)
    fn = kernel.fn
    view.fn = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
    signature = inspect.signature(fn)
    view.fn.__signature__ = signature.replace(parameters=[
        *signature.parameters.values(),
        *(inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=extra) for n in added)])
    view.tg_source = Source(source.name, tree, source.file, source.first_line, source.lines,
                            {**source.scope, "tritongrad_tl": tl})
    return view
