"""A read-only property of a Python face that reads one attribute off the C++ object it wraps
(``shardwise._C``): the faces (Cluster, Simulation) forward many such figures unchanged, and
each was a four-line property of its own."""
from __future__ import annotations

from typing import Any, Callable


def core_property(name: str, doc: str | None = None, *, holder: str = "_core",
                  convert: Callable[[Any], Any] | None = None) -> property:
    """``self.<holder>.<name>``, passed through ``convert`` (``list``: a fresh Python list of a
    bound vector) when given."""

    def read(self):
        value = getattr(getattr(self, holder), name)
        return value if convert is None else convert(value)

    read.__name__ = name
    return property(read, doc=doc)
