"""The errors tritongrad raises of its own, under one base class (``tritongrad.TritongradError``): a kernel that
cannot be differentiated, and an op used in a way its backward cannot honour."""

from __future__ import annotations


class TritongradError(Exception):
    """Every error of tritongrad's own (``except tritongrad.TritongradError`` catches them all)."""


class NotDifferentiableError(TritongradError):
    """A kernel uses a construct tritongrad cannot differentiate.

    Carries where (``file``, ``line``), what (``construct``) and what to do instead
    (``hint``), so the message points at the user's own source line.
    """

    def __init__(self, construct: str, *, file: str = "<unknown>", line: int = 0, hint: str = "",
                 source_line: str = ""):
        self.construct = construct
        self.file = file
        self.line = line
        self.hint = hint
        self.source_line = source_line.strip()
        message = f"{file}:{line}: cannot differentiate {construct}"
        if self.source_line:
            message += f"\n    {self.source_line}"
        if hint:
            message += f"\n  hint: {hint}"
        super().__init__(message)


class OpError(TritongradError, RuntimeError):
    """A tritongrad.op was used (or defined) in a way its backward cannot honour. A RuntimeError too, as PyTorch's
    own refusals of an autograd node are."""


def noted(error: Exception, note: str) -> Exception:
    """``error`` with ``note`` added once (PEP 678), for re-raising where the context is known."""
    if note not in getattr(error, "__notes__", ()):
        error.add_note(note)
    return error
