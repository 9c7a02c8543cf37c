"""Values worked out once per frozen object: a model's columns, a cluster's, a bands object's
tables, an allocator model's coefficients. Every query reads them, and the objects they come from
(pydantic models with dict fields, so not hashable) do not change once built."""

from __future__ import annotations

from typing import Any, Callable


class IdentityCache:
    """``build()`` kept per (object, key). Keyed by the object's id; the entry holds the object, so
    the id is not reused while the entry lives, and an entry whose object is not the one asked
    about is built again. Bounded: cleared when ``size`` entries are held (objects made per call
    in a loop must not pile up)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._entries: dict[tuple[int, Any], tuple[object, Any]] = {}

    def get(self, obj: object, key: Any, build: Callable[[], Any]) -> Any:
        entry = self._entries.get((id(obj), key))
        if entry is None or entry[0] is not obj:
            if len(self._entries) >= self.size:
                self._entries.clear()
            entry = self._entries[(id(obj), key)] = (obj, build())
        return entry[1]

    def __len__(self) -> int:
        return len(self._entries)
