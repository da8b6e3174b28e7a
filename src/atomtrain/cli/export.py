"""``atomtrain export model.ckpt -o model.pt``."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..errors import AtomtrainError
from ..io import check_writable_directory
from ..models.export import export
from ..training.checkpoint import load_checkpoint, model_from_checkpoint


def add_parser(commands) -> None:
    parser = commands.add_parser(
        "export",
        help="export a checkpoint to a metatomic model file for MD engines",
        description="Export the best model of a checkpoint as a metatomic model (model.pt, "
        "with the torch extensions it needs in extensions/ beside it), for ASE, i-PI, "
        "LAMMPS and TorchSim through metatomic, or atomtrain.ase.Calculator.",
    )
    parser.add_argument("checkpoint", type=Path, help="checkpoint (.ckpt) written by training")
    parser.add_argument(
        "-o",
        "--output",
        type=Path,
        default=Path("model.pt"),
        help="exported file (default: model.pt)",
    )
    parser.set_defaults(run=run)


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
