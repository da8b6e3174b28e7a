"""What the reader of a data set section is told: its file, where the targets live in
it (TargetKeys) and its units. Without torch, so that a command can hand its files to a
reader before importing it (data/ahead.py)."""

from __future__ import annotations

from pathlib import Path

from ..data.conventions import TargetKeys, Units
from ..options import DatasetOptions, Options


def _gradient_choice(value, default_key: str) -> tuple[str, bool | None]:
    """(key, read): read True requires the values in every structure, None reads them
    where present. A mapping with the default key is what metatrain's expanded options
    (options_restart.yaml) hold for every energy, periodic or not, and metatrain trains
    without the values where the file lacks them: so does atomtrain."""
    if value is None:
        return default_key, None
    if isinstance(value, bool):
        return default_key, value
    if isinstance(value, str):
        return value, True
    if value.key in (None, default_key):
        return default_key, None
    return value.key, True


def target_keys(dataset: DatasetOptions, require_energy: bool = True) -> TargetKeys:
    energy = dataset.targets.energy
    others = tuple(dataset.targets.specs())
    extra = tuple(options.spec(name) for name, options in dataset.extra_data.items())
    if energy is None:  # mtt:: targets only
        return TargetKeys(
            read_forces=False,
            read_stress=False,
            require_energy=False,
            read_energy=False,
            others=others,
            extra=extra,
            weight=dataset.weight_key,
        )
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
        others=others,
        extra=extra,
        weight=dataset.weight_key,
    )


def reading_of(
    dataset: DatasetOptions, require_energy: bool = True
) -> tuple[Path, TargetKeys, Units]:
    """(file, keys, units) of a section, as load_datasets reads it."""
    energy = dataset.targets.energy
    units = Units(length=dataset.systems.length_unit, energy=energy.unit if energy else "eV")
    return Path(dataset.systems.read_from), target_keys(dataset, require_energy), units


def readings(options: Options) -> list[tuple[Path, TargetKeys, Units]]:
    """What load_datasets reads: each training file, then the validation and test files
    given as lists."""
    found = [
        reading_of(dataset, require_energy=not dataset.pseudo_labels)
        for dataset in options.training_set
    ]
    for section in (options.validation_set, options.test_set):
        if isinstance(section, list):
            found += [reading_of(dataset) for dataset in section]
    return found
