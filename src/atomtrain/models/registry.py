"""Architectures by ``architecture.name``. Adding one is a package under models/ that
defines ``ARCHITECTURE`` (an :class:`~atomtrain.models.architecture.Architecture`) in
its ``__init__`` and ``ModelOptions`` in its ``options`` module, and a line here.
Packages are imported when first asked for, so that one architecture's dependencies
are not loaded by a run of another."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

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
    return importlib.import_module(PACKAGES[canonical_name(name)]).ARCHITECTURE


def model_options(name: str) -> type[BaseModel]:
    """An architecture's model section, imported without the architecture's model."""
    return importlib.import_module(f"{PACKAGES[canonical_name(name)]}.options").ModelOptions


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
