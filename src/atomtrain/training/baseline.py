"""The per-element energy baseline and target scale of a model, from the training data:
each rank adds up its shard's normal equations, one all-reduce, the same solve on every
rank (see models/composition.py)."""

from __future__ import annotations

import logging
import math

import numpy as np
import torch

from ..data.frames import FrameSet
from ..distributed import Context
from ..models.composition import (
    composition_counts,
    determined_directions,
    incomplete_span,
    normal_equation_sums,
    solve_baseline,
    undetermined_directions,
)
from ..models.energy_model import EnergyModel
from ..options import Options
from .evaluation import local_batches, predict
from .outputs import LOGGER_NAME

logger = logging.getLogger(LOGGER_NAME)


def local_share(structures: FrameSet, context: Context) -> np.ndarray:
    """Positions of this rank's shard of ``structures`` (round-robin, as ``shard``)."""
    return np.arange(context.rank, len(structures), context.world_size)


def composition_rows(
    structures: FrameSet, positions: np.ndarray, atomic_types: list[int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """(element counts [n, n_elements], energies [n], NaN where unknown) of the
    structures at ``positions``, in float64, read a chunk at a time."""
    counts, energies = [torch.zeros((0, len(atomic_types)), dtype=torch.float64)], []
    for frames, indices in structures.chunks(positions):
        numbers = np.asarray(frames.numbers[frames.atoms_of(indices)], dtype=np.int64)
        system_index = np.repeat(np.arange(len(indices)), frames.atom_counts[indices])
        counts.append(
            composition_counts(
                torch.from_numpy(numbers),
                torch.from_numpy(system_index),
                len(indices),
                atomic_types,
            )
        )
        if frames.energy is None:
            energies.append(np.full(len(indices), np.nan))
        else:
            energies.append(np.asarray(frames.energy[indices], np.float64) * frames.energy_unit)
    joined = np.concatenate(energies) if energies else np.zeros(0)
    return torch.cat(counts), torch.from_numpy(joined)


def local_compositions(
    structures: FrameSet, context: Context, atomic_types: list[int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """(element counts [n, n_elements], energies [n]) of this rank's shard of
    ``structures`` (training data, with energies)."""
    return composition_rows(structures, local_share(structures, context), atomic_types)


def force_spread(structures: FrameSet, context: Context) -> torch.Tensor:
    """(sum of squared force components, their count) over every rank's shard."""
    spread = torch.zeros(2, dtype=torch.float64)
    for frames, indices in structures.chunks(local_share(structures, context)):
        if frames.forces is None:
            continue
        rows = frames.atoms_of(indices[frames.forces_known[indices]])
        values = np.asarray(frames.forces[rows], np.float64) * (frames.energy_unit / frames.length)
        spread += torch.tensor([(values**2).sum(), values.size], dtype=torch.float64)
    return context.all_reduce_sum(spread)


def by_energy(training: FrameSet, model: EnergyModel) -> list[tuple[int, str, FrameSet]]:
    """(position, name, structures) of each energy the model learns: the training
    structures whose energy is that one."""
    if len(model.energy_names) == 1:  # one energy: the set itself, no index copies
        return [(0, model.energy_names[0], training)]
    variants = training.energy_variants()
    return [
        (position, name, training.subset(np.nonzero(variants == position)[0]))
        for position, name in enumerate(model.energy_names)
    ]


def fit_baseline(
    model: EnergyModel,
    training: FrameSet,
    options: Options,
    context: Context,
    scale_from_forces: bool = False,
) -> None:
    """Each energy's per-element energies and scale (see fit_energy_baseline)."""
    for position, name, structures in by_energy(training, model):
        fit_energy_baseline(model, structures, options, context, scale_from_forces, position, name)


def fit_energy_baseline(
    model: EnergyModel,
    training: FrameSet,
    options: Options,
    context: Context,
    scale_from_forces: bool = False,
    variant: int = 0,
    name: str = "energy",
) -> None:
    """Per-element energies by least squares and the target scale, from all training
    structures: each rank adds up its shard, one all-reduce, the same solve everywhere.
    The fixed atomic_baseline holds for the first energy only (a variant is another
    level of theory, with other atomic energies). ``scale_from_forces``: the
    architecture's choice (Architecture.scale_from_forces)."""
    types = model.atomic_types
    fixed = {int(z): float(e) for z, e in options.architecture.training.atomic_baseline.items()}
    fixed = fixed if variant == 0 else {}
    counts, energies = local_compositions(training, context, types)
    fixed_vector = torch.tensor([fixed.get(z, 0.0) for z in types], dtype=torch.float64)
    free = torch.tensor([z not in fixed for z in types])
    residual = energies - counts @ fixed_vector
    gram, moment = normal_equation_sums(counts[:, free], residual)
    every, _ = normal_equation_sums(counts, residual)
    packed = context.all_reduce_sum(torch.cat([gram.reshape(-1), moment, every.reshape(-1)]))
    n_free, n_types = int(free.sum()), len(types)
    baseline = fixed_vector.clone()
    if n_free:
        baseline[free] = solve_baseline(
            packed[: n_free * n_free].reshape(n_free, n_free),
            packed[n_free * n_free : n_free * (n_free + 1)],
        )
    span = determined_directions(packed[n_free * (n_free + 1) :].reshape(n_types, n_types))
    scale, measured = 1.0, "eV"
    if options.architecture.training.scale_targets:
        spread = torch.zeros(2, dtype=torch.float64)
        if scale_from_forces:
            spread = force_spread(training, context)
        if spread[1] > 0:
            measured = "eV/A, the RMS of the force components"
        else:  # energies: the per-atom spread of what the baseline leaves
            remainder = energies - counts @ baseline
            spread = context.all_reduce_sum(torch.stack([(remainder**2).sum(), counts.sum()]))
        if spread[0] > 0:
            scale = math.sqrt(float(spread[0] / spread[1]))
    target_baseline, target_scale = model.energy_baseline(variant)
    target_baseline.copy_(baseline)
    target_scale.fill_(scale)
    if variant == 0:
        model.baseline_span = span.tolist()
    listing = ", ".join(f"Z={z}: {e:.6f} eV" for z, e in zip(types, baseline.tolist()))
    which = "" if name == "energy" else f" of {name}"
    logger.info(
        f"per-element energy baseline{which}: {listing}; target scale {scale:.6g} {measured}"
    )
    fixed_count = n_types - n_free
    if span.shape[0] < n_types and span.shape[0] + fixed_count < n_types:
        logger.info(
            f"the training compositions fix the per-element energies along {span.shape[0]} "
            f"of {n_types} directions (e.g. every structure has the same composition): "
            "the baseline above is the smallest that gives these compositions their mean "
            "energy, and the split between elements is arbitrary. Training is unaffected (only "
            "these compositions are seen); fine-tuning on other compositions fits the "
            "undetermined part to its data before it starts"
        )


def refit_undetermined_baseline(model: EnergyModel, training: FrameSet, context: Context) -> None:
    """Before fine-tuning: fit the part of the baseline that the pretraining data left
    undetermined (baseline_span) to this run's data, leaving the energies of every
    composition the pretraining saw unchanged. Nothing happens when the span is unknown
    (an older model), complete, or when this data lies within it."""
    types = model.atomic_types
    span = incomplete_span(model.baseline_span, len(types))
    if span is None:
        return
    free = undetermined_directions(span, len(types))  # [n_elements, m]
    counts, energies = local_compositions(training, context, types)
    baseline = model.baseline.detach().cpu().to(torch.float64)
    along = counts @ free
    gram, moment = normal_equation_sums(along, energies - counts @ baseline)
    size = (counts**2).sum().reshape(1)  # the scale of the compositions, for rounding
    packed = context.all_reduce_sum(torch.cat([gram.reshape(-1), moment, size]))
    m = free.shape[1]
    gram = packed[: m * m].reshape(m, m)
    # compositions within the span reach the free directions by rounding only (~1e-30)
    if float(torch.linalg.eigvalsh(gram).max()) <= 1e-10 * float(packed[-1]):
        return
    shift = free @ solve_baseline(gram, packed[m * m : m * m + m])
    model.set_baseline(baseline + shift, float(model.scale))
    model.baseline_span = determined_directions(span.T @ span + free @ gram @ free.T).tolist()
    listing = ", ".join(f"Z={z}: {e:+.6f} eV" for z, e in zip(types, shift.tolist()))
    logger.info(
        "the pretrained baseline left these compositions undetermined: fitted to this "
        f"data, leaving the pretraining compositions' energies as they were ({listing})"
    )


def refit_baseline(
    model: EnergyModel,
    training: FrameSet,
    options: Options,
    context: Context,
    dtype: torch.dtype,
) -> bool:
    """After training (``refit_baseline``): the free per-element energies again by least
    squares, now on what the trained network leaves of the training energies, each
    structure's equation divided by its atom count (the loss's energy per atom). Sums
    over each rank's shard, one all-reduce, the same solve everywhere. Whether it
    refitted (not when switched off, or when nothing is free to fit)."""
    refitted = False
    for position, name, structures in by_energy(training, model):
        refitted |= refit_energy_baseline(
            model, structures, options, context, dtype, position, name
        )
    return refitted


def refit_energy_baseline(
    model: EnergyModel,
    training: FrameSet,
    options: Options,
    context: Context,
    dtype: torch.dtype,
    variant: int = 0,
    name: str = "energy",
    required: bool = False,
) -> bool:
    """refit_baseline for one of the model's energies, on its structures (``required``:
    whatever the options say, as for a new head's start)."""
    training_options = options.architecture.training
    if not (training_options.refit_baseline or required) or not len(training):
        return False
    types = model.atomic_types
    fixed = {int(z) for z in training_options.atomic_baseline} if variant == 0 else set()
    free = torch.tensor([z not in fixed for z in types])
    n_free = int(free.sum())
    if not n_free:
        return False
    gram = torch.zeros((n_free, n_free), dtype=torch.float64)
    moment = torch.zeros(n_free, dtype=torch.float64)
    indices = local_share(training, context).tolist()
    batches = local_batches(
        training,
        indices,
        training_options.batch_size,
        float(model.cutoff),
        training_options.max_atoms_per_batch,
    )
    for _, batch in batches:
        assert batch.energy is not None  # training data has energies
        with torch.no_grad():  # energies only: no graph over the parameters
            predicted = predict(model, batch.to(context.device, dtype), False, False)["energy"]
        atoms = batch.n_atoms.to(torch.float64)
        counts = composition_counts(
            batch.atomic_numbers, batch.system_index, batch.n_structures, types
        )
        residual = batch.energy.to(torch.float64) - predicted.cpu().to(torch.float64)
        batch_gram, batch_moment = normal_equation_sums(
            counts[:, free] / atoms[:, None], residual / atoms
        )
        gram += batch_gram
        moment += batch_moment
    packed = context.all_reduce_sum(torch.cat([gram.reshape(-1), moment]))
    shift = torch.zeros(len(types), dtype=torch.float64)
    shift[free] = solve_baseline(
        packed[: n_free * n_free].reshape(n_free, n_free), packed[-n_free:]
    )
    target_baseline, _ = model.energy_baseline(variant)
    target_baseline.add_(shift.to(target_baseline.device))
    listing = ", ".join(f"Z={z}: {e:+.6f} eV" for z, e in zip(types, shift.tolist()))
    which = "" if name == "energy" else f" of {name}"
    logger.info(
        f"per-element energies{which} refitted to the trained model's residuals ({listing})"
    )
    return True


def target_rows(
    frames, indices: np.ndarray, column, atomic_types: list[int], per_volume: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """(compositions [rows, n_elements], values [rows, width]) of an mtt:: target over
    the structures ``indices`` of ``frames`` that have it: a row per structure, or per
    atom (its element one-hot) for a per-atom target. ``per_volume``: the values times
    their cells' volumes (the sums of the atoms' contributions), of periodic structures
    only."""
    indices = indices[column.known[indices]]
    if per_volume:
        indices = indices[np.asarray(frames.pbc[indices]).any(axis=1)]
        volumes = np.abs(np.linalg.det(frames.cells[indices] * frames.length))
    lookup = np.full(max(atomic_types) + 1, -1, dtype=np.int64)
    lookup[atomic_types] = np.arange(len(atomic_types))
    rows = frames.atoms_of(indices)
    elements = lookup[np.asarray(frames.numbers[rows], dtype=np.int64)]
    if column.per_atom:
        counts = np.zeros((len(rows), len(atomic_types)))
        counts[np.arange(len(rows)), elements] = 1.0
        return counts, np.asarray(column.values[rows], dtype=np.float64)
    system = np.repeat(np.arange(len(indices)), frames.atom_counts[indices])
    counts = np.zeros((len(indices), len(atomic_types)))
    np.add.at(counts, (system, elements), 1.0)
    values = np.asarray(column.values[indices], dtype=np.float64)
    return counts, values * volumes[:, None] if per_volume else values


def fit_target_baselines(
    model: EnergyModel, training: FrameSet, context: Context, only: set[str] | None = None
) -> None:
    """Each mtt:: head's per-element baseline (of its o3_lambda 0 part, by least
    squares, as the energy's) and scale (the RMS of what the baseline leaves, per atom
    and value), from every rank's share as sums: the same for any number of processes.
    ``only``: the heads to fit (all by default)."""
    types = model.atomic_types
    for spec, head in zip(model.target_specs(), model.heads):
        if only is not None and spec.name not in only:
            continue
        n_sub = spec.num_subtargets
        gram = torch.zeros((len(types), len(types)), dtype=torch.float64)
        moment = torch.zeros((len(types), n_sub), dtype=torch.float64)
        gathered = []
        for frames, indices in training.chunks(local_share(training, context)):
            column = frames.targets.get(spec.name)
            if column is None:
                continue
            counts, values = target_rows(frames, indices, column, types, spec.per_volume)
            gathered.append((counts, values))
            isotropic = spec.isotropic(values)
            if isotropic is not None:
                part_gram, part_moment = normal_equation_sums(
                    torch.from_numpy(counts), torch.from_numpy(isotropic)
                )
                gram += part_gram
                moment += part_moment
        packed = context.all_reduce_sum(torch.cat([gram.reshape(-1), moment.reshape(-1)]))
        baseline = torch.zeros((len(types), n_sub), dtype=torch.float64)
        if spec.isotropic_positions() is not None:
            baseline = solve_baseline(
                packed[: len(types) ** 2].reshape(len(types), len(types)),
                packed[len(types) ** 2 :].reshape(len(types), n_sub),
            )
        spread = torch.zeros(2, dtype=torch.float64)
        for counts, values in gathered:
            residual = spec.without_isotropic(values, counts @ baseline.numpy())
            # a structure's value is a sum over its atoms: its spread per atom
            spread += torch.tensor([(residual**2).sum(), counts.sum() * values.shape[1]])
        spread = context.all_reduce_sum(spread)
        scale = math.sqrt(float(spread[0] / spread[1])) if spread[0] > 0 else 1.0
        head.baseline.copy_(baseline)
        head.scale.fill_(scale)
        listing = ", ".join(
            f"Z={z}: {', '.join(f'{v:.6g}' for v in row)}"
            for z, row in zip(types, baseline.tolist())
        )
        fitted = f"per-element baseline {listing}; " if spec.isotropic_positions() else ""
        if spec.per_volume:  # fitted to the values times the volume: the virial's units
            logger.info(f"{spec.name} times the cell volume: {fitted}scale {scale:.6g}")
        else:
            logger.info(f"{spec.name}: {fitted}scale {scale:.6g} {spec.unit}".rstrip())
