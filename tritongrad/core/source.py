"""Kernel objects and their source: the jit function under the wrappers, its parsed source and scope;
and a user's file imported (``tritongrad show FILE.py:KERNEL``, ``check FILE.py:OP``)."""

from __future__ import annotations

import ast
import functools
import importlib
import importlib.util
import inspect
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import NotDifferentiableError
from .ir import Origin


def append_parameters(fdef: ast.FunctionDef, names) -> None:
    """Parameters added after a kernel's own (a derived forward's tapes, a descriptor's sizes): after defaulted
    parameters Python wants defaults, so they get None there; every launch passes them."""
    defaulted = bool(fdef.args.defaults)
    for name in names:
        fdef.args.args.append(ast.arg(arg=name))
        if defaulted:
            fdef.args.defaults.append(ast.Constant(None))


def unwrap(kernel: Any) -> Any:
    """The jit function under ``@triton.autotune`` / ``@triton.heuristics`` wrappers."""
    seen = 0
    while not is_jit(kernel) and hasattr(kernel, "fn") and seen < 10:
        kernel, seen = kernel.fn, seen + 1
    if not is_jit(kernel):
        raise TypeError(f"expected a @triton.jit kernel, got {type(kernel).__name__}")
    return kernel


def is_jit(obj: Any) -> bool:
    return type(obj).__name__ in ("JITFunction", "InterpretedFunction") and hasattr(obj, "fn")


def triton_language_name(obj: Any, spelled: ast.expr | None = None) -> str | None:
    """``"exp"`` for ``tl.exp`` (or ``tl.math.exp``, libdevice's ``exp``...), else None."""
    fn = getattr(obj, "fn", obj)
    if isinstance(fn, functools.partial):  # (the interpreter's stand-in for a hint: `_set_attr` with its name bound)
        fn = fn.func
    module = getattr(fn, "__module__", "") or ""
    if module.startswith("triton.language"):
        return getattr(fn, "__name__", None)
    if module == "triton.runtime.interpreter" and spelled is not None:
        # Triton's interpreter leaves tl.* replaced by its own functions after a kernel ran (3.2), or after one
        # raised (3.9)
        return spelled.attr if isinstance(spelled, ast.Attribute) else getattr(spelled, "id", None)
    return None


@dataclass
class Source:
    """A Python function's source, parsed, with where it lives (block pointers not yet rewritten)."""

    name: str
    tree: ast.FunctionDef
    file: str
    first_line: int
    lines: list[str]
    scope: dict[str, Any]

    @classmethod
    def of(cls, jit_fn: Any) -> Source:
        prepared = getattr(jit_fn, "tg_source", None)  # a kernel's view made by tritongrad (host_descriptors.py)
        if prepared is not None:
            return prepared
        fn = jit_fn.fn
        try:
            lines, first_line = inspect.getsourcelines(fn)
        except (OSError, TypeError) as e:
            raise NotDifferentiableError(
                f"kernel `{fn.__name__}`: its source cannot be found",
                file=getattr(fn.__code__, "co_filename", "<unknown>"),
                line=getattr(fn.__code__, "co_firstlineno", 0),
                hint="define the kernel in a file (not with exec or in a REPL) so its source can be read",
            ) from e
        tree = ast.parse(textwrap.dedent("".join(lines)))
        fdef = next(n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))
        scope = dict(fn.__globals__)
        if fn.__closure__:
            scope.update(inspect.getclosurevars(fn).nonlocals)
        return cls(fn.__name__, fdef, fn.__code__.co_filename, first_line, lines, scope)

    def origin(self, node: ast.AST) -> Origin:
        lineno = getattr(node, "lineno", 1)
        text = self.lines[lineno - 1].strip() if 0 < lineno <= len(self.lines) else ""
        return Origin(self.file, self.first_line + lineno - 1, text, self.name)


def import_file(file: Path):
    """Import a file, under its package's dotted name when it is inside one (relative imports work). The folder
    it is imported from goes first on the import path, as Python puts a script's: it may import its siblings."""
    parts, folder = [file.stem], file.parent
    while (folder / "__init__.py").exists():
        parts.insert(0, folder.name)
        folder = folder.parent
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
    if len(parts) > 1:
        return importlib.import_module(".".join(parts))
    spec = importlib.util.spec_from_file_location(file.stem, file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[file.stem] = module
    spec.loader.exec_module(module)
    return module
