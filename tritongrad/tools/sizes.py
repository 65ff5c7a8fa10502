"""An example's size as the command line writes it (``4096``, ``16384x4096``), shared by ``check`` and ``bench``:
sizes are integers or tuples of them (``make_inputs(size, ...)``), their CSV rows and tables print them back."""

from __future__ import annotations

import argparse


def format_size(size) -> str:
    if isinstance(size, (tuple, list)):
        return "x".join(str(s) for s in size)
    return str(size)


def parse_size(text: str):
    """'4096' -> 4096; '16384x4096' -> (16384, 4096)."""
    parts = text.lower().split("x")
    try:
        numbers = tuple(int(p) for p in parts)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a size is N or AxB (integers), not {text!r}") from None
    if any(n < 0 for n in numbers):
        raise argparse.ArgumentTypeError(f"a size is N or AxB (integers, none negative), not {text!r}")
    return numbers[0] if len(numbers) == 1 else numbers
