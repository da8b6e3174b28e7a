"""Everything that talks to torch.distributed lives here; the rest of atomtrain calls
these helpers, which are no-ops in a single process (one code path).

The context (and torch with it) is imported when first named, so that
``atomtrain.distributed.env`` tells a command's rank before torch is imported."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .env import LaunchInfo, detect_launch

if TYPE_CHECKING:
    from .context import Context, single_process

__all__ = ["Context", "LaunchInfo", "detect_launch", "single_process"]


def __getattr__(name: str):
    if name in ("Context", "single_process"):
        from . import context

        return getattr(context, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
