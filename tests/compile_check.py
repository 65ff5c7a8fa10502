"""TRITONGRAD_COMPILE_CHECK=1: every kernel Triton's interpreter runs in the tests is first compiled to Triton IR for
a Hopper GPU (the front end only: Triton's code generator, no GPU needed).

The interpreter runs kernels as Python, so it lets through what the compiler refuses: a loop-carried value whose type
changes (`m = float("-inf")` then float64 maxima), branches that leave a value with two types, a `tl.dot` accumulator
of the wrong type. Those surface only on a GPU run; this check finds them on the CPU, in the kernels tritongrad derives
and in the tests' own. conftest.py installs it when the variable is set; a kernel whose arguments it cannot type
(descriptors, tuples) is left to the GPU run.
"""

from __future__ import annotations

import inspect
import os

import torch
import triton
import triton.language as tl
from triton.compiler.errors import CompilationError
from triton.language import core as tl_core
from triton.runtime.errors import InterpreterError  # (its builtins are patched by the interpreter too: _pristine)

_POINTER = {torch.float64: "fp64", torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16",
            torch.int64: "i64", torch.int32: "i32", torch.int16: "i16", torch.int8: "i8", torch.uint8: "u8",
            torch.bool: "i1"}
_checked: dict = {}
_ABSENT = object()
_pristine: list = []  # (object, name, value) of each attribute the interpreter patches, as Triton defines it


class Untyped(Exception):
    """An argument this check cannot give a type."""


def _type(value) -> tuple[str, object]:
    """(signature type, constexpr value or None)."""
    if isinstance(value, torch.Tensor):
        if value.dtype not in _POINTER:
            raise Untyped(value.dtype)
        return "*" + _POINTER[value.dtype], None
    if isinstance(value, bool):
        return "i1", None
    if isinstance(value, int):
        return ("i32" if -2**31 <= value < 2**31 else "i64"), None
    if isinstance(value, float):
        return "fp32", None
    raise Untyped(type(value).__name__)


def _constexpr(value):
    if value is None or isinstance(value, (bool, int, float, str, tl.dtype)):
        return value
    if isinstance(value, tl.constexpr):
        return _constexpr(value.value)
    if type(value).__name__ == "InterpretedFunction":
        return _jit(value)
    raise Untyped(type(value).__name__)


def _jit(interpreted):
    """The compiled-mode JITFunction of an interpreted one (its callees are converted where the generator meets
    them)."""
    found = _checked.get(("jit", interpreted.fn))
    if found is None:
        try:
            found = triton.runtime.jit.JITFunction(interpreted.fn)
        except (OSError, ValueError) as e:  # (a function whose source Triton cannot find)
            raise Untyped(str(e)) from None
        _checked[("jit", interpreted.fn)] = found
    return found


def _converting(method):
    def visit(self, *args, **kwargs):
        value = method(self, *args, **kwargs)
        if type(value).__name__ == "InterpretedFunction":
            return _jit(value)
        if isinstance(value, tl.constexpr) and type(value.value).__name__ == "InterpretedFunction":
            return tl.constexpr(_jit(value.value))
        return value
    return visit


def _ir(jit_fn, signature: dict, constexprs: dict):
    from triton._C.libtriton import ir
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia.compiler import CUDABackend
    from triton.compiler.compiler import ASTSource

    target = GPUTarget("cuda", 90, 32)
    backend = CUDABackend(target)
    options = backend.parse_options({})
    context = ir.context()
    ir.load_dialects(context)
    backend.load_dialects(context)
    source = ASTSource(jit_fn, signature, constexprs)
    knobs = triton.knobs.compilation
    allowed, knobs.allow_non_constexpr_globals = knobs.allow_non_constexpr_globals, True  # (helpers are interpreted
    now = [(obj, name, obj.__dict__.get(name, _ABSENT)) for obj, name, _ in _pristine]  # functions until the
    _set(_pristine)  # generator meets them: _converting); Triton's own tl while compiling (a jitted function called
    try:  # as a function leaves the interpreter's patches in place)
        return source.make_ir(target, options, backend.get_codegen_implementation(options),
                              backend.get_module_map(), context)
    except CompilationError as e:
        if isinstance(e.__cause__, InterpreterError):  # an interpreter's function the generator reached (a tensor
            return None  # method the interpreter replaced): not this check's to judge
        raise
    finally:
        knobs.allow_non_constexpr_globals = allowed
        _set(now)


def _set(attributes: list) -> None:
    for obj, name, value in attributes:
        if value is _ABSENT:
            if name in obj.__dict__:
                delattr(obj, name)
        else:
            setattr(obj, name, value)


def check(interpreted, args: tuple, kwargs: dict) -> None:
    """Compile ``interpreted`` for the arguments of one launch; raise Triton's CompilationError where it fails."""
    if not active:
        return
    params = inspect.signature(interpreted.fn).parameters
    bound = dict(zip(params, args, strict=False))
    bound.update({k: v for k, v in kwargs.items() if k in params})
    signature, constexprs = {}, {}
    try:
        for name, p in params.items():
            value = bound[name] if name in bound else p.default
            if value is inspect.Parameter.empty:
                return  # (not passed: the launch itself fails)
            if "constexpr" in str(p.annotation) or value is None or isinstance(value, (tl.dtype, str, tl.constexpr)):
                signature[name], constexprs[name] = "constexpr", _constexpr(value)
            else:
                signature[name], _ = _type(value)
    except Untyped:
        return
    key = (interpreted.fn, tuple(signature.items()), tuple((k, repr(v)) for k, v in constexprs.items()))
    if key in _checked:
        return
    _checked[key] = True
    try:
        jitted = _jit(interpreted)
    except Untyped:
        return
    _ir(jitted, signature, constexprs)


def _probe():
    return tl, tl_core  # (the modules the interpreter patches, seen from a function's globals)


def install() -> None:
    global _installed
    if _installed:
        return
    _installed = True
    from triton.compiler.code_generator import CodeGenerator
    from triton.runtime import interpreter
    from triton.runtime.interpreter import InterpretedFunction

    scope = interpreter._patch_lang(_probe)
    changes = list(scope._changes)
    scope.restore()
    _pristine.extend((obj, name, obj.__dict__.get(name, _ABSENT)) for obj, name, _ in changes)

    from triton.runtime.jit import DependenciesFinder

    record = DependenciesFinder.record_reference
    DependenciesFinder.record_reference = lambda self, val, *a, **k: record(
        self, _jit(val) if type(val).__name__ == "InterpretedFunction" else val, *a, **k)
    CodeGenerator.visit_Name = _converting(CodeGenerator.visit_Name)
    CodeGenerator.visit_Attribute = _converting(CodeGenerator.visit_Attribute)
    run = InterpretedFunction.run

    def checked_run(self, *args, grid, warmup, **kwargs):
        check(self, args, kwargs)
        return run(self, *args, grid=grid, warmup=warmup, **kwargs)

    InterpretedFunction.run = checked_run


# on for every test with TRITONGRAD_COMPILE_CHECK=1; per test, on for those marked `compiled`, off for those marked
# `interpreter` (of the interpreter's meaning alone): conftest.py
ENABLED = os.environ.get("TRITONGRAD_COMPILE_CHECK") == "1"
active = ENABLED
_installed = False
