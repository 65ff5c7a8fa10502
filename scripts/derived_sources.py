"""Every kernel source tritongrad derives, one file per kernel, to show that a change left derivation unchanged.

    python scripts/derived_sources.py OUT [--fuzz N] [--only SUBSTRING]    # derive, write OUT/<where>.<kernel>.txt
    python scripts/derived_sources.py --compare A B                        # exit 1 if the two folders differ

Run from the worktree whose tritongrad is to be derived with (``PYTHONPATH=$PWD``; the script checks that it
imports this tree's package). It sets ``TRITON_INTERPRET=1`` itself and needs no GPU.

The kernels: every ``@triton.jit`` object (autotuned and heuristic ones unwrapped) defined at the top level of a
bundled example (tritongrad/examples), of a test module (tests/test_*.py, tests/fuzz/regressions, tests/data/user_ops)
and of the first N fuzz programs (tests/fuzz/generate.py's ``random_program(seed)`` for seeds 0..N-1; 400 by
default). Per kernel, each under a ``== section`` line:

- ``backward``: what ``tritongrad show`` prints (the backward, its launch notes, the kernel an op's kept outputs or
  kept loop states give);
- ``deterministic``: ``grad(k, deterministic=True).src``;
- ``jvp``: ``jvp(k).src``;
- ``specialized {...}``: the backward and jvp for constexpr values the tests launch with (keyword arguments with
  literal values at the kernel's calls in its module, ``constexprs={...}`` given to ``grad``; a fuzz program's blocks
  and flags), one section per distinct result;
- ``vjp``: ``vjp(f, wrt=<every parameter but constexprs>).tg_src`` for a (tile-level) function ``show`` refuses.

A derivation that raises writes its error (type and message), so a changed refusal is a difference too. Paths under
the worktree, the fuzz programs' temporary module names and object addresses are written as placeholders, so that
folders written from two worktrees compare equal where derivation is the same.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import difflib
import importlib
import importlib.util
import inspect
import io
import os
import re
import sys
import warnings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _normalized(text: str) -> str:
    text = text.replace(ROOT, "<ROOT>")
    text = re.sub(r"/[^\s'\"]*tritongrad_fuzz_[A-Za-z0-9_]+/fuzz_[0-9a-f]+", "<FUZZ>", text)
    text = re.sub(r"\bfuzz_[0-9a-f]{16}\b", "<FUZZ>", text)
    return re.sub(r"0x[0-9a-f]{6,}", "0x?", text)


def _outcome(derive) -> str:
    """What ``derive()`` returns, or the error it raises (with its notes)."""
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            return derive()
    except Exception as e:  # a refusal is part of what derivation gives
        return "\n".join([f"RAISED {type(e).__name__}: {e}", *map(str, getattr(e, "__notes__", ()))])


def _constexpr_params(jit_fn) -> list[str]:
    params = inspect.signature(jit_fn.fn).parameters.values()
    return [p.name for p in params if "constexpr" in str(p.annotation)]


def _literal(node: ast.expr):
    try:
        return True, ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False, None


def _launch_constexprs(module, names: set[str]) -> dict[str, list[dict]]:
    """Per kernel name, the constexpr values its module passes it as literals: ``k[grid](..., BLOCK=128)``,
    ``k.run(..., BLOCK=128)``, ``grad(k, constexprs={"BLOCK": 128})``."""
    try:
        tree = ast.parse(inspect.getsource(module))
    except (OSError, TypeError, SyntaxError):
        return {}
    found: dict[str, list[dict]] = {}

    def kernel_named(e: ast.expr) -> str | None:
        while isinstance(e, (ast.Subscript, ast.Attribute)):
            e = e.value
        return e.id if isinstance(e, ast.Name) and e.id in names else None

    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        values: dict = {}
        name = kernel_named(node.func) if not isinstance(node.func, ast.Name) else None
        if name is not None:
            for kw in node.keywords:
                ok, value = _literal(kw.value)
                if kw.arg and ok:
                    values[kw.arg] = value
        elif node.args and (name := kernel_named(node.args[0])) is not None:
            for kw in node.keywords:
                ok, value = _literal(kw.value)
                if kw.arg == "constexprs" and ok and isinstance(value, dict):
                    values.update(value)
        if name is not None and values:
            found.setdefault(name, []).append(values)
    return found


def _derived(kernel, specializations: list[dict]) -> str:
    from tritongrad import grad, jvp, vjp
    from tritongrad.core.source import unwrap
    from tritongrad.tools.cli import _shown_backward

    jit_fn = unwrap(kernel)
    sections = [("backward", _outcome(lambda: _shown_backward(kernel, None, None))),
                ("deterministic", _outcome(lambda: grad(kernel, deterministic=True).src)),
                ("jvp", _outcome(lambda: jvp(kernel).src))]
    constexprs = set(_constexpr_params(jit_fn))
    if sections[0][1].startswith("RAISED"):
        values = [i for i, p in enumerate(inspect.signature(jit_fn.fn).parameters) if p not in constexprs]
        sections.append(("vjp", _outcome(lambda: vjp(kernel, wrt=tuple(values)).tg_src)))
    seen = {sections[0][1] + sections[2][1]}
    given = {repr(sorted(values.items())): values for values in (
        {k: v for k, v in s.items() if k in constexprs} for s in specializations)}
    for label, values in sorted(given.items()):
        if not values:
            continue
        backward = _outcome(lambda: grad(kernel, constexprs=values).src)  # noqa: B023 (called at once)
        tangent = _outcome(lambda: jvp(kernel, constexprs=values).src)  # noqa: B023
        if backward + tangent in seen:
            continue
        seen.add(backward + tangent)
        sections += [(f"specialized {label}", backward), (f"specialized {label} jvp", tangent)]
    return _normalized("\n".join(f"== {title}\n{text}" for title, text in sections))


def _kernels_of(module, skip_modules: set[str]):
    """The module's own jit objects, by name (one imported from another dumped module is dumped there)."""
    from tritongrad.core.source import unwrap

    for name, obj in sorted(vars(module).items()):
        try:
            fn = unwrap(obj)
        except Exception:
            continue
        if fn is None or not callable(getattr(fn, "fn", None)) or not hasattr(fn, "arg_names"):
            continue
        home = getattr(fn.fn, "__module__", None)
        if home != module.__name__ and home in skip_modules:
            continue
        yield name, obj


def _import_quietly(name: str):
    with contextlib.redirect_stdout(io.StringIO()):
        return importlib.import_module(name)


def dump(out: str, fuzz: int, only: str | None) -> int:
    os.environ["TRITON_INTERPRET"] = "1"
    warnings.filterwarnings("ignore")
    tests = os.path.join(ROOT, "tests")
    sys.path[:0] = [ROOT, tests]
    import tritongrad

    assert os.path.abspath(tritongrad.__file__).startswith(ROOT + os.sep), (
        f"tritongrad imported from {tritongrad.__file__}, not {ROOT}: run with PYTHONPATH={ROOT}")
    os.makedirs(out, exist_ok=True)
    examples = sorted(f[:-3] for f in os.listdir(os.path.join(ROOT, "tritongrad", "examples"))
                      if f.endswith(".py") and f != "__init__.py")
    modules = [f"tritongrad.examples.{m}" for m in examples]
    modules += [f[:-3] for f in sorted(os.listdir(tests)) if f.startswith("test_") and f.endswith(".py")]
    modules += [f"fuzz.regressions.{f[:-3]}" for f in sorted(os.listdir(os.path.join(tests, "fuzz", "regressions")))
                if f.startswith("test_")]
    modules += ["fuzz.test_fuzz"]
    user_ops = os.path.join(tests, "data", "user_ops")
    sys.path.append(user_ops)
    modules += [f[:-3] for f in sorted(os.listdir(user_ops)) if f.endswith(".py")]
    skip_modules = set(modules)
    seen: set[int] = set()
    total = 0

    def write(label: str, module, specialize: dict[str, list[dict]]) -> int:
        n = 0
        for name, kernel in _kernels_of(module, skip_modules):
            key = f"{label}.{name}"
            if id(kernel) in seen or (only and only not in key):
                continue
            seen.add(id(kernel))
            with open(os.path.join(out, key + ".txt"), "w") as f:
                f.write(_derived(kernel, specialize.get(name, [])))
            n += 1
        return n

    for name in modules:
        try:
            module = _import_quietly(name)
        except BaseException as e:  # a test module that cannot import here (a GPU's, an optional package's)
            print(f"skipped {name}: {type(e).__name__}: {e}", file=sys.stderr)
            continue
        names = {n for n, _ in _kernels_of(module, skip_modules)}
        total += write(name.removeprefix("tritongrad."), module, _launch_constexprs(module, names))
    if fuzz:
        from fuzz.generate import load_module, random_program, render

        for seed in range(fuzz):
            try:
                program = random_program(seed)[0]
                module = load_module(render(program))
            except Exception as e:
                print(f"skipped fuzz program {seed}: {type(e).__name__}: {e}", file=sys.stderr)
                continue
            values = {**{d.BLOCK: d.block for d in program.dims}, **program.meta}
            total += write(f"fuzz.{seed}", module, {n: [values] for n in vars(module)})
    return total


def compare(a: str, b: str, shown: int = 5) -> int:
    """Report the files only one folder has and those that differ (a diff of the first ``shown``); 1 if any."""
    left, right = set(os.listdir(a)), set(os.listdir(b))
    differ = []
    for name in sorted(left & right):
        with open(os.path.join(a, name)) as f, open(os.path.join(b, name)) as g:
            x, y = f.read(), g.read()
        if x != y:
            differ.append(name)
            if len(differ) <= shown:
                sys.stdout.writelines(difflib.unified_diff(x.splitlines(True), y.splitlines(True),
                                                           f"{a}/{name}", f"{b}/{name}", n=2))
    for name in sorted(left - right):
        print(f"only in {a}: {name}")
    for name in sorted(right - left):
        print(f"only in {b}: {name}")
    print(f"compared {len(left & right)} kernels: {len(differ)} differ, {len(left - right)} only in {a}, "
          f"{len(right - left)} only in {b}")
    for name in differ:
        print(f"differs: {name}")
    return 1 if differ or left != right else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", nargs="?", help="the folder to write the derived sources to")
    parser.add_argument("--fuzz", type=int, default=400, help="fuzz programs of seeds 0..N-1 (default 400)")
    parser.add_argument("--only", help="only the kernels whose file name contains this")
    parser.add_argument("--compare", nargs=2, metavar=("A", "B"), help="compare two folders written before")
    args = parser.parse_args(argv)
    if args.compare:
        return compare(*args.compare)
    if not args.out:
        parser.error("give OUT, or --compare A B")
    print(f"derived {dump(args.out, args.fuzz, args.only)} kernels into {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
