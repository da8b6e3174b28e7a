"""The evaluation of ``atomtrain eval`` (cli/eval.py checks its arguments and data
description first, before torch is imported)."""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

import ase
import ase.io
import ase.units
import numpy as np
import torch

from ..data.extxyz import read_frames
from ..data.frames import FrameSet
from ..errors import DataError, OptionsError
from ..io import atomic_write
from ..models.composition import incomplete_span, outside_span, undetermined_note
from ..models.export import BASELINE_SPAN_FILE, learnt_targets, load_exported
from ..options import DatasetOptions
from ..runtime import BusyCores
from ..training.baseline import composition_rows
from ..training.checkpoint import best_model, is_checkpoint
from ..training.datasets import file_labels, read_files
from ..training.evaluation import local_batches, predict
from ..training.figures import cancel_early, parity_plot, started_early
from ..training.llpr import predicted_uncertainties
from ..training.metrics import MetricSums, finalize
from ..training.outputs import LOGGER_NAME
from ..training.reports import metrics_table

logger = logging.getLogger(LOGGER_NAME)


def check_elements(model_path: Path, files: list[tuple[str, FrameSet]], known: list[int]) -> None:
    """Every element of the data must be one the model was trained for."""
    for path, structures in files:
        unknown = sorted(structures.elements() - set(known))
        if unknown:
            raise DataError(
                f"{path} holds atomic numbers {unknown} that the model {model_path} was not "
                f"trained on (it knows {known}); evaluate it on structures of those elements"
            )


def warn_undetermined(
    span: list[list[float]] | None, known: list[int], files: list[tuple[str, FrameSet]]
) -> None:
    """Warn once when structures have compositions whose per-element energies the
    model's training data left undetermined (``span``: the determined directions)."""
    directions = incomplete_span(span, len(known))
    if directions is None:
        return
    outside, total, where = 0, 0, []
    for path, structures in files:
        counts, _ = composition_rows(structures, np.arange(len(structures)), known)
        found = int(outside_span(directions, counts).sum())
        outside, total = outside + found, total + len(structures)
        if found:
            where.append(Path(path).name)
    if outside:
        files_named = ", ".join(where)
        logger.warning(undetermined_note(f"{outside} of {total} structures ({files_named}) have"))


def prediction_key(name: str) -> str:
    """Where a target's predictions go in the predictions file: predicted_mtt_dipole for
    mtt::dipole (extended XYZ's per-atom columns are separated by colons)."""
    return "predicted_" + name.replace("::", "_")


def uncertainty_key(name: str) -> str:
    """Where a target's LLPR uncertainties go in the predictions file: mtt_dipole_uncertainty
    for mtt::dipole."""
    return name.replace("::", "_") + "_uncertainty"


def check_energies(model_path: Path, files: list[tuple[str, FrameSet]], names: list[str]) -> None:
    """Each file's energy (its section's ``energy`` or ``energy/<variant>``) is one the
    model has; its structures are evaluated with it."""
    for path, structures in files:
        for frames in structures.parts:
            if not names and frames.energy_name != "energy":
                raise OptionsError(
                    f"{path}: the model {model_path} learnt no energy, so no "
                    f"'{frames.energy_name}'; leave it out of the data description's targets"
                )
            if names and frames.energy_name not in names:
                raise OptionsError(
                    f"{path}: the model {model_path} has no '{frames.energy_name}' (it has "
                    f"{', '.join(names)}); name one of those as the target in the data "
                    "description (targets: {energy/<variant>: {key: ...}})"
                )
            frames.energy_variant = names.index(frames.energy_name) if names else 0


def write_predictions(
    path: Path, files: list[tuple[str, FrameSet]], predictions: list[dict]
) -> None:
    """The reference frames as they are in their files (every key kept), with the
    predictions beside them: ``predicted_energy`` (eV) and ``predicted_stress`` (eV/A^3,
    Voigt order, ASE's sign) in the info, ``predicted_forces`` (eV/A) per atom; for a
    model with LLPR, ``energy_uncertainty`` (eV) in the info and each atom's
    ``atomic_energy_uncertainty`` (eV), and each mtt:: target's beside its predictions
    (uncertainty_key)."""
    frames = [atoms for source, structures in files for atoms in frames_of(source, structures)]
    for atoms, predicted in zip(frames, predictions):
        if "energy" in predicted:
            atoms.info["predicted_energy"] = predicted["energy"]
            atoms.arrays["predicted_forces"] = predicted["forces"]
        if "energy_uncertainty" in predicted:
            atoms.info["energy_uncertainty"] = predicted["energy_uncertainty"]
            atoms.arrays["atomic_energy_uncertainty"] = predicted["atomic_energy_uncertainty"]
        if "stress" in predicted:
            atoms.info["predicted_stress"] = predicted["stress"].reshape(9)[VOIGT]
        for name, values in predicted.get("targets", {}).items():
            # per atom: a row per atom; per structure: the values flat, as in the file
            where = atoms.arrays if values.ndim == 2 else atoms.info
            where[prediction_key(name)] = values
        for name, values in predicted.get("uncertainties", {}).items():
            where = atoms.arrays if values.ndim == 2 else atoms.info
            where[uncertainty_key(name)] = values
    atomic_write(
        path,
        lambda stream: ase.io.write(stream, frames, format="extxyz"),
        binary=False,
        what="predictions",
    )


def frames_of(source: str, structures: FrameSet) -> list[ase.Atoms]:
    """The frames of a data file as ASE reads them; for a memmap directory, which ASE
    cannot read, the structures with their reference values (angstrom, eV)."""
    if not Path(source).is_dir():
        return read_frames(Path(source))
    frames = []
    for structure in structures:
        atoms = ase.Atoms(
            numbers=structure.atomic_numbers.numpy(),
            positions=structure.positions.numpy(),
            cell=structure.cell.numpy(),
            pbc=structure.pbc.numpy(),
        )
        if structure.energy is not None:
            atoms.info["energy"] = structure.energy
        if structure.forces is not None:
            atoms.arrays["forces"] = structure.forces.numpy()
        if structure.stress is not None:
            atoms.info["stress"] = structure.stress.numpy().reshape(9)[VOIGT]
        frames.append(atoms)
    return frames


# the 3x3 stress as ASE's Voigt vector: xx, yy, zz, yz, xz, xy
VOIGT = [0, 4, 8, 5, 2, 1]


def predict_all(
    model: torch.nn.Module, structures: FrameSet, batch_size: int, dtype: torch.dtype
) -> tuple[list[dict], torch.Tensor]:
    """Predictions for each structure (stress for the periodic ones), and the error sums."""
    energies, learnt = learnt_targets(model)
    targets = tuple(name for name, _ in learnt)
    learns_energy = len(energies) > 0
    periodic = structures.fully_periodic()
    stress = bool(periodic.any()) and learns_energy
    uncertain = bool(model.has_uncertainty())
    sums = MetricSums("cpu", targets)
    busy_cores = BusyCores.for_this_process()
    predictions: list[dict] = []
    indices = list(range(len(structures)))
    for chunk, batch in local_batches(structures, indices, batch_size, model.cutoff):
        batch = batch.to("cpu", dtype)
        # Every batch has its own shape: the TorchScript profiling executor's warm-up
        # and re-specialisation cost more than they gain here (measured). Off entirely,
        # not only its specializations as the calculator's (export.unspecialized_on_cpu):
        # eval of 1,000 ethanol frames took 7.0-7.1 s against 7.6-8.3 s (MACE), 7.1-7.5
        # against 7.7 s (PET), 5.0-5.1 against 5.1-5.3 s (SOAP-BPNN), alternated
        with torch.jit.optimized_execution(False):
            predicted = predict(model, batch, learns_energy, stress)
            uncertainties = predicted_uncertainties(model, batch) if uncertain else {}
        sums.accumulate(predicted, batch)
        decision = busy_cores.poll()
        if decision is not None and decision.message:
            logger.warning(decision.message.replace("training", "evaluating"))
        offsets = torch.cumsum(batch.n_atoms, 0) - batch.n_atoms
        for position, index in enumerate(chunk):
            start, count = int(offsets[position]), int(batch.n_atoms[position])
            entry: dict = {"targets": {}, "uncertainties": {}}
            if learns_energy:
                entry["energy"] = float(predicted["energy"][position].detach())
                forces = predicted["forces"][start : start + count]
                entry["forces"] = forces.detach().double().numpy()
            variant = 0 if batch.energy_variant is None else int(batch.energy_variant[position])
            if learns_energy and energies[variant] in uncertainties:
                whole, atoms = uncertainties[energies[variant]]
                entry["energy_uncertainty"] = float(whole[position])
                atomic = atoms[start : start + count].reshape(-1)
                entry["atomic_energy_uncertainty"] = atomic.numpy()
            if stress and periodic[index]:
                entry["stress"] = predicted["stress"][position].detach().double().numpy()
            for name, per_atom in learnt:
                values = predicted[name].detach().double()
                rows = values[start : start + count] if per_atom else values[position]
                entry["targets"][name] = rows.numpy()
                if name in uncertainties:
                    whole, atoms = uncertainties[name]
                    sigma = atoms[start : start + count] if per_atom else whole[position]
                    entry["uncertainties"][name] = sigma.reshape(rows.shape).numpy()
            predictions.append(entry)
    return predictions, sums.values


def run(arguments: argparse.Namespace, descriptions: list[DatasetOptions]) -> int:
    """The evaluation ``atomtrain eval`` checked the arguments and description of."""
    from_checkpoint = is_checkpoint(arguments.model)
    if from_checkpoint:
        model = best_model(arguments.model)
        span = model.baseline_span
        if model.reading_note:
            logger.info(model.reading_note)
    else:
        stored = {BASELINE_SPAN_FILE: ""}
        # the command uses no metatrain code after it: metatensor's operations left out
        model = load_exported(arguments.model, extra=stored, last_use=True)
        span = json.loads(stored[BASELINE_SPAN_FILE] or "null")
    dtype = next(model.parameters()).dtype
    files = read_files(descriptions, require_energy=False)
    check_elements(arguments.model, files, [int(z) for z in model.atomic_types])
    check_energies(arguments.model, files, learnt_targets(model)[0])
    warn_undetermined(span, [int(z) for z in model.atomic_types], files)
    structures = [structure for _, part in files for structure in part]
    predictions: list[dict] = []
    targets = tuple(name for name, _ in learnt_targets(model)[1])
    total = MetricSums("cpu", targets).values
    per_file: dict[str, dict[str, float]] = {}
    for name, (_, part) in zip(file_labels([path for path, _ in files]), files):
        part_predictions, sums = predict_all(model, part, arguments.batch_size, dtype)
        predictions += part_predictions
        total += sums  # error sums add up: the whole set's metrics are exact
        per_file[f"  {name}"] = finalize(sums, targets)
    metrics = finalize(total, targets)
    figure = arguments.output.with_suffix(".png")
    if not metrics:  # no reference values: no figure
        cancel_early()
    plot = started_early()  # a command's process; in-process calls draw it here, after
    if plot is not None:  # drawn while the predictions are written
        plot.draw_parity(parity_pairs(structures, predictions), figure)
    try:
        write_predictions(arguments.output, files, predictions)
    except BaseException:
        if plot is not None:  # no figure of predictions that were not written
            plot.process.kill()
        raise
    if metrics:
        # one file: its own name; several: the description's, with a row per file
        whole = arguments.data.name if len(files) > 1 else Path(files[0][0]).name
        table = {whole: metrics, **(per_file if len(files) > 1 else {})}
        which = f"the best model of {arguments.model}" if from_checkpoint else str(arguments.model)
        logger.info(metrics_table(table, f"metrics of {which}"))
        for said in uncertainty_summary(structures, predictions):
            logger.info(said)
    if plot is not None:
        plot.wait("parity plot")
    elif metrics:
        parity_plot(figure, parity_pairs(structures, predictions))
    logger.info(f"wrote predictions for {len(structures)} structures to {arguments.output}")
    return 0


def uncertainty_summary(structures, predictions) -> list[str]:
    """How the LLPR uncertainties compare with the errors where the data has reference
    values: the root mean square of each (the energy's per atom, a target's per value),
    and the rank correlation of one with the other."""
    lines = []
    known = [
        (s, p)
        for s, p in zip(structures, predictions)
        if s.energy is not None and "energy_uncertainty" in p
    ]
    if len(known) >= 2:
        atoms = np.array([s.n_atoms for s, _ in known], dtype=np.float64)
        errors = np.array([p["energy"] - s.energy for s, p in known]) / atoms
        sigmas = np.array([p["energy_uncertainty"] for _, p in known]) / atoms
        sigma, error = (1e3 * np.sqrt(np.mean(values**2)) for values in (sigmas, errors))
        lines.append(
            f"energy uncertainty (LLPR): root mean square {sigma:.4g} meV/atom against an "
            f"error of {error:.4g} meV/atom; Spearman rank correlation of |error| and "
            f"uncertainty {spearman(np.abs(errors), sigmas):.2f}"
        )
    for name in dict.fromkeys(n for p in predictions for n in p.get("uncertainties", {})):
        pairs = [(s, p) for s, p in zip(structures, predictions) if name in s.targets]
        if len(pairs) < 2:
            continue
        errors = np.concatenate(
            [(p["targets"][name] - reference_of(s, p, name)).reshape(-1) for s, p in pairs]
        )
        sigmas = np.concatenate([p["uncertainties"][name].reshape(-1) for _, p in pairs])
        finite = np.isfinite(errors)
        errors, sigmas = errors[finite], sigmas[finite]
        sigma, error = (np.sqrt(np.mean(values**2)) for values in (sigmas, errors))
        lines.append(
            f"{name} uncertainty (LLPR): root mean square {sigma:.4g} against an error of "
            f"{error:.4g} (per value, in its unit); Spearman rank correlation of |error| and "
            f"uncertainty {spearman(np.abs(errors), sigmas):.2f}"
        )
    return lines


def reference_of(structure, prediction: dict, name: str) -> np.ndarray:
    """A structure's reference values of target ``name``, shaped as its prediction."""
    return structure.targets[name].numpy().reshape(prediction["targets"][name].shape)


def spearman(first: np.ndarray, second: np.ndarray) -> float:
    """Spearman's rank correlation (ties ranked by position: none in real numbers)."""
    ranks = [np.argsort(np.argsort(values)).astype(np.float64) for values in (first, second)]
    return float(np.corrcoef(ranks[0], ranks[1])[0, 1])


def parity_pairs(structures, predictions) -> dict[str, tuple[list[float], list[float]]]:
    pairs: dict[str, tuple[list[float], list[float]]] = {}
    for name in dict.fromkeys(n for p in predictions for n in p.get("targets", {})):
        known = [(s, p) for s, p in zip(structures, predictions) if name in s.targets]
        if known:
            pairs[name] = (
                [v for s, _ in known for v in s.targets[name].reshape(-1).tolist()],
                [v for _, p in known for v in p["targets"][name].reshape(-1).tolist()],
            )
    if all(structure.energy is not None for structure in structures) and all(
        "energy" in p for p in predictions
    ):
        pairs["energy per atom (eV)"] = (
            [s.energy / s.n_atoms for s in structures],
            [p["energy"] / s.n_atoms for s, p in zip(structures, predictions)],
        )
    known = [(s, p) for s, p in zip(structures, predictions) if s.forces is not None]
    if known:
        pairs["force component (eV/A)"] = (
            torch.cat([s.forces.reshape(-1) for s, _ in known]).tolist(),
            [v for _, p in known for v in p["forces"].reshape(-1).tolist()],
        )
    known = [(s, p) for s, p in zip(structures, predictions) if s.stress is not None]
    if known:
        pairs["stress component (GPa)"] = (
            [v / ase.units.GPa for s, _ in known for v in s.stress.reshape(-1).tolist()],
            [v / ase.units.GPa for _, p in known for v in p["stress"].reshape(-1).tolist()],
        )
    return pairs
