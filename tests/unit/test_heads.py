"""Targets other than the energy: each type's heads are exactly as equivariant as the
type says, the spherical components follow real spherical harmonics, the data readers
name what is wrong, and the loss weighs each target as asked."""

from __future__ import annotations

import importlib.util

import ase
import ase.io
import numpy as np
import pytest
import torch
from scipy.spatial.transform import Rotation

from atomtrain.data import collate
from atomtrain.data.conventions import TargetKeys
from atomtrain.data.reading import read_structures
from atomtrain.data.system import Structure
from atomtrain.errors import DataError
from atomtrain.models import registry
from atomtrain.models.heads import matrix_from_spherical, spherical_from_matrix
from atomtrain.options import LossOptions
from atomtrain.targets import NON_CONSERVATIVE_FORCE, NON_CONSERVATIVE_STRESS, Irrep, TargetSpec
from atomtrain.training.augmentation import turn_target
from atomtrain.training.evaluation import predict
from atomtrain.training.llpr import edge_inputs
from atomtrain.training.losses import GlobalCounts, batch_loss

from conftest import RESOURCES
from helpers import small_model

SPECS = [
    TargetSpec("mtt::scalar", "s", "scalar", num_subtargets=2),
    TargetSpec("mtt::vector", "v", "cartesian", rank=1),
    TargetSpec("mtt::matrix", "t", "cartesian", rank=2, num_subtargets=2),
    TargetSpec(
        "mtt::spherical",
        "x",
        "spherical",
        irreps=(Irrep(0, 1), Irrep(1, 1), Irrep(1, -1), Irrep(2, 1), Irrep(2, -1)),
    ),
    TargetSpec("mtt::charges", "q", "scalar", per_atom=True),
    TargetSpec("mtt::atomic_vector", "w", "cartesian", rank=1, per_atom=True),
]


def model_with_heads(architecture="soap_bpnn", seed=0):
    if architecture == "soap_bpnn":
        model = small_model([1, 6, 8], seed=seed)
    else:
        if importlib.util.find_spec("mace") is None:  # importing mace sets a torch variable
            pytest.skip("mace-torch is not installed")
        torch.manual_seed(seed)
        model = registry.new_model(
            "mace", [1, 6, 8], hidden_irreps="8x0e + 8x1o", num_interactions=2, r_max=4.0
        ).set_precision(torch.float64)
    model.attach_targets(SPECS)
    generator = torch.Generator().manual_seed(seed)
    for head in model.heads:  # non-trivial outputs, baselines and scales
        last = head.network[-1].weight
        last.data.copy_(torch.randn(last.shape, generator=generator, dtype=last.dtype))
        head.baseline.copy_(torch.randn(head.baseline.shape, generator=generator))
        head.scale.fill_(1.7)
    return model


def molecule(positions):
    numbers = torch.tensor([6, 6, 8, 1, 1, 1, 1, 1, 1])
    return Structure(
        torch.as_tensor(positions), numbers, torch.zeros(3, 3), torch.zeros(3, dtype=bool)
    )


def outputs(model, positions):
    batch = collate([molecule(positions)], model.cutoff).to("cpu", torch.float64)
    return {k: v.detach().numpy() for k, v in predict(model, batch, True, False).items()}


def rotate(spec: TargetSpec, values: np.ndarray, matrix: np.ndarray) -> np.ndarray:
    """What ``values`` [samples, width] become under the orthogonal ``matrix``, as the
    target's type says (pseudotensors pick up the determinant): the turn the training
    data gets when an architecture learns from rotated structures."""
    matrices = torch.from_numpy(matrix).expand(values.shape[0], 3, 3)
    return turn_target(torch.from_numpy(values), spec, matrices).numpy()


@pytest.mark.parametrize("architecture", ["soap_bpnn", "mace"])
@pytest.mark.parametrize("transform", ["rotation", "inversion", "improper rotation"])
def test_every_target_type_is_exactly_as_equivariant_as_its_type(transform, architecture):
    model = model_with_heads(architecture)
    rotation = Rotation.random(random_state=3).as_matrix()
    matrix = {"rotation": rotation, "inversion": -np.eye(3), "improper rotation": -rotation}[
        transform
    ]
    positions = np.random.default_rng(1).normal(size=(9, 3)) * 1.2
    before, after = outputs(model, positions), outputs(model, positions @ matrix.T)
    for spec in SPECS:
        values = before[spec.name].reshape(before[spec.name].shape[0], -1)
        expected = rotate(spec, values, matrix).reshape(after[spec.name].shape)
        scale = np.abs(values).max()
        assert scale > 1e-3, spec.name  # the check is not about zeros
        assert np.abs(after[spec.name] - expected).max() <= 1e-10 * scale, spec.name
    assert np.abs(after["energy"] - before["energy"]).max() <= 1e-10 * np.abs(before["energy"])


def test_a_pseudotensor_is_not_a_tensor():
    """The check above can fail: the pseudovector treated as a vector does, under
    inversion."""
    model = model_with_heads()
    positions = np.random.default_rng(1).normal(size=(9, 3)) * 1.2
    before, after = outputs(model, positions), outputs(model, -positions)
    pseudo = before["mtt::spherical"][:, 4:7]
    assert np.abs(after["mtt::spherical"][:, 4:7] - (-pseudo)).max() > 1e-3


def test_spherical_components_are_real_spherical_harmonics():
    """o3_mu of a vector are (y, z, x); the five of a matrix are proportional to the
    real spherical harmonics of order 2 (sphericart's, metatensor's convention)."""
    import sphericart.torch

    directions = torch.nn.functional.normalize(torch.randn(20, 3, dtype=torch.float64), dim=1)
    harmonics = sphericart.torch.SphericalHarmonics(2)(directions)  # [20, 9]
    identity = torch.eye(3, dtype=torch.float64)
    outer = directions[:, :, None] * directions[:, None, :] - identity / 3
    components = spherical_from_matrix(outer)
    ratio = components / harmonics[:, 4:9]
    assert torch.allclose(ratio, ratio[0, 0].expand_as(ratio), rtol=1e-10)
    vector_ratio = directions[:, [1, 2, 0]] / harmonics[:, 1:4]
    assert torch.allclose(vector_ratio, vector_ratio[0, 0].expand_as(vector_ratio), rtol=1e-10)
    back = matrix_from_spherical(components)
    assert torch.allclose(back, outer, atol=1e-12)


def test_per_structure_targets_sum_the_per_atom_contributions():
    model = model_with_heads()
    positions = np.random.default_rng(2).normal(size=(9, 3)) * 1.2
    batch = collate([molecule(positions), molecule(positions * 1.1)], model.cutoff)
    batch = batch.to("cpu", torch.float64)
    atomic = model.atomic_predictions(*edge_inputs(model, batch))
    totals = predict(model, batch, False, False)
    for spec in SPECS:
        if spec.per_atom:
            assert torch.equal(totals[spec.name], atomic[spec.name])
            continue
        summed = torch.stack([atomic[spec.name][:9].sum(0), atomic[spec.name][9:].sum(0)])
        assert torch.allclose(totals[spec.name], summed, rtol=1e-12, atol=1e-12)
    assert torch.allclose(totals["energy"][0], atomic["energy"][:9].sum(), rtol=1e-12)


def write_frames(path, frames):
    ase.io.write(path, frames, format="extxyz")
    return path


def qm7x_frames(count=3):
    return ase.io.read(RESOURCES / "qm7x_reduced_100.xyz", f":{count}")


def polarisability_keys(**changes) -> TargetKeys:
    spec = TargetSpec("mtt::polarizability", "polarizability", "cartesian", rank=2, **changes)
    return TargetKeys(read_energy=False, require_energy=False, others=(spec,))


def test_a_rank_2_target_is_read_row_major():
    structures = read_structures(RESOURCES / "qm7x_reduced_100.xyz", polarisability_keys())
    reference = qm7x_frames(1)[0].info["polarizability"]
    values = structures[0].targets["mtt::polarizability"].numpy()
    assert np.array_equal(values, np.asarray(reference).reshape(9))
    assert structures[0].energy is None


def test_a_frame_without_the_key_is_named(tmp_path):
    frames = qm7x_frames()
    del frames[2].info["polarizability"]
    path = write_frames(tmp_path / "data.xyz", frames)
    with pytest.raises(DataError) as error:
        read_structures(path, polarisability_keys())
    message = str(error.value)
    assert f"{path}, frame 2: no 'polarizability'" in message
    assert "mtt::polarizability" in message and "\n" not in message


def test_a_target_of_the_wrong_shape_names_both_shapes(tmp_path):
    frames = qm7x_frames()
    frames[1].info["polarizability"] = np.arange(6.0)
    path = write_frames(tmp_path / "data.xyz", frames)
    with pytest.raises(DataError) as error:
        read_structures(path, polarisability_keys())
    message = str(error.value)
    assert f"{path}, frame 1:" in message
    assert "has shape (6,), expected (3, 3, 1)" in message


def test_a_per_atom_target_is_read_from_the_arrays(tmp_path):
    frames = qm7x_frames()
    for atoms in frames:
        atoms.arrays["charges"] = np.linspace(-1, 1, len(atoms))
    path = write_frames(tmp_path / "data.xyz", frames)
    spec = TargetSpec("mtt::charges", "charges", "scalar", per_atom=True)
    keys = TargetKeys(read_energy=False, require_energy=False, others=(spec,))
    structures = read_structures(path, keys)
    batch = structures.batch([0, 1], 5.0)
    assert batch.targets["mtt::charges"].shape == (len(frames[0]) + len(frames[1]), 1)


def vector_loss_case(seed: int, copies: int = 1):
    """Predictions of the mtt::vector head for ``copies`` of one random molecule, a
    batch whose only target is that vector at zero, and the counts the loss divides by."""
    model = model_with_heads()
    positions = np.random.default_rng(seed).normal(size=(9, 3)) * 1.2
    batch = collate([molecule(positions)] * copies, model.cutoff).to("cpu", torch.float64)
    predictions = predict(model, batch, False, False)
    batch.energy = None
    batch.targets = {"mtt::vector": torch.zeros(copies, 3, dtype=torch.float64)}
    return predictions, batch, GlobalCounts(copies, 0, 0, {"mtt::vector": 3})


def test_a_target_weight_changes_the_loss():
    """MACE #1335: a weight silently ignored. Here each weight scales its own term."""
    predictions, batch, counts = vector_loss_case(seed=4)
    once = batch_loss(predictions, batch, LossOptions(), counts)
    expected = (predictions["mtt::vector"] ** 2).sum() / 3
    assert torch.allclose(once, expected)
    weighted = LossOptions.model_validate({"weights": {"mtt::vector": 2.5}})
    assert torch.allclose(batch_loss(predictions, batch, weighted, counts), 2.5 * once)
    off = LossOptions.model_validate({"target_weights": {"mtt::vector": 0.0}})
    assert float(batch_loss(predictions, batch, off, counts).detach()) == 0.0


def test_unknown_samples_add_nothing():
    predictions, batch, counts = vector_loss_case(seed=5, copies=2)
    batch.target_masks = {"mtt::vector": torch.tensor([True, False])}
    loss = batch_loss(predictions, batch, LossOptions(), counts)
    assert torch.allclose(loss, (predictions["mtt::vector"][0] ** 2).sum() / 3)


@pytest.mark.parametrize("architecture", ["soap_bpnn", "mace"])
def test_an_empty_share_of_a_batch_runs_through_every_head(architecture):
    """A rank whose share of a short global batch is empty still runs the model, so that
    it takes part in the gradient reduction."""
    from atomtrain.data.batch import empty_batch

    model = model_with_heads(architecture)
    model.attach_targets(SPECS, ["energy", "energy/other"])
    batch = empty_batch(True, True, False).to("cpu", torch.float64)
    batch.energy_variant = torch.zeros(0, dtype=torch.long)
    predictions = predict(model, batch, True, False, True)
    for spec in SPECS:
        assert predictions[spec.name].shape == (0, spec.width)
    assert predictions["energy"].shape == (0,) and predictions["forces"].shape == (0, 3)


def test_a_new_variant_inherited_from_the_energy_starts_equal_to_it():
    """metatrain's inherit_heads {energy/r2scan: energy}: the new head learns the
    difference to the energy, and starts at zero difference."""
    from atomtrain.training.new_heads import extend_heads

    model = model_with_heads()
    added = extend_heads(model, SPECS, ["energy", "energy/r2scan"], {"energy/r2scan": "energy"})
    assert added == {"energy/r2scan"} and model.variant_relative == [True]
    positions = np.random.default_rng(6).normal(size=(9, 3)) * 1.2
    batch = collate([molecule(positions)], model.cutoff).to("cpu", torch.float64)
    main = predict(model, batch, True, False)
    batch.energy_variant = torch.ones(1, dtype=torch.long)
    variant = predict(model, batch, True, False)
    assert torch.allclose(variant["energy"], main["energy"], rtol=1e-14)
    assert torch.allclose(variant["forces"], main["forces"], rtol=1e-12, atol=1e-14)
    # and it is a head of its own: changing it moves the variant only
    torch.nn.init.normal_(model.variant_heads[0].network[-1].weight)
    moved = predict(model, batch, True, False)
    batch.energy_variant = None
    assert not torch.allclose(moved["energy"], main["energy"])
    assert torch.equal(predict(model, batch, True, False)["energy"], main["energy"])


def test_a_new_target_inherited_from_another_copies_its_head():
    from atomtrain.errors import OptionsError
    from atomtrain.training.new_heads import extend_heads

    model = model_with_heads()
    dipole = TargetSpec("mtt::dipole_b3lyp", "d", "cartesian", rank=1)
    before = model.heads[1].state_dict()  # mtt::vector
    extend_heads(model, [*SPECS, dipole], ["energy"], {"mtt::dipole_b3lyp": "mtt::vector"})
    assert model.target_names[-1] == "mtt::dipole_b3lyp"
    for name, value in model.heads[-1].state_dict().items():
        assert torch.equal(value, before[name]), name
    for name, value in model.heads[1].state_dict().items():  # its own heads are kept
        assert torch.equal(value, before[name]), name
    with pytest.raises(OptionsError, match="differ in type"):
        extend_heads(
            model_with_heads(), [*SPECS, dipole], ["energy"], {"mtt::dipole_b3lyp": "mtt::scalar"}
        )
    with pytest.raises(OptionsError, match="has no target 'mtt::none'"):
        extend_heads(
            model_with_heads(), [*SPECS, dipole], ["energy"], {"mtt::dipole_b3lyp": "mtt::none"}
        )
    with pytest.raises(OptionsError, match="not a target this run adds"):
        extend_heads(model_with_heads(), SPECS, ["energy"], {"mtt::vector": "mtt::scalar"})


def test_a_target_may_have_a_loss_of_its_own():
    """metatrain's per-target loss: {mtt::x: {type: mae, weight: 3}}."""
    from atomtrain.options import parse_options

    options = parse_options(
        {
            "training_set": "data.xyz",
            "architecture": {
                "training": {"loss": {"energy": "mse", "mtt::vector": {"type": "mae", "weight": 3}}}
            },
        }
    )
    loss_options = options.architecture.training.loss
    assert loss_options.target_loss("mtt::vector") == ("mae", 1.0)
    predictions, batch, counts = vector_loss_case(seed=7)
    loss = batch_loss(predictions, batch, loss_options, counts)
    assert torch.allclose(loss, 3 * predictions["mtt::vector"].abs().sum() / 3)


DIRECT = [
    TargetSpec(NON_CONSERVATIVE_FORCE, "forces", "cartesian", rank=1, per_atom=True),
    TargetSpec(NON_CONSERVATIVE_STRESS, "stress", "cartesian", rank=2),
]


def crystal(positions, cell, periodic=True):
    numbers = torch.tensor([6, 6, 8, 1, 1, 1, 1, 1, 1])
    return Structure(
        torch.as_tensor(positions),
        numbers,
        torch.as_tensor(cell) if periodic else torch.zeros(3, 3, dtype=torch.float64),
        torch.full((3,), periodic),
    )


def direct_predictions(model, structures):
    batch = collate(structures, model.cutoff).to("cpu", torch.float64)
    return {k: v.detach().numpy() for k, v in predict(model, batch, False, False).items()}


def test_direct_forces_and_stress_turn_with_the_cell_and_the_stress_is_intensive():
    """A non-conservative stress is a symmetric matrix that turns as R S R^T, its atoms'
    sum over the cell's volume: a supercell twice as long has the same stress and each
    atom the same force; a structure that is not periodic has none."""
    model = small_model([1, 6, 8], seed=4)
    model.attach_targets(DIRECT)
    generator = torch.Generator().manual_seed(4)
    for head in model.heads:
        last = head.network[-1].weight
        last.data.copy_(torch.randn(last.shape, generator=generator, dtype=last.dtype))
        head.baseline.copy_(torch.randn(head.baseline.shape, generator=generator))
    rng = np.random.default_rng(5)
    cell = np.diag([6.0, 6.5, 7.0]) + rng.normal(size=(3, 3)) * 0.3
    positions = rng.uniform(size=(9, 3)) @ cell
    rotation = Rotation.random(random_state=6).as_matrix()
    doubled = np.concatenate([positions, positions + cell[0]])
    supercell = np.stack([2 * cell[0], cell[1], cell[2]])
    twice = Structure(
        torch.as_tensor(doubled),
        torch.tensor([6, 6, 8, 1, 1, 1, 1, 1, 1] * 2),
        torch.as_tensor(supercell),
        torch.ones(3, dtype=torch.bool),
    )
    found = direct_predictions(
        model,
        [
            crystal(positions, cell),
            crystal(positions @ rotation.T, cell @ rotation.T),
            twice,
            crystal(positions, cell, periodic=False),
        ],
    )
    forces, stress = found[NON_CONSERVATIVE_FORCE], found[NON_CONSERVATIVE_STRESS]
    stress = stress.reshape(-1, 3, 3)
    scale = np.abs(stress[0]).max()
    assert scale > 1e-6 and np.abs(forces[:9]).max() > 1e-3  # not about zeros
    assert np.abs(stress[0] - stress[0].T).max() <= 1e-12 * scale
    assert np.abs(stress[1] - rotation @ stress[0] @ rotation.T).max() <= 1e-10 * scale
    assert np.abs(forces[9:18] - forces[:9] @ rotation.T).max() <= 1e-10 * np.abs(forces).max()
    assert np.abs(stress[2] - stress[0]).max() <= 1e-10 * scale
    assert np.abs(forces[18:27] - forces[:9]).max() <= 1e-10 * np.abs(forces).max()
    assert np.abs(forces[27:36] - forces[:9]).max() <= 1e-10 * np.abs(forces).max()
    assert np.array_equal(stress[3], np.zeros((3, 3)))


def test_a_stress_in_voigt_order_is_read_as_its_matrix(tmp_path):
    frames = qm7x_frames(2)
    matrix = np.arange(9.0).reshape(3, 3) + np.arange(9.0).reshape(3, 3).T
    stresses = [np.array([1.0, 2.0, 3.0, 4.0, 5.0, 6.0]), matrix]
    for atoms, stress in zip(frames, stresses):
        atoms.info["stress"] = stress
        atoms.cell, atoms.pbc = np.eye(3) * 10.0, True
    write_frames(tmp_path / "s.xyz", frames)
    spec = DIRECT[1]
    keys = TargetKeys(read_energy=False, require_energy=False, read_stress=False, others=(spec,))
    structures = read_structures(tmp_path / "s.xyz", keys)
    voigt, full = (structures[i].targets[spec.name].numpy() for i in range(2))
    assert np.array_equal(voigt.reshape(3, 3), [[1, 6, 5], [6, 2, 4], [5, 4, 3]])
    assert np.array_equal(full, matrix.reshape(9))
