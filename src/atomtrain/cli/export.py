"""``atomtrain export model.ckpt -o model.pt``."""

from __future__ import annotations

import argparse

from ..io import check_output_path
from ..models.export import export
from ..training.checkpoint import load_checkpoint, model_from_checkpoint


def run(arguments: argparse.Namespace) -> int:
    check_output_path(arguments.output)
    model = model_from_checkpoint(load_checkpoint(arguments.checkpoint))
    export(model, arguments.output)
    print(f"exported {arguments.checkpoint} to {arguments.output}")
    return 0
