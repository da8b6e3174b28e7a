"""Targets other than the energy, end to end: metatrain's own options files train
unchanged (QM7-X polarisability, Cartesian and spherical), the exported model gives
training's predictions in a process that never imports atomtrain, two processes and a
mid-epoch resume give the one-process model, and bad targets get one line."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import ase.io
import numpy as np
import pytest
import torch
import yaml

from atomtrain.ase import Calculator
from atomtrain.cli.main import main
from atomtrain.data.conventions import TargetKeys
from atomtrain.data.reading import read_structures
from atomtrain.errors import AtomtrainError
from atomtrain.training.checkpoint import load_checkpoint, model_from_checkpoint
from atomtrain.training.evaluation import predict
from atomtrain.training.llpr import predicted_uncertainties

from conftest import RESOURCES
from helpers import ENGINE_SETTINGS, TINY_PET, environment, run_directories, write_options
from test_faults import final_state, options_in, stop_then_resume_with_two, train_command

PYTHON = sys.executable
QM7X = RESOURCES / "qm7x_reduced_100.xyz"
QM9 = RESOURCES / "qm9_reduced_100.xyz"
ETHANOL = RESOURCES / "ethanol_40.xyz"

POLARISABILITY = {
    "key": "polarizability",
    "quantity": "polarizability",
    "unit": "bohr^3",
    "per_atom": False,
    "type": {"cartesian": {"rank": 2}},
}


def train(directory, options, *extra):
    result = subprocess.run(
        [PYTHON, "-m", "atomtrain", "train", str(options), *map(str, extra)],
        cwd=directory,
        env=environment(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    return result


def train_and_export(directory, options):
    """Train in ``directory`` with ``-o model.pt``; the run's directory."""
    result = train(directory, options, "-o", directory / "model.pt")
    assert result.returncode == 0, result.stderr[-3000:]
    (run,) = run_directories(directory / "outputs")
    return run


def metatrain_options(directory, data, targets, **changes):
    """An options file as metatrain users write it: targets beside each other under
    the data set's targets, with atomtrain's small test model."""
    changes = {"architecture__training__num_epochs": 2, **changes}
    options = write_options(directory, data, **changes)
    content = yaml.safe_load(options.read_text())
    content["training_set"] = {
        "systems": {"read_from": str(data), "length_unit": "angstrom"},
        "targets": targets,
    }
    options.write_text(yaml.safe_dump(content))
    return options


SMALL_MACE = {
    "name": "mace",
    "model": {"hidden_irreps": "8x0e + 8x1o", "num_interactions": 2, "r_max": 4.0, "max_ell": 2},
    "training": {"batch_size": 10, "num_epochs": 2},
}


@pytest.fixture(scope="module", params=["soap_bpnn", "mace", "pet"])
def polarisability_run(tmp_path_factory, request):
    directory = tmp_path_factory.mktemp("polarisability")
    options = metatrain_options(directory, QM7X, {"mtt::polarizability": POLARISABILITY})
    if request.param == "mace":
        if importlib.util.find_spec("mace") is None:  # importing mace sets a torch variable
            pytest.skip("mace-torch is not installed")
        content = yaml.safe_load(options.read_text())
        content["architecture"] = SMALL_MACE
        options.write_text(yaml.safe_dump(content))
    if request.param == "pet":  # on randomly rotated molecules, polarisabilities with them
        content = yaml.safe_load(options.read_text())
        content["architecture"] = {**SMALL_MACE, "name": "pet", "model": TINY_PET}
        options.write_text(yaml.safe_dump(content))
    return directory, train_and_export(directory, options)


EXPORTED = (
    ENGINE_SETTINGS
    + """
import json, sys
import ase.io
from metatomic.torch import ModelOutput
from metatomic_ase import MetatomicCalculator

frames = ase.io.read(sys.argv[1], ":4")
calculator = MetatomicCalculator(sys.argv[2], extensions_directory=sys.argv[3])
found = {"atomtrain imported": "atomtrain" in sys.modules}
for per_atom in (False, True):
    maps = calculator.run_model(frames, {sys.argv[4]: ModelOutput(per_atom=per_atom)})
    block = maps[sys.argv[4]].block()
    found[str(per_atom)] = {
        "values": block.values.detach().tolist(),
        "samples": block.samples.values.tolist(),
        "components": [c.names for c in block.components],
    }
found["outputs"] = sorted(calculator._model.capabilities().outputs)
print(json.dumps(found))
"""
)


def run_exported(model, data, name):
    result = subprocess.run(
        [PYTHON, "-c", EXPORTED, str(data), str(model), str(model.parent / "extensions"), name],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def training_predictions(checkpoint, data, keys, count=4):
    model = model_from_checkpoint(load_checkpoint(checkpoint), best=True)
    structures = read_structures(data, keys)
    batch = structures.batch(list(range(count)), model.cutoff).to("cpu", torch.float64)
    return {name: value.detach() for name, value in predict(model, batch, False, False).items()}


@pytest.mark.slow
def test_metatrain_polarisability_options_train_and_the_export_gives_training_values(
    polarisability_run,
):
    directory, run = polarisability_run
    log = (run / "train.log").read_text()
    assert "targets: no energy, mtt::polarizability" in log
    columns = (run / "train.csv").read_text().splitlines()[0]
    assert "validation_mtt::polarizability_rmse" in columns
    found = run_exported(directory / "model.pt", QM7X, "mtt::polarizability")
    assert not found["atomtrain imported"]
    # no energy was learnt; its LLPR uncertainty (the antisymmetric block linearised)
    assert found["outputs"] == ["mtt::aux::polarizability_uncertainty", "mtt::polarizability"]
    assert found["False"]["components"] == [["xyz_1"], ["xyz_2"]]
    exported = torch.tensor(found["False"]["values"], dtype=torch.float64).reshape(4, 9)
    keys = TargetKeys(read_energy=False, require_energy=False)
    expected = training_predictions(run / "best.ckpt", QM7X, keys)["mtt::polarizability"]
    assert torch.allclose(exported, expected, rtol=1e-10, atol=1e-10)
    # atomtrain's own calculator gives the same, in the file's layout
    for index, atoms in enumerate(ase.io.read(QM7X, ":4")):
        atoms.calc = Calculator(str(directory / "model.pt"))
        values = atoms.calc.get_property("mtt::polarizability", atoms)
        assert values.shape == (3, 3, 1)
        assert np.allclose(values.reshape(9), expected[index].numpy(), rtol=1e-10, atol=1e-10)
    # per atom on request: the atomic contributions, which sum to each structure's value
    per_atom = torch.tensor(found["True"]["values"], dtype=torch.float64).reshape(-1, 9)
    systems = torch.tensor(found["True"]["samples"])[:, 0]
    summed = torch.zeros(4, 9, dtype=torch.float64).index_add(0, systems, per_atom)
    assert torch.allclose(summed, exported, rtol=1e-10, atol=1e-10)


def test_eval_writes_a_prediction_for_every_target(polarisability_run, tmp_path, capsys):
    directory, run = polarisability_run
    description = tmp_path / "eval.yaml"
    description.write_text(
        yaml.safe_dump({"systems": str(QM7X), "targets": {"mtt::polarizability": POLARISABILITY}})
    )
    predictions = tmp_path / "predictions.xyz"
    assert (
        main(["eval", str(directory / "model.pt"), str(description), "-o", str(predictions)]) == 0
    )
    frames = ase.io.read(predictions, ":")
    reference = ase.io.read(QM7X, ":")
    predicted = np.stack([atoms.info["predicted_mtt_polarizability"] for atoms in frames])
    truth = np.stack([atoms.info["polarizability"] for atoms in reference]).reshape(-1, 9)
    assert predicted.shape == truth.shape
    rmse = np.sqrt(np.mean((predicted - truth) ** 2))
    mae = np.mean(np.abs(predicted - truth))
    (row,) = [line for line in capsys.readouterr().out.splitlines() if "qm7x_reduced" in line]
    assert [float(cell) for cell in row.split()[1:]] == pytest.approx([rmse, mae], abs=1e-4)
    assert predictions.with_suffix(".png").is_file()
    # an energy variant asked of a model that learnt no energy: one line, not ignored
    described = {"systems": str(QM7X), "targets": {"energy/r2scan": {"key": "energy"}}}
    description.write_text(yaml.safe_dump(described))
    capsys.readouterr()
    refused = tmp_path / "refused.xyz"  # not the working directory's predictions.xyz
    assert main(["eval", str(directory / "model.pt"), str(description), "-o", str(refused)]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "learnt no energy, so no 'energy/r2scan'" in line and str(QM7X) in line
    assert not refused.exists()


def l2_components(matrix):
    """metatrain's conversion of a polarisability to its o3_lambda 2 components."""
    a = np.asarray(matrix).reshape(3, 3)
    return np.array(
        [
            (a[0, 1] + a[1, 0]) / 2,
            (a[1, 2] + a[2, 1]) / 2,
            (2 * a[2, 2] - a[0, 0] - a[1, 1]) / (2 * np.sqrt(3)),
            (a[0, 2] + a[2, 0]) / 2,
            (a[0, 0] - a[1, 1]) / 2,
        ]
    )


@pytest.mark.slow
def test_metatrain_spherical_options_train(tmp_path):
    frames = ase.io.read(QM7X, ":")
    for atoms in frames:
        atoms.info["polarizability_l2"] = l2_components(atoms.info["polarizability"])
    data = tmp_path / "spherical.xyz"
    ase.io.write(data, frames, format="extxyz")
    spherical = {
        "key": "polarizability_l2",
        "type": {"spherical": {"irreps": [{"o3_lambda": 2, "o3_sigma": 1}]}},
    }
    options = metatrain_options(
        tmp_path, data, {"mtt::polarizability_l2": spherical}, architecture__training__num_epochs=4
    )
    result = train(tmp_path, options, "-o", tmp_path / "model.pt")
    assert result.returncode == 0, result.stderr[-3000:]
    found = run_exported(tmp_path / "model.pt", data, "mtt::polarizability_l2")
    assert found["False"]["components"] == [["o3_mu"]]
    values = np.array(found["False"]["values"])
    assert values.shape == (4, 5, 1)
    (run,) = run_directories(tmp_path / "outputs")
    rows = (run / "train.csv").read_text().splitlines()
    header = rows[0].split(",")
    (column,) = [
        position
        for position, name in enumerate(header)
        if name.startswith("train_mtt::polarizability_l2_rmse")
    ]
    first, last = float(rows[1].split(",")[column]), float(rows[-1].split(",")[column])
    assert last < first


def mixed_data(directory):
    """30 QM9 molecules with energies (U0, B3LYP, hartree), the HOMO-LUMO gap (a scalar
    per structure) and a per-atom vector (each atom's offset from the centroid)."""
    frames = ase.io.read(QM9, ":30")
    for atoms in frames:
        atoms.arrays["offset"] = atoms.positions - atoms.positions.mean(0)
    path = directory / "qm9_targets.xyz"
    ase.io.write(path, frames, format="extxyz")
    return path


QM9_TARGETS = {
    "energy/b3lyp": {"key": "U0", "unit": "hartree", "forces": False},
    "mtt::gap": {"key": "epsgap", "unit": "hartree"},
    "mtt::offset": {"key": "offset", "per_atom": True, "type": {"cartesian": {"rank": 1}}},
}


def mixed_options(directory, **changes):
    """Two levels of theory and two sections with different targets: ethanol (PBE,
    energy and forces) and QM9 (B3LYP energies as a variant, a scalar, a per-atom
    vector)."""
    options = options_in(directory, ETHANOL, **changes)
    content = yaml.safe_load(options.read_text())
    content["training_set"] = [
        {"systems": str(ETHANOL)},
        {
            "systems": str(mixed_data(directory)),
            "targets": QM9_TARGETS,
            "weight": 2.0,
            "epoch_fraction": 0.5,  # a different half of it each epoch
        },
    ]
    options.write_text(yaml.safe_dump(content))
    return options


@pytest.mark.slow
def test_two_processes_and_a_mid_epoch_resume_give_the_one_process_model(tmp_path):
    """Two energies, a scalar and a per-atom vector on two sections, one weighted and
    half of it sampled each epoch: SIGTERM a one-process run after its second epoch and
    resume it with two processes; the final model is the uninterrupted one-process
    run's."""
    reference_dir = tmp_path / "reference"
    reference_dir.mkdir()
    options = mixed_options(reference_dir)
    result = subprocess.run(
        train_command(options, reference_dir / "run"),
        env=environment(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    reference = final_state(reference_dir / "run")
    assert any(name.startswith("heads.1.") for name in reference)
    assert any(name.startswith("variant_heads.0.") for name in reference)
    resumed_dir = tmp_path / "resumed"
    resumed_dir.mkdir()
    options = mixed_options(resumed_dir, logging__figures=True)
    stop_then_resume_with_two(options, resumed_dir / "run", 12)
    actual = final_state(resumed_dir / "run")
    for name, value in reference.items():
        if value.is_floating_point():
            difference = (actual[name] - value).abs().max()
            assert difference <= 1e-8 * value.abs().max().clamp_min(1e-12), name
    # the LLPR of every output (fitted on two processes after the resume) is the one
    # process's, to the rounding of the sums' order
    best = [
        torch.load(directory / "run" / "best.ckpt", weights_only=True)["best_model_state"]
        for directory in (reference_dir, resumed_dir)
    ]
    assert best[0]["llpr_widths"].tolist() == [64, 32, 32, 528]
    assert torch.equal(best[1]["llpr_widths"], best[0]["llpr_widths"])
    # (the weights agree to 1e-8; the multipliers divide small validation errors by
    # variances along directions the regulariser, 1e-12 of the mean, barely bounds,
    # which amplifies that: 2.4e-4 measured for the per-atom vector's)
    for name, tolerance in (("llpr_covariance", 1e-6), ("llpr_multiplier", 1e-3)):
        torch.testing.assert_close(best[1][name], best[0][name], rtol=tolerance, atol=0)
    log = (resumed_dir / "run" / "train.log").read_text()
    assert "mtt::gap RMSE" in log and "mtt::offset RMSE" in log
    import matplotlib.image

    # energy per atom, energy, forces, mtt::gap, mtt::offset: two rows of three panels
    curves = matplotlib.image.imread(resumed_dir / "run" / "learning_curves.png")
    assert curves.shape[:2] == (700, 1350)


def one_line_error(result, *parts):
    assert result.returncode == 2, result.stderr[-2000:]
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    for part in parts:
        assert part in lines[0], lines[0]


@pytest.mark.parametrize(
    "target, parts",
    [
        ({"type": "vector"}, ["unknown target type 'vector'", "mtt::polarizability.type"]),
        (
            {"type": {"spherical": {"irreps": [{"o3_lambda": 3, "o3_sigma": 1}]}}},
            ["o3_lambda 3", "up to 2"],
        ),
        (
            {"key": "polarizability", "type": {"cartesian": {"rank": 1}}},
            ["frame 0", "has shape (9,), expected (3, 1)"],
        ),
        ({"key": "alpha"}, ["frame 0: no 'alpha'", "keys present: polarizability"]),
        (
            {"key": "polarizability", "per_atom": True},
            ["no 'polarizability' in the frame's per-atom arrays", "set per_atom: false"],
        ),
        (  # metatomic, which the exported model declares it to, refuses it: said first
            {**POLARISABILITY, "unit": "bohr^3/angstrum"},
            ["mtt::polarizability: unit 'bohr^3/angstrum'", "unknown unit 'angstrum'"],
        ),
    ],
)
def test_bad_targets_get_one_line(tmp_path, target, parts):
    options = metatrain_options(tmp_path, QM7X, {"mtt::polarizability": target})
    one_line_error(train(tmp_path, options, "--check"), *parts)
    assert not (tmp_path / "outputs").exists() or not list((tmp_path / "outputs").glob("*/*"))


@pytest.fixture(scope="module")
def two_energies(tmp_path_factory):
    directory = tmp_path_factory.mktemp("variants")
    options = mixed_options(directory, architecture__training__num_epochs=2)
    return directory, train_and_export(directory, options)


VARIANTS = (
    ENGINE_SETTINGS
    + """
import json, sys
import ase.io
from metatomic_ase import MetatomicCalculator

frames = ase.io.read(sys.argv[1], ":3")
found = {"atomtrain imported": "atomtrain" in sys.modules}
for variant in (None, "b3lyp"):
    chosen = None if variant is None else {"energy": variant}
    calculator = MetatomicCalculator(sys.argv[2], extensions_directory=sys.argv[3], variants=chosen)
    found[str(variant)] = [calculator.get_potential_energy(atoms) for atoms in frames]
print(json.dumps(found))
"""
)


def test_energy_variants_are_exported_as_metatomic_variants(two_energies):
    directory, run = two_energies
    data = directory / "qm9_targets.xyz"
    model = directory / "model.pt"
    result = subprocess.run(
        [PYTHON, "-c", VARIANTS, str(data), str(model), str(directory / "extensions")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    found = json.loads(result.stdout.strip().splitlines()[-1])
    assert not found["atomtrain imported"]
    checkpoint = run / "best.ckpt"
    model_in_training = model_from_checkpoint(load_checkpoint(checkpoint), best=True)
    assert model_in_training.energy_names == ["energy", "energy/b3lyp"]
    keys = TargetKeys(energy="U0", read_forces=False, read_stress=False)
    structures = read_structures(data, keys)
    batch = structures.batch([0, 1, 2], model_in_training.cutoff).to("cpu", torch.float64)
    for variant, name in ((0, "None"), (1, "b3lyp")):
        batch.energy_variant = torch.full((3,), variant)
        expected = predict(model_in_training, batch, False, False)["energy"].detach()
        assert np.allclose(found[name], expected.numpy(), rtol=1e-10), name
    assert abs(found["b3lyp"][0] - found["None"][0]) > 100  # two levels, two baselines
    atoms = ase.io.read(data, 0)
    atoms.calc = Calculator(str(model), variant="b3lyp")
    assert atoms.get_potential_energy() == pytest.approx(found["b3lyp"][0], rel=1e-10)


def test_eval_takes_the_variant_its_description_names(two_energies, tmp_path):
    directory, _ = two_energies
    description = tmp_path / "eval.yaml"
    data = directory / "qm9_targets.xyz"
    described = {"systems": str(data), "targets": {"energy/b3lyp": QM9_TARGETS["energy/b3lyp"]}}
    description.write_text(yaml.safe_dump(described))
    output = tmp_path / "predictions.xyz"
    assert main(["eval", str(directory / "model.pt"), str(description), "-o", str(output)]) == 0
    atoms = ase.io.read(output, 0)
    calculator = Calculator(str(directory / "model.pt"), variant="b3lyp")
    with pytest.raises(AtomtrainError, match="has no energy 'energy/pbe0'; it has energy, "):
        Calculator(str(directory / "model.pt"), variant="pbe0")  # a variant it lacks
    reference = ase.io.read(data, 0)
    reference.calc = calculator
    assert atoms.info["predicted_energy"] == pytest.approx(reference.get_potential_energy())
    # every target the model has, per atom in the arrays (names without colons)
    assert atoms.arrays["predicted_mtt_offset"].shape == (len(atoms), 3)
    assert atoms.info["predicted_mtt_gap"] == pytest.approx(
        calculator.get_property("mtt::gap", reference)[0]
    )
    described["targets"] = {"energy/pbe0": {"key": "U0", "unit": "hartree"}}
    description.write_text(yaml.safe_dump(described))
    result = subprocess.run(
        [PYTHON, "-m", "atomtrain", "eval", str(directory / "model.pt"), str(description)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    one_line_error(result, "has no 'energy/pbe0'", "energy, energy/b3lyp")


UNCERTAINTIES = (
    ENGINE_SETTINGS
    + """
import json, sys
import ase.io
from metatomic.torch import ModelOutput
from metatomic_ase import MetatomicCalculator

frames = ase.io.read(sys.argv[1], ":4")
calculator = MetatomicCalculator(sys.argv[2], extensions_directory=sys.argv[3])
found = {"atomtrain imported": "atomtrain" in sys.modules}
for name in sys.argv[4:]:
    for per_atom in (False, True):
        maps = calculator.run_model(frames, {name: ModelOutput(per_atom=per_atom)})
        found[f"{name} {per_atom}"] = maps[name].block().values.detach().tolist()
found["outputs"] = sorted(calculator._model.capabilities().outputs)
print(json.dumps(found))
"""
)


def test_every_energy_and_target_has_an_llpr_uncertainty(two_energies, tmp_path, capsys):
    """Both energies, the scalar and the per-atom vector get LLPR uncertainties: the
    export gives them by metatomic's and metatrain's names, per structure and per atom,
    as the training model computes them, and eval writes them beside the predictions."""
    directory, run = two_energies
    (said,) = [line for line in (run / "train.log").read_text().splitlines() if "LLPR" in line]
    for name in ("energy", "energy/b3lyp", "mtt::gap", "mtt::offset"):
        assert f" {name} (" in said
    data = directory / "qm9_targets.xyz"
    exported = {
        "energy/b3lyp": "energy_uncertainty/b3lyp",
        "mtt::gap": "mtt::aux::gap_uncertainty",
        "mtt::offset": "mtt::aux::offset_uncertainty",
    }
    model = directory / "model.pt"
    result = subprocess.run(
        [PYTHON, "-c", UNCERTAINTIES, str(data), str(model), str(directory / "extensions")]
        + list(exported.values()),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    found = json.loads(result.stdout.strip().splitlines()[-1])
    assert not found["atomtrain imported"]
    assert {"energy_uncertainty", *exported.values()} <= set(found["outputs"])
    trained = model_from_checkpoint(load_checkpoint(run / "best.ckpt"), best=True)
    keys = TargetKeys(energy="U0", read_forces=False, read_stress=False)
    batch = read_structures(data, keys).batch([0, 1, 2, 3], trained.cutoff)
    expected = predicted_uncertainties(trained, batch.to("cpu", torch.float64))
    for output, name in exported.items():
        for per_atom, values in enumerate(expected[output]):
            got = np.asarray(found[f"{name} {bool(per_atom)}"]).reshape(values.shape[0], -1)
            assert np.allclose(got, values.reshape(values.shape[0], -1).numpy(), rtol=1e-8)
            assert got.max() > 0
    description = tmp_path / "eval.yaml"
    description.write_text(yaml.safe_dump({"systems": str(data), "targets": QM9_TARGETS}))
    output = tmp_path / "predictions.xyz"
    assert main(["eval", str(model), str(description), "-o", str(output)]) == 0
    said = capsys.readouterr().out
    assert "mtt::gap uncertainty (LLPR): root mean square" in said
    assert "mtt::offset uncertainty (LLPR): root mean square" in said
    atoms = ase.io.read(output, 1)
    gap, offset = expected["mtt::gap"][0][1], expected["mtt::offset"][1]
    assert atoms.info["mtt_gap_uncertainty"] == pytest.approx(float(gap.reshape(())), rel=1e-8)
    start = int(batch.n_atoms[0])
    rows = offset[start : start + len(atoms)].reshape(len(atoms), 3).numpy()
    assert np.allclose(atoms.arrays["mtt_offset_uncertainty"], rows, rtol=1e-8)
    energy = expected["energy/b3lyp"][0][1]
    assert atoms.info["energy_uncertainty"] == pytest.approx(float(energy.reshape(())), rel=1e-8)


def weighted_options(directory, second: dict, first_frames=slice(0, 30)):
    frames = ase.io.read(ETHANOL, ":")
    ase.io.write(directory / "a.xyz", frames[first_frames], format="extxyz")
    ase.io.write(directory / "b.xyz", frames[30:], format="extxyz")
    options = write_options(directory, directory / "a.xyz", test_set=0.0)
    content = yaml.safe_load(options.read_text())
    sections = [{"systems": str(directory / "a.xyz")}]
    if second:
        sections.append({"systems": str(directory / "b.xyz"), **second})
    content["training_set"] = sections
    options.write_text(yaml.safe_dump(content))
    return options


def last_weights(directory, options):
    result = train(directory, options, "--run-dir", directory / "run")
    assert result.returncode == 0, result.stderr[-3000:]
    return torch.load(directory / "run" / "last.ckpt", weights_only=True)["model_state"]


@pytest.fixture(scope="module")
def alone_and_doubled(tmp_path_factory):
    """The weights of a run on the first section alone, and of one with the second
    section at weight 2, at two threads (as fixed_threads)."""
    found = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("OMP_NUM_THREADS", "2")
        for second in ({}, {"weight": 2.0}):
            directory = tmp_path_factory.mktemp("weighted")
            found.append(last_weights(directory, weighted_options(directory, second)))
    return found


@pytest.mark.parametrize("how", ["section", "per structure"])
@pytest.mark.slow
def test_a_weight_of_zero_gives_the_model_trained_without_the_section(
    tmp_path, how, fixed_threads, alone_and_doubled
):
    """MACE #1335 and fairchem's per-data-set weights: a weight must act. Here a weight
    of 0 leaves the section's structures out (they are still validated), a weight of 2
    changes the model."""
    expected, changed = alone_and_doubled
    zero = tmp_path / "zero"
    zero.mkdir()
    if how == "per structure":
        frames = ase.io.read(ETHANOL, ":")
        for index, atoms in enumerate(frames):
            atoms.info["w"] = 0.0 if index >= 30 else (2.0 if index == 0 else 1.0)
        ase.io.write(tmp_path / "weighted.xyz", frames, format="extxyz")
    options = weighted_options(zero, {"weight": 0.0})
    if how == "per structure":  # one file, its last ten structures of weight 0
        content = yaml.safe_load(options.read_text())
        content["training_set"] = [{"systems": str(tmp_path / "weighted.xyz"), "weight_key": "w"}]
        options.write_text(yaml.safe_dump(content))
    if how == "section":
        found = last_weights(zero, options)
        for name, value in expected.items():  # to rounding: threads follow the load
            assert torch.allclose(found[name], value, rtol=1e-9, atol=1e-12), name
        assert "8 structures of weight 0 left out" in (zero / "run" / "train.log").read_text()
    else:
        log = train(zero, options, "--run-dir", zero / "run")
        assert log.returncode == 0, log.stderr[-3000:]
        assert "structures of weight 0 left out" in (zero / "run" / "train.log").read_text()
    assert any(
        not torch.allclose(changed[name], value, rtol=1e-6) for name, value in expected.items()
    )


def test_a_missing_per_structure_weight_is_named(tmp_path):
    options = weighted_options(tmp_path, {"weight_key": "w"})
    one_line_error(train(tmp_path, options, "--check"), "b.xyz, frame 0", "weight_key")


@pytest.mark.slow
def test_fine_tuning_adds_a_head_and_keeps_the_others(two_energies, tmp_path):
    directory, run = two_energies
    options = write_options(
        tmp_path,
        ETHANOL,
        architecture__training__num_epochs=1,
        architecture__training__finetune={
            "read_from": str(run / "best.ckpt"),
            "inherit_heads": {"energy/pbe_new": "energy"},
        },
    )
    content = yaml.safe_load(options.read_text())
    content["training_set"] = {
        "systems": str(ETHANOL),
        "targets": {"energy/pbe_new": {"key": "energy", "unit": "eV"}},
    }
    options.write_text(yaml.safe_dump(content))
    result = train(tmp_path, options, "-o", tmp_path / "model.pt")
    assert result.returncode == 0, result.stderr[-3000:]
    (finetuned,) = run_directories(tmp_path / "outputs")
    assert (
        "fine-tuning adds heads for energy/pbe_new (from energy)"
        in (finetuned / "train.log").read_text()
    )
    model = model_from_checkpoint(load_checkpoint(finetuned / "best.ckpt"), best=True)
    assert model.energy_names == ["energy", "energy/b3lyp", "energy/pbe_new"]
    assert model.target_names == ["mtt::gap", "mtt::offset"]
    found = run_exported(tmp_path / "model.pt", QM9, "mtt::gap")
    assert found["outputs"] == [
        "energy",
        "energy/b3lyp",
        "energy/pbe_new",
        "mtt::gap",
        "mtt::offset",
    ]


@pytest.mark.slow
def test_a_target_reads_the_same_from_a_file_and_from_a_directory(tmp_path, fixed_threads):
    """A float64 model with an extra target is the same trained from an extended XYZ
    file and from its memory-mapped directory (metatrain's layout: <key>.bin, and
    atomtrain's float64 copy beside it). Threads fixed: compared to 1e-10, LLPR's factors
    included, the two runs must split their sums alike (fixed_threads)."""
    frames = ase.io.read(ETHANOL, ":")
    vectors = np.stack([(a.positions - a.positions.mean(0)).T @ a.numbers for a in frames])
    for atoms, vector in zip(frames, vectors):
        atoms.info["dipole"] = vector
    data = tmp_path / "ethanol_dipole.xyz"
    ase.io.write(data, frames, format="extxyz")
    directory = tmp_path / "ethanol_dipole"
    assert main(["convert", str(ETHANOL), "-o", str(directory), "--float64"]) == 0
    vectors.reshape(-1, 3, 1).astype(np.float32).tofile(directory / "dipole.bin")
    vectors.reshape(-1, 3, 1).astype(np.float64).tofile(directory / "atomtrain_dipole64.bin")
    target = {"key": "dipole", "unit": "e*angstrom", "type": {"cartesian": {"rank": 1}}}
    weights = []
    for name, source in (("file", data), ("directory", directory)):
        run = tmp_path / name
        run.mkdir()
        options = write_options(run, source, architecture__training__num_epochs=2)
        content = yaml.safe_load(options.read_text())
        content["training_set"]["targets"] = {"energy": {}, "mtt::dipole": target}
        options.write_text(yaml.safe_dump(content))
        weights.append(last_weights(run, options))
    for name, value in weights[0].items():
        assert torch.allclose(weights[1][name], value, rtol=1e-10, atol=1e-12), name
    assert any(name.startswith("heads.0.") for name in weights[0])
    (directory / "dipole.bin").unlink()
    (directory / "atomtrain_dipole64.bin").unlink()
    one_line_error(train(tmp_path / "directory", options, "--check"), "no dipole.bin")


# metatrain's tests/resources/options-extra-data.yaml, as it is (its data file's path)
METATRAIN_EXTRA_DATA = """
seed: 42

architecture:
  name: soap_bpnn
  training:
    batch_size: 5
    num_epochs: 1
  model:
    soap:
      max_radial: 4
      max_angular: 2

training_set:
  systems:
    read_from: {data}
    length_unit: angstrom
  targets:
    energy:
      key: U0
      unit: eV
  extra_data:
    extra:
      key: {extra_key}
      unit: eV

test_set: 0.5
validation_set: 0.1
"""


def test_metatrains_extra_data_options_train_unchanged(tmp_path, capsys):
    """metatrain's options-extra-data.yaml trains: its extra data is read and checked
    in every frame, and a key no frame has is named in one line, exit 2."""
    options = tmp_path / "options.yaml"
    options.write_text(METATRAIN_EXTRA_DATA.format(data=QM9, extra_key="U0"))
    assert main(["train", str(options), "--outputs", str(tmp_path / "outputs")]) == 0
    (run,) = run_directories(tmp_path / "outputs")
    log = (run / "train.log").read_text()
    assert "extra_data extra (key U0): read and checked in every frame, not trained on" in log
    options.write_text(METATRAIN_EXTRA_DATA.format(data=QM9, extra_key="charges"))
    capsys.readouterr()
    assert main(["train", str(options), "--check"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "qm9_reduced_100.xyz" in line and "frame 0" in line and "'charges'" in line
