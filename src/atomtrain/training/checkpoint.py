"""Checkpoints: plain tensors, numbers and strings, loadable with weights_only=True,
written atomically so that the newest complete checkpoint is always usable."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ..errors import AtomtrainError
from ..io import atomic_write
from ..models import registry
from ..models.energy_model import EnergyModel
from ..models.export import CHECKPOINT_INSTEAD, first_line, foreign_file, torch_file_kind

# 2: SOAP buffers changed (one upper-triangle index, spread and normalisation buffers)
# 3: spherical Bessel radial basis, trimmed channels (wavenumbers and selected buffers)
FORMAT = "atomtrain-checkpoint-3"


def save_checkpoint(path: Path, state: dict[str, Any]) -> None:
    """Write atomically: a crash mid-write never leaves a corrupt ``path``."""
    atomic_write(
        path, lambda stream: torch.save({"format": FORMAT, **state}, stream), what="checkpoint"
    )


def replace_best_model(path: Path, best_model_state: dict[str, torch.Tensor]) -> None:
    """Give a checkpoint of this run another best model (the one with the refitted
    baseline, which model.pt holds), so that its eval, export and fine-tuning start from
    model.pt's model; its training state stays, so resuming from it is still exact."""
    try:
        state = load_checkpoint(path)
    except AtomtrainError:  # none, or a damaged one that --restart auto already skips
        return
    state["best_model_state"] = {
        name: value.detach().cpu() for name, value in best_model_state.items()
    }
    save_checkpoint(path, {key: value for key, value in state.items() if key != "format"})


def newest_complete_checkpoint(
    directory: Path, skipped: list[str] | None = None, excluding: Path | None = None
) -> tuple[Path, dict[str, Any]] | None:
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


def load_checkpoint(path: str | Path) -> dict[str, Any]:
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
    written = state.get("format", "") if isinstance(state, dict) else ""
    if isinstance(written, str) and written.startswith("atomtrain-checkpoint-"):
        if written != FORMAT:
            raise AtomtrainError(
                f"{path}: checkpoint format '{written}' is from another atomtrain version "
                f"(this one reads '{FORMAT}'); use the version that wrote it, or train anew"
            )
    else:
        raise AtomtrainError(f"{path}: not an atomtrain checkpoint")
    if state.get("architecture") not in registry.known():
        raise AtomtrainError(
            f"{path}: checkpoint of architecture '{state.get('architecture')}', which this "
            f"atomtrain does not know (known: {', '.join(registry.known())})"
        )
    return state


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
    """The best model of the checkpoint at ``path``."""
    return model_from_checkpoint(load_checkpoint(path), best=True)


def model_from_checkpoint(state: dict[str, Any], best: bool = True) -> EnergyModel:
    """The model a checkpoint holds: the best one by default, else the latest."""
    architecture = registry.architecture(state["architecture"])
    model = architecture.model_from(state["hypers"]).set_precision(getattr(torch, state["dtype"]))
    weights = state["best_model_state"] if best and "best_model_state" in state else None
    model.load_state_dict(weights or state["model_state"])
    model.baseline_span = state.get("baseline_span")  # absent from older checkpoints
    model.trained_on = state.get("trained_on", "")
    return model
