"""Physics of SOAP-BPNN: symmetries, conservative forces and stress, smoothness,
batching, and the composition baseline."""

from __future__ import annotations

import dataclasses

import ase
import ase.build
import numpy as np
import pytest
import scipy.integrate
import scipy.special
import torch

from atomtrain.data import collate
from atomtrain.models.composition import (
    composition_counts,
    normal_equation_sums,
    solve_baseline,
)
from atomtrain.models.energy_model import mirrored_half
from atomtrain.models.export import export, load_exported
from atomtrain.models.soap_bpnn.soap import (
    SoapPowerSpectrum,
    neighbor_sums,
    radial_functions_per_l,
    spherical_bessel,
    spherical_bessel_radial_basis,
    spherical_bessel_zeros,
)
from atomtrain.training.evaluation import predict

from helpers import run_model, small_model, structure_from_atoms


def random_rotation(seed=3):
    generator = np.random.default_rng(seed)
    matrix, _ = np.linalg.qr(generator.normal(size=(3, 3)))
    return matrix * np.sign(np.linalg.det(matrix))


def molecule():
    atoms = ase.build.molecule("CH3CH2OH")
    atoms.rattle(0.05, seed=1)
    return atoms


def crystal():
    atoms = ase.build.bulk("SiO", "rocksalt", a=4.6, cubic=True)
    atoms.set_cell(
        atoms.cell.array @ np.array([[1, 0.05, 0], [0, 1, 0.1], [0, 0, 1.02]]), scale_atoms=True
    )
    atoms.rattle(0.05, seed=2)
    return atoms


def evaluate(model, atoms, stress=False):
    outputs = run_model(model, [structure_from_atoms(atoms)], stress=stress)
    return {key: value.detach() for key, value in outputs.items()}


@pytest.fixture(scope="module")
def organic_model():
    return small_model([1, 6, 8])


@pytest.fixture(scope="module")
def oxide_model():
    return small_model([8, 14])


def test_permutation_of_same_element_atoms(organic_model):
    atoms = molecule()
    hydrogens = [index for index, z in enumerate(atoms.numbers) if z == 1]
    order = list(range(len(atoms)))
    order[hydrogens[0]], order[hydrogens[-1]] = order[hydrogens[-1]], order[hydrogens[0]]
    reference = evaluate(organic_model, atoms)
    permuted = evaluate(organic_model, atoms[order])
    assert torch.allclose(permuted["energy"], reference["energy"], atol=1e-10)
    assert torch.allclose(permuted["forces"], reference["forces"][order], atol=1e-10)


def test_energy_and_forces_continuous_across_cutoff():
    model = small_model([1, 8])
    cutoff = model.cutoff

    def dimer(distance):
        return ase.Atoms("OH", positions=[[0, 0, 0], [0, 0, distance]])

    inside = evaluate(model, dimer(cutoff - 1e-7))
    outside = evaluate(model, dimer(cutoff + 1e-7))
    far = evaluate(model, dimer(cutoff + 1.0))
    assert torch.allclose(inside["energy"], outside["energy"], atol=1e-9)
    assert torch.allclose(inside["forces"], outside["forces"], atol=1e-6)
    assert torch.allclose(outside["energy"], far["energy"], atol=1e-12)
    assert torch.count_nonzero(outside["forces"]) == 0


def test_batch_equals_single_structure_calls(oxide_model):
    structures = []
    for seed in range(3):
        atoms = crystal()
        atoms.rattle(0.05, seed=10 + seed)
        structures.append(structure_from_atoms(atoms))
    molecule_atoms = ase.Atoms("SiO2", positions=[[0, 0, 0], [1.6, 0, 0], [-1.6, 0.1, 0]])
    structures.append(structure_from_atoms(molecule_atoms))
    batched = run_model(oxide_model, structures, stress=True)
    offset = 0
    for index, structure in enumerate(structures):
        single = run_model(oxide_model, [structure], stress=True)
        assert torch.allclose(batched["energy"][index], single["energy"][0], atol=1e-10)
        count = structure.n_atoms
        assert torch.allclose(
            batched["forces"][offset : offset + count], single["forces"], atol=1e-10
        )
        assert torch.allclose(batched["stress"][index], single["stress"][0], atol=1e-10)
        offset += count
    assert torch.count_nonzero(batched["stress"][-1]) == 0  # not periodic


def test_composition_fit_recovers_per_element_energies():
    generator = torch.Generator().manual_seed(0)
    types = [1, 6, 8]
    truth = torch.tensor([-13.6, -1029.5, -2041.3], dtype=torch.float64)
    counts = torch.randint(0, 6, (30, 3), generator=generator).to(torch.float64)
    counts[:, 1] += 1
    numbers = torch.cat([torch.tensor(types).repeat_interleave(row.long()) for row in counts])
    system_index = torch.repeat_interleave(torch.arange(30), counts.sum(1).long())
    rebuilt = composition_counts(numbers, system_index, 30, types)
    assert torch.equal(rebuilt, counts)
    energies = counts @ truth
    gram, moment = normal_equation_sums(rebuilt, energies)
    assert torch.allclose(solve_baseline(gram, moment), truth, rtol=1e-10)
    # shards add up to the same fit
    first = normal_equation_sums(rebuilt[:11], energies[:11])
    second = normal_equation_sums(rebuilt[11:], energies[11:])
    sharded = solve_baseline(first[0] + second[0], first[1] + second[1])
    assert torch.allclose(sharded, truth, rtol=1e-10)


def test_collinear_compositions_give_minimum_norm_fit():
    counts = torch.tensor([[6.0, 2.0, 1.0]] * 4)  # every structure is C2H6O
    energies = torch.tensor([-100.0, -101.0, -99.0, -100.0], dtype=torch.float64)
    baseline = solve_baseline(*normal_equation_sums(counts, energies))
    assert torch.allclose(counts[0].double() @ baseline, energies.mean())


@pytest.mark.parametrize("n_pairs", [0, 1, 40])
def test_padded_neighbor_sums_equal_scattered_outer_products(n_pairs):
    generator = torch.Generator().manual_seed(n_pairs)
    n_targets = 7  # some targets receive no pair at all
    target = torch.randint(0, n_targets - 2, (n_pairs,), generator=generator)
    radial = torch.randn(n_pairs, 4, generator=generator, dtype=torch.float64)
    angular = torch.randn(n_pairs, 9, generator=generator, dtype=torch.float64)
    expected = torch.zeros(n_targets, 4, 9, dtype=torch.float64).index_add(
        0, target, radial.unsqueeze(2) * angular.unsqueeze(1)
    )
    assert torch.allclose(neighbor_sums(radial, angular, target, n_targets), expected)


def test_spherical_bessel_functions_are_scipys_where_their_zeros_are_sought():
    for order in range(13):
        # from the previous order's first zero on, where the zeros are bracketed
        start = np.pi if order == 0 else spherical_bessel_zeros(order - 1, 1)[order - 1, 0]
        x = np.linspace(start, 80.0, 4001)
        expected = scipy.special.spherical_jn(order, x)
        assert np.allclose(spherical_bessel(order, x), expected, rtol=1e-9, atol=1e-15)


def test_radial_channels_per_l_are_trimmed_by_laplacian_eigenvalue():
    zeros = spherical_bessel_zeros(6, 8)
    # j_0 vanishes at multiples of pi; tabulated first zeros of j_1 and j_6
    assert np.allclose(zeros[0], np.pi * np.arange(1, 9))
    assert np.isclose(zeros[1, 0], 4.493409457909064)
    assert np.isclose(zeros[6, 0], 10.512835408093999)
    for angular_l in range(7):
        assert np.all(np.abs(scipy.special.spherical_jn(angular_l, zeros[angular_l])) < 1e-15)
    # metatrain's (spex) trimmed Laplacian-eigenstate basis for max_radial 7, max_angular 6
    assert radial_functions_per_l(7, 6) == [8, 7, 7, 6, 6, 5, 5]
    assert radial_functions_per_l(0, 3) == [1, 1, 1, 1]


def test_radial_basis_is_orthonormal_j0_of_the_cutoff_sphere():
    soap = SoapPowerSpectrum(1, 5.0, 0.5, 7, 6)
    # from just above zero: no neighbor pair has zero length
    grid = torch.linspace(0.0, 5.0, 20001, dtype=torch.float64)[1:]
    values = spherical_bessel_radial_basis(grid, soap.wavenumbers, 5.0).numpy()
    wavenumbers = soap.wavenumbers.numpy()
    expected = scipy.special.spherical_jn(0, np.outer(grid.numpy(), wavenumbers))
    assert np.allclose(values / values[:1], expected)
    products = values[:, :, None] * values[:, None, :]
    radii = grid.numpy()
    overlap = scipy.integrate.trapezoid(radii[:, None, None] ** 2 * products, radii, axis=0)
    assert np.allclose(overlap, np.eye(8), atol=1e-6)
    assert np.allclose(values[-1], 0.0, atol=1e-12)  # nodes at the cutoff


def test_feature_count_follows_the_trimmed_channels():
    soap = SoapPowerSpectrum(2, 5.0, 0.5, 7, 6)
    channels = [2 * count for count in radial_functions_per_l(7, 6)]
    assert soap.n_features == sum(c * (c + 1) // 2 for c in channels)


def test_atoms_without_neighbors_feel_no_force():
    outputs = evaluate(small_model([1, 8]), ase.Atoms("OH", positions=[[0, 0, 0], [9, 0, 0]]))
    assert torch.all(outputs["forces"] == 0) and torch.isfinite(outputs["energy"]).all()


def force_and_stress_loss(model, structures):
    outputs = run_model(model, structures, stress=True, create_graph=True)
    return (outputs["forces"] ** 2).sum() + 1e3 * (outputs["stress"] ** 2).sum()


def exported_copy(model, directory):
    export(model, directory / "model.pt")
    return load_exported(directory / "model.pt")


def test_training_gradients_equal_those_of_the_exported_model(oxide_model, tmp_path):
    """Training differentiates the harmonics through cached gradients; the exported
    model through the tangent term of SoapPowerSpectrum.angular_with_tangent. The
    gradients of a force and stress loss with respect to the parameters must be the
    same."""
    structures = [structure_from_atoms(crystal())]
    parameters = list(oxide_model.parameters())
    fast = torch.autograd.grad(
        force_and_stress_loss(oxide_model, structures), parameters, allow_unused=True
    )
    scripted = exported_copy(oxide_model, tmp_path)
    for parameter in scripted.parameters():
        parameter.requires_grad_(True)  # metatomic saves models for inference
    exact = torch.autograd.grad(
        force_and_stress_loss(scripted, structures),
        list(scripted.parameters()),
        allow_unused=True,  # output biases shift energies only, not forces or stress
    )
    assert sum(gradient is not None for gradient in fast) > len(parameters) // 2
    for mine, reference in zip(fast, exact):
        assert (mine is None) == (reference is None)
        if mine is not None:
            assert torch.allclose(mine, reference, rtol=1e-10, atol=1e-12)


def test_hessian_from_the_training_model_is_refused(organic_model):
    """Training's harmonics have no second derivatives with respect to positions: an
    error, not a silently wrong Hessian. (The exported model's first derivatives are
    exact in any process; its second derivatives miss the harmonics' curvature, as
    docs/engines.md says.)"""
    structure = structure_from_atoms(molecule())
    batch = collate([structure], organic_model.cutoff).to("cpu", torch.float64)
    inputs = (batch.cell, batch.atomic_numbers, batch.system_index, batch.pair_first)
    inputs += (batch.pair_second, batch.cell_shifts)
    positions = batch.positions.clone().requires_grad_(True)
    energy = organic_model.energies(positions, *inputs).sum()
    gradient = torch.autograd.grad(energy, positions, create_graph=True)[0]
    with pytest.raises(RuntimeError, match="no second derivatives with respect to positions"):
        torch.autograd.grad(gradient[0, 0], positions)


def test_mirrored_pair_layout_gives_the_same_model_as_any_order(oxide_model, organic_model):
    """Collated pairs come as [pairs; the same reversed], and the model then computes
    the geometry of the first half only. Energies, forces, stress and the parameter
    gradients of a force and stress loss must equal those of the same pairs in a
    shuffled order, which takes the general path."""
    for model, structures in [
        (oxide_model, [structure_from_atoms(crystal())]),
        (organic_model, [structure_from_atoms(molecule()), structure_from_atoms(molecule())]),
    ]:
        stress = structures[0].is_periodic
        batch = collate(structures, model.cutoff).to("cpu", torch.float64)
        order = torch.randperm(batch.pair_first.numel(), generator=torch.Generator().manual_seed(0))
        shuffled = dataclasses.replace(
            batch,
            pair_first=batch.pair_first[order],
            pair_second=batch.pair_second[order],
            cell_shifts=batch.cell_shifts[order],
        )
        assert mirrored_half(batch.pair_first, batch.pair_second, batch.cell_shifts) > 0
        assert mirrored_half(shuffled.pair_first, shuffled.pair_second, shuffled.cell_shifts) == 0
        results = []
        for layout in (batch, shuffled):
            outputs = predict(model, layout, True, stress, create_graph=True)
            loss = (outputs["forces"] ** 2).sum()
            if stress:
                loss = loss + (outputs["stress"] ** 2).sum()
            parameters = list(model.parameters())
            gradients = torch.autograd.grad(loss, parameters, allow_unused=True)
            results.append(({k: v.detach() for k, v in outputs.items()}, gradients))
        (mirrored, mirrored_gradients), (general, general_gradients) = results
        for key in mirrored:
            assert torch.allclose(mirrored[key], general[key], rtol=1e-12, atol=1e-12), key
        for mine, reference in zip(mirrored_gradients, general_gradients):
            assert (mine is None) == (reference is None)
            if mine is not None:
                assert torch.allclose(mine, reference, rtol=1e-10, atol=1e-12)
