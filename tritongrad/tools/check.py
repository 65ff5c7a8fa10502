"""``tritongrad check``: an operator's forward and gradients against its plain-PyTorch reference.

    tritongrad check rmsnorm softmax [--dtype float64 ...] [--sizes 7x45 ...]
    tritongrad check path/to/file.py:my_op            # the file also defines reference, make_inputs

For each size: fresh random inputs (``make_inputs``), the op's outputs against the reference's
computed in float64 from the same inputs, then the gradients of every floating-point input for a
random gradient of every output, each error the largest absolute difference over the largest
magnitude expected. On a CPU the kernels run in Triton's interpreter, in float64 where the example
takes it; on a GPU, in bfloat16 and float32.

What fails in the op is a failing row (its file and line where it raised in the op's file; a kernel that
cannot be differentiated, its full refusal after the table); what fails in ``make_inputs`` or
``reference`` is a mistake in what was asked (subjects.UsageError: exit status 2).
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..core.errors import NotDifferentiableError
from .sizes import format_size
from .subjects import Subject, UsageError, load_subject, one_line, raised_at

# largest error relative to the expected tensor's largest magnitude (float32 on a GPU: tl.dot is tf32)
TOLERANCE = {torch.float64: 1e-9, torch.float32: 5e-3, torch.bfloat16: 5e-2, torch.float16: 1e-2}

__all__ = ["Row", "Subject", "check", "check_size", "default_dtypes", "load_subject", "relative_errors", "table"]


@dataclass(frozen=True)
class Row:
    """One output or gradient at one size: its errors, or what went wrong."""

    subject: str
    size: object
    dtype: torch.dtype
    tensor: str  # "out", "out[1]", "d_x"...
    abs_error: float = float("nan")
    rel_error: float = float("nan")
    error: str = ""  # an exception instead of numbers
    detail: str = ""  # all it said, where its first line is not enough (a refusal's source line and hint)

    @property
    def ok(self) -> bool:
        return not self.error and self.rel_error <= TOLERANCE[self.dtype]


def flatten(out) -> list:
    """An op's or a reference's result as a list of outputs (one output is returned bare)."""
    return list(out) if isinstance(out, (tuple, list)) else [out]


def relative_errors(got: torch.Tensor | None, want: torch.Tensor | None) -> tuple[float, float]:
    """(max |got - want|, that over max |want|); inf where a tensor is missing, misshapen or not finite."""
    if got is None and want is None:
        return 0.0, 0.0
    if got is None or want is None or got.shape != want.shape or not torch.isfinite(got).all():
        return float("inf"), float("inf")
    diff = (got.double() - want.double()).abs().max().item() if got.numel() else 0.0
    scale = want.double().abs().max().item() if want.numel() else 0.0
    return diff, diff / max(scale, 1e-30)


def _shape(t) -> tuple | str:
    return tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__


def check_size(subject: Subject, size, device: str, dtype: torch.dtype, seed: int = 0) -> list[Row]:
    """The op against its reference at one size (the reference in float64 from the same inputs)."""
    torch.manual_seed(seed)
    inputs = _users(subject, "make_inputs", size, size, device=device, dtype=dtype)
    names = list(inspect.signature(subject.reference).parameters)

    def leaves(wide: bool) -> list:
        return [t.detach().to(torch.float64 if wide else t.dtype).requires_grad_()
                if isinstance(t, torch.Tensor) and t.is_floating_point() else t for t in inputs]

    ours, theirs = leaves(wide=False), leaves(wide=True)
    want = flatten(_users(subject, "reference", size, *theirs))
    got = flatten(subject.op(*ours))
    if len(got) != len(want):
        return [Row(subject.name, size, dtype, "out", error=f"{len(got)} outputs, the reference has {len(want)}")]
    label = (lambda i: "out") if len(got) == 1 else (lambda i: f"out[{i}]")
    rows = [Row(subject.name, size, dtype, label(i), *relative_errors(g, w))
            for i, (g, w) in enumerate(zip(got, want, strict=True))]
    shapes = [(i, _shape(g), _shape(w)) for i, (g, w) in enumerate(zip(got, want, strict=True))]
    if any(g != w for _, g, w in shapes):  # (no gradient to compare either)
        return [Row(subject.name, size, dtype, label(i), error=f"shape {g}, the reference's {w}")
                for i, g, w in shapes if g != w]

    differentiable = [i for i, w in enumerate(want) if isinstance(w, torch.Tensor) and w.requires_grad]
    torch.manual_seed(seed + 1)
    upstream = [torch.randn_like(want[i]) for i in differentiable]
    wrt = [i for i, t in enumerate(theirs) if isinstance(t, torch.Tensor) and t.requires_grad]
    if not differentiable or not wrt:
        return rows
    expected = torch.autograd.grad([want[i] for i in differentiable], [theirs[i] for i in wrt], upstream,
                                   allow_unused=True)
    upstream_ours = [g.to(got[i].dtype) for g, i in zip(upstream, differentiable, strict=True)]
    derived = torch.autograd.grad([got[i] for i in differentiable], [ours[i] for i in wrt], upstream_ours,
                                  allow_unused=True)
    for i, d, e in zip(wrt, derived, expected, strict=True):
        name = names[i] if i < len(names) else str(i)
        rows.append(Row(subject.name, size, dtype, f"d_{name}", *relative_errors(d, e)))
    return rows


def _users(subject: Subject, what: str, size, *args, **kwargs):
    """``subject.<what>(*args, **kwargs)``; its failure is a mistake in what was asked, not a failed check."""
    try:
        return getattr(subject, what)(*args, **kwargs)
    except Exception as e:
        at = raised_at(e, subject.file or None) or raised_at(e)
        raise UsageError(f"{subject.name}: {what} failed at size {format_size(size)}"
                         f"{f' ({at})' if at else ''}: {one_line(e)}") from None


def check(subject: Subject, device: str, dtypes: Sequence[torch.dtype], sizes: Sequence | None = None) -> list[Row]:
    """Every size in every dtype the subject takes; an exception in the op becomes a failing row (one in
    ``make_inputs`` or ``reference`` raises UsageError)."""
    rows = []
    for dtype in dtypes:
        if dtype not in subject.dtypes:
            continue
        for size in sizes or subject.sizes:
            try:
                rows += check_size(subject, size, device, dtype)
            except UsageError:
                raise
            except NotDifferentiableError as e:  # the refusal whole: its source line and hint
                detail = "\n".join([str(e), *getattr(e, "__notes__", ())])
                rows.append(Row(subject.name, size, dtype, "-", error=one_line(e)[:200], detail=detail))
            except Exception as e:  # report it with the rest, fail at the end
                at = raised_at(e, subject.file) if subject.file else ""
                rows.append(Row(subject.name, size, dtype, "-", error=(one_line(e) + (f" ({at})" if at else ""))[:200]))
    return rows


def default_dtypes(device: str) -> tuple[torch.dtype, ...]:
    return (torch.float64,) if device == "cpu" else (torch.bfloat16, torch.float32)


def table(rows: list[Row], title: str = "Forward and gradients against the PyTorch reference"):
    from rich.table import Table
    from rich.text import Text  # (an error's brackets are not markup)

    t = Table(title=title)
    for column in ("op", "size", "dtype", "tensor", "max abs error", "max rel error", "tolerance", "result"):
        t.add_column(column, overflow="fold")
    for r in rows:
        numbers = [f"{r.abs_error:.1e}", f"{r.rel_error:.1e}"] if not r.error else [Text(r.error), "-"]
        t.add_row(r.subject, format_size(r.size), str(r.dtype).removeprefix("torch."), r.tensor, *numbers,
                  f"{TOLERANCE[r.dtype]:.0e}", "[green]ok" if r.ok else "[red]FAIL")
    return t
