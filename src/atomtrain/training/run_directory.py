"""Where a run lives and what it resumes from: a new ``outputs/DATE/TIME`` directory,
the one given with ``--run-dir``, or the newest run with a complete checkpoint; and the
removal of a directory whose run never started. Rank 0 decides; the other ranks get
its answer (cli/train.py)."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Any

from ..errors import AtomtrainError
from .checkpoint import newest_complete_checkpoint
from .outputs import close_logging, new_run_directory, newest_run_directory

RUN_MARKERS = ".runs"


def elastic_restart(environ) -> bool:
    """A worker group restarted by torchrun --max-restarts after a failure."""
    return int(environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0) > 0


def resume_point(
    outputs: Path, run_dir: Path | None, restart: str | None, environ
) -> tuple[Path, Path | None]:
    """(run directory, checkpoint to resume from). Rank 0 decides; see README's rule.

    * ``--run-dir DIR``: the run lives in DIR; ``--restart auto`` or an elastic restart
      resumes from its newest complete checkpoint.
    * ``--restart auto`` alone: the newest run under ``--outputs``.
    * ``--restart CKPT``: the run holding CKPT continues.
    * under torchrun without ``--run-dir``: the directory is recorded under
      ``outputs/.runs/<TORCHELASTIC_RUN_ID>`` so that a restarted group finds it.
    """
    restarted = elastic_restart(environ)
    run_id = environ.get("TORCHELASTIC_RUN_ID")
    marker = outputs / RUN_MARKERS / run_id if run_id else None
    directory: Path | None = run_dir
    if directory is None and restarted and marker is not None and marker.is_file():
        directory = Path(marker.read_text().strip())
    if restart not in (None, "auto"):
        checkpoint = Path(restart)
        if not checkpoint.is_file():
            raise AtomtrainError(f"{checkpoint}: checkpoint not found")
        return (directory or checkpoint.resolve().parent), checkpoint
    skipped: list[str] = []
    if directory is not None:
        directory = directory.resolve()
        directory.mkdir(parents=True, exist_ok=True)
        found = newest_complete_checkpoint(directory, skipped)
        report_skipped(skipped, found)
        if restart == "auto" or restarted:
            if found is None and restart == "auto":
                raise AtomtrainError(
                    f"--restart auto: no complete checkpoint in {directory}; start a new "
                    "run without --restart"
                )
            return directory, found[0] if found else None
        if found is not None:
            raise AtomtrainError(
                f"{directory} already holds a run; add --restart auto to continue it, or "
                "choose another --run-dir"
            )
        return directory, None
    if restart == "auto":
        previous = newest_run_directory(outputs)
        found = newest_complete_checkpoint(previous, skipped) if previous else None
        report_skipped(skipped, found)
        if found is None:
            raise AtomtrainError(
                f"--restart auto: no earlier run with a checkpoint under {outputs}/; "
                "start a new run without --restart"
            )
        return previous, found[0]
    directory = new_run_directory(outputs).resolve()
    if marker is not None:
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text(str(directory))
    return directory, None


def report_skipped(skipped: list[str], found: tuple[Path, Any] | None) -> None:
    """Say which newer checkpoints --restart auto passed over, before logging starts."""
    if skipped and found is not None:
        for reason in skipped:
            print(f"atomtrain: skipping {reason}", file=sys.stderr)
        print(f"atomtrain: resuming from {found[0]}", file=sys.stderr)


def discard_unstarted(directory: Path | None, outputs: Path, made_outputs: bool = False) -> None:
    """Remove the directory of a run that failed on bad input before it trained: what it
    holds (a log, the options) describes a run that never was, and an empty date
    directory above it goes too, and ``outputs`` itself when this run made it
    (``made_outputs``) and it is left empty. A directory with a checkpoint or logged
    epochs stays."""
    if directory is None or any(directory.glob("*.ckpt")) or (directory / "train.csv").exists():
        return
    close_logging()
    shutil.rmtree(directory, ignore_errors=True)
    forget_marker(outputs, directory)
    if directory.parent.parent == outputs.resolve():
        try:
            directory.parent.rmdir()  # outputs/DATE when this was its only run
            if made_outputs:
                outputs.rmdir()
        except OSError:
            pass


def forget_marker(outputs: Path, directory: Path) -> None:
    """Remove the record of ``directory`` a torchrun or ``--nproc`` group left for its
    restart (resume_point), and the records' folder when it is left empty."""
    run_id = os.environ.get("TORCHELASTIC_RUN_ID")
    if not run_id:
        return
    marker = outputs / RUN_MARKERS / run_id
    try:
        if marker.read_text().strip() == str(directory):
            marker.unlink()
            marker.parent.rmdir()
    except OSError:  # no record, another's, or other groups' records beside it
        pass
