"""From the options' data sections to training, validation and test structures."""

from __future__ import annotations

from dataclasses import dataclass

from ..data.extxyz import TargetKeys, Units, read_structures
from ..data.split import split_indices
from ..data.system import Structure
from ..errors import DataError
from ..options import DatasetOptions, Options


def _gradient_choice(value, default_key: str) -> tuple[str, bool | None]:
    if value is None:
        return default_key, None
    if isinstance(value, bool):
        return default_key, value
    if isinstance(value, str):
        return value, True
    return value.key or default_key, True


def target_keys(dataset: DatasetOptions, require_energy: bool = True) -> TargetKeys:
    energy = dataset.targets.energy
    forces_key, read_forces = _gradient_choice(energy.forces, "forces")
    stress_key, read_stress = _gradient_choice(energy.stress, "stress")
    virial_key, read_virial = _gradient_choice(energy.virial, "virial")
    if read_stress is None and read_virial:
        read_stress = True
    return TargetKeys(
        energy=energy.key,
        forces=forces_key,
        stress=stress_key,
        virial=virial_key,
        read_forces=read_forces,
        read_stress=read_stress,
        require_energy=require_energy,
    )


def read_dataset(dataset: DatasetOptions, require_energy: bool = True) -> list[Structure]:
    for holder in dataset.targets.energy.file_holders():
        elsewhere = holder.read_from
        if elsewhere not in (None, dataset.systems.read_from):
            raise DataError(
                f"{elsewhere}: targets must be read from the systems file "
                f"{dataset.systems.read_from}"
            )
    return read_structures(
        dataset.systems.read_from,
        target_keys(dataset, require_energy),
        Units(length=dataset.systems.length_unit, energy=dataset.targets.energy.unit),
    )


@dataclass
class Datasets:
    training: list[Structure]
    validation: list[Structure]
    test: list[Structure]
    split: dict[str, list[int]]  # indices into the training file, for the record


def elements(structures: list[Structure]) -> set[int]:
    """Atomic numbers present in ``structures``."""
    found: set[int] = set()
    for structure in structures:
        found.update(structure.atomic_numbers.unique().tolist())
    return found


def load_datasets(options: Options, seed: int) -> Datasets:
    """Read the files, split off fractions with ``seed``, check the result is usable."""
    source = options.training_set.systems.read_from
    structures = read_dataset(options.training_set)
    fractions = [
        value if isinstance(value, float) else 0.0
        for value in (options.validation_set, options.test_set)
    ]
    training_indices, validation_indices, test_indices = split_indices(
        len(structures), fractions, seed
    )
    training = [structures[index] for index in training_indices]
    if not training:
        raise DataError(
            f"{source}: no training structure is left after splitting off validation and "
            "test fractions; lower the fractions or add data"
        )
    others = {}
    for name, value, indices in (
        ("validation_set", options.validation_set, validation_indices),
        ("test_set", options.test_set, test_indices),
    ):
        if isinstance(value, DatasetOptions):
            others[name] = read_dataset(value)
        else:
            others[name] = [structures[index] for index in indices]
    known = elements(training)
    for name, part in others.items():
        missing = elements(part) - known
        if missing:
            raise DataError(
                f"{name} contains atomic numbers {sorted(missing)} that the training set "
                f"({source}) lacks; the model cannot predict them. Add such structures "
                "to the training set"
            )
    return Datasets(
        training=training,
        validation=others["validation_set"],
        test=others["test_set"],
        split={
            "training": training_indices,
            "validation": validation_indices,
            "test": test_indices,
        },
    )
