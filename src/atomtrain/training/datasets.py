"""From the options' data sections to training, validation and test sets: each a
:class:`FrameSet` over the files' arrays (a split chooses indices, it copies nothing)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..data.frames import FrameSet
from ..data.reading import read_structures
from ..data.split import split_indices
from ..errors import DataError, OptionsError
from ..options import DatasetOptions, Options
from .dataset_keys import reading_of


def read_dataset(dataset: DatasetOptions, require_energy: bool = True) -> FrameSet:
    energy = dataset.targets.energy
    holders = [
        *(energy.file_holders() if energy else []),
        *dataset.targets.others.values(),
        *dataset.extra_data.values(),
    ]
    for holder in holders:
        elsewhere = holder.read_from
        if elsewhere not in (None, dataset.systems.read_from):
            raise DataError(
                f"{elsewhere}: targets must be read from the systems file "
                f"{dataset.systems.read_from}"
            )
    structures = read_structures(*reading_of(dataset, require_energy))
    for frames in structures.parts:
        frames.energy_name = dataset.targets.energy_name
        if dataset.weight != 1.0:
            given = frames.weights if frames.weights is not None else np.ones(len(frames))
            frames.weights = given * dataset.weight
    return structures


@dataclass
class Datasets:
    training: FrameSet
    validation: FrameSet
    test: FrameSet
    # indices into each training file, for the record: {part: indices} for one file,
    # [{file, part: indices}] for several
    split: dict[str, list[int]] | list[dict]
    # each part's structures file by file ("training", "validation", "test"), for
    # metrics per file
    files: dict[str, list[tuple[str, FrameSet]]]
    # each training file's (first position in the training set, structures, epoch_fraction)
    shares: tuple[tuple[int, int, float], ...] = ()
    # training structures of weight 0, left out
    left_out: int = 0


def read_files(
    section: list[DatasetOptions], require_energy: bool = True
) -> list[tuple[str, FrameSet]]:
    """Each file of a data set section with its structures, in order."""
    return [
        (dataset.systems.read_from, read_dataset(dataset, require_energy)) for dataset in section
    ]


def file_labels(paths: list[str]) -> list[str]:
    """Names for files in a table of metrics: their names, their paths where names repeat,
    numbered where the same file is listed twice."""
    labels = [Path(path).name for path in paths]
    if len(set(labels)) < len(labels):
        labels = list(paths)
    if len(set(labels)) < len(labels):
        labels = [f"{label} ({position + 1})" for position, label in enumerate(labels)]
    return labels


def known_elements(options: Options, training: FrameSet, sources: str) -> tuple[set, str]:
    """The elements the model will know, and what to say of an element it does not."""
    listed = options.architecture.atomic_types
    finetune = options.architecture.training.finetune
    if finetune is not None:
        return set(listed or ()), (
            f"that the model fine-tuned from {finetune.read_from} lacks (it knows {listed}); "
            "fine-tune on structures of those elements only"
        )
    if listed:
        return set(listed), (
            f"that architecture.atomic_types {listed} lacks; add them to atomic_types or "
            "leave it unset"
        )
    return training.elements(), (
        f"that the training set ({sources}) lacks; the model cannot predict them. Add such "
        "structures to the training set, or list them in architecture.atomic_types"
    )


def load_datasets(
    options: Options, seed: int, label: Callable[[str, FrameSet], None] | None = None
) -> Datasets:
    """Read the files, split off fractions of each training file (with ``seed`` plus the
    file's position in the list), check the result is usable. ``label``: what gives the
    structures of a ``pseudo_labels`` section (its file, its structures) their labels."""
    sources = ", ".join(dataset.systems.read_from for dataset in options.training_set)
    fractions = [
        value if isinstance(value, float) else 0.0
        for value in (options.validation_set, options.test_set)
    ]
    files: dict[str, list[tuple[str, FrameSet]]] = {
        "training": [],
        "validation": [],
        "test": [],
    }
    split: list[dict] = []
    shares: list[tuple[int, int, float]] = []
    start, left_out = 0, 0
    for position, dataset in enumerate(options.training_set):
        structures = read_dataset(dataset, require_energy=not dataset.pseudo_labels)
        if dataset.pseudo_labels:
            if label is None:
                raise OptionsError(
                    f"training_set: {dataset.systems.read_from} has pseudo_labels: true, "
                    "but the run starts from no model to label it; set "
                    "architecture.training.finetune.read_from, or remove pseudo_labels"
                )
            label(dataset.systems.read_from, structures)
        indices = split_indices(len(structures), fractions, seed + position)
        record = dict(zip(files, indices))
        for part, chosen in record.items():
            chosen_set = structures.subset(chosen)
            weighted = any(frames.weights is not None for frames in chosen_set.parts)
            if part == "training" and weighted:  # weight 0: validated, not trained on
                kept = np.nonzero(chosen_set.weights() > 0)[0]
                left_out += len(chosen_set) - len(kept)
                chosen_set = chosen_set.subset(kept) if len(kept) < len(chosen_set) else chosen_set
            if part == "training":
                shares.append((start, len(chosen_set), dataset.epoch_fraction))
                start += len(chosen_set)
            files[part].append((dataset.systems.read_from, chosen_set))
        split.append({"file": dataset.systems.read_from, **record})
    for part, section in (("validation", options.validation_set), ("test", options.test_set)):
        if isinstance(section, list):
            for dataset in section:
                if dataset.pseudo_labels:
                    raise OptionsError(
                        f"{part}_set: {dataset.systems.read_from} has pseudo_labels: true, "
                        "which only a training_set section takes; remove it"
                    )
            files[part] = read_files(section)
    joined = {
        part: FrameSet.joined([structures for _, structures in entries])
        for part, entries in files.items()
    }
    if not joined["training"]:
        raise DataError(
            f"{sources}: no training structure is left after splitting off validation and "
            "test fractions; lower the fractions or add data"
        )
    known, lacking = known_elements(options, joined["training"], sources)
    for name, part in (
        ("training_set", "training"),
        ("validation_set", "validation"),
        ("test_set", "test"),
    ):
        missing = joined[part].elements() - known
        if missing:
            raise DataError(f"{name} contains atomic numbers {sorted(missing)} {lacking}")
    return Datasets(
        training=joined["training"],
        validation=joined["validation"],
        test=joined["test"],
        split={part: split[0][part] for part in files} if len(split) == 1 else split,
        files=files,
        shares=tuple(shares) if any(share[2] != 1.0 for share in shares) else (),
        left_out=left_out,
    )
