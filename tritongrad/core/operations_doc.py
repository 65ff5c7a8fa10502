"""docs/operations.md's operation table, generated from core/operations.py's table so that it cannot drift."""

from .operations import OPERATIONS


def markdown_table() -> str:
    """The supported operations as a markdown table (README.md's, generated from this table so that it cannot
    drift: ``python -m tritongrad.core.operations_doc`` prints it)."""
    spelled = {"copy": "`a = b`", "add": "`a + b`", "sub": "`a - b`", "mul": "`a * b`", "truediv": "`a / b`",
               "neg": "`-a`", "pos": "`+a`", "pow": "`a ** b`", "subscript": "`x[:, None]`",
               "trans": "`tl.trans`, `.T`", "to": "`.to(dtype)`", "cast": "`tl.cast`",
               "item": "`a, b = ...` (an item of several results)", "fpow": "libdevice `pow`",
               "linear_scan": "`tl.associative_scan` of a first-order linear recurrence"}
    rows = ["| operation | adjoint of each differentiated argument (`g`: the result's adjoint, `out`: the result) |",
            "| --- | --- |"]
    for kind, op in OPERATIONS.items():
        if not op.has_rule:
            continue
        name = spelled.get(kind, f"`tl.{kind}`")
        adjoints = "; ".join(f"`{p}`: " + (f"`{t}`" if isinstance(t, str) else "(depends on the literal arguments)")
                             for p, t in op.adjoints.items())
        rows.append(f"| {name} | {adjoints} |")
    no_gradient = ", ".join(f"`{k}`" for k, o in OPERATIONS.items() if o.no_gradient)
    rows.append(f"| no gradient | {no_gradient} |")
    memory = ", ".join(f"`{k}`" for k, o in OPERATIONS.items() if o.memory is not None)
    rows.append(f"| memory (writes/strategies.py, reverse/memory.py) | {memory} |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    print(markdown_table(), end="")
