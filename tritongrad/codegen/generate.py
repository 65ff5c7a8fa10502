"""Backward body -> Python source -> a ``triton.jit`` kernel.

The source is compiled under a made-up file name registered in ``linecache``, so
``inspect``, Triton's interpreter and torch.compile can all read it back, and the
function keeps a real code object and globals (Inductor looks at both).
"""

from __future__ import annotations

import ast
import copy
import hashlib
import inspect
import linecache
import re
import textwrap
from collections import Counter
from typing import Any

import triton
import triton.language as tl

from ..core import language as tg
from ..core.ir import Program, target_of, tl_call
from ..core.operations import operation_of
from ..reverse.sweep import MARKER, BackwardBody, comment_marker
from .early_loads import issue_loads_early
from .exponentials import base_two_exponentials
from .orient import orient_tiles
from .peel import split_at_masks

HEADER = "import triton\nimport triton.language as tl\nimport tritongrad.core.language as tg\n"


def fold_temporaries(body: list[ast.stmt], foldable: set[str], reassigned: set[str] = frozenset()) -> list[ast.stmt]:
    """Write temporaries the flattening introduced back into the expressions that use them.

    ``row_times_stride = row * stride; x = tl.load(x_ptr + row_times_stride)`` reads
    again as ``x = tl.load(x_ptr + row * stride)``. Only names without adjoints, and
    only cheap pure operations (``foldable`` in operations.py), are folded; never a value read from a name assigned more
    than once (a loop-carried or merged variable), which may change between the two places.
    """
    values: dict[str, ast.expr] = {}

    class Fold(ast.NodeTransformer):
        def visit_Name(self, n: ast.Name) -> ast.expr:
            return copy.deepcopy(values[n.id]) if n.id in values and isinstance(n.ctx, ast.Load) else n

        def visit_BinOp(self, n: ast.BinOp) -> ast.expr:
            self.generic_visit(n)  # helpers' defaults leave `0 * size + ...` and `offs * 1`
            return _simplify(n)

    def fold(block: list[ast.stmt]) -> list[ast.stmt]:
        out = []
        for stmt in block:
            if isinstance(stmt, (ast.If, ast.For)):
                if isinstance(stmt, ast.If):
                    stmt.test = Fold().visit(stmt.test)
                    stmt.orelse = fold(stmt.orelse)
                else:
                    stmt.iter = Fold().visit(stmt.iter)
                stmt.body = fold(stmt.body) or [ast.Pass()]
                out.append(stmt)
                continue
            stmt = Fold().visit(stmt)
            target = (stmt.targets[0].id if isinstance(stmt, ast.Assign) and isinstance(stmt.targets[0], ast.Name)
                      else None)
            tag = getattr(stmt, "tg", None)  # (the sweep's own statements have none)
            if (target in foldable and tag is not None and operation_of(tag.op).foldable and target not in reassigned
                    and not any(isinstance(n, ast.Name) and n.id in reassigned for n in ast.walk(stmt.value))):
                values[target] = stmt.value
                continue
            out.append(stmt)
        return out

    return fold(body)


def transposed_products(body: list[ast.stmt]) -> list[ast.stmt]:
    """``y = tl.trans(x)`` of ``x = tl.dot(a, b)`` read nowhere else becomes ``y = tl.dot(b.T, a.T)`` (a
    ``.T`` of a ``tl.trans`` dropped): an adjoint ``d_k = tl.trans(tl.dot(tl.trans(q), d_s))`` is computed
    as ``tl.dot(tl.trans(d_s), q)``, as by hand, without transposing a float32 accumulator in registers."""
    everywhere = ast.Module(body=body, type_ignores=[])
    loads = Counter(n.id for n in ast.walk(everywhere) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load))
    stores = Counter(n.id for n in ast.walk(everywhere) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store))

    def rewrite(block: list[ast.stmt]) -> list[ast.stmt]:
        dropped = set()
        for i, stmt in enumerate(block):
            for child in ("body", "orelse"):
                if isinstance(getattr(stmt, child, None), list) and not isinstance(stmt, ast.FunctionDef):
                    setattr(stmt, child, rewrite(getattr(stmt, child)))
            x = _tl_call(stmt.value, "trans") if isinstance(stmt, ast.Assign) else None
            if x is None or not isinstance(x.args[0], ast.Name):
                continue
            name = x.args[0].id
            found = [j for j in range(i) if target_of(block[j]) == name]
            product = _tl_call(block[found[-1]].value, "dot") if found else None
            if (product is None or len(product.args) != 2 or loads[name] != 1 or stores[name] != 1
                    or any(k.arg not in ("input_precision", "allow_tf32", "out_dtype") for k in product.keywords)):
                continue
            between = {n.id for t in block[found[-1] + 1:i] for n in ast.walk(t)
                       if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
            if between & {n.id for n in ast.walk(product) if isinstance(n, ast.Name)}:
                continue
            a, b = product.args
            stmt.value = ast.Call(func=product.func, args=[_transposed(b), _transposed(a)], keywords=product.keywords)
            dropped.add(found[-1])
        return [stmt for j, stmt in enumerate(block) if j not in dropped]

    return rewrite(body)


def _tl_call(e: ast.expr, function: str) -> ast.Call | None:
    """``e`` if it is ``tl.<function>(...)`` (a ``tl.trans`` of one argument, no keywords), else None."""
    if tl_call(e, function) is None:
        return None
    return e if function != "trans" or (len(e.args) == 1 and not e.keywords) else None


def _transposed(e: ast.expr) -> ast.expr:
    if _tl_call(e, "trans") is not None:
        return e.args[0]
    return ast.Call(func=ast.Attribute(value=ast.Name("tl", ast.Load()), attr="trans", ctx=ast.Load()), args=[e],
                    keywords=[])


def _is_constant(node: ast.expr, value: int) -> bool:
    return isinstance(node, ast.Constant) and type(node.value) is int and node.value == value


def _simplify(n: ast.BinOp) -> ast.expr:
    """``x * 1``, ``x + 0``: identities that keep x's shape and type (``0 * x`` would drop a broadcast)."""
    if isinstance(n.op, ast.Mult):
        if _is_constant(n.left, 1):
            return n.right
        if _is_constant(n.right, 1):
            return n.left
    if isinstance(n.op, (ast.Add, ast.Sub)) and _is_constant(n.right, 0):
        return n.left
    if isinstance(n.op, ast.Add) and _is_constant(n.left, 0):
        return n.right
    return n


def function_source(program: Program, backward: BackwardBody, name: str, docstring: str, tile: bool,
                    peel: bool = True) -> str:
    """The kernel's source; ``peel``: its loops split where their masks hold in every lane (peel.py), not in a
    kernel to be differentiated in turn (derivation refuses the split's binary search, a ``while`` loop)."""
    params = [ast.arg(arg=p.arg, annotation=p.annotation) for p in program.params]
    kept = [*backward.tapes, *([backward.prologue.tape] if backward.prologue is not None else [])]
    tapes = [n for tape in kept for n in (*(param for param, _ in tape.states), tape.slots)]
    later = [n for adds in backward.later_adds for n in (adds.values, adds.offsets)]
    params += [ast.arg(arg=n) for n in (*backward.cotangent_params, *backward.shadow_params, *backward.as_left_params,
                                        *backward.extra_params, *tapes, *later)]
    constexprs = {tape.slots for tape in kept if tape.constexpr_slots}
    params = [ast.arg(arg=p.arg, annotation=ast.parse("tl.constexpr", mode="eval").body) if p.arg in constexprs else p
              for p in params]
    for constexpr in (backward.loop_stages, backward.loop_held):
        if constexpr is not None:
            params.append(ast.arg(arg=constexpr, annotation=ast.parse("tl.constexpr", mode="eval").body))
    body: list[ast.stmt] = [ast.Expr(ast.Constant(docstring))] if docstring else []
    folded = fold_temporaries(transposed_products(backward.body), backward.foldable, backward.reassigned)
    comments = dict(backward.comments)  # peel.py adds its own
    taken = {n.id for n in ast.walk(ast.Module(folded, [])) if isinstance(n, ast.Name)} | {p.arg for p in params}
    oriented = orient_tiles(folded, [p.arg for p in params], lambda text: comment_marker(comments, text))
    peeled = split_at_masks(oriented, taken, lambda text: comment_marker(comments, text)) if peel else oriented
    body += issue_loads_early(base_two_exponentials(peeled), lambda text: comment_marker(comments, text))
    if tile:
        value = backward.returns[0] if len(backward.returns) == 1 else ast.Tuple(elts=backward.returns, ctx=ast.Load())
        body.append(ast.Return(value))
    fn = ast.parse(f"@triton.jit\ndef {name}(): pass").body[0]  # a FunctionDef valid on every Python
    fn.args.args = params
    fn.body = body or [ast.Pass()]
    src = _insert_comments(ast.unparse(ast.fix_missing_locations(fn)), comments)
    return "\n".join(line.rstrip() for line in src.splitlines()) + "\n"


def _insert_comments(src: str, comments: dict[str, str]) -> str:
    """Each marker becomes its comment, after a blank line unless it opens a block."""
    def line(m: re.Match) -> str:
        previous = m.group(1).strip()  # a block's opening line, or a comment: no blank line in between
        gap = "" if previous.endswith(":") or previous.startswith("#") else f"\n{m.group(2)}"
        text = "".join(f"\n{m.group(2)}# {part}" for part in comments[m.group(3)].splitlines())
        return f"{m.group(1)}{gap}{text}"

    pattern = re.compile(rf"^(.*)\n( *)({MARKER}\d+__)$", flags=re.M)
    while pattern.search(src):  # markers in a row: one substitution per pass
        src = pattern.sub(line, src)
    return src


def compile_kernel(src: str, name: str, program: Program) -> Any:
    """``triton.jit`` of ``src``, with the forward's globals (and tl, tg) in scope."""
    return jit_source(src, name, {**program.scope, "triton": triton, "tl": tl, "tg": tg})


def self_contained(kernel: Any, floats: tuple[str, ...] = ()) -> Any:
    """A derived kernel (or an augmented forward: runtime/augment.py) whose ``tg`` helpers are globals of their own
    (``tg.widened`` -> ``tg_widened``, defined as ``def tg_widened``), ``tl`` spelled ``tl``, and the generated
    kernels it calls made so too: what torch.compile's Inductor can copy into its own module, which names a kernel's
    dependencies by the JIT functions' own names, imports Triton's language as ``tl`` and takes no other module.
    ``floats``: parameters passed Python floats, cast to float32 first: Triton types a float argument float32,
    Inductor float64, and float64 arithmetic on every element of a tile runs at a fraction of the rate (an attention
    backward's scale: 1.65x its eager time). Cached. Any other kernel (not compiled by ``jit_source``: a user's) as
    it is."""
    if not _generated(kernel):
        return kernel
    found = _contained.get((kernel, floats))
    if found is None:
        helpers: dict[str, Any] = {}
        src = _TL_NAME.sub("tl.", _TG_NAME.sub(lambda m: _helper(m.group(1), helpers), jit_src(kernel)))
        src = _cast_first(src, floats)
        scope = {**kernel.fn.__globals__, **helpers, "tl": tl}
        scope.update({n: self_contained(scope[n]) for n in kernel.fn.__code__.co_names if _generated(scope.get(n))})
        found = _contained[(kernel, floats)] = jit_source(f"@triton.jit\n{src}", kernel.fn.__name__, scope)
    return found


def _cast_first(src: str, params: tuple[str, ...]) -> str:
    """``src`` (a ``def``) opening with ``p = tl.cast(p, tl.float32)`` for each of ``params``."""
    if not params:
        return src
    first = ast.parse(src).body[0].body[0]
    lines = src.splitlines(keepends=True)
    indent = " " * first.col_offset
    casts = [f"{indent}{p} = tl.cast({p}, tl.float32)\n" for p in params]
    return "".join([*lines[:first.lineno - 1], *casts, *lines[first.lineno - 1:]])


def _generated(kernel: Any) -> bool:
    code = getattr(getattr(kernel, "fn", None), "__code__", None)
    return code is not None and code.co_filename.startswith(_FILE_PREFIX)


_FILE_PREFIX = "<tritongrad:"  # the file name jit_source compiles a kernel's source under
_TG_NAME = re.compile(r"\b(?:tritongrad_)?tg\.(\w+)")  # (an augmented forward's own name for tg, and for tl:)
_TL_NAME = re.compile(r"\btritongrad_tl\.")
_contained: dict[Any, Any] = {}


def _helper(name: str, helpers: dict[str, Any]) -> str:
    """``tg_<name>``, its definition (and those of the helpers it calls) added to ``helpers``."""
    own = f"tg_{name}"
    if own in helpers:
        return own
    found = getattr(tg, name)
    if not hasattr(found, "fn"):  # a constant (DESCRIPTOR_ATOMICS)
        helpers[own] = found
        return own
    helpers[own] = None  # (being made: a helper calling itself)
    src = re.sub(r"^def \w+", f"def {own}", jit_src(found), count=1, flags=re.M)
    src = _CALLED.sub(lambda m: _helper(m.group(1), helpers), src)
    helpers[own] = jit_source(f"@triton.jit\n{src}", own, {**found.fn.__globals__, **helpers})
    return own


_CALLED = re.compile(rf"(?<![.\w])({'|'.join(sorted({*tg.HELPERS, *tg._COMBINES}, key=len, reverse=True))})\b")


def jit_src(kernel: Any) -> str:
    """A jitted function's source from its ``def`` (a JITFunction's ``src``; read back for the interpreter's)."""
    found = getattr(kernel, "src", None)
    if found is None:
        found = textwrap.dedent(inspect.getsource(kernel.fn))
        found = found[re.search(r"^def\s+\w+\s*\(", found, re.M).start():]
    return found


def jit_source(src: str, name: str, scope: dict[str, Any]) -> Any:
    """The function ``name`` that ``src`` (decorated ``@triton.jit``) defines in a copy of ``scope``, its
    source registered with linecache (Triton reads it back)."""
    digest = hashlib.sha1(src.encode()).hexdigest()[:12]
    filename = f"{_FILE_PREFIX}{name}:{digest}>"
    linecache.cache[filename] = (len(src), None, src.splitlines(keepends=True), filename)
    scope = dict(scope)
    exec(compile(src, filename, "exec"), scope)  # runs the @triton.jit decorator
    return scope[name]
