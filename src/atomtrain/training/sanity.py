"""A physicist's look at the training data before a step is taken: neighbors per atom
within the model's cutoff, the shortest interatomic distances, the energies per atom and
the force scale. Mistakes of units or cutoff (positions in nm declared as angstrom, eV
declared as meV, a 30 A cutoff) pass every syntactic check and cost a whole run; here
they are caught by values no atomistic data set has.

The survey reads a fixed sample of the training structures (the first ones of a seeded
order, up to a budget of structures and neighbor pairs), the same on every rank, so it
needs no collective and every rank reaches the same verdict. The thresholds come from
the shared data sets (docs/sanity.md gives their values there)."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import numpy as np
import torch
from ase.data import covalent_radii

from ..data.conventions import SUSPECT_DISTANCE
from ..data.frames import FrameSet
from ..data.neighbors import compute_neighbor_list
from ..errors import DataError
from ..models.composition import normal_equation_sums, solve_baseline
from ..options import DatasetOptions
from ..units import ENERGY_UNITS, LENGTH_UNITS
from .outputs import LOGGER_NAME

logger = logging.getLogger(LOGGER_NAME)

SURVEY_STRUCTURES = 1000
"""At most this many training structures are surveyed (a seeded sample beyond)."""
SURVEY_PAIRS = 2_000_000
"""The survey stops adding structures beyond this many neighbor pairs (a 30 A cutoff
on a metal gives ~10,000 neighbors per atom: a few cells suffice to say so)."""

# Thresholds (docs/sanity.md lists what the shared data sets give for each).
MOST_ATOMS_ISOLATED = 0.5
"""Warn when more than this fraction of atoms has no neighbor within the cutoff."""
MANY_NEIGHBORS = 500
"""Warn when atoms have more neighbors than this on average: each step then costs
seconds and gigabytes (a 30 A cutoff on bcc iron: 29.5 s and 6.3 GB a step)."""
SHORT_RATIO, LONG_RATIO = 0.6, 1.6
"""Bounds on the typical (median over structures) nearest-neighbor distance as a
fraction of the sum of the two atoms' covalent radii: the shared data sets give
0.81-1.01; angstrom read as bohr gives 0.53, bohr read as angstrom 1.89."""
ENERGY_SPREAD = (1e-4, 10.0)
"""Plausible spread (eV per atom) of the energies about a per-element baseline."""
FORCE_SCALE = (0.02, 20.0)
"""Plausible RMS of the force components (eV/A)."""


@dataclass
class Survey:
    """What the survey measured, in angstrom and eV."""

    structures: int  # surveyed
    searched: int  # of which searched for neighbors (up to SURVEY_PAIRS pairs)
    of: int  # training structures in all
    cutoff: float
    neighbor_counts: np.ndarray  # per surveyed atom
    nearest: np.ndarray  # per structure with two atoms or more: its shortest distance
    nearest_ratio: np.ndarray  # the same over the sum of that pair's covalent radii
    energy_per_atom: np.ndarray  # per surveyed structure with an energy
    energy_spread: float | None  # RMS per atom about a per-element least-squares fit
    force_rms: float | None


def survey(training: FrameSet, cutoff: float, budget: int = SURVEY_STRUCTURES) -> Survey:
    """Neighbors, distances, energies and forces of a fixed sample of ``training`` (at
    most ``budget`` structures)."""
    order = np.arange(len(training))
    if len(training) > budget:
        order = np.random.default_rng(0).permutation(len(training))
    counts, nearest, ratios = [], [], []
    energies, compositions, atoms_with_energy = [], [], []
    force_squares, force_components = 0.0, 0
    pairs = 0
    searched = 0
    for position in order[:budget]:
        frames, index = training.locate(int(position))
        start, end = int(frames.offsets[index]), int(frames.offsets[index + 1])
        numbers = np.asarray(frames.numbers[start:end], dtype=np.int64)
        if pairs <= SURVEY_PAIRS:
            neighbors = frames.neighbors(index, cutoff)
            first, second = neighbors.first.numpy(), neighbors.second.numpy()
            counts.append(
                np.bincount(first, minlength=len(numbers))
                + np.bincount(second, minlength=len(numbers))
            )
            pairs += 2 * len(first)
            searched += 1
            shortest = nearest_pair(frames, index, numbers, cutoff, (first, second, neighbors))
            if shortest is not None:
                nearest.append(shortest[0])
                ratios.append(shortest[1])
        if frames.energy is not None and frames.energy_known[index]:
            energies.append(float(frames.energy[index]) * frames.energy_unit)
            compositions.append(np.bincount(numbers, minlength=119))
            atoms_with_energy.append(len(numbers))
        if frames.forces is not None and frames.forces_known[index]:
            values = frames.forces_of(start, end)
            force_squares += float((values**2).sum())
            force_components += values.size
    atoms = np.asarray(atoms_with_energy, dtype=np.float64)
    energy = np.asarray(energies)
    return Survey(
        structures=min(budget, len(training)),
        searched=searched,
        of=len(training),
        cutoff=cutoff,
        neighbor_counts=np.concatenate(counts) if counts else np.zeros(0, np.int64),
        nearest=np.asarray(nearest),
        nearest_ratio=np.asarray(ratios),
        energy_per_atom=energy / atoms if len(energy) else energy,
        energy_spread=baseline_spread(np.asarray(compositions), energy, atoms),
        force_rms=math.sqrt(force_squares / force_components) if force_components else None,
    )


def nearest_pair(
    frames, index: int, numbers: np.ndarray, cutoff: float, within
) -> tuple[float, float] | None:
    """(shortest distance, its ratio to the pair's covalent radii) of one structure,
    searching beyond the cutoff (doubling it up to 64 A) when no pair lies within."""
    if len(numbers) < 2:
        return None
    positions, cell = frames.positions_of(index), frames.cell_of(index)
    first, second, neighbors = within
    radius = cutoff
    while len(first) == 0 and radius < 64.0:
        radius *= 2
        neighbors = compute_neighbor_list(positions, cell, frames.pbc[index], radius)
        first, second = neighbors.first.numpy(), neighbors.second.numpy()
    if len(first) == 0:
        return None
    shifts = neighbors.cell_shifts.numpy().astype(np.float64)
    vectors = positions[second] - positions[first] + shifts @ cell
    distances = np.linalg.norm(vectors, axis=1)
    closest = int(np.argmin(distances))
    bonded = covalent_radii[numbers[first[closest]]] + covalent_radii[numbers[second[closest]]]
    return float(distances[closest]), float(distances[closest] / bonded)


def baseline_spread(compositions: np.ndarray, energies: np.ndarray, atoms: np.ndarray):
    """RMS per atom of what a per-element least-squares fit leaves of the energies (the
    spread a model learns), or None without two energies."""
    if len(energies) < 2:
        return None
    counts = torch.from_numpy(compositions[:, compositions.any(axis=0)].astype(np.float64))
    baseline = solve_baseline(*normal_equation_sums(counts, torch.from_numpy(energies)))
    remainder = (energies - (counts @ baseline).numpy()) / atoms
    return float(np.sqrt(np.mean(remainder**2)))


def report(found: Survey, length_unit: str, energy_unit: str) -> str:
    """The survey as the log gives it: lengths in angstrom, energies in the file's
    declared energy unit (and in eV)."""
    counts = found.neighbor_counts
    sample = (
        f"{found.structures} of {found.of} training structures"
        if found.structures < found.of
        else f"{found.of} training structures"
    )
    converted = "" if LENGTH_UNITS[length_unit.strip().lower()] == 1.0 else f" from {length_unit}"
    lines = [f"data survey ({sample}; lengths in angstrom{converted}):"]
    if counts.size:
        quartiles = np.percentile(counts, [0, 25, 50, 75, 100])
        among = "" if found.searched == found.structures else f" (in {found.searched})"
        lines.append(
            f"  neighbors per atom within {found.cutoff:g} A{among}: mean {counts.mean():.1f}, "
            "min / 25% / median / 75% / max "
            + " / ".join(f"{value:g}" for value in quartiles)
            + f"; without neighbors: {np.mean(counts == 0) * 100:.1f}% of atoms"
        )
    if found.nearest.size:
        lines.append(
            f"  shortest interatomic distance: {found.nearest.min():.3f} A; per structure, "
            f"median {np.median(found.nearest):.3f} A, {np.median(found.nearest_ratio):.2f} "
            "of the covalent radii's sum"
        )
    unit = ENERGY_UNITS[energy_unit.strip().lower()]
    if found.energy_per_atom.size:
        mean, spread = found.energy_per_atom.mean(), found.energy_per_atom.std()
        text = f"  energy per atom: mean {in_units(mean, unit, energy_unit)}, spread (std) "
        text += in_units(spread, unit, energy_unit)
        if found.energy_spread is not None:
            text += "; about a per-element baseline " + in_units(
                found.energy_spread, unit, energy_unit
            )
        lines.append(text)
    if found.force_rms is not None:
        lines.append(
            "  force scale (RMS of the components): "
            + in_units(found.force_rms, unit, energy_unit, "/A")
        )
    return "\n".join(lines)


def in_units(value: float, unit: float, name: str, per: str = "") -> str:
    """A value in eV, shown in the declared unit (and in eV when that differs)."""
    if unit == 1.0:
        return f"{value:.4g} eV{per}"
    return f"{value / unit:.4g} {name}{per} ({value:.4g} eV{per})"


@dataclass
class Finding:
    name: str  # a key of WARNINGS
    text: str


def findings(found: Survey, length_unit: str, energy_unit: str) -> list[Finding]:
    """What looks wrong: each a sentence that says what is odd and what would fix it.
    Raises DataError where training cannot be meaningful (no atom has a neighbor)."""
    result = []
    counts = found.neighbor_counts
    suggestion = length_suggestion(found, length_unit)
    if counts.size and not counts.any():
        raise DataError(
            f"no atom of the {found.searched} surveyed training structures has a "
            f"neighbor within the cutoff of {found.cutoff:g} A"
            + (
                f" (the nearest neighbors are {np.median(found.nearest):.3g} A apart)"
                if found.nearest.size
                else ""
            )
            + f": the model would see isolated atoms only; {suggestion or 'raise the cutoff'}"
        )
    if counts.size and np.mean(counts == 0) > MOST_ATOMS_ISOLATED:
        result.append(
            Finding(
                "isolated_atoms",
                f"{np.mean(counts == 0) * 100:.0f}% of the atoms have no neighbor within the "
                f"cutoff of {found.cutoff:g} A; {suggestion or 'raise the cutoff'}",
            )
        )
    if counts.size and counts.mean() > MANY_NEIGHBORS:
        smaller = found.cutoff * (MANY_NEIGHBORS / 5 / counts.mean()) ** (1 / 3)
        result.append(
            Finding(
                "many_neighbors",
                f"atoms have {counts.mean():.0f} neighbors on average within the cutoff of "
                f"{found.cutoff:g} A (typical potentials see 10-100): every step costs "
                f"seconds and gigabytes; a cutoff near {smaller:.1f} A gives about "
                f"{MANY_NEIGHBORS // 5}",
            )
        )
    if found.nearest.size:
        typical = float(np.median(found.nearest_ratio))
        if typical < SHORT_RATIO or found.nearest.min() < SUSPECT_DISTANCE:
            result.append(
                Finding(
                    "short_distances",
                    f"the nearest neighbors are {typical:.2f} times the sum of their "
                    f"covalent radii apart (typical data: 0.8-1.2), and the shortest "
                    f"distance is {found.nearest.min():.3f} A; "
                    + (suggestion or "check the positions"),
                )
            )
        elif typical > LONG_RATIO:
            result.append(
                Finding(
                    "long_distances",
                    f"the nearest neighbors are {typical:.2f} times the sum of their "
                    f"covalent radii apart (typical data: 0.8-1.2); "
                    f"{suggestion or 'check the positions and length_unit'}",
                )
            )
    result += energy_findings(found, energy_unit)
    return result


def length_suggestion(found: Survey, length_unit: str) -> str | None:
    """'if the positions are in X, declare length_unit: X', for the known unit that
    brings the nearest neighbors closest to bonded distances, when it is not the
    declared one."""
    if not found.nearest.size:
        return None
    declared = LENGTH_UNITS[length_unit.strip().lower()]
    typical = float(np.median(found.nearest_ratio))
    names = {"angstrom": 1.0, "bohr": LENGTH_UNITS["bohr"], "nm": LENGTH_UNITS["nm"]}
    best = min(names, key=lambda name: abs(math.log(names[name] * typical / declared)))
    if math.isclose(names[best], declared):
        return None
    return (
        f"if the positions are in {best}, declare systems.length_unit: {best} (it is {length_unit})"
    )


def energy_findings(found: Survey, energy_unit: str) -> list[Finding]:
    """Energies and forces far from any atomistic data set's, with the unit that would
    bring them back."""
    declared = ENERGY_UNITS[energy_unit.strip().lower()]
    checks = [
        (
            "energy_spread",
            found.energy_spread,
            ENERGY_SPREAD,
            "the energies spread {} eV per "
            "atom about a per-element baseline (typical data: {}-{} eV per atom)",
        ),
        (
            "force_scale",
            found.force_rms,
            FORCE_SCALE,
            "the forces' RMS component is {} eV/A (typical data: {}-{} eV/A)",
        ),
    ]
    result = []
    for name, value, (low, high), text in checks:
        if value is not None and value > 0 and not low <= value <= high:
            suggestion = energy_suggestion(value, (low * high) ** 0.5, declared, energy_unit)
            said = text.format(f"{value:.3g}", f"{low:g}", f"{high:g}")
            result.append(Finding(name, f"{said}; {suggestion}"))
    return result


def energy_suggestion(value: float, typical: float, declared: float, name: str) -> str:
    """The energy unit that would bring ``value`` (eV) nearest to ``typical``."""
    names = {"eV": 1.0, "meV": 1e-3, "hartree": ENERGY_UNITS["hartree"]}
    names["kcal/mol"] = ENERGY_UNITS["kcal/mol"]
    best = min(names, key=lambda key: abs(math.log(value * names[key] / declared / typical)))
    if math.isclose(names[best], declared):
        return "check the data"
    return (
        f"if the file's energies are in {best}, declare the energy target's unit: {best} "
        f"(it is {name})"
    )


def check_training_data(
    sections: list[DatasetOptions],
    files: list[tuple[str, FrameSet]],
    cutoff: float,
    silenced: list[str],
) -> int:
    """Survey each training file, log the report and warn of what looks wrong (unless
    silenced); raise DataError where training cannot be meaningful. Returns how many
    warnings were given."""
    budget = max(SURVEY_STRUCTURES // max(len(files), 1), 100)
    warned = 0
    for dataset, (path, structures) in zip(sections, files):
        if not len(structures):
            continue
        length_unit = dataset.systems.length_unit
        energy = dataset.targets.energy
        energy_unit = energy.unit if energy is not None else "eV"
        found = survey(structures, cutoff, budget)
        logger.info(f"{path}: " + report(found, length_unit, energy_unit))
        try:
            problems = findings(found, length_unit, energy_unit)
        except DataError as error:
            raise DataError(f"{path}: {error}") from None
        for finding in problems:
            if finding.name not in silenced:
                logger.warning(
                    f"{path}: {finding.text} (silence with silence_warnings: [{finding.name}])"
                )
                warned += 1
    return warned
