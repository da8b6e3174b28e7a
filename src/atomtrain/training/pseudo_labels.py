"""Pseudo-labels: a training section whose energies, forces and stress are the
fine-tuning start's own predictions (``pseudo_labels: true``), so that fine-tuning keeps
what the foundation model knew where its own training data are not at hand (replay).

The model labels the section before training. The structures are cut into the same
global batches whatever the number of processes, every process labels every
``world_size``-th batch, and a sum over processes (each value has one contributor, the
others add zeros, so the sum is exact) gives every process every label: N processes
label as one does, bitwise.
"""

from __future__ import annotations

import logging

import numpy as np
import torch

from ..data.frames import Frames, FrameSet
from ..data.sampler import global_batches
from ..distributed import Context
from ..models.energy_model import EnergyModel
from .evaluation import predict

logger = logging.getLogger(__name__)


def pseudo_label(
    structures: FrameSet, model: EnergyModel, context: Context, batch_size: int
) -> None:
    """Every structure of ``structures`` (whole files, as read) labelled by ``model``:
    its energy and forces, and the stress of the periodic ones, in its file's units."""
    for frames in structures.parts:
        label_frames(frames, model, context, batch_size)


def label_frames(frames: Frames, model: EnergyModel, context: Context, batch_size: int) -> None:
    whole = FrameSet.whole(frames)
    n, atoms = len(frames), int(frames.offsets[-1])
    periodic = whole.fully_periodic()
    energy = torch.zeros(n, dtype=torch.float64)
    forces = torch.zeros((atoms, 3), dtype=torch.float64)
    stress = torch.zeros((n, 3, 3), dtype=torch.float64)
    # where the model is (the start, read on the CPU: moved to the run's device later)
    parameter = next(model.parameters())
    device, dtype = parameter.device, parameter.dtype
    chunks = global_batches(list(range(n)), batch_size)
    for chunk in chunks[context.rank :: context.world_size]:
        batch = whole.batch(chunk, float(model.cutoff)).to(device, dtype)
        with_stress = bool(periodic[chunk].any())
        predicted = predict(model, batch, True, with_stress)
        chosen = torch.as_tensor(chunk)
        energy[chosen] = predicted["energy"].detach().cpu().to(torch.float64)
        rows = torch.as_tensor(frames.atoms_of(np.asarray(chunk)))
        forces[rows] = predicted["forces"].detach().cpu().to(torch.float64)
        if with_stress:
            stress[chosen] = predicted["stress"].detach().cpu().to(torch.float64)
    flat = context.all_reduce_sum(torch.cat([energy, forces.reshape(-1), stress.reshape(-1)]))
    energy, forces, stress = flat.split([n, 3 * atoms, 9 * n])
    # stored in the file's units, which reading converts to eV and angstrom
    unit, length = frames.energy_unit, frames.length
    frames.energy = energy.numpy() / unit
    frames.forces = forces.reshape(atoms, 3).numpy() * (length / unit)
    frames.stress = stress.reshape(n, 3, 3).numpy() * (length**3 / unit)
    frames.energy_known = np.ones(n, dtype=bool)
    frames.forces_known = np.ones(n, dtype=bool)
    frames.stress_known = np.asarray(periodic, dtype=bool).copy()
    logger.info(
        f"{frames.source}: {n} structures labelled by the fine-tuning start's predictions "
        f"(energies, forces{', stress of the periodic ones' if periodic.any() else ''})"
    )
