"""An operation's adjoints: its rule from the table of operations (core/operations.py), per differentiated
argument, with the contribution summed back to the argument's shape where it was broadcast, and kept at zero in
lanes a mask left out where the rule would read an infinite value there; an operation with several results reads
each result's adjoint (zeros for one that has none)."""

from __future__ import annotations

import ast
import functools

from ..analysis.flow import INFINITE, MASKED, padding_at_unbounded
from ..core.ir import arguments, construct_origin, name_node, op_of, reads, refuse
from ..core.operations import instantiate, operation_of


class OperationAdjoints:
    """Operations' adjoints (loads and stores aside: memory.py), written into a :class:`sweep.BackwardBuilder`'s
    sweep."""

    def __init__(self, builder):
        self.builder = builder  # the sweep this writes adjoints into (sweep.BackwardBuilder)
    def reverse(self, stmt: ast.stmt, t: str) -> None:
        """The adjoint of ``t = <operation>``: its rule's contribution to each active argument."""
        op = op_of(stmt)
        rule = operation_of(op)
        bound = arguments(stmt)
        env = {**bound, "g": name_node(self.builder.g_of(stmt)), "out": name_node(t)}
        for param, arg in bound.items():
            if param not in rule.adjoints or not self.builder.analysis.is_active(arg):
                continue
            template = rule.adjoints[param]
            if callable(template):
                try:
                    template = template(bound)
                except ValueError as e:
                    raise refuse(construct_origin(stmt), f"`{op.kind}` with arguments that are not literal constants",
                                 "pass dimensions as literal integers") from e
            contribution = instantiate(template, env)
            if self.reads_infinite_padding(stmt, contribution):  # 0 * inf in a lane a mask left out: 0
                contribution = instantiate("tl.where(g == 0.0, 0.0, c)", {"g": env["g"], "c": contribution})
            sig = rule.signature  # a one-operand elementwise operation keeps its operand's shape
            unary = len(sig.positional) == 1 and not sig.keyword and sig.vararg is None
            if rule.elementwise and not unary and not self.builder.same_shape(arg.id, t):
                contribution = instantiate("tg.unbroadcast(c, x)", {"c": contribution, "x": arg})
            self.builder.accumulate(arg.id, contribution)

    def reads_infinite_padding(self, stmt: ast.stmt, contribution: ast.expr) -> bool:
        """Whether an elementwise adjoint reads a value that may be infinite in lanes a load's mask left
        out, or divides by a masked-off value (log's ``g / x``), where its ``g`` is zero."""
        rule, padding = operation_of(op_of(stmt)), self.builder.analysis.padding
        if not (rule.elementwise or rule.lanes == "same"):
            return False
        return (any(INFINITE in padding.get(n, ()) for n in reads(contribution))
                or MASKED in padding_at_unbounded(stmt, padding))

    def reverse_multi(self, stmt: ast.stmt, t: str) -> None:
        """An operation with several results: its rule reads each result's adjoint as ``g0``, ``g1``...
        (zeros for a result that has none); a tuple argument gets a tuple of adjoints."""
        op = op_of(stmt)
        rule = operation_of(op)
        bound = arguments(stmt)
        items = self.builder.items.get(t, {})  # (an index read twice, `scan[0]` in a derived kernel: its adjoints add)
        if not any(n in self.builder.adjoint for names in items.values() for n in names):
            return
        self.builder.comment_for(stmt)
        env = {**bound, "out": name_node(t)}
        for i in range(rule.results):
            found = [name_node(self.builder.adjoint[n]) for n in items.get(i, ()) if n in self.builder.adjoint]
            env[f"g{i}"] = (functools.reduce(lambda x, y: ast.BinOp(x, ast.Add(), y), found) if found
                            else instantiate(f"tl.zeros_like(out[{i}])", {"out": name_node(t)}))
        for param, arg in bound.items():
            elements = arg.elts if isinstance(arg, (ast.Tuple, ast.List)) else [arg]
            if param not in rule.adjoints or not any(self.builder.analysis.is_active(e) for e in elements):
                continue
            template = rule.adjoints[param]
            contribution = instantiate(template(bound) if callable(template) else template, env)
            if elements[0] is arg:
                self.builder.accumulate(arg.id, contribution)
                continue
            d = self.builder.namer.fresh(f"d_{t}")
            self.builder.emit(ast.Assign(targets=[ast.Name(d, ast.Store())], value=contribution))
            for i, e in enumerate(elements):
                if self.builder.analysis.is_active(e):
                    self.builder.accumulate(e.id, instantiate(f"d[{i}]", {"d": name_node(d)}))
