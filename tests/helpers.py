"""Small shared helpers for the tests."""

from __future__ import annotations

import ase
import torch

from atomtrain.data import collate, read_structures
from atomtrain.data.system import Structure
from atomtrain.models import SoapBpnn
from atomtrain.training.evaluation import predict

SMALL_HYPERS = dict(
    cutoff=4.0,
    cutoff_width=0.5,
    max_radial=3,
    max_angular=3,
    num_hidden_layers=2,
    num_neurons_per_layer=16,
)


def small_model(atomic_types, dtype=torch.float64, seed=0, **changes) -> SoapBpnn:
    torch.manual_seed(seed)
    hypers = {**SMALL_HYPERS, **changes}
    model = SoapBpnn(atomic_types, **hypers).set_precision(dtype)
    # non-trivial baseline and scale, so that they are exercised too
    model.set_baseline(torch.linspace(-3.0, -1.0, len(model.atomic_types)), 0.7)
    return model


def structure_from_atoms(atoms: ase.Atoms) -> Structure:
    return Structure(
        positions=torch.tensor(atoms.positions, dtype=torch.float64),
        atomic_numbers=torch.tensor(atoms.numbers, dtype=torch.long),
        cell=torch.tensor(atoms.cell.array, dtype=torch.float64),
        pbc=torch.tensor(atoms.pbc),
    )


def run_model(
    model, structures, forces=True, stress=False, dtype=torch.float64, create_graph=False
):
    batch = collate(structures, model.cutoff).to("cpu", dtype)
    return predict(model, batch, forces, stress, create_graph)


def read(path, **keys):
    return read_structures(path, **keys)


def write_options(directory, data_file, **changes):
    """A small, fast options file (float64, tiny SOAP) in ``directory``."""
    import yaml

    options = {
        "seed": 5,
        "device": "cpu",
        "base_precision": 64,
        "architecture": {
            "name": "soap_bpnn",
            "model": {
                "soap": {
                    "cutoff": {"radius": 4.0, "width": 0.5},
                    "max_radial": 3,
                    "max_angular": 3,
                },
                "bpnn": {"num_hidden_layers": 2, "num_neurons_per_layer": 16},
            },
            "training": {
                "batch_size": 6,
                "num_epochs": 3,
                "learning_rate": 0.005,
                "checkpoint_interval": 2,
            },
        },
        "training_set": {"systems": {"read_from": str(data_file)}},
        "validation_set": 0.2,
        "test_set": 0.1,
    }
    for dotted, value in changes.items():
        target = options
        parts = dotted.split("__")
        for part in parts[:-1]:
            target = target.setdefault(part, {})
        target[parts[-1]] = value
    path = directory / "options.yaml"
    path.write_text(yaml.safe_dump(options))
    return path


def checkpoint_weights(path):
    import torch

    return torch.load(path, weights_only=True)["best_model_state"]


def run_directories(outputs):
    return sorted(path.parent for path in outputs.glob("*/*/train.log"))
