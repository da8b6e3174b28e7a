"""PET's :class:`~atomtrain.models.architecture.Architecture`: how metatrain's network
is built, read from a metatrain checkpoint, and fine-tuned (heads, LoRA)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..architecture import Architecture, DataFacts
from . import ARCHITECTURE_NAME
from .options import ModelOptions

if TYPE_CHECKING:
    from .model import PetModel


REFERENCES = {
    "implementation": [
        "atomtrain: https://github.com/atomtrain/atomtrain",
        "metatrain (PETBackend): https://github.com/metatensor/metatrain",
    ],
    "architecture": [
        "PET: S. Pozdnyakov, M. Ceriotti, Advances in Neural Information Processing "
        "Systems 36 (2023), https://arxiv.org/abs/2305.19302",
    ],
}


def build(options: ModelOptions, facts: DataFacts) -> PetModel:
    from .model import PetModel

    return PetModel(facts.atomic_types, options)


def read_metatrain(checkpoint: dict[str, Any], path: str) -> PetModel:
    from .metatrain import read_pet_checkpoint

    return read_pet_checkpoint(checkpoint, path)


ARCHITECTURE = Architecture(
    name=ARCHITECTURE_NAME,
    display_name="PET",
    model_options=ModelOptions,
    build=build,
    references=REFERENCES,
    summary="metatrain 2026.4.1's `PETBackend`, unchanged; trained on randomly rotated "
    "structures, as metatrain trains it",
    install="`pip install atomtrain[pet]`",
    learns_other_targets=True,
    augments_rotations=True,
    # its compiled step took 0.61x the eager one's time, 30 ms less (ethanol, batch 8,
    # float32, examples/pet), and its first step 298 s cold (docs/performance-notes.md)
    compile_pays_after=10000,
    # metatrain's pet defaults for heads fine-tuning: its heads and last layers
    head_modules=lambda section: (
        "node_heads",
        "edge_heads",
        "node_last_layers",
        "edge_last_layers",
    ),
    module_prefix="pet.",
    # metatrain's pet default: the attention's input and output maps
    lora_targets=("input_linear", "output_linear"),
    read_metatrain=read_metatrain,
)
