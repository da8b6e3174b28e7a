"""vesin neighbor lists agree with ASE's, and are kept between epochs up to a budget."""

from __future__ import annotations

import ase
import ase.build
import numpy as np
import pytest
import torch
from ase.neighborlist import neighbor_list as ase_neighbor_list

from atomtrain.data import columns as columns_module
from atomtrain.data.frames import frames_from_structures
from atomtrain.data.neighbors import compute_neighbor_list

from helpers import structure_from_atoms


def neighbors_of(atoms, cutoff):
    return compute_neighbor_list(atoms.positions, atoms.cell.array, atoms.pbc, cutoff)


def pairs_from_ase(atoms, cutoff):
    first, second, shifts = ase_neighbor_list("ijS", atoms, cutoff)
    return sorted(zip(first.tolist(), second.tolist(), map(tuple, shifts.tolist())))


def pairs_from_atomtrain(atoms, cutoff):
    first, second, shifts = neighbors_of(atoms, cutoff).full()
    return sorted(zip(first.tolist(), second.tolist(), map(tuple, shifts.tolist())))


def skewed_cell():
    atoms = ase.Atoms(
        "SiSiO",
        positions=[[0.1, 0.2, 0.3], [1.3, 0.9, 0.4], [0.7, 1.6, 1.5]],
        cell=[[2.8, 0.0, 0.0], [1.9, 2.4, 0.0], [0.6, 1.1, 2.2]],
        pbc=True,
    )
    return atoms


CASES = {
    "small-periodic": (ase.build.bulk("Si", "diamond", a=5.43), 5.0),
    "skewed-periodic": (skewed_cell(), 4.5),
    "mixed-pbc": (ase.build.fcc111("Al", size=(2, 2, 3), vacuum=5.0), 4.0),
    "molecule": (ase.build.molecule("C6H6"), 3.0),
}


@pytest.mark.parametrize("name", list(CASES))
def test_neighbor_lists_agree_with_ase(name):
    atoms, cutoff = CASES[name]
    expected = pairs_from_ase(atoms, cutoff)
    assert len(expected) > 0
    assert pairs_from_atomtrain(atoms, cutoff) == expected


def test_pair_vectors_have_the_right_length():
    atoms, cutoff = CASES["skewed-periodic"]
    first, second, shifts = neighbors_of(atoms, cutoff).full()
    vectors = (
        atoms.positions[second.numpy()]
        - atoms.positions[first.numpy()]
        + shifts.numpy() @ atoms.cell.array
    )
    distances = np.linalg.norm(vectors, axis=1)
    assert np.all(distances < cutoff) and np.all(distances > 0)


def test_neighbor_lists_are_kept_within_the_budget_and_computed_again_beyond(monkeypatch):
    structures = [structure_from_atoms(ase.build.molecule(name)) for name in ("H2O", "C6H6")]
    frames = frames_from_structures("", structures)
    first = frames.neighbors(0, 3.0)
    assert frames.neighbors(0, 3.0) is first
    assert frames.neighbors(0, 2.0) is not first
    # a full budget: the list is computed again each time, and equal
    monkeypatch.setattr(columns_module.NEIGHBOR_CACHE, "used", columns_module.NEIGHBOR_CACHE.budget)
    benzene = frames.neighbors(1, 3.0)
    again = frames.neighbors(1, 3.0)
    assert again is not benzene
    assert torch.equal(again.first, benzene.first) and torch.equal(again.second, benzene.second)


def test_a_structure_keeps_each_pair_once_in_32_bits():
    """The cached list holds each pair once (a quarter of the full list in 64 bits); the
    full list is those pairs, then the same reversed in the same order."""
    atoms, cutoff = CASES["small-periodic"]
    nl = neighbors_of(atoms, cutoff)
    assert {nl.first.dtype, nl.second.dtype, nl.cell_shifts.dtype} == {torch.int32}
    first, second, shifts = nl.full()
    half = nl.first.shape[0]
    assert first.shape[0] == nl.n_pairs == 2 * half and first.dtype == torch.int64
    assert torch.equal(first[half:], second[:half]) and torch.equal(second[half:], first[:half])
    assert torch.equal(shifts[half:], -shifts[:half])


@pytest.mark.parametrize("value", ["abc", "-5", "nan"])
def test_a_bad_cache_size_is_named_in_one_line(monkeypatch, value):
    from atomtrain.errors import OptionsError

    monkeypatch.setenv("ATOMTRAIN_NEIGHBOR_CACHE_MB", value)
    with pytest.raises(OptionsError, match=f"ATOMTRAIN_NEIGHBOR_CACHE_MB={value}: give"):
        columns_module.budget_from_environment()
    monkeypatch.setenv("ATOMTRAIN_NEIGHBOR_CACHE_MB", "2")
    assert columns_module.budget_from_environment() == 2 * 2**20
