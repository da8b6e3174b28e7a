"""Experiment logs beside train.csv: TensorBoard event files and Weights & Biases, each
given the rows train.csv gets (one per validated epoch). Rank 0 alone creates them.

A resumed run (--restart, a requeued job) continues the same W&B run: the run's id is
kept in the run directory (``wandb_run_id``) the first time, and given back to
``wandb.init`` with ``resume="allow"`` afterwards; TensorBoard's new event file in the
same directory continues the curves at the resumed epoch.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import secrets
from pathlib import Path
from typing import Any

from ..errors import AtomtrainError, OptionsError
from ..options import LoggingOptions
from ..runtime import unimported
from .outputs import LOGGER_NAME

logger = logging.getLogger(LOGGER_NAME)

WANDB_ID_FILE = "wandb_run_id"
TENSORBOARD_DIRECTORY = "tensorboard"
# wandb.init waits this long for its service (and, online, for the server) before it
# fails: a run never hangs on an unreachable W&B
WANDB_TIMEOUT_S = 60


def installed(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ValueError:  # in sys.modules without a spec (None: made unimportable)
        return False


def check_logging(options: LoggingOptions) -> None:
    """What the options ask that this installation lacks: one line, before any data is
    read (train and --check)."""
    if options.tensorboard and not installed("tensorboard"):
        raise OptionsError(
            "logging.tensorboard is true but tensorboard is not installed: run "
            "'pip install atomtrain[tensorboard]', or set logging.tensorboard: false"
        )
    if options.wandb is not None and not installed("wandb"):
        raise OptionsError(
            "logging.wandb is set but wandb is not installed: run 'pip install "
            "atomtrain[wandb]', or remove logging.wandb"
        )


class ExperimentLogs:
    """The experiment loggers a run's options ask for (none on ranks other than 0)."""

    def __init__(self, options: LoggingOptions, directory: Path, record: dict[str, Any]):
        self.tensorboard = None
        self.wandb_run = None
        wanted = options.tensorboard
        if wanted is None:
            wanted = installed("tensorboard")
        if wanted:
            with unimported("fsspec", "boto3"):  # remote paths' layers, not used
                from torch.utils.tensorboard import SummaryWriter

            self.tensorboard = SummaryWriter(log_dir=str(directory / TENSORBOARD_DIRECTORY))
        if options.wandb is not None:
            self.wandb_run = start_wandb(options.wandb, directory, record)

    def log(self, epoch: int, row: dict[str, Any]) -> None:
        values = {name: value for name, value in row.items() if name != "epoch"}
        if self.tensorboard is not None:
            for name, value in values.items():
                self.tensorboard.add_scalar(name, value, epoch)
            self.tensorboard.flush()
        if self.wandb_run is not None:
            self.wandb_run.log({"epoch": epoch, **values}, step=epoch)

    def close(self) -> None:
        if self.tensorboard is not None:
            self.tensorboard.close()
            self.tensorboard = None
        if self.wandb_run is not None:
            self.wandb_run.finish()
            self.wandb_run = None


def start_wandb(settings: dict[str, Any], directory: Path, record: dict[str, Any]):
    import wandb

    id_file = directory / WANDB_ID_FILE
    if id_file.exists():
        run_id = id_file.read_text().strip()
    else:
        run_id = secrets.token_hex(6)
        id_file.write_text(run_id + "\n")
    os.environ.setdefault("WANDB_SILENT", "true")
    try:
        run = wandb.init(
            **{"dir": str(directory), "config": record, **settings},
            id=run_id,
            resume="allow",
            settings=wandb.Settings(init_timeout=WANDB_TIMEOUT_S, quiet=True),
        )
    except TypeError as error:
        raise OptionsError(f"logging.wandb: {error}") from error
    except Exception as error:
        raise AtomtrainError(
            f"W&B could not start ({str(error).splitlines()[0]}); without a network, set "
            "logging.wandb.mode: offline (upload later with wandb sync)"
        ) from error
    logger.info(f"W&B run {run_id} ({run.settings.mode}) in {directory / 'wandb'}")
    return run
