"""Mistakes `tritongrad check` names as mistakes: an input maker without device and dtype."""

import torch
from my_ops import my_softplus as op  # noqa: F401


def reference(x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.softplus(x)


def make_inputs(size):
    return (torch.randn(size),)
