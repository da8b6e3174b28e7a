"""``atomtrain train options.yaml``: one command for one process, torchrun, srun and
``--nproc N``."""

from __future__ import annotations

import argparse
import logging
import os
import random
from pathlib import Path

from ..distributed.context import initialize
from ..distributed.env import detect_launch, hostname
from ..distributed.launch import launch_workers
from ..errors import AtomtrainError
from ..options import load_options
from ..training.checkpoint import load_checkpoint
from ..training.loop import Run, train
from ..training.outputs import (
    LOGGER_NAME,
    close_logging,
    new_run_directory,
    newest_run_directory,
    setup_logging,
)
from .export import check_output_path

logger = logging.getLogger(LOGGER_NAME)


def add_parser(commands) -> None:
    parser = commands.add_parser(
        "train",
        help="train a model from an options file",
        description="Train a model from a YAML options file. Outputs go to "
        "outputs/YYYY-MM-DD/HH-MM-SS/ (log, CSV, checkpoints, exported model.pt).",
    )
    parser.add_argument("options", type=Path, help="YAML options file")
    parser.add_argument(
        "-o", "--output", type=Path, default=None, help="also write the exported model here"
    )
    parser.add_argument(
        "-r",
        "--override",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override an option, e.g. -r architecture.training.num_epochs=5",
    )
    parser.add_argument(
        "--restart",
        default=None,
        metavar="auto|CHECKPOINT",
        help="continue a run: 'auto' takes the newest run under outputs/, or "
        "give a checkpoint; the run continues in the checkpoint's directory",
    )
    parser.add_argument(
        "--nproc",
        type=int,
        default=None,
        help="start this many worker processes on this machine",
    )
    parser.add_argument(
        "--outputs",
        type=Path,
        default=Path("outputs"),
        help="directory holding the runs (default: outputs)",
    )
    parser.set_defaults(run=run)


def find_restart(restart: str | None, outputs: Path) -> Path | None:
    if restart is None:
        return None
    if restart == "auto":
        directory = newest_run_directory(outputs)
        if directory is None:
            raise AtomtrainError(
                f"--restart auto: no earlier run with a checkpoint under {outputs}/; "
                "start a new run without --restart"
            )
        return directory / "last.ckpt"
    return Path(restart)


def choose_run_directory(restart_checkpoint: Path | None, outputs: Path) -> Path:
    if restart_checkpoint is not None:
        return restart_checkpoint.resolve().parent
    return new_run_directory(outputs).resolve()


def run(arguments: argparse.Namespace) -> int:
    options = load_options(arguments.options, arguments.override)
    if arguments.output is not None:
        check_output_path(arguments.output)
    launch = detect_launch(os.environ, arguments.nproc, options.distributed.port)
    batch_size = options.architecture.training.batch_size
    if launch.world_size > batch_size:
        raise AtomtrainError(
            f"{launch.world_size} processes but architecture.training.batch_size is "
            f"{batch_size} (the global batch): each process needs at least one structure "
            "per step; raise batch_size or use fewer processes"
        )
    if launch.kind == "spawn":
        return launch_workers(
            strip_nproc(arguments.argv),
            launch.world_size,
            options.distributed.port,
            options.distributed.timeout,
        )
    restart_checkpoint = find_restart(arguments.restart, arguments.outputs)
    restart_state = load_checkpoint(restart_checkpoint) if restart_checkpoint else None
    if launch.rank != 0:
        setup_logging(launch.rank, None)
    context = initialize(launch, options.device, options.distributed.timeout)
    try:
        directory = None
        if context.is_main:
            directory = choose_run_directory(restart_checkpoint, arguments.outputs)
            setup_logging(0, directory / "train.log")
        directory = context.broadcast_object(directory)
        seed = options.seed
        if restart_state is not None:
            seed = int(restart_state["seed"])
        if seed is None:
            seed = context.broadcast_object(random.SystemRandom().randrange(2**31))
        logger.info(f"atomtrain train {arguments.options} -> {directory}")
        logger.info(f"seed {seed}")
        log_rank_map(context)
        run_state = Run(
            directory=directory, restart_state=restart_state, output_path=arguments.output
        )
        train(options, context, run_state, seed)
        return 0
    finally:
        context.close()
        close_logging()


def log_rank_map(context) -> None:
    entries = context.all_gather_objects((context.rank, hostname(), str(context.device)))
    if context.is_distributed:
        lines = [f"  rank {rank}: host {host}, device {device}" for rank, host, device in entries]
        logger.info(f"{context.world_size} processes ({context.master}):\n" + "\n".join(lines))
    else:
        logger.info(f"1 process on host {entries[0][1]}, device {entries[0][2]}")


def strip_nproc(arguments: list[str]) -> list[str]:
    result = []
    skip = False
    for argument in arguments:
        if skip:
            skip = False
            continue
        if argument == "--nproc":
            skip = True
            continue
        if argument.startswith("--nproc="):
            continue
        result.append(argument)
    return result
