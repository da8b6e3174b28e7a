"""The baseline refitted after training: the least-squares optimum of the energy error per
atom over the per-element energies, with forces untouched and fixed elements kept."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from atomtrain.data import FrameSet
from atomtrain.distributed.context import single_process
from atomtrain.models.composition import composition_counts
from atomtrain.options import parse_options
from atomtrain.training.baseline import fit_baseline, refit_baseline

from helpers import read, run_model, small_model

ETHANOL = Path(__file__).resolve().parent.parent / "resources" / "ethanol_40.xyz"
CONTEXT = single_process(torch.device("cpu"))


def mixed_structures() -> FrameSet:
    """Ethanol, and ethanol missing its last hydrogen (8 atoms, energy moved by 13 eV):
    two compositions of two sizes, so that the equations' weights per atom matter."""
    ethanol = list(read(ETHANOL))
    stripped = [
        dataclasses.replace(
            structure,
            positions=structure.positions[:-1],
            atomic_numbers=structure.atomic_numbers[:-1],
            forces=structure.forces[:-1],
            energy=structure.energy + 13.0,
        )
        for structure in ethanol[:15]
    ]
    return FrameSet.from_structures(ethanol[15:] + stripped)


def options(**training):
    return parse_options(
        {
            "training_set": str(ETHANOL),
            "architecture": {"name": "soap_bpnn", "training": training},
        }
    )


def residuals_per_atom(model, structures) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(reference - predicted energy per atom, forces, per-atom compositions)."""
    listed = list(structures)
    predicted = run_model(model, listed)
    atoms = torch.tensor([s.n_atoms for s in listed], dtype=torch.float64)
    reference = torch.tensor([s.energy for s in listed], dtype=torch.float64)
    numbers = torch.cat([s.atomic_numbers for s in listed])
    system = torch.repeat_interleave(torch.arange(len(listed)), atoms.long())
    counts = composition_counts(numbers, system, len(listed), model.atomic_types)
    residual = (reference - predicted["energy"].detach()) / atoms
    return residual, predicted["forces"].detach(), counts / atoms[:, None]


def test_refit_leaves_the_per_atom_energy_errors_orthogonal_to_every_free_element():
    structures = mixed_structures()
    model = small_model([1, 6, 8])  # an untrained network: its energies are far off
    settings = options()
    fit_baseline(model, structures, settings, CONTEXT)
    before, forces_before, fractions = residuals_per_atom(model, structures)
    refit_baseline(model, structures, settings, CONTEXT, torch.float64)
    after, forces_after, _ = residuals_per_atom(model, structures)
    # the normal equations of the least squares: nothing left along any element
    assert torch.allclose(fractions.T @ after, torch.zeros(3, dtype=torch.float64), atol=1e-9)
    assert float((after**2).mean()) < float((before**2).mean())
    assert torch.equal(forces_after, forces_before)


def test_refit_keeps_fixed_elements_and_can_be_switched_off():
    structures = mixed_structures()
    model = small_model([1, 6, 8])
    fixed = options(atomic_baseline={1: -13.5})
    fit_baseline(model, structures, fixed, CONTEXT)
    baseline = model.baseline.clone()
    refit_baseline(model, structures, fixed, CONTEXT, torch.float64)
    assert float(model.baseline[0]) == baseline[0] == pytest.approx(-13.5)
    assert not torch.equal(model.baseline[1:], baseline[1:])
    after, _, fractions = residuals_per_atom(model, structures)
    left = fractions[:, 1:].T @ after  # along carbon and oxygen, the free elements
    assert torch.allclose(left, torch.zeros(2, dtype=torch.float64), atol=1e-9)

    switched_off = options(refit_baseline=False)
    baseline = model.baseline.clone()
    refit_baseline(model, structures, switched_off, CONTEXT, torch.float64)
    assert torch.equal(model.baseline, baseline)
