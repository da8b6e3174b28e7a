"""Checkpoints written by metatrain (``mtt train``'s ``model.ckpt``), read without
running pickled code.

metatrain saves its checkpoints with ``torch.save`` and reads them with
``weights_only=False``: beside the tensors they hold two metatrain classes (DatasetInfo
and TargetInfo), TorchScript objects of metatensor and metatomic (Labels, TensorMap,
ModelMetadata), and an OrderedDict. atomtrain loads them with ``weights_only=True`` and
allows exactly these: the two metatrain classes are stand-ins here, filled with the
pickled attributes and never metatrain's code, and TorchScript objects are rebuilt by
the C++ classes that metatensor-torch and metatomic-torch register. Anything else in
the file is refused with one line.

An architecture reads its own kind (``Architecture.read_metatrain``) from the loaded
dictionary.
"""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path
from typing import Any

import torch

from ..errors import AtomtrainError
from . import registry
from .energy_model import EnergyModel
from .export import first_line, metatomic_torch, pickle_header


class DatasetInfo:
    """Stand-in for metatrain.utils.data.dataset.DatasetInfo: its pickled attributes."""


class TargetInfo:
    """Stand-in for metatrain.utils.data.target_info.TargetInfo: its pickled attributes."""


ALLOWED = [
    (DatasetInfo, "metatrain.utils.data.dataset.DatasetInfo"),
    (TargetInfo, "metatrain.utils.data.target_info.TargetInfo"),
    OrderedDict,
    torch.ScriptObject,
]


def is_metatrain_checkpoint(path: str | Path) -> bool:
    """Whether ``path`` is a torch.save archive whose pickle names metatrain's version
    key (a path with "metatrain" in it is no sign)."""
    header = pickle_header(path)
    return header is not None and b"model_ckpt_version" in header


def load(path: str | Path) -> dict[str, Any]:
    """The checkpoint's dictionary, loaded with weights_only=True and ALLOWED only."""
    metatomic_torch()  # registers the TorchScript classes it holds

    try:
        with torch.serialization.safe_globals(ALLOWED):
            loaded = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:
        raise AtomtrainError(
            f"{path}: this metatrain checkpoint holds more than tensors, metatrain's data "
            f"descriptions and metatensor objects ({first_line(error)}); atomtrain does not "
            "read it as pickle: export it with metatrain (mtt export) and run the model.pt"
        ) from error
    if not isinstance(loaded, dict) or "architecture_name" not in loaded:
        raise AtomtrainError(f"{path}: not a metatrain checkpoint (no architecture_name)")
    return loaded


def read(path: str | Path) -> EnergyModel:
    """The model a metatrain checkpoint holds (its best model, as metatrain's fine-tuning
    and export take it), as an atomtrain model."""
    loaded = load(path)
    name = registry.canonical_name(str(loaded["architecture_name"]))
    readers = [known for known in registry.known() if registry.architecture(known).read_metatrain]
    reader = registry.architecture(name).read_metatrain if name in readers else None
    if reader is None:
        raise AtomtrainError(
            f"{path}: a metatrain checkpoint of architecture '{name}'; atomtrain reads "
            f"metatrain's {', '.join(readers)} checkpoints only: train anew with atomtrain on "
            "the same options file (metatrain's format runs unchanged)"
        )
    return reader(loaded, str(path))
