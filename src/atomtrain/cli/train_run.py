"""The run of ``atomtrain train`` (cli/train.py checks its arguments and options first,
before torch is imported)."""

from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path

import torch

from ..data.ahead import finish_reading
from ..distributed import single_process
from ..distributed.context import check_gpus_per_host, device_type, initialize
from ..distributed.env import LaunchInfo
from ..distributed.faults import PeerFailure
from ..distributed.launch import launch_workers
from ..errors import AtomtrainError
from ..models.energy_model import EnergyModel
from ..options import Options
from ..training.checkpoint import load_checkpoint
from ..training.finetune import adopt_pretrained
from ..training.loop import train
from ..training.outputs import LOGGER_NAME, close_logging, setup_logging
from ..training.reports import describe_model
from ..training.run_directory import discard_unstarted, resume_point
from ..training.setup import Run, fresh_seed, prepare, training_dtype
from ..training.stopping import CollectiveError, TrainingStopped

logger = logging.getLogger(LOGGER_NAME)


def decide_on_rank_0(context, decide):
    """Run ``decide`` on rank 0 and give every rank its result, or its error."""
    outcome: tuple[str, object] = ("ok", None)
    if context.is_main:
        try:
            outcome = ("ok", decide())
        except AtomtrainError as error:
            outcome = ("error", str(error))
    kind, value = context.broadcast_object(outcome)
    if kind == "error":
        raise CollectiveError(str(value))
    return value


def check_only(options: Options, launch: LaunchInfo, pretrained: EnergyModel | None) -> int:
    """Everything a run reads and checks before training (prepare(), as a run calls it,
    with the seed rule of a run), then what it would do."""
    setup_logging(0, None)
    seed = options.seed if options.seed is not None else fresh_seed()
    prepared = prepare(options, single_process(torch.device("cpu")), seed, None, pretrained)
    training_options = options.architecture.training
    logger.info(describe_model(prepared.model, training_dtype(options)))
    logger.info(
        f"{prepared.plan.steps_per_epoch} steps per epoch, {training_options.num_epochs} "
        f"epochs; {launch.world_size} process(es) ({launch.kind}) on "
        f"{device_type(options.device)}"
    )
    warned = prepared.survey_warnings
    caveat = f", but see the {warned} warning(s) above" if warned else ""
    logger.info(f"options and data are usable{caveat}; nothing was trained (--check)")
    return 0


def run(arguments: argparse.Namespace, options: Options, launch: LaunchInfo) -> int:
    """The run ``atomtrain train`` checked the arguments and options of."""
    pretrained = adopt_pretrained(options, str(arguments.options))
    if arguments.check:
        return check_only(options, launch, pretrained)
    if launch.kind == "spawn":
        if device_type(options.device) == "cuda":
            check_gpus_per_host(launch.world_size)  # once here rather than in every worker
        finish_reading()  # the processes find the files read ahead in the cache
        return launch_workers(
            strip_nproc(arguments.argv),
            launch.world_size,
            options.distributed.port,
            options.distributed.timeout,
        )
    if launch.rank != 0:
        setup_logging(launch.rank, None)
    made_outputs = not arguments.outputs.exists()  # to leave no empty outputs/ behind
    context = initialize(launch, options.device, options.distributed.timeout)
    failed = False
    new_directory: Path | None = None  # a directory this run made, until it has a checkpoint
    try:
        with context.guard():
            directory, checkpoint = decide_on_rank_0(
                context,
                lambda: resume_point(
                    arguments.outputs, arguments.run_dir, arguments.restart, os.environ
                ),
            )
        # before the log: a file that is no checkpoint leaves no train.log beside it
        restart_state = load_checkpoint(checkpoint) if checkpoint is not None else None
        if context.is_main:
            if checkpoint is None and not any(directory.iterdir()):
                new_directory = directory
            setup_logging(0, directory / "train.log")
        seed = options.seed
        if restart_state is not None:
            seed = restart_state.seed
        with context.guard():
            if seed is None:
                seed = context.broadcast_object(fresh_seed())
            logger.info(f"atomtrain train {arguments.options} -> {directory}")
            if checkpoint is not None:
                logger.info(f"resuming from {checkpoint}")
            logger.info(f"seed {seed}")
            log_rank_map(context)
        run_state = Run(
            directory=directory,
            restart_state=restart_state,
            output_path=arguments.output,
            pretrained=pretrained,
        )
        train(options, context, run_state, seed)
        return 0
    except CollectiveError as error:
        if not isinstance(error, TrainingStopped):
            discard_unstarted(new_directory, arguments.outputs, made_outputs)
        # every rank raised it at the same step: they leave together (finally), as after
        # a normal end; tearing down alone while a peer still does can abort that peer
        raise
    except BaseException as error:
        failed = True
        logger.debug("stopping on error", exc_info=True)
        context.fail(error)
        if isinstance(error, AtomtrainError) and not isinstance(error, PeerFailure):
            # the console says it all
            discard_unstarted(new_directory, arguments.outputs, made_outputs)
        raise
    finally:
        if not failed:
            try:
                context.close()
            except Exception:
                logger.debug("error while leaving the process group", exc_info=True)
        close_logging()


def log_rank_map(context) -> None:
    entries = context.gather_hosts()
    if context.is_main:
        for note in context.notes:
            logger.warning(note)
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
