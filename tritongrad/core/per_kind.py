"""Registries of one analysis's function per operation kind, where the analysis needs code per kind rather than a
fact of the table (core/operations.py): how a stabilizer's shift moves through an operation, how lane coordinates
do. Each analysis registers its functions (``@FORMS.register("add", negate=False)``) and names the kinds it knows
nothing of (``unknown``), where it takes its safe default; tests/test_architecture.py checks that every kind of the
table is one or the other, so a new operation is considered by every analysis."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import Any, ClassVar


class PerKind:
    """An analysis's function per operation kind; ``job``: what the functions compute, for messages."""

    every: ClassVar[list[PerKind]] = []

    def __init__(self, job: str, unknown: Iterable[str] | str = ()):
        self.job = job
        self.rules: dict[str, Callable] = {}
        self.unknown = frozenset(unknown.split() if isinstance(unknown, str) else unknown)
        PerKind.every.append(self)

    def register(self, kinds: str, **bound: Any) -> Callable[[Callable], Callable]:
        """A decorator registering its function for each of ``kinds`` (space-separated), with ``bound`` put in as
        keyword arguments (``sub``: ``negate=True``)."""
        def add(fn: Callable) -> Callable:
            for kind in kinds.split():
                assert kind not in self.rules and kind not in self.unknown, (self.job, kind)
                self.rules[kind] = functools.partial(fn, **bound) if bound else fn
            return fn

        return add

    def get(self, kind: str, default: Any = None) -> Any:
        return self.rules.get(kind, default)

    def __contains__(self, kind: str) -> bool:
        return kind in self.rules
