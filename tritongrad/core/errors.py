"""The one error a user sees when a kernel cannot be differentiated."""

from __future__ import annotations


class NotDifferentiableError(Exception):
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


class OpError(RuntimeError):
    """A tritongrad.op was used in a way its backward cannot honour."""


def noted(error: Exception, note: str) -> Exception:
    """``error`` with ``note`` added once (PEP 678), for re-raising where the context is known."""
    if note not in getattr(error, "__notes__", ()):
        error.add_note(note)
    return error
