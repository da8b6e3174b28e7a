"""SOAP-BPNN's :class:`~atomtrain.models.architecture.Architecture`: how it is built,
checked on a device and exported (the package's docstring says what it is)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..architecture import Architecture, DataFacts
from . import ARCHITECTURE_NAME
from .harmonics_library import check_harmonics_on, import_sphericart_torch
from .options import ModelOptions

if TYPE_CHECKING:
    from .model import SoapBpnn


REFERENCES = {
    "implementation": ["atomtrain: https://github.com/atomtrain/atomtrain"],
    "architecture": [
        "SOAP: A. P. Bartók, R. Kondor, G. Csányi, Phys. Rev. B 87, 184115 (2013), "
        "https://doi.org/10.1103/PhysRevB.87.184115",
        "Behler-Parrinello networks: J. Behler, M. Parrinello, Phys. Rev. Lett. 98, 146401 "
        "(2007), https://doi.org/10.1103/PhysRevLett.98.146401",
    ],
}


def upgrade_hypers(hypers: dict[str, Any]) -> dict[str, Any]:
    """Records before architectures were plug-ins held the constructor's flat keyword
    arguments (cutoff, max_radial, ...); today's hold the model section."""
    if "model" in hypers:
        return hypers
    return {
        "architecture": ARCHITECTURE_NAME,
        "atomic_types": hypers["atomic_types"],
        "model": {
            "soap": {
                "cutoff": {"radius": hypers["cutoff"], "width": hypers["cutoff_width"]},
                "max_radial": hypers["max_radial"],
                "max_angular": hypers["max_angular"],
            },
            "bpnn": {
                "num_hidden_layers": hypers["num_hidden_layers"],
                "num_neurons_per_layer": hypers["num_neurons_per_layer"],
                "layernorm": hypers["layernorm"],
            },
        },
    }


def head_modules(options: ModelOptions) -> tuple[str, ...]:
    """The last layer of every element's network."""
    return (f"networks.networks.*.{2 * options.bpnn.num_hidden_layers}",)


def build(options: ModelOptions, facts: DataFacts) -> SoapBpnn:
    from .model import SoapBpnn

    return SoapBpnn(facts.atomic_types, options)


ARCHITECTURE = Architecture(
    name=ARCHITECTURE_NAME,
    display_name="SOAP-BPNN",
    model_options=ModelOptions,
    build=build,
    references=REFERENCES,
    summary="SOAP power spectrum (sphericart) and one network per element",
    install="none",
    check_device=check_harmonics_on,
    extensions=("sphericart",),
    load_extensions=import_sphericart_torch,
    upgrade_hypers=upgrade_hypers,
    learns_other_targets=True,
    # its compiled step took 0.91-0.94x the eager one's time, 0.3-0.8 ms less (ethanol,
    # silicon, batch 8, float32), and compiling takes 5-35 s (docs/performance-notes.md)
    compile_pays_after=50000,
    head_modules=head_modules,
)
