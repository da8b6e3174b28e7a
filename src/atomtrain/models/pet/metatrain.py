"""metatrain's PET checkpoints (``mtt train`` with ``pet``, PET-MAD, UPET) as atomtrain
models: the best model's PETBackend weights, its composition model's per-element
energies as the baseline, and its scaler's energy scale as the target scale. metatrain
evaluates ``scale * PET + composition``, as atomtrain's energy model does, so the
predictions are metatrain's."""

from __future__ import annotations

from typing import Any

import torch
from pydantic import ValidationError

from ...errors import AtomtrainError
from ...targets import is_direct
from .model import PetModel
from .options import ModelOptions

# metatrain 2026.4.1's PET model version; others are named with this one
READ_VERSION = 16
METATRAIN = "metatrain 2026.4.1"


def read_pet_checkpoint(checkpoint: dict[str, Any], path: str) -> PetModel:
    version = checkpoint.get("model_ckpt_version")
    if version != READ_VERSION:
        raise AtomtrainError(
            f"{path}: a metatrain PET checkpoint of model version {version}; atomtrain reads "
            f"version {READ_VERSION} ({METATRAIN}): upgrade it by loading and saving it "
            f"with {METATRAIN} (mtt train ... --restart), or export it (mtt export)"
        )
    data = checkpoint["model_data"]
    options = section_of(data["model_hypers"], path)
    info = vars(data["dataset_info"])
    direct = sorted(name for name in info["targets"] if is_direct(name))
    if sorted(set(info["targets"]) - set(direct)) != ["energy"]:
        raise AtomtrainError(
            f"{path}: this PET has the targets {', '.join(sorted(info['targets']))}; atomtrain "
            "reads a metatrain PET's energy head (one target named energy, and direct "
            "forces and stress, which it leaves out)"
        )
    state = checkpoint["best_model_state_dict"] or checkpoint["model_state_dict"]
    if state.get("finetune_config"):
        raise AtomtrainError(
            f"{path}: a PET fine-tuned by metatrain with {state['finetune_config'].get('method')}"
            " (its adapters are not merged); atomtrain reads fully trained or fully "
            "fine-tuned PETs"
        )
    atomic_types = [int(z) for z in info["_atomic_types"]]
    model = PetModel(atomic_types, options)
    # the direct heads' layers are named after their targets (node_heads.<target>...)
    weights = {
        name.removeprefix("backend."): value
        for name, value in state.items()
        if name.startswith("backend.") and not any(f".{target}." in name for target in direct)
    }
    dtype = weights["edge_embedder.weight"].dtype
    model.set_precision(dtype)
    try:
        model.pet.load_state_dict(weights)
    except RuntimeError as error:
        raise AtomtrainError(
            f"{path}: its PET weights do not fit the network its hypers describe "
            f"({str(error).splitlines()[0]}); was it written by {METATRAIN}?"
        ) from error
    baseline = composition_energies(state, atomic_types, path)
    model.set_baseline(baseline, energy_scale(state, path))
    model.trained_on = f"metatrain checkpoint {path}"
    if direct:
        # PET-MAD's and UPET's direct heads are metatrain's own networks; atomtrain's
        # direct targets have heads of their own, trained anew (docs/targets.md)
        model.reading_note = (
            f"{path}: its energy read; its direct heads ({', '.join(direct)}) left out: "
            "to predict them, fine-tune with non_conservative_forces / "
            "non_conservative_stress targets (new heads of atomtrain's)"
        )
    return model


def section_of(hypers: dict[str, Any], path: str) -> ModelOptions:
    try:
        return ModelOptions.model_validate(hypers)
    except ValidationError as error:
        problem = error.errors()[0]
        where = ".".join(str(part) for part in problem["loc"])
        raise AtomtrainError(
            f"{path}: its PET uses {where} = {problem.get('input')!r}, which atomtrain's "
            f"PET cannot run ({problem['msg']})"
        ) from error


def tensor_map(state: dict[str, Any], name: str, path: str):
    import metatensor.torch as metatensor

    if name not in state:
        raise AtomtrainError(
            f"{path}: no {name} in the checkpoint's model; not a PET of {METATRAIN}?"
        )
    return metatensor.load_buffer(state[name])


def composition_energies(state: dict[str, Any], atomic_types: list[int], path: str) -> torch.Tensor:
    """metatrain's composition model's energy per element, ordered like atomic_types."""
    weights = tensor_map(state, "additive_models.0.energy_composition_buffer", path)
    block = weights.block(0)
    types = [int(row[0]) for row in block.samples.values]
    values = block.values.reshape(-1).to(torch.float64)
    energies = dict(zip(types, values.tolist()))
    return torch.tensor([energies.get(z, 0.0) for z in atomic_types], dtype=torch.float64)


def energy_scale(state: dict[str, Any], path: str) -> float:
    """metatrain's scaler's energy scale (per target times per property: its full
    scale); one for all elements."""
    scales = tensor_map(state, "scaler.energy_scaler_buffer", path)
    values = scales.block(0).values.reshape(-1)
    if values.numel() != 1:
        raise AtomtrainError(
            f"{path}: its energy has a scale per element ({values.numel()}); atomtrain's "
            "models have one energy scale"
        )
    return float(values[0])
