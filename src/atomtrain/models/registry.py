"""Architectures by ``architecture.name``. Adding one is a package under models/ and a
line here. The package's ``plugin`` module defines ``ARCHITECTURE`` (an
:class:`~atomtrain.models.architecture.Architecture`); its ``options`` module defines
``ModelOptions`` and, where the architecture has them, ``TRAINING_DEFAULTS`` and
``START_FILE_KEY``, and imports no torch, nor does the package's ``__init__``: options
files are checked before torch is imported. Packages are imported when first asked for,
so that one architecture's dependencies are not loaded by a run of another."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pydantic import BaseModel

    from .architecture import Architecture

PACKAGES = {
    "soap_bpnn": "atomtrain.models.soap_bpnn",
    "mace": "atomtrain.models.mace",
    "pet": "atomtrain.models.pet",
}
DEFAULT = "soap_bpnn"


def known() -> list[str]:
    return list(PACKAGES)


def canonical_name(name: str) -> str:
    """metatrain's ``experimental.`` prefix names the same architecture."""
    return name.removeprefix("experimental.")


def architecture(name: str) -> Architecture:
    return importlib.import_module(f"{PACKAGES[canonical_name(name)]}.plugin").ARCHITECTURE


def _options_module(name: str):
    return importlib.import_module(f"{PACKAGES[canonical_name(name)]}.options")


def model_options(name: str) -> type[BaseModel]:
    """An architecture's model section, imported without the architecture's model."""
    return _options_module(name).ModelOptions


def training_defaults(name: str) -> dict[str, Any]:
    """The training keys an architecture sets otherwise than the training section."""
    return getattr(_options_module(name), "TRAINING_DEFAULTS", {})


def start_file_key(name: str) -> str | None:
    """The model section's key that names a file of the architecture's own program to
    start from (MACE's ``mace_model``), trained on as a fine-tuning run is; None where
    it has none."""
    return getattr(_options_module(name), "START_FILE_KEY", None)


def start_file(name: str, section: BaseModel) -> str | None:
    """The file the model section says to start from, if any."""
    key = start_file_key(name)
    return getattr(section, key) if key else None


def architecture_of(hypers: dict) -> Architecture:
    """The architecture of a hyperparameter record; records written before there were
    several architectures do not name theirs, and are SOAP-BPNN's."""
    return architecture(hypers.get("architecture", "soap_bpnn"))


def new_model(name: str, atomic_types: list[int], average_neighbors: float = 10.0, **section):
    """A new model of architecture ``name`` with its section's defaults, or the keys
    given (scripts and benchmarks; training builds models from the data's facts)."""
    from .architecture import DataFacts

    chosen = architecture(name)
    options = chosen.model_options.model_validate(section)
    return chosen.build(options, DataFacts(list(atomic_types), average_neighbors))
