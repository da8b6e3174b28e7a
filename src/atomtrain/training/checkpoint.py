"""Checkpoints: plain tensors, numbers and strings, loadable with weights_only=True,
written atomically so that the newest complete checkpoint is always usable."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..errors import AtomtrainError
from ..io import atomic_write
from ..models import metatrain_checkpoint, registry
from ..models.energy_model import EnergyModel
from ..models.export import CHECKPOINT_INSTEAD, first_line, foreign_file, torch_file_kind

FORMAT_PREFIX = "atomtrain-checkpoint-"
VERSION = 3
FORMAT = f"{FORMAT_PREFIX}{VERSION}"
# The version chain: UPGRADES[v] turns a checkpoint of version v into one of v + 1, so
# that a checkpoint an older atomtrain wrote is upgraded, not refused. A version whose
# weights no upgrade can carry over is refused with the reason (REFUSED).
UPGRADES: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {}
REFUSED = {
    1: "SOAP-BPNN's buffers changed in version 2 (one upper-triangle index, spread and "
    "normalisation buffers)",
    2: "SOAP-BPNN's radial basis changed in version 3 (spherical Bessel functions, "
    "channels trimmed by Laplacian eigenvalue): its weights do not fit the new basis",
}


@dataclass
class TrainingState:
    """What a checkpoint holds, and the one place that names its keys: the model (its
    hyperparameter record, precision and weights), where training stands (epochs and
    steps done, the epoch's metric sums so far), the optimizer's, scheduler's and
    plateau's states, and the best model so far. Saved as a plain dict of tensors,
    numbers and strings (loadable with weights_only=True)."""

    architecture: str
    hypers: dict[str, Any]
    dtype: str  # "float32" or "float64"
    model_state: dict[str, torch.Tensor]
    seed: int
    best_model_state: dict[str, torch.Tensor] | None = None
    epoch: int = 0  # full epochs done
    step: int = 0  # global steps done of the next epoch
    epoch_sums: torch.Tensor | None = None  # that epoch's metric sums, mid-epoch
    optimizer_state: dict[str, Any] = field(default_factory=dict)
    parameter_layout: str = "default"
    scheduler_state: dict[str, Any] = field(default_factory=dict)
    plateau_state: dict[str, Any] | None = None  # absent before ReduceLROnPlateau
    best_metric: float = math.inf
    best_epoch: int = -1
    baseline_span: list[list[float]] | None = None  # absent before it was recorded
    trained_on: str = ""
    options: dict[str, Any] | None = None  # the run's expanded options, for the record
    average_state: dict[str, Any] | None = None  # the weights' moving average (ema_decay)

    def to_dict(self) -> dict[str, Any]:
        # the fields as they are: torch.save writes them at once, and dataclasses.asdict
        # would copy every tensor of the model and the optimizer first (6 ms a checkpoint)
        fields = {field.name: getattr(self, field.name) for field in dataclasses.fields(self)}
        state = {"format": FORMAT, **fields}
        return {key: value for key, value in state.items() if value is not None}

    @classmethod
    def from_dict(cls, state: dict[str, Any], path: Path | str = "checkpoint") -> TrainingState:
        """The state of a checkpoint of this version, or of an older one upgraded along
        the version chain; refused in one line where no upgrade exists."""
        state = upgraded(dict(state), path)
        known = {field.name for field in dataclasses.fields(cls)}
        return cls(**{key: value for key, value in state.items() if key in known})


def upgraded(state: dict[str, Any], path: Path | str) -> dict[str, Any]:
    """``state`` brought to VERSION through UPGRADES."""
    written = state.get("format", "")
    version_text = written.removeprefix(FORMAT_PREFIX) if isinstance(written, str) else ""
    if not isinstance(written, str) or not written.startswith(FORMAT_PREFIX):
        raise AtomtrainError(f"{path}: not an atomtrain checkpoint")
    if not version_text.isdigit() or int(version_text) > VERSION:
        raise AtomtrainError(
            f"{path}: checkpoint format '{written}' is from a newer atomtrain (this one reads "
            f"up to '{FORMAT}'); update atomtrain"
        )
    version = int(version_text)
    while version < VERSION:
        upgrade = UPGRADES.get(version)
        if upgrade is None:
            reason = REFUSED.get(version, "no upgrade is known")
            raise AtomtrainError(
                f"{path}: checkpoint format '{written}' is from an older atomtrain and "
                f"cannot be upgraded ({reason}); use the version that wrote it, or train anew"
            )
        state = upgrade(state)
        version += 1
    state["format"] = FORMAT
    return state


def save_checkpoint(path: Path, state: TrainingState) -> None:
    """Write atomically: a crash mid-write never leaves a corrupt ``path``."""
    atomic_write(path, lambda stream: torch.save(state.to_dict(), stream), what="checkpoint")


def replace_best_model(path: Path, best_model_state: dict[str, torch.Tensor]) -> None:
    """Give a checkpoint of this run another best model (the one with the refitted
    baseline, which model.pt holds), so that its eval, export and fine-tuning start from
    model.pt's model; its training state stays, so resuming from it is still exact."""
    try:
        state = load_checkpoint(path)
    except AtomtrainError:  # none, or a damaged one that --restart auto already skips
        return
    state.best_model_state = {
        name: value.detach().cpu() for name, value in best_model_state.items()
    }
    save_checkpoint(path, state)


def newest_complete_checkpoint(
    directory: Path, skipped: list[str] | None = None, excluding: Path | None = None
) -> tuple[Path, TrainingState] | None:
    """The most recently written checkpoint of a run that loads completely (last.ckpt
    or epoch_N.ckpt), other than ``excluding``, with its contents; None when there is
    none. Why each newer one did not load is added to ``skipped``."""
    candidates = [directory / "last.ckpt", *directory.glob("epoch_*.ckpt")]
    existing = [path for path in candidates if path.is_file() and path != excluding]
    for path in sorted(existing, key=lambda path: path.stat().st_mtime_ns, reverse=True):
        try:
            return path, load_checkpoint(path)
        except AtomtrainError as error:
            if skipped is not None:
                skipped.append(str(error))
            continue
    return None


def load_checkpoint(path: str | Path) -> TrainingState:
    path = Path(path)
    if not path.exists():
        raise AtomtrainError(f"{path}: checkpoint not found")
    foreign = foreign_file(path)
    if foreign is not None:
        raise AtomtrainError(f"{path}: {foreign}")
    kind = torch_file_kind(path)
    if kind == "model":
        raise AtomtrainError(
            f"{path}: an exported model (it runs in engines as it is), not a checkpoint; "
            f"{CHECKPOINT_INSTEAD} (to fine-tune from this model instead: "
            "architecture.training.finetune.read_from)"
        )
    if kind == "other":
        raise AtomtrainError(
            f"{path}: not a checkpoint (torch did not write it); {CHECKPOINT_INSTEAD}"
        )
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:
        raise AtomtrainError(unreadable(path, error)) from error
    if not isinstance(state, dict):
        raise AtomtrainError(f"{path}: not an atomtrain checkpoint")
    state = upgraded(state, path)
    if state.get("architecture") not in registry.known():
        raise AtomtrainError(
            f"{path}: checkpoint of architecture '{state.get('architecture')}', which this "
            f"atomtrain does not know (known: {', '.join(registry.known())})"
        )
    try:
        return TrainingState.from_dict(state, path)
    except TypeError as error:  # a key this version requires is missing
        raise AtomtrainError(f"{path}: an incomplete atomtrain checkpoint ({error})") from error


def unreadable(path: Path, error: BaseException) -> str:
    """Why a checkpoint does not load, in one short line."""
    if isinstance(error, RuntimeError) and (
        "zip archive" in str(error) or "miniz" in str(error) or "central directory" in str(error)
    ):
        older = newest_complete_checkpoint(path.parent, excluding=path)
        instead = (
            f"; --restart auto would resume from {older[0]}"
            if older
            else "; no other complete checkpoint is beside it"
        )
        return f"{path}: the checkpoint is truncated or corrupt{instead}"
    return f"{path}: not a readable atomtrain checkpoint ({first_line(error)})"


def is_checkpoint(path: str | Path) -> bool:
    """A .ckpt, or a file of torch.save's kind whatever its name (a renamed checkpoint)."""
    path = Path(path)
    return path.suffix == ".ckpt" or (path.is_file() and torch_file_kind(path) == "saved")


def best_model(path: str | Path) -> EnergyModel:
    """The best model of the checkpoint at ``path``: atomtrain's, or metatrain's of an
    architecture that reads them."""
    if metatrain_checkpoint.is_metatrain_checkpoint(path):
        return metatrain_checkpoint.read(path)
    return model_from_checkpoint(load_checkpoint(path), best=True)


def model_from_checkpoint(state: TrainingState, best: bool = True) -> EnergyModel:
    """The model a checkpoint holds: the best one by default, else the latest."""
    architecture = registry.architecture(state.architecture)
    model = architecture.model_from(state.hypers).set_precision(getattr(torch, state.dtype))
    weights = state.best_model_state if best else None
    model.load_state_dict(weights or state.model_state)
    model.baseline_span = state.baseline_span
    model.trained_on = state.trained_on
    return model
