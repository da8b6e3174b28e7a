"""Atomic file writes: a reader never sees a half-written file replacing a good one."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path


def atomic_write(path: str | Path, write: Callable[[Path], None]) -> None:
    """Call ``write`` on a temporary file in the same directory, then rename it to
    ``path``. A crash leaves the previous file (if any) untouched."""
    path = Path(path)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(handle)
    try:
        write(Path(temporary))
        os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)
