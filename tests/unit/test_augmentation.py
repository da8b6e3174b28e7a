"""Random rotations of training structures (training/augmentation.py): each label turns
as the physics says, checked against a model that is exactly equivariant by
construction; the draw depends on the seed, the epoch and the structure only."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch
from test_heads import SPECS, model_with_heads

from atomtrain.data import collate
from atomtrain.data.system import Structure
from atomtrain.training.augmentation import random_transformations, turned_batch
from atomtrain.training.evaluation import predict


def structures() -> list[Structure]:
    """A molecule and a sheared periodic cell of the same elements."""
    generator = np.random.default_rng(4)
    numbers = torch.tensor([6, 6, 8, 1, 1, 1, 1, 1, 1])
    molecule = Structure(
        torch.as_tensor(generator.normal(size=(9, 3)) * 1.2),
        numbers,
        torch.zeros(3, 3, dtype=torch.float64),
        torch.zeros(3, dtype=bool),
    )
    cell = torch.tensor([[6.0, 0.0, 0.0], [0.8, 6.5, 0.0], [0.3, -0.4, 7.0]], dtype=torch.float64)
    crystal = Structure(
        torch.as_tensor(generator.uniform(size=(9, 3))) @ cell,
        numbers,
        cell,
        torch.ones(3, dtype=bool),
    )
    return [molecule, crystal]


def labelled_by(model, batch):
    """``batch`` with the model's predictions as its labels."""
    found = {k: v.detach() for k, v in predict(model, batch, True, True).items()}
    targets = {spec.name: found[spec.name].reshape(found[spec.name].shape[0], -1) for spec in SPECS}
    atom_targets = tuple(spec.name for spec in SPECS if spec.per_atom)
    return replace(
        batch,
        energy=found["energy"],
        forces=found["forces"],
        stress=found["stress"],
        targets=targets,
        atom_targets=atom_targets,
    )


def test_turned_labels_are_what_an_equivariant_model_predicts_for_the_turned_structures():
    """Positions, cell, forces, stress and every target type (vectors, matrices,
    spherical blocks proper and pseudo, per structure and per atom) turned together:
    the turned labels are the exactly equivariant model's predictions on the turned
    structures, for rotations and improper rotations alike."""
    model = model_with_heads()
    batch = collate(structures(), model.cutoff).to("cpu", torch.float64)
    matrices = random_transformations(seed=5, epoch=2, positions=[11, 12])
    determinants = torch.linalg.det(matrices)
    assert sorted(determinants.round().tolist()) == [-1.0, 1.0]  # both kinds are checked
    labelled = labelled_by(model, batch)
    turned = turned_batch(labelled, matrices, SPECS)
    expected = labelled_by(model, turned)
    assert torch.abs(turned.positions - batch.positions).max() > 0.1
    assert torch.abs(turned.stress - labelled.stress).max() > 1e-4  # something turned
    torch.testing.assert_close(turned.energy, expected.energy, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(turned.forces, expected.forces, rtol=1e-9, atol=1e-10)
    torch.testing.assert_close(turned.stress, expected.stress, rtol=1e-9, atol=1e-10)
    for spec in SPECS:
        torch.testing.assert_close(
            turned.targets[spec.name], expected.targets[spec.name], rtol=1e-9, atol=1e-10
        )


def test_a_structures_draw_depends_on_the_seed_the_epoch_and_its_position_only():
    first = random_transformations(1, 0, [3, 7, 9])
    again = random_transformations(1, 0, [9, 3])  # another batch, another share
    torch.testing.assert_close(again, first[[2, 0]], rtol=0, atol=0)
    assert not torch.allclose(random_transformations(1, 1, [3]), first[:1])
    assert not torch.allclose(random_transformations(2, 0, [3]), first[:1])
    many = random_transformations(0, 0, range(400))
    identity = torch.eye(3, dtype=torch.float64).expand(400, 3, 3)
    torch.testing.assert_close(many @ many.transpose(1, 2), identity)
    improper = (torch.linalg.det(many) < 0).sum().item()
    assert 150 < improper < 250  # inversions half of the time, as metatrain's O3 draws
