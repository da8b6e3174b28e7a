"""Fine-tuning: a run that starts from the best model of an earlier one."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from ..errors import AtomtrainError, OptionsError
from ..models import adapters, registry
from ..models.energy_model import EnergyModel
from ..models.export import BASELINE_SPAN_FILE, HYPERS_FILE, load_exported
from ..options import FINETUNE_LEARNING_RATE, Options
from .checkpoint import best_model, is_checkpoint
from .setup import starting_point


def pretrained_model(path: str, architecture_name: str) -> EnergyModel:
    """The model to fine-tune (see read_pretrained), without its LLPR uncertainty: that
    belongs to the weights it was computed for, and is computed again at the end."""
    model = read_pretrained(path, architecture_name)
    model.clear_uncertainty()
    return model


def read_pretrained(path: str, architecture_name: str) -> EnergyModel:
    """A checkpoint's best model (.ckpt), a file of the architecture's own program
    (mace_run_train's .model), or an exported model with the hyperparameters that export
    stores beside its code."""
    architecture = registry.architecture(architecture_name)
    if architecture.read_file is not None and Path(path).suffix == ".model":
        return architecture.read_file(path)
    if is_checkpoint(path):
        return best_model(path)
    extra = {HYPERS_FILE: "", BASELINE_SPAN_FILE: ""}
    exported = load_exported(path, extra=extra)
    if not extra[HYPERS_FILE]:
        raise AtomtrainError(
            f"{path}: this exported model does not hold its hyperparameters (an older "
            "atomtrain exported it); fine-tune from the checkpoint of its run (best.ckpt)"
        )
    hypers = json.loads(extra[HYPERS_FILE])
    model = registry.architecture_of(hypers).model_from(hypers)
    model.set_precision(next(exported.parameters()).dtype)
    # TorchScript's state_dict also holds the buffers the model does not save (derived)
    saved = model.state_dict()
    model.load_state_dict(
        {name: value for name, value in exported.state_dict().items() if name in saved}
    )
    model.baseline_span = json.loads(extra[BASELINE_SPAN_FILE] or "null")
    return model


def keys_set(section: BaseModel, prefix: str) -> dict[str, Any]:
    """The dotted keys the options file set in ``section`` (not their defaults)."""
    found: dict[str, Any] = {}
    for name in section.model_fields_set:
        value = getattr(section, name)
        if isinstance(value, BaseModel):
            found.update(keys_set(value, f"{prefix}{name}."))
        else:
            found[f"{prefix}{name}"] = value
    return found


def value_at(section: BaseModel, dotted: str) -> Any:
    value: Any = section
    for part in dotted.split("."):
        value = getattr(value, part)
    return value


def adopt_pretrained(options: Options, source: str) -> EnergyModel | None:
    """With architecture.training.finetune: the pretrained model, and ``options`` made to
    describe it (model section, atomic_types), so that the run's record builds it again.
    Keys the options file set to other values than the checkpoint's are refused."""
    finetune = options.architecture.training.finetune
    architecture = options.architecture
    if finetune is not None and registry.start_file(architecture.name, architecture.model):
        key = registry.start_file_key(architecture.name)
        raise OptionsError(
            f"{source}: both 'architecture.training.finetune' and 'architecture.model.{key}' "
            "name a model to start from; keep one"
        )
    read_from = starting_point(options)
    if read_from is None:
        return None
    # a model fine-tuned with adapters starts the next run as the plain model it exports
    model = adapters.merged(pretrained_model(read_from, architecture.name))
    hypers = model.hypers
    if hypers["architecture"] != architecture.name:
        raise OptionsError(
            f"{source}: 'architecture.name' is {architecture.name}, but the model "
            f"fine-tuned from {read_from} is {hypers['architecture']}; set "
            f"architecture.name: {hypers['architecture']}"
        )
    pretrained = registry.architecture(architecture.name).options_from(hypers)
    conflicts = [
        (f"architecture.model.{key}", value, value_at(pretrained, key))
        for key, value in keys_set(architecture.model, "").items()
        if value != value_at(pretrained, key)
    ]
    if architecture.atomic_types not in (None, hypers["atomic_types"]):
        conflicts.append(
            ("architecture.atomic_types", architecture.atomic_types, hypers["atomic_types"])
        )
    if architecture.training.atomic_baseline:
        conflicts.append(("architecture.training.atomic_baseline", "set", "its own"))
    if conflicts:
        key, value, theirs = conflicts[0]
        raise OptionsError(
            f"{source}: '{key}' is {value}, but the model fine-tuned from "
            f"{read_from} has {theirs}; remove the key (fine-tuning keeps the "
            "model's architecture and energy baseline)"
        )
    architecture.model = pretrained
    architecture.atomic_types = list(hypers["atomic_types"])
    if "learning_rate" not in architecture.training.model_fields_set:
        architecture.training.learning_rate = FINETUNE_LEARNING_RATE
    return model
