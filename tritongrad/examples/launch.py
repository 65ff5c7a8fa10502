"""``Launch``: one forward kernel launch, described before it runs.

Each example's ``*_launch`` function allocates the output and returns a ``Launch``;
its host launcher just runs it. Keeping the grid and arguments around lets the tests
and ``tritongrad demo`` poison the output first, and run the derived backward of the
very same launch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class Launch:
    """``kernel[grid](*args, **kwargs)``, which fills ``out``, passed as the parameter ``output``."""

    kernel: Any
    grid: tuple[int, ...]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    output: str
    out: torch.Tensor

    def __call__(self) -> torch.Tensor:
        self.kernel[self.grid](*self.args, **self.kwargs)
        return self.out
