"""A memo whose size is bounded: the caches of launches, layouts and call patterns the runtime keeps (a long-running
program may call with ever new shapes). Full, it forgets everything before taking a new key: the entries are cheap
to make again, and a program's working set is far smaller than the bound."""

from __future__ import annotations

from typing import Any


class Bounded(dict):
    """A dict holding at most ``limit`` keys."""

    def __init__(self, limit: int = 4096):
        super().__init__()
        self.limit = limit

    def __setitem__(self, key: Any, value: Any) -> None:
        if key not in self and len(self) >= self.limit:
            self.clear()
        super().__setitem__(key, value)

    def add(self, key: Any) -> None:
        """Remember ``key`` (a set's add: ``key in memo`` afterwards)."""
        self[key] = True
