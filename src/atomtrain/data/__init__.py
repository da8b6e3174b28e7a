"""Reading structures, neighbor lists, batching, splitting and sampling.

The names below are imported from their modules when first asked for, so that a module
of this package that does not need torch (a reader run in a child process: ahead.py)
is imported without it."""

from __future__ import annotations

import importlib
from typing import Any

_MODULES = {
    "Batch": ".batch",
    "FrameSet": ".frames",
    "Frames": ".columns",
    "Structure": ".system",
    "TargetKeys": ".conventions",
    "Units": ".conventions",
    "collate": ".frames",
    "read_structures": ".reading",
}

__all__ = list(_MODULES)


def __getattr__(name: str) -> Any:
    if name not in _MODULES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_MODULES[name], __name__), name)
