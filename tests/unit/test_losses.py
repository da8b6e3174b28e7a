"""The training loss: per-atom energy, force components, and stress as virial per atom;
and the metric that picks the best model, which weighs errors as the loss does."""

from __future__ import annotations

import ase.build
import pytest
import torch

from atomtrain.data import FrameSet, TargetKeys, collate
from atomtrain.data.neighbors import compute_neighbor_list
from atomtrain.data.sampler import shard_by_work
from atomtrain.distributed.context import single_process
from atomtrain.errors import OptionsError
from atomtrain.options import LossOptions, parse_options
from atomtrain.training.batches import global_counts
from atomtrain.training.evaluation import metric_sums, predict
from atomtrain.training.loop import selection_metric
from atomtrain.training.losses import GlobalCounts, batch_loss
from atomtrain.training.metrics import SUM_NAMES, MetricSums, finalize, resumed_sums
from atomtrain.training.setup import check_selection_metric

from conftest import RESOURCES
from helpers import read, small_model, structure_from_atoms


def labelled_silicon(repeat: tuple[int, int, int]):
    atoms = ase.build.bulk("Si", "diamond", a=5.43, cubic=True).repeat(repeat)
    structure = structure_from_atoms(atoms)
    structure.energy = -5.0 * structure.n_atoms
    structure.forces = torch.zeros((structure.n_atoms, 3), dtype=torch.float64)
    structure.stress = torch.zeros((3, 3), dtype=torch.float64)
    return structure


def loss_of_stress_error(structure, error: torch.Tensor) -> float:
    batch = collate([structure], 3.0)
    assert batch.energy is not None and batch.forces is not None
    predictions = {
        "energy": batch.energy.clone(),
        "forces": batch.forces.clone(),
        "stress": error.reshape(1, 3, 3),
    }
    counts = GlobalCounts(structures=1, force_components=3 * structure.n_atoms, stress_components=9)
    return float(batch_loss(predictions, batch, LossOptions(), counts))


def test_stress_loss_is_the_squared_virial_per_atom_error():
    structure = labelled_silicon((1, 1, 1))
    error = torch.diag(torch.tensor([1e-3, -2e-3, 0.0], dtype=torch.float64))
    volume_per_atom = structure.volume / structure.n_atoms  # ~20 A^3 for silicon
    expected = float(((error * volume_per_atom) ** 2).sum()) / 9
    assert loss_of_stress_error(structure, error) == pytest.approx(expected, rel=1e-12)


def test_stress_loss_does_not_depend_on_the_cell_size():
    error = torch.full((3, 3), 4e-3, dtype=torch.float64)
    small = loss_of_stress_error(labelled_silicon((1, 1, 1)), error)
    large = loss_of_stress_error(labelled_silicon((2, 1, 1)), error)
    assert small > 0 and large == pytest.approx(small, rel=1e-12)


def test_best_model_is_picked_by_the_errors_the_loss_weighs():
    """Validation's selection metric sums the same squared errors as the loss, stress as
    a virial per atom, not in eV/A^3 (where silicon's errors count 400 times less)."""
    structure = labelled_silicon((1, 1, 1))
    batch = collate([structure], 3.0)
    assert batch.energy is not None and batch.forces is not None
    predictions = {
        "energy": batch.energy + 0.08,
        "forces": batch.forces + 0.01,
        "stress": torch.full((1, 3, 3), 2e-3, dtype=torch.float64),
    }
    counts = GlobalCounts(structures=1, force_components=3 * structure.n_atoms, stress_components=9)
    loss = float(batch_loss(predictions, batch, LossOptions(), counts))
    sums = MetricSums()
    sums.accumulate(predictions, batch)
    options = parse_options({"training_set": "unused.xyz"})
    assert selection_metric(finalize(sums.values), options) == pytest.approx(loss, rel=1e-12)


def test_metatrain_best_model_metric_is_the_product_of_the_errors():
    metrics = {"energy_per_atom_rmse": 0.02, "forces_rmse": 0.5, "virial_per_atom_rmse": 0.1}
    metrics |= {"energy_per_atom_mae": 0.01, "forces_mae": 0.3, "stress_rmse": 7.0}
    for choice, expected in (("rmse_prod", 0.02 * 0.5 * 0.1), ("mae_prod", 0.01 * 0.3)):
        training = {"best_model_metric": choice}
        options = parse_options({"training_set": "x.xyz", "architecture": {"training": training}})
        assert selection_metric(metrics, options) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize(
    "named, used",
    [
        ("forces_mae", "forces_mae"),
        ("forces", "forces_rmse"),
        ("energy", "energy_per_atom_rmse"),
        ("mtt::dipole", "mtt::dipole_rmse"),
        ("mtt::dipole_mae", "mtt::dipole_mae"),
    ],
)
def test_best_model_metric_may_name_one_error_of_any_target(named, used):
    metrics = {"energy_per_atom_rmse": 0.02, "forces_rmse": 0.5, "forces_mae": 0.3}
    metrics |= {"mtt::dipole_rmse": 0.07, "mtt::dipole_mae": 0.05}
    training = {"best_model_metric": named}
    options = parse_options({"training_set": "x.xyz", "architecture": {"training": training}})
    assert options.architecture.training.best_model_metric == used
    assert selection_metric(metrics, options, ("mtt::dipole",)) == metrics[used]
    check_selection_metric(used, set(metrics))
    with pytest.raises(OptionsError, match="gives no 'stress_rmse'; it gives energy_per_atom"):
        check_selection_metric("stress_rmse", set(metrics))


def test_a_target_with_its_own_loss_type_is_weighed_by_it_in_the_selection():
    """An mtt:: target trained with an MAE loss beside an MSE energy counts its MAE."""
    metrics = {"energy_per_atom_rmse": 0.02, "mtt::dipole_rmse": 0.07, "mtt::dipole_mae": 0.05}
    loss = {"mtt::dipole": {"type": "mae", "weight": 2.0}}
    training = {"loss": loss}
    options = parse_options({"training_set": "x.xyz", "architecture": {"training": training}})
    assert selection_metric(metrics, options, ("mtt::dipole",)) == pytest.approx(
        0.02**2 + 2.0 * 0.05, rel=1e-12
    )


def test_sums_of_an_older_checkpoint_resume_with_the_new_sums_at_zero():
    saved = torch.arange(1.0, len(SUM_NAMES) - 1, dtype=torch.float64)  # two sums fewer
    completed = resumed_sums(saved)
    assert completed.shape == (len(SUM_NAMES),)
    assert torch.equal(completed[: saved.shape[0]], saved) and not completed[-2:].any()
    current = torch.ones(len(SUM_NAMES), dtype=torch.float64)
    assert resumed_sums(current) is current


def test_metric_sums_do_not_depend_on_how_structures_are_batched():
    structures = read(RESOURCES / "tio2_30.xyz")[:7]  # 24 atoms each
    model = small_model([8, 22])
    context = single_process(torch.device("cpu"))
    by_count = metric_sums(model, structures, context, 3, torch.float64)
    by_atoms = metric_sums(model, structures, context, 3, torch.float64, max_atoms=50)
    assert by_count[SUM_NAMES.index("structures")] == 7
    torch.testing.assert_close(by_atoms, by_count, rtol=1e-12, atol=0.0)


def test_targets_known_for_some_structures_count_only_there():
    """Data sets of several files may give forces and stress for some structures only:
    the loss and the error sums take each target where it is known, counted there."""
    silicon = labelled_silicon((1, 1, 1))  # energy, forces, stress
    molecule = structure_from_atoms(ase.build.molecule("CH4"))
    molecule.energy = -24.0  # energy only
    batch = collate([molecule, silicon], 3.0)
    assert batch.forces is not None and batch.stress is not None
    assert batch.forces_mask is not None and batch.stress_mask is not None
    assert batch.forces_mask.tolist() == [False] * 5 + [True] * 8
    assert batch.stress_mask.tolist() == [False, True]
    generator = torch.Generator().manual_seed(0)
    energy_error = torch.randn(2, generator=generator, dtype=torch.float64)
    force_error = torch.randn((13, 3), generator=generator, dtype=torch.float64)
    stress_error = torch.randn((2, 3, 3), generator=generator, dtype=torch.float64) * 1e-2
    predictions = {
        "energy": batch.energy + energy_error,
        "forces": batch.forces + force_error,
        "stress": batch.stress + stress_error,
    }
    counts = GlobalCounts(structures=2, force_components=24, stress_components=9)
    volume_per_atom = silicon.volume / silicon.n_atoms
    expected = (
        float(((energy_error / torch.tensor([5.0, 8.0])) ** 2).sum()) / 2
        + float((force_error[5:] ** 2).sum()) / 24
        + float(((stress_error[1] * volume_per_atom) ** 2).sum()) / 9
    )
    loss = float(batch_loss(predictions, batch, LossOptions(), counts))
    assert loss == pytest.approx(expected, rel=1e-12)
    sums = MetricSums()
    sums.accumulate(predictions, batch)
    values = dict(zip(SUM_NAMES, sums.values.tolist()))
    assert (values["force_components"], values["stress_components"]) == (24, 9)
    assert values["forces_squared"] == pytest.approx(float((force_error[5:] ** 2).sum()))
    assert values["stress_squared"] == pytest.approx(float((stress_error[1] ** 2).sum()))


def pairs(structure, cutoff: float) -> int:
    positions, cell, pbc = (structure.positions, structure.cell, structure.pbc)
    return compute_neighbor_list(positions.numpy(), cell.numpy(), pbc.numpy(), cutoff).n_pairs


def test_ranks_gradients_add_up_to_the_whole_batch_with_targets_known_in_part():
    """Molecules with forces, molecules with energies only, silicon with stress: the
    gradients of each rank's share of the loss, summed, are the whole batch's."""
    structures = (
        read(RESOURCES / "ethanol_40.xyz")[:4]
        + read(RESOURCES / "qm9_reduced_100.xyz", keys=TargetKeys(energy="U0"))[:4]
        + read(RESOURCES / "si_test.xyz")[7:10]
    )
    model = small_model([1, 6, 7, 8, 14])
    parameters = list(model.parameters())
    indices = list(range(len(structures)))
    counts = global_counts(FrameSet.from_structures(structures), indices)
    work = [pairs(structure, model.cutoff) for structure in structures]

    def gradients(part: list[int]) -> list[torch.Tensor]:
        batch = collate([structures[index] for index in part], model.cutoff)
        predictions = predict(model, batch, True, True, create_graph=True)
        loss = batch_loss(predictions, batch, LossOptions(), counts)
        return list(torch.autograd.grad(loss, parameters))

    whole = gradients(indices)
    shares = [shard_by_work(indices, work, rank, 2) for rank in range(2)]
    assert all(shares) and sorted(shares[0] + shares[1]) == indices
    summed = [a + b for a, b in zip(gradients(shares[0]), gradients(shares[1]))]
    for expected, actual in zip(whole, summed):
        torch.testing.assert_close(actual, expected, rtol=1e-12, atol=1e-15)
