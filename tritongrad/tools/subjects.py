"""What a command acts on, named the same way for ``show``, ``check`` and ``bench``: a bundled example's name
(``rmsnorm``) or ``FILE.py:NAME``, a kernel for ``show``, an op for ``check`` and ``bench``, whose file also
defines ``make_inputs`` (and, for ``check``, ``reference``). A mistake in naming it, or in what the file
defines, is a :class:`UsageError`: one line, with the file and line where there is one; exit status 2.
"""

from __future__ import annotations

import inspect
import os
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..core.errors import TritongradError
from .sizes import format_size


class UsageError(TritongradError):
    """A mistake in what a command was asked to do: its one-line message goes to stderr, exit status 2."""


@dataclass(frozen=True)
class Subject:
    """An op and what checking and timing it need: its reference and input maker, the sizes and dtypes it takes;
    for ``bench``, its sizes there and the bytes (``traffic``) and flops one pass moves. ``file``: where a user's
    op, or a bundled example, is defined (its errors are located there)."""

    name: str
    op: Callable
    reference: Callable | None
    make_inputs: Callable
    sizes: tuple
    dtypes: tuple = (torch.float64, torch.float32, torch.bfloat16, torch.float16)
    bench_sizes: tuple = ()
    traffic: Callable | None = None
    flops: Callable | None = None
    file: str = ""
    bundled: bool = True  # (a user's op is timed against Liger-Kernel only if asked to)


def shown(path: str | Path) -> str:
    """A path as messages show it: relative to the working directory where it lies below it."""
    relative = os.path.relpath(path)
    return str(path) if relative.startswith("..") else relative


def defined_at(obj: Any) -> str:
    """``file:line`` where a function (or a kernel's function) is defined; "" where unknown."""
    fn = getattr(obj, "fn", obj)
    fn = inspect.unwrap(fn) if callable(fn) else fn
    code = getattr(fn, "__code__", None)
    return f"{shown(code.co_filename)}:{code.co_firstlineno}" if code is not None else ""


def raised_at(error: BaseException, file: str | None = None) -> str:
    """``file:line`` of the innermost frame of ``error``'s traceback in ``file`` (any file if None); ""."""
    frames = traceback.extract_tb(error.__traceback__)
    if file is not None:
        frames = [f for f in frames if Path(f.filename).resolve() == Path(file).resolve()]
    return f"{shown(frames[-1].filename)}:{frames[-1].lineno}" if frames else ""


def one_line(error: BaseException) -> str:
    first = (str(error).strip().splitlines() or [""])[0]
    return f"{type(error).__name__}: {first}" if first else type(error).__name__


def _split(spec: str, form: str) -> tuple[str, str] | None:
    """``FILE.py:NAME`` -> (FILE.py, NAME); None for a bare name; UsageError for a file without a name."""
    path, colon, name = spec.rpartition(":")
    if colon and path and name and not name.startswith(("\\", "/")):  # (not a Windows drive's colon)
        return path, name
    if colon or spec.endswith(".py") or os.sep in spec or "/" in spec or Path(spec).is_file():
        raise UsageError(f"expected {form} (or a bundled example's name), got {spec!r}")
    return None


def example(name: str, form: str) -> Any:
    """The bundled example of that name (``cross-entropy`` spells ``cross_entropy`` too)."""
    from .. import examples

    spelled = name if name in examples.EXAMPLES else name.replace("-", "_")
    if spelled not in examples.EXAMPLES:
        raise UsageError(f"no example `{name}` (there are: {', '.join(examples.EXAMPLES)}; or name {form})")
    return examples.EXAMPLES[spelled]


def load_module(path: str) -> Any:
    """A user's file imported (its folder on the import path, so that it may import its siblings)."""
    from ..core.source import import_file

    file = Path(path).resolve()
    if not file.is_file():
        raise UsageError(f"no such file: {path}")
    try:
        return import_file(file)
    except Exception as e:  # the user's file: say what went wrong where, in one line
        at = raised_at(e, str(file)) or raised_at(e)
        raise UsageError(f"importing {path} failed{f' at {at}' if at else ''}: {one_line(e)}") from None


def load_kernels(spec: str) -> list[Any]:
    """``show``'s subject: an example's kernels, or ``FILE.py:KERNEL``."""
    from ..core.source import unwrap

    split = _split(spec, "FILE.py:KERNEL")
    if split is None:
        return list(example(spec, "FILE.py:KERNEL").kernels)
    path, name = split
    module = load_module(path)
    file = Path(path).resolve()
    kernels = [k for k, v in vars(module).items() if _defined_in(v, file, unwrap)]
    listed = f"; its kernels: {', '.join(kernels)}" if kernels else "; it defines no @triton.jit kernel"
    if not hasattr(module, name):
        raise UsageError(f"{path} defines no `{name}`{listed}")
    kernel = getattr(module, name)
    try:
        unwrap(kernel)
    except TypeError:
        raise UsageError(f"`{name}` in {path} is not a Triton kernel (it is a {type(kernel).__name__}){listed}"
                         ) from None
    return [kernel]


def _defined_in(obj: Any, file: Path, unwrap: Callable) -> bool:
    """Whether ``obj`` is a Triton kernel (jit function, autotuned or heuristics-driven) written in ``file``."""
    try:
        return Path(unwrap(obj).fn.__code__.co_filename).resolve() == file
    except (TypeError, AttributeError):
        return False


def load_subject(spec: str, reference: bool = True) -> Subject:
    """``check``'s and ``bench``'s subject: an example, or ``FILE.py:OP`` whose file also defines ``make_inputs``
    and (``reference``: as check needs) ``reference``, and may define ``SIZES``, ``BENCH_SIZES``, ``DTYPES``,
    ``traffic`` and ``flops`` as the examples do (tritongrad/examples/__init__.py)."""
    from ..core.source import unwrap

    split = _split(spec, "FILE.py:OP")
    if split is None:
        e = example(spec, "FILE.py:OP")
        return Subject(e.name, e.op, e.reference, e.make_inputs, e.sizes, e.dtypes, e.bench_sizes, e.traffic,
                       e.flops, e.module.__file__)
    path, name = split
    module = load_module(path)
    try:
        kernel = unwrap(getattr(module, name, None))
    except TypeError:
        pass
    else:
        raise UsageError(f"{defined_at(kernel)}: `{name}` is a Triton kernel; name the op that launches it (a "
                         f"@tritongrad.op function; `tritongrad show {path}:{name}` prints the kernel's backward)")
    needed = (name, "reference", "make_inputs") if reference else (name, "make_inputs")
    missing = [n for n in needed if not callable(getattr(module, n, None))]
    if missing:
        raise UsageError(f"{path} defines no {', '.join(f'`{n}`' for n in missing)} (check needs the op, "
                         "`reference` with the same signature and `make_inputs(size, device, dtype)`; bench needs "
                         "the op and `make_inputs`)")
    op, make_inputs = getattr(module, name), module.make_inputs
    parameters = inspect.signature(make_inputs).parameters
    if not any(p.kind == p.VAR_KEYWORD for p in parameters.values()) and not {"device", "dtype"} <= set(parameters):
        raise UsageError(f"{defined_at(make_inputs)}: make_inputs must take `device` and `dtype` (it is called as "
                         "make_inputs(size, device=..., dtype=...))")
    return Subject(name, op, getattr(module, "reference", None), make_inputs, tuple(getattr(module, "SIZES", ())),
                   tuple(getattr(module, "DTYPES", Subject.dtypes)), tuple(getattr(module, "BENCH_SIZES", ())),
                   getattr(module, "traffic", None), getattr(module, "flops", None), str(Path(path).resolve()), False)


def check_sizes(subject: Any, sizes) -> None:
    """Refuse a size with fewer or more numbers than the subject's own sizes have (``7`` for rows x columns)."""
    known = [*getattr(subject, "sizes", ()), *getattr(subject, "bench_sizes", ())]
    if not known or not sizes:
        return
    ranks = [_rank(s) for s in known]
    for size in sizes:
        if not min(ranks) <= _rank(size) <= max(ranks):
            count = f"{min(ranks)} to {max(ranks)}" if min(ranks) != max(ranks) else str(min(ranks))
            like = ", ".join(dict.fromkeys(format_size(s) for s in known[:3]))
            raise UsageError(f"{subject.name} takes sizes of {count} number{'s' if max(ranks) > 1 else ''} "
                             f"(such as {like}), not {format_size(size)}")


def _rank(size) -> int:
    return len(size) if isinstance(size, (tuple, list)) else 1

