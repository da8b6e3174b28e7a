"""``atomtrain export model.ckpt -o model.pt``."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..errors import AtomtrainError
from ..io import check_writable_directory
from ..models.export import export
from ..training.checkpoint import load_checkpoint, model_from_checkpoint


def check_output_path(path: Path) -> None:
    """Fail before any work when ``path`` cannot be written."""
    if not path.parent.resolve().is_dir():
        raise AtomtrainError(
            f"{path}: directory {path.parent} does not exist; create it or choose another path"
        )
    if path.is_dir():
        raise AtomtrainError(f"{path} is a directory; give a file name")
    check_writable_directory(
        path.parent.resolve(), f"give {path.name} a path in a directory you can write to"
    )


def run(arguments: argparse.Namespace) -> int:
    check_output_path(arguments.output)
    model = model_from_checkpoint(load_checkpoint(arguments.checkpoint))
    export(model, arguments.output)
    print(f"exported {arguments.checkpoint} to {arguments.output}")
    return 0
