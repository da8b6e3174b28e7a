"""``atomtrain train options.yaml``: one command for one process, torchrun, srun and
``--nproc N``. The arguments and the options file are checked before torch and the
trainer are imported (cli/train_run.py), so that a mistake in them is said at once."""

from __future__ import annotations

import argparse
import os

from ..data.ahead import read_ahead
from ..distributed.env import LaunchInfo, detect_launch
from ..errors import AtomtrainError, OptionsError
from ..io import check_output_path, check_writable_directory
from ..options import Options, load_options
from ..runtime import runs_one_command
from ..training.dataset_keys import readings
from ..training.figures import start_early
from ..training.phases import mark_command_start


def run(arguments: argparse.Namespace) -> int:
    if arguments.nproc is not None and arguments.nproc < 1:
        raise OptionsError(
            f"--nproc {arguments.nproc}: give a positive number of processes (or leave "
            "--nproc out for one)"
        )
    options = load_options(arguments.options, arguments.override)
    if arguments.output is not None:
        check_output_path(arguments.output)
    launch = detect_launch(os.environ, arguments.nproc, options.distributed.port)
    if launch.rank == 0 and not arguments.check:  # rank 0 writes the run's files
        if arguments.run_dir is not None:
            check_writable_directory(arguments.run_dir, "give a --run-dir you can write to")
        else:
            check_writable_directory(
                arguments.outputs,
                "the run's outputs go there: run from a directory you can write to, or "
                "give --outputs DIR",
            )
    batch_size = options.architecture.training.batch_size
    packed = options.architecture.training.max_atoms_per_batch is not None
    if launch.world_size > batch_size and not packed:
        raise AtomtrainError(
            f"{launch.world_size} processes but architecture.training.batch_size is "
            f"{batch_size} (the global batch): each process needs at least one structure "
            "per step; raise batch_size or use fewer processes"
        )
    if runs_one_command() and draws_figures_here(arguments, options, launch):
        start_early()  # matplotlib's import alongside torch's
    if runs_one_command() and (launch.world_size == 1 or launch.kind == "spawn"):
        read_ahead(readings(options))  # files not read before, alongside torch's import
    from . import train_run  # torch and the trainer

    mark_command_start()  # the imports above count as the start's
    return train_run.run(arguments, options, launch)


def draws_figures_here(arguments: argparse.Namespace, options: Options, launch: LaunchInfo) -> bool:
    """This process trains and is rank 0, and the options ask for figures: it draws
    the learning curves at the end (--nproc's launcher leaves them to its rank 0)."""
    return (
        options.logging.figures
        and not arguments.check
        and launch.kind != "spawn"
        and launch.rank == 0
    )
