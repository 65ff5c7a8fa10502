"""Backward body -> Python source -> a ``triton.jit`` kernel.

The source is compiled under a made-up file name registered in ``linecache``, so
``inspect``, Triton's interpreter and torch.compile can all read it back, and the
function keeps a real code object and globals (Inductor looks at both).
"""

from __future__ import annotations

import ast
import copy
import hashlib
import linecache
import re
from typing import Any

import triton
import triton.language as tl

from . import language as tg
from .ir import Program
from .operations import operation_of
from .reverse import BackwardBody

HEADER = "import triton\nimport triton.language as tl\nimport tritongrad.language as tg\n"


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


def function_source(program: Program, backward: BackwardBody, name: str, docstring: str, tile: bool) -> str:
    params = [ast.arg(arg=p.arg, annotation=p.annotation) for p in program.params]
    tapes = [n for tape in backward.tapes for n in (*(param for param, _ in tape.states), tape.slots)]
    later = [n for adds in backward.later_adds for n in (adds.values, adds.offsets)]
    params += [ast.arg(arg=n) for n in (*backward.cotangent_params, *backward.shadow_params, *backward.extra_params,
                                        *tapes, *later)]
    body: list[ast.stmt] = [ast.Expr(ast.Constant(docstring))] if docstring else []
    body += fold_temporaries(backward.body, backward.foldable, backward.reassigned)
    if tile:
        value = backward.returns[0] if len(backward.returns) == 1 else ast.Tuple(elts=backward.returns, ctx=ast.Load())
        body.append(ast.Return(value))
    fn = ast.parse(f"@triton.jit\ndef {name}(): pass").body[0]  # a FunctionDef valid on every Python
    fn.args.args = params
    fn.body = body or [ast.Pass()]
    src = _insert_comments(ast.unparse(ast.fix_missing_locations(fn)), backward.comments)
    return "\n".join(line.rstrip() for line in src.splitlines()) + "\n"


def _insert_comments(src: str, comments: dict[str, str]) -> str:
    """Each marker becomes its comment, after a blank line unless it opens a block."""
    def line(m: re.Match) -> str:
        gap = "" if m.group(1).rstrip().endswith(":") else f"\n{m.group(2)}"
        text = "".join(f"\n{m.group(2)}# {part}" for part in comments[m.group(3)].splitlines())
        return f"{m.group(1)}{gap}{text}"

    pattern = re.compile(r"^(.*)\n( *)(__tg_comment_\d+__)$", flags=re.M)
    while pattern.search(src):  # markers in a row: one substitution per pass
        src = pattern.sub(line, src)
    return src


def compile_kernel(src: str, name: str, program: Program) -> Any:
    """``triton.jit`` of ``src``, with the forward's globals (and tl, tg) in scope."""
    return jit_source(src, name, {**program.scope, "triton": triton, "tl": tl, "tg": tg})


def jit_source(src: str, name: str, scope: dict[str, Any]) -> Any:
    """The function ``name`` that ``src`` (decorated ``@triton.jit``) defines in a copy of ``scope``, its
    source registered with linecache (Triton reads it back)."""
    digest = hashlib.sha1(src.encode()).hexdigest()[:12]
    filename = f"<tritongrad:{name}:{digest}>"
    linecache.cache[filename] = (len(src), None, src.splitlines(keepends=True), filename)
    scope = dict(scope)
    exec(compile(src, filename, "exec"), scope)  # runs the @triton.jit decorator
    return scope[name]
