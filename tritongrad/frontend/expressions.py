"""Flattening expressions: every operation gets a statement of its own, on names and constants.

Nested expressions are hoisted into temporaries named after what they compute
(``x_times_w``); calls are resolved to Triton operations (their canonical kinds, see
operations.py), ``@triton.jit`` helpers are inlined, and ``tl.reduce`` /
``tl.associative_scan`` whose combine functions are recognised become the operations
they compute.
"""

from __future__ import annotations

import ast
import builtins
import copy
import inspect
from dataclasses import dataclass, field, replace
from typing import Any

from ..core.ir import Op, Origin
from ..core.operations import CUSTOM, DESCRIPTOR_METHODS, OPERATIONS, Signature, operation_of
from ..core.source import Source, is_jit, triton_language_name
from .blockptr import rewrite_block_pointers

LOCAL = object()  # resolve(): the expression is a local value, not a global object

BINOPS = {
    ast.Add: "add", ast.Sub: "sub", ast.Mult: "mul", ast.Div: "truediv", ast.FloorDiv: "floordiv",
    ast.Mod: "mod", ast.Pow: "pow", ast.MatMult: "matmul", ast.BitAnd: "and_", ast.BitOr: "or_",
    ast.BitXor: "xor", ast.LShift: "lshift", ast.RShift: "rshift",
}
UNARYOPS = {ast.USub: "neg", ast.UAdd: "pos", ast.Not: "not_", ast.Invert: "invert"}
CMPOPS = {ast.Lt: "lt", ast.LtE: "le", ast.Gt: "gt", ast.GtE: "ge", ast.Eq: "eq", ast.NotEq: "ne",
          ast.Is: "is_", ast.IsNot: "is_not", ast.In: "in_", ast.NotIn: "not_in"}
# words used to name temporaries after what they compute: `x_times_w`
OP_WORDS = {"add": "plus", "sub": "minus", "mul": "times", "truediv": "over", "pow": "pow"}
# attribute reads that describe a value rather than compute from it
METADATA_ATTRS = {"dtype", "shape", "type", "element_ty", "numel", "primitive_bitwidth", "ndim"}


@dataclass
class Frame:
    """One function being flattened: the kernel itself or an inlined helper."""

    fn: Source
    env: dict[str, ast.expr]  # source name -> the atom it stands for now (its SSA name, or a constant)
    inlined: bool
    call_origin: Origin | None = None  # for helpers: the call site in the kernel
    calls: tuple[Origin, ...] = ()  # for helpers: each call site on the way from the kernel (Origin.calls)
    gone: dict[str, str] = field(default_factory=dict)  # source name -> why it has no value here any more


class ExpressionFlattener:
    """The expression half of :class:`frontend.Normalizer`."""

    def __init__(self, normalizer):
        self.normalizer = normalizer  # the Normalizer whose statements this flattens expressions for
        self.in_condition = False  # flattening a test (condition()): compile-time parts stay inline

    def atom(self, node: ast.expr, stmt: ast.stmt) -> ast.expr:
        """Flatten ``node`` and return a name, constant or metadata expression for it."""
        result = self.expr(node, stmt)
        if isinstance(result, _Deferred) and self.in_condition and self._compile_time(result.op):
            return result.node
        if isinstance(result, _Deferred):
            ssa = self.normalizer.namer.fresh(result.hint)
            self.normalizer.temporaries.add(ssa)
            self.normalizer.defined.add(ssa)
            new = ast.Assign(targets=[ast.Name(ssa, ast.Store())], value=result.node)
            self.normalizer.finish(new, result.op, stmt)
            self.normalizer.learn(ssa, result.op)
            return ast.Name(ssa, ast.Load())
        if isinstance(result, list):
            return ast.Tuple(elts=result, ctx=ast.Load())
        return result

    def condition(self, node: ast.expr, stmt: ast.stmt) -> ast.expr:
        """An ``if``'s (or a conditional expression's) test as an atom, its parts known when Triton compiles
        (constexprs, metadata, literals, and comparisons, arithmetic and ``and`` / ``or`` of them) kept inline:
        compiled Triton makes a tensor of a value assigned to a name, so a test hoisted into one
        (``gt = len(x.shape) > 1; if gt:``) would be a runtime ``if``, whose branches must give each value one
        type, where written inline it is decided when Triton compiles."""
        saved, self.in_condition = self.in_condition, True
        try:
            return self.normalizer.written_out(self.atom(node, stmt))
        finally:
            self.in_condition = saved

    def _compile_time(self, op: Op) -> bool:
        """Whether an operation's result is known when Triton compiles: its kind is (operations.py's
        ``constexpr``) and so are its operands."""
        return operation_of(op).constexpr and all(
            self.normalizer.is_constexpr(a) for a in [*op.args, *op.kwargs.values()])

    def expr(self, node: ast.expr, stmt: ast.stmt, top: bool = False) -> Any:
        """Flatten an expression: an atom, a list of atoms (tuples), or a _Deferred op."""
        if isinstance(node, ast.Constant):
            return node
        if isinstance(node, ast.Name):
            if node.id in self.normalizer.frame.env:
                return copy.deepcopy(self.normalizer.frame.env[node.id])
            if node.id in self.normalizer.frame.gone:
                raise self.normalizer.refuse(stmt, f"using `{node.id}` here: {self.normalizer.frame.gone[node.id]}",
                                  f"give `{node.id}` a value before the `if` or loop that assigns it")
            return self.global_name(node)
        if isinstance(node, (ast.Tuple, ast.List)):
            elts = [self.atom(e, stmt) for e in node.elts]
            return elts if top else type(node)(elts=elts, ctx=ast.Load())
        if isinstance(node, ast.Attribute):
            return self.attribute(node, stmt)
        if isinstance(node, ast.BinOp):
            kind = BINOPS[type(node.op)]
            a, b = self.atom(node.left, stmt), self.atom(node.right, stmt)
            hint = "_".join(x for x in (_label(a), OP_WORDS.get(kind, kind), _label(b)) if x)
            return _Deferred(ast.BinOp(left=a, op=node.op, right=b), Op(kind, [a, b]), hint)
        if isinstance(node, ast.UnaryOp):
            kind = UNARYOPS[type(node.op)]
            a = self.atom(node.operand, stmt)
            if OPERATIONS[kind].sign < 0 and isinstance(a, ast.Constant):
                return ast.Constant(-a.value)
            return _Deferred(ast.UnaryOp(op=node.op, operand=a), Op(kind, [a]), f"{kind}_{_label(a) or 'x'}")
        if isinstance(node, ast.Compare):
            if len(node.ops) != 1:
                raise self.normalizer.refuse(stmt, "a chained comparison", "split it: `(a < b) & (b < c)`")
            kind = CMPOPS[type(node.ops[0])]
            a, b = self.atom(node.left, stmt), self.atom(node.comparators[0], stmt)
            hint = "_".join(x for x in (_label(a), kind, _label(b)) if x)
            return _Deferred(ast.Compare(left=a, ops=node.ops, comparators=[b]), Op(kind, [a, b]), hint)
        if isinstance(node, ast.BoolOp):
            values = [self.atom(v, stmt) for v in node.values]
            return _Deferred(ast.BoolOp(op=node.op, values=values), Op("boolop", values), "cond")
        if isinstance(node, ast.IfExp) and not self.in_condition:  # an `if` statement, differentiated
            return self.normalizer.control.conditional(node, stmt)
        if isinstance(node, ast.IfExp):
            # a value only a test reads: kept whole (inline where Triton knows it when it compiles); its kind has no
            # rule, so a differentiated value through it is refused, never given a zero gradient
            parts = [self.condition(node.test, stmt), self.atom(node.body, stmt), self.atom(node.orelse, stmt)]
            node = ast.IfExp(test=parts[0], body=parts[1], orelse=parts[2])
            return _Deferred(node, Op("ifexp", parts), "choice")
        if isinstance(node, ast.Subscript):
            return self.subscript(node, stmt)
        if isinstance(node, ast.Call):
            return self.call(node, stmt)
        if isinstance(node, ast.JoinedStr):
            return node
        raise self.normalizer.refuse(stmt, f"the expression `{ast.unparse(node)}`",
                          "use Triton operations on names and constants")

    def global_name(self, node: ast.Name) -> ast.expr:
        """A name not bound locally: look it up where the function was defined."""
        frame = self.normalizer.frame
        if not frame.inlined:
            return ast.Name(node.id, ast.Load())
        scope = frame.fn.scope
        if node.id in scope:
            obj = scope[node.id]
            if node.id in self.normalizer.scope and self.normalizer.scope[node.id] is not obj:
                alias = self.normalizer.namer.fresh(node.id)
                self.normalizer.scope[alias] = obj
                frame.env[node.id] = name_node(alias)  # later uses in this helper use the alias too
                return name_node(alias)
            self.normalizer.scope[node.id] = obj
        return ast.Name(node.id, ast.Load())

    def resolve(self, node: ast.expr) -> Any:
        """The Python object an expression names (``tl.exp``, a helper), or LOCAL."""
        if isinstance(node, ast.Name):
            if node.id in self.normalizer.frame.env:
                return LOCAL
            scope = self.normalizer.frame.fn.scope
            if node.id in scope:
                return scope[node.id]
            return getattr(builtins, node.id, LOCAL)
        if isinstance(node, ast.Attribute):
            base = self.resolve(node.value)
            if base is LOCAL:
                return LOCAL
            return getattr(base, node.attr, LOCAL)
        return LOCAL

    def attribute(self, node: ast.Attribute, stmt: ast.stmt) -> Any:
        obj = self.resolve(node)
        if obj is not LOCAL:  # `tl.float32`, a module-level constexpr...
            self._import_globals(node)
            return rename_globals(node, self.normalizer.frame)
        if node.attr == "T":
            x = self.atom(node.value, stmt)
            return _Deferred(ast.Attribute(value=x, attr="T", ctx=ast.Load()), Op("trans", [x]), f"{_label(x)}_T")
        if node.attr in METADATA_ATTRS or _is_metadata(node.value):
            value = self.atom(node.value, stmt)
            return ast.Attribute(value=value, attr=node.attr, ctx=ast.Load())
        raise self.normalizer.refuse(stmt, f"the attribute `{ast.unparse(node)}`",
                          "only metadata (`.dtype`, `.shape`) and `.T` of a tensor are known")

    def _import_globals(self, node: ast.expr) -> None:
        root = node
        while isinstance(root, ast.Attribute):
            root = root.value
        if isinstance(root, ast.Name):
            self.global_name(root)

    def subscript(self, node: ast.Subscript, stmt: ast.stmt) -> Any:
        if _is_metadata(node.value):  # x.shape[0]
            return ast.Subscript(value=self.atom(node.value, stmt), slice=node.slice, ctx=ast.Load())
        x = self.atom(node.value, stmt)
        index = node.slice
        if isinstance(x, ast.Name) and x.id in self.normalizer.result_tuples and isinstance(index, ast.Constant) \
                and isinstance(index.value, int):  # `scan[1]` of an operation's several results (a derived kernel's)
            return _Deferred(ast.Subscript(value=x, slice=index, ctx=ast.Load()), Op("item", [x, index]),
                             f"{x.id}_{index.value}")
        parts = index.elts if isinstance(index, ast.Tuple) else [index]
        for p in parts:
            ok = (isinstance(p, ast.Constant) and p.value is None) or (
                isinstance(p, ast.Slice) and p.lower is None and p.upper is None and p.step is None)
            if not ok:
                raise self.normalizer.refuse(stmt, f"the subscript `{ast.unparse(node)}`",
                                  "only `None` and `:` are valid tensor subscripts in Triton")
        new = ast.Subscript(value=x, slice=index, ctx=ast.Load())
        return _Deferred(new, Op("subscript", [x], {"index": index}), f"{_label(x) or 'x'}_b")

    def call(self, node: ast.Call, stmt: ast.stmt) -> Any:
        if any(isinstance(a, ast.Starred) for a in node.args) or any(k.arg is None for k in node.keywords):
            raise self.normalizer.refuse(stmt, "a call with *args or **kwargs", "pass arguments explicitly")
        func = node.func
        obj = self.resolve(func)
        if obj is LOCAL:
            if isinstance(func, ast.Attribute):  # a tensor method: x.to(...), x.sum(0)
                receiver = self.atom(func.value, stmt)
                if isinstance(receiver, ast.Name) and receiver.id in self.normalizer.descriptors:
                    return self.descriptor_method(func, receiver, node, stmt)
                if func.attr in ("load", "store", "atomic_add", "gather", "scatter"):
                    raise self.normalizer.refuse(stmt, f"`{ast.unparse(func)}(...)`, a tensor descriptor's {func.attr} "
                                                 "through a descriptor made outside the kernel",
                                      "launch the kernel inside a tritongrad.op, which reads the host "
                                      "descriptors a launch passes; or pass the tensor and build its descriptor in "
                                      "the kernel with `tl.make_tensor_descriptor(x_ptr, shape, strides, "
                                      "block_shape)`")
                if _is_metadata(receiver):  # `x.dtype.is_floating()`: known when Triton compiles, kept inline (a
                    # name assigned it is a tensor to compiled Triton, which tl.static_assert refuses)
                    return ast.Call(func=ast.Attribute(value=receiver, attr=func.attr, ctx=ast.Load()),
                                    args=[self.atom(a, stmt) for a in node.args],
                                    keywords=[ast.keyword(arg=k.arg, value=self.atom(k.value, stmt))
                                              for k in node.keywords])
                return self.build_call(func.attr, ast.Attribute(value=receiver, attr=func.attr, ctx=ast.Load()),
                                       [receiver], node, stmt, method=True)
            raise self.normalizer.refuse(stmt, f"a call to the local value `{ast.unparse(func)}`",
                              "call @triton.jit helpers and Triton functions by their global name")
        if is_jit(obj) and obj.fn in CUSTOM:  # a helper with a hand-written rule: called, not inlined
            _, alias, backward = CUSTOM[obj.fn]
            if self.normalizer.scope.setdefault(alias, backward) is not backward:
                raise self.normalizer.refuse(stmt, f"the call to `{ast.unparse(func)}`: its custom rule's backward "
                                  f"`{alias}` is another object in this kernel's module",
                                  "give the backward a name the kernel's module does not use otherwise")
            self._import_globals(func)
            callee = rename_globals(func, self.normalizer.frame)
            return self.build_call("custom", callee, [], node, stmt, func_obj=obj)
        name = triton_language_name(obj, func)
        if name == "reduce":
            return self.reduce(node, stmt, obj)
        if name == "associative_scan":
            return self.scan(node, stmt, obj)
        if name in ("make_block_ptr", "advance"):  # left over by blockptr.py only when it could not run
            raise self.normalizer.refuse(stmt, f"`tl.{name}` here", "assign block pointers to names, then load, store "
                                         "and advance them")
        if name == "pow":  # libdevice's pow(x, y), apart from the `**` operator
            name = "fpow"
        if name is None and is_jit(obj):
            return self.inline(obj, node, stmt)
        if name is None and getattr(obj, "__module__", None) == "builtins":
            # float("inf"), min(BLOCK, N): compile-time values, kept inline
            args = [self.atom(a, stmt) for a in node.args]
            keywords = [ast.keyword(arg=k.arg, value=self.atom(k.value, stmt)) for k in node.keywords]
            return ast.Call(func=node.func, args=args, keywords=keywords)
        self._import_globals(func)
        callee = rename_globals(func, self.normalizer.frame)
        if name is None:
            name = "call"
        return self.build_call(name, callee, [], node, stmt, func_obj=obj)

    def descriptor_method(self, func: ast.Attribute, desc: ast.Name, node: ast.Call, stmt: ast.stmt) -> _Deferred:
        """``desc.load(offsets)``, ``desc.store(offsets, value)``, ``desc.atomic_add(offsets, value)`` of a
        descriptor made in the kernel: memory operations whose shadow goes through a descriptor too."""
        kind = DESCRIPTOR_METHODS.get(func.attr)
        if kind is None:
            raise self.normalizer.refuse(stmt, f"a tensor descriptor's `{func.attr}`",
                              "differentiable descriptor accesses are load, store and atomic_add")
        method = ast.Attribute(value=desc, attr=func.attr, ctx=ast.Load())
        return self.build_call(kind, method, [desc], node, stmt, method=True)

    def reduce(self, node: ast.Call, stmt: ast.stmt, obj: Any) -> _Deferred:
        """``tl.reduce(x, axis, combine)``: differentiated as tl.sum / tl.max / tl.min when ``combine``
        is one of those (``a + b``, ``tl.maximum(a, b)``, ``tl.minimum(a, b)``); else left without a rule."""
        self._import_globals(node.func)
        d = self.build_call("reduce", rename_globals(node.func, self.normalizer.frame), [], node, stmt, func_obj=obj)
        try:
            bound = REDUCE_SIGNATURE.bind(d.op.args, d.op.kwargs)
        except TypeError as e:
            raise self.normalizer.refuse(stmt, f"the call to `tl.reduce`: {e}",
                                         "check the arguments against Triton's") from e
        combine = bound["combine_fn"]
        kind = _combine_kind(self.resolve(combine) if isinstance(combine, ast.Name) else None)
        if kind is not None:  # op.func stays tl.reduce: with axis=None it flattens first (shapes differ)
            d.op = Op(kind, [bound["input"], bound["axis"]], {"keep_dims": bound["keep_dims"]}, obj)
        return d

    def scan(self, node: ast.Call, stmt: ast.stmt, obj: Any) -> _Deferred:
        """``tl.associative_scan``: of a pair ``(a, b)`` with the combine function of a first-order linear
        recurrence, ``(a1, b1), (a2, b2) -> (a1 * a2, b1 * a2 + b2)``, it is a ``linear_scan`` (h_t = a_t h_{t-1}
        + b_t, with the products of the a's); of one tensor combined by ``a + b``, a ``cumsum``. Any other
        combine function has no rule."""
        self._import_globals(node.func)
        d = self.build_call("associative_scan", rename_globals(node.func, self.normalizer.frame), [], node, stmt,
                            func_obj=obj)
        args, kwargs = d.op.args, d.op.kwargs
        try:  # (the axis and the rest may come by keyword)
            bound = SCAN_SIGNATURE.bind(args, kwargs)
        except TypeError as e:
            raise self.normalizer.refuse(stmt, f"the call to `tl.associative_scan`: {e}",
                                         "check the arguments against Triton's") from e
        scanned, combine = bound["input"], bound["combine_fn"]
        fn = self.resolve(combine) if isinstance(combine, ast.Name) else None
        pair = isinstance(scanned, (ast.Tuple, ast.List)) and len(scanned.elts) == 2
        if pair and _is_linear_recurrence(fn):
            d.op = Op("linear_scan", args, kwargs, obj)
        elif isinstance(scanned, ast.Name) and _combine_kind(fn) == "sum":
            reverse = {"reverse": bound["reverse"]} if len(args) > 3 or "reverse" in kwargs else {}
            d.op = Op("cumsum", [scanned, bound["axis"]], reverse, obj)
        return d

    def build_call(self, kind: str, callee: ast.expr, lead: list[ast.expr], node: ast.Call, stmt: ast.stmt,
                   func_obj: Any = None, method: bool = False) -> _Deferred:
        args = lead + [self.atom(a, stmt) for a in node.args]
        kwargs = {k.arg: self.atom(k.value, stmt) for k in node.keywords}
        call_args = args[1:] if method else args
        new = ast.Call(func=callee, args=call_args, keywords=[ast.keyword(arg=k, value=v) for k, v in kwargs.items()])
        first = _label(args[0]) if args else ""
        hint = kind if kind in ("load", "call", "custom") or not first else f"{kind}_{first}"
        if kind in OPERATIONS and OPERATIONS[kind].memory == "load":  # a descriptor's load too
            hint = "load"
        if kind == "custom":
            hint = getattr(func_obj, "__name__", "custom")
        return _Deferred(new, Op(kind, args, kwargs, func_obj), hint)

    def inline(self, helper: Any, node: ast.Call, stmt: ast.stmt) -> Any:
        """Inline a call to a @triton.jit helper; returns its result atom(s)."""
        if self.normalizer.inline_depth > 32:
            raise self.normalizer.refuse(stmt, "recursion through @triton.jit helpers",
                              "helpers are inlined, so they cannot recurse")
        fn = Source.of(helper)
        fdef = rewrite_block_pointers(fn.tree, fn.scope, fn.origin)
        sig_params = [a.arg for a in fdef.args.args]
        # a helper called in a test: its arguments and body flattened as anywhere, its result kept as a test's
        in_condition, self.in_condition = self.in_condition, False
        args = [self.atom(a, stmt) for a in node.args]
        kwargs = {k.arg: self.atom(k.value, stmt) for k in node.keywords}
        try:
            bound = inspect.signature(helper.fn).bind(*args, **kwargs)
        except TypeError as e:
            raise self.normalizer.refuse(stmt, f"the call to `{fn.name}`: {e}", "match the helper's signature") from e
        bound.apply_defaults()
        call_origin = self.normalizer.frame.call_origin or self.normalizer.origin(stmt)
        site = self.normalizer.origin(stmt)
        frame = Frame(fn, {}, inlined=True, call_origin=call_origin, calls=(*site.calls, replace(site, calls=())))
        assigned = {t.id for n in ast.walk(fdef) for t in ast.walk(n)
                    if isinstance(t, ast.Name) and isinstance(t.ctx, ast.Store)}
        self.normalizer.frames.append(frame)
        self.normalizer.inline_depth += 1
        try:
            for p in sig_params:
                v = bound.arguments[p]
                v = v if isinstance(v, ast.AST) else ast.Constant(v)
                if p in assigned:  # the helper rebinds it: start from a copy
                    ssa = self.normalizer.new_version(p)
                    self.normalizer.finish(ast.Assign(targets=[name_node(ssa, ast.Store())], value=v), Op("copy", [v]),
                                           fdef)
                else:  # substitute the argument itself
                    frame.env[p] = v
            body = list(fdef.body)
            while body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                body.pop(0)
            body, ret = self.normalizer.control.lift_returns(body, True)
            self.normalizer.block(body)
            if ret is None or ret.value is None:
                return ast.Constant(None)
            value = ret.value
            if isinstance(value, ast.Tuple):
                return [self.atom(e, ret) for e in value.elts]
            self.in_condition = in_condition
            return self.atom(value, ret)
        finally:
            self.normalizer.inline_depth -= 1
            self.normalizer.frames.pop()
            self.in_condition = in_condition


REDUCE_SIGNATURE = Signature.parse("input, axis, combine_fn, keep_dims=False")
SCAN_SIGNATURE = Signature.parse("input, axis, combine_fn, reverse=False")


@dataclass
class _Deferred:
    """An operation not yet assigned: the caller decides its name."""

    node: ast.expr
    op: Op
    hint: str


def name_node(id: str, ctx: ast.expr_context | None = None) -> ast.Name:
    return ast.Name(id, ctx or ast.Load())


def _label(node: ast.expr) -> str:
    if isinstance(node, ast.Name) and len(node.id) <= 12:
        return node.id
    if isinstance(node, ast.Constant) and isinstance(node.value, int) and 0 <= node.value < 100:
        return str(node.value)
    return ""


def _is_metadata(node: ast.expr) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr in METADATA_ATTRS) or (
        isinstance(node, ast.Subscript) and _is_metadata(node.value))


def rename_globals(node: ast.expr, frame: Frame) -> ast.expr:
    """Copy of ``node`` with local names mapped to their SSA names, globals to their aliases."""

    class Rename(ast.NodeTransformer):
        def visit_Name(self, n: ast.Name) -> ast.expr:
            return copy.deepcopy(frame.env[n.id]) if n.id in frame.env else n

    return Rename().visit(ast.parse(ast.unparse(node), mode="eval").body)


def _single_return(fn: Any, arity: int) -> tuple[Source, list[str], ast.expr] | None:
    """A @triton.jit combine function of ``arity`` parameters whose body is one ``return``:
    (the parsed function, its parameter names, the returned expression), else None."""
    if not is_jit(fn):
        return None
    helper = Source.of(fn)
    params = [a.arg for a in helper.tree.args.args]
    body = [s for s in helper.tree.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
    if len(params) != arity or len(body) != 1 or not isinstance(body[0], ast.Return):
        return None
    return helper, params, body[0].value


def _combine_kind(fn: Any) -> str | None:
    """``"sum"``, ``"max"`` or ``"min"`` when a combine function's body is ``return a + b`` or
    ``return tl.maximum(a, b)`` / ``tl.minimum(a, b)`` (either order), else None."""
    parsed = _single_return(fn, 2)
    if parsed is None:
        return None
    helper, params, value = parsed
    operands = None
    if isinstance(value, ast.BinOp) and isinstance(value.op, ast.Add):
        kind, operands = "sum", [value.left, value.right]
    elif isinstance(value, ast.Call) and not value.keywords:
        target = helper.scope.get(value.func.id) if isinstance(value.func, ast.Name) else None
        if isinstance(value.func, ast.Attribute):
            base = value.func.value
            module = helper.scope.get(base.id) if isinstance(base, ast.Name) else None
            target = getattr(module, value.func.attr, None)
        kind = {"maximum": "max", "minimum": "min"}.get(triton_language_name(target, value.func) or "")
        operands = value.args
    if operands is None or kind is None:
        return None
    names = sorted(o.id for o in operands if isinstance(o, ast.Name))
    return kind if names == sorted(params) else None


def _is_linear_recurrence(fn: Any) -> bool:
    """Whether a combine function is ``(a1, b1, a2, b2) -> (a1 * a2, b1 * a2 + b2)`` (either order of
    each product and of the sum), the composition of two steps of ``h = a * h + b``."""
    parsed = _single_return(fn, 4)
    if parsed is None:
        return False
    _, params, value = parsed
    if not isinstance(value, ast.Tuple) or len(value.elts) != 2:
        return False
    a1, b1, a2, b2 = params

    def product(e: ast.expr, x: str, y: str) -> bool:
        return (isinstance(e, ast.BinOp) and isinstance(e.op, ast.Mult) and all(isinstance(o, ast.Name)
                for o in (e.left, e.right)) and sorted((e.left.id, e.right.id)) == sorted((x, y)))

    first, second = value.elts
    if not product(first, a1, a2) or not (isinstance(second, ast.BinOp) and isinstance(second.op, ast.Add)):
        return False
    terms = [second.left, second.right]
    return any(product(t, b1, a2) and isinstance(o, ast.Name) and o.id == b2 for t, o in (terms, terms[::-1]))

