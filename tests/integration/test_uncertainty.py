"""The energy's LLPR uncertainty (architecture.training.uncertainty, training/llpr.py),
end to end: a model trained on bulk silicon (AIMD and strained crystals) is more
uncertain where it errs more on held-back structures (vacancies and surfaces among
them); the exported model's ``energy_uncertainty`` (per structure and per atom) is what
``atomtrain eval`` writes; its ``energy_ensemble`` (``ensemble_members``) averages to
the model's energy and forces and spreads as the uncertainty, and i-PI's metatomic
driver reads it as a committee; ``uncertainty: none`` exports none; two processes
compute the one-process covariance."""

from __future__ import annotations

import json

import ase.io
import ase.units
import numpy as np
import pytest
import torch
import yaml

from atomtrain.cli.main import main

from conftest import EXAMPLES, RESOURCES
from helpers import run_directories, write_options
from test_faults import PYTHON, start_in_own_session

BULK = ("AIMD-NVT", "Elastic")
ENSEMBLE = 2000  # members: their spread matches the uncertainty to about 1.6 %


def silicon_files(directory):
    """bulk.xyz: 120 bulk structures to train on; held.xyz: the other 25 bulk ones, the
    vacancies and the surfaces."""
    frames = ase.io.read(EXAMPLES / "silicon" / "si_train.xyz", ":")
    bulk = [atoms for atoms in frames if atoms.info["config_type"] in BULK]
    other = [atoms for atoms in frames if atoms.info["config_type"] not in BULK]
    ase.io.write(directory / "bulk.xyz", bulk[:120])
    ase.io.write(directory / "held.xyz", bulk[120:] + other)
    return directory / "bulk.xyz", directory / "held.xyz"


def silicon_options(directory, data, **training):
    options = {
        "seed": 7,
        "device": "cpu",
        "architecture": {
            "name": "soap_bpnn",
            "model": {
                "soap": {"cutoff": {"radius": 5.0, "width": 0.5}, "max_radial": 6, "max_angular": 4}
            },
            "training": {
                "batch_size": 8,
                "num_epochs": 15,
                "learning_rate": 0.003,
                "loss": {"weights": {"energy": 1.0, "forces": 1.0, "stress": 1.0}},
                **training,
            },
        },
        "training_set": {
            "systems": str(data),
            "targets": {"energy": {"key": "energy", "forces": True, "stress": True}},
        },
        "validation_set": 0.15,
        "test_set": 0.0,
        "logging": {"tensorboard": False},
    }
    path = directory / "options.yaml"
    path.write_text(yaml.safe_dump(options))
    return path


@pytest.fixture(scope="module")
def silicon(tmp_path_factory):
    directory = tmp_path_factory.mktemp("silicon")
    bulk, held = silicon_files(directory)
    options = silicon_options(directory, bulk, ensemble_members=ENSEMBLE)
    assert main(["train", str(options), "--outputs", str(directory / "outputs")]) == 0
    (run,) = run_directories(directory / "outputs")
    predictions = directory / "held_predictions.xyz"
    assert main(["eval", str(run / "model.pt"), str(held), "-o", str(predictions)]) == 0
    return run, held, ase.io.read(predictions, ":")


def test_the_most_uncertain_structures_have_the_largest_errors(silicon):
    _, _, predicted = silicon
    atoms = np.array([len(frame) for frame in predicted], dtype=float)
    errors = np.abs(
        [frame.info["predicted_energy"] - frame.get_potential_energy() for frame in predicted]
    )
    sigmas = np.array([frame.info["energy_uncertainty"] for frame in predicted])
    errors, sigmas = errors / atoms, sigmas / atoms
    order = np.argsort(sigmas)
    third = len(order) // 3
    assert errors[order[-third:]].mean() > 1.5 * errors[order[:third]].mean()
    # and by kind: the surfaces, furthest from bulk, are the most uncertain
    kinds = np.array([frame.info["config_type"] for frame in predicted])
    assert sigmas[kinds == "Surface"].mean() > 2 * sigmas[np.isin(kinds, BULK)].mean()


def test_the_exported_model_gives_the_uncertainties_eval_writes(silicon):
    from metatomic.torch import ModelOutput, load_atomistic_model
    from metatomic_ase import MetatomicCalculator

    run, held, predicted = silicon
    frames = ase.io.read(held, ":3")
    calculator = MetatomicCalculator(
        str(run / "model.pt"), extensions_directory=str(run / "extensions")
    )
    model = load_atomistic_model(str(run / "model.pt"), str(run / "extensions"))
    assert "energy_uncertainty" in model.capabilities().outputs
    for frame, written in zip(frames, predicted[:3]):
        for kind, expected in (
            ("system", [written.info["energy_uncertainty"]]),
            ("atom", written.arrays["atomic_energy_uncertainty"].reshape(-1)),
        ):
            outputs = {"energy_uncertainty": ModelOutput(sample_kind=kind)}
            found = calculator.run_model(frame, outputs)["energy_uncertainty"]
            values = found.block().values.detach().reshape(-1).numpy()
            # float32 features: eval's batches and the engine's vectors round apart
            np.testing.assert_allclose(values, expected, rtol=1e-4)
        # with the energy, from the same pass: the same energy as alone
        both = calculator.run_model(
            frame,
            {
                "energy": ModelOutput(sample_kind="system"),
                "energy_uncertainty": ModelOutput(sample_kind="atom"),
            },
        )
        alone = calculator.run_model(frame, {"energy": ModelOutput(sample_kind="system")})
        torch.testing.assert_close(
            both["energy"].block().values, alone["energy"].block().values, rtol=1e-14, atol=0
        )


def test_the_exported_ensemble_spreads_as_the_uncertainty_around_the_model(silicon):
    """energy_ensemble: its members' mean is the model's energy, and their forces'
    mean the model's forces (autograd through the engine's positions); their spread is
    the LLPR uncertainty, to the sampling error of 2000 members."""
    from metatomic.torch import (
        ModelEvaluationOptions,
        ModelOutput,
        load_atomistic_model,
        systems_to_torch,
    )
    from metatomic_ase import MetatomicCalculator
    from vesin.metatomic import compute_requested_neighbors

    run, held, predicted = silicon
    path, extensions = str(run / "model.pt"), str(run / "extensions")
    model = load_atomistic_model(path, extensions)
    assert "energy_ensemble" in model.capabilities().outputs
    calculator = MetatomicCalculator(path, extensions_directory=extensions)
    for frame, written in zip(ase.io.read(held, ":3"), predicted[:3]):
        system = systems_to_torch(frame, dtype=torch.float64, positions_requires_grad=True)
        compute_requested_neighbors([system], "angstrom", model)
        outputs = {
            "energy_ensemble": ModelOutput(sample_kind="system"),
            "energy": ModelOutput(sample_kind="system"),
        }
        options = ModelEvaluationOptions(length_unit="angstrom", outputs=outputs)
        found = model([system], options, check_consistency=True)
        values = found["energy_ensemble"].block().values.reshape(-1)
        assert values.shape == (ENSEMBLE,)
        energy = found["energy"].block().values.reshape(())
        torch.testing.assert_close(values.mean(), energy, rtol=1e-12, atol=0)
        spread = float(values.detach().std())
        assert spread == pytest.approx(written.info["energy_uncertainty"], rel=0.08)
        (gradient,) = torch.autograd.grad(values.mean(), system.positions)
        frame.calc = calculator
        np.testing.assert_allclose(-gradient.numpy(), frame.get_forces(), atol=1e-6, rtol=1e-6)
        # and per atom: the members' atomic energies sum to theirs
        outputs = {"energy_ensemble": ModelOutput(sample_kind="atom")}
        options = ModelEvaluationOptions(length_unit="angstrom", outputs=outputs)
        atomic = model([system], options, check_consistency=True)["energy_ensemble"]
        summed = atomic.block().values.sum(0).reshape(-1)
        torch.testing.assert_close(summed, values, rtol=1e-10, atol=1e-8)


@pytest.mark.slow
def test_i_pis_metatomic_driver_reads_the_ensemble_as_a_committee(silicon, tmp_path):
    """i-PI's own metatomic driver, with energy_ensemble and force_virial_ensemble: the
    committee's energies average to the potential and its forces (a Jacobian over the
    members) to the forces."""
    from ipi.pes.metatomic import MetatomicDriver

    run, held, _ = silicon
    frame = ase.io.read(held, 0)
    ase.io.write(tmp_path / "template.xyz", frame)
    driver = MetatomicDriver(
        str(tmp_path / "template.xyz"),
        str(run / "model.pt"),
        extensions=str(run / "extensions"),
        energy_ensemble=True,
        force_virial_ensemble=True,
    )
    bohr = ase.units.Bohr
    potential, forces, _, extras = driver.compute_structure(
        frame.cell.array.T / bohr, frame.positions / bohr
    )
    extras = json.loads(extras)  # i-PI's extras: a JSON string
    committee = np.array(extras["committee_pot"])
    assert committee.shape == (ENSEMBLE,)
    assert committee.mean() == pytest.approx(potential, rel=1e-12)
    members = np.array(extras["committee_force"]).reshape(ENSEMBLE, -1)
    np.testing.assert_allclose(members.mean(0), np.asarray(forces).reshape(-1), atol=1e-7)
    assert members.std(0).mean() > 1e-4  # a spread of forces, in hartree/bohr


def test_an_ensemble_without_llpr_is_one_line(tmp_path, capsys):
    bulk, _ = silicon_files(tmp_path)
    options = silicon_options(tmp_path, bulk, uncertainty="none", ensemble_members=8)
    assert main(["train", str(options), "--check"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "ensemble_members: 8" in line and "uncertainty: llpr" in line


def test_no_uncertainty_when_switched_off(tmp_path):
    from metatomic.torch import load_atomistic_model

    bulk, held = silicon_files(tmp_path)
    options = silicon_options(tmp_path, bulk, num_epochs=1, uncertainty="none")
    assert main(["train", str(options), "--outputs", str(tmp_path / "outputs")]) == 0
    (run,) = run_directories(tmp_path / "outputs")
    model = load_atomistic_model(str(run / "model.pt"), str(run / "extensions"))
    assert "energy_uncertainty" not in model.capabilities().outputs
    assert "energy" in model.capabilities().outputs
    predictions = tmp_path / "predictions.xyz"
    assert main(["eval", str(run / "model.pt"), str(held), "-o", str(predictions)]) == 0
    assert "energy_uncertainty" not in ase.io.read(predictions, 0).info


def test_without_a_validation_set_the_training_set_calibrates(tmp_path):
    options = write_options(
        tmp_path, RESOURCES / "ethanol_40.xyz", validation_set=0.0, test_set=0.0
    )
    assert main(["train", str(options), "--outputs", str(tmp_path / "outputs")]) == 0
    (run,) = run_directories(tmp_path / "outputs")
    log = (run / "train.log").read_text()
    assert "fitted on 40 training samples" in log
    assert "no validation set: calibrated on the training set" in log
    state = torch.load(run / "best.ckpt", weights_only=True)["best_model_state"]
    assert float(state["llpr_multiplier"]) > 0


def test_a_bad_uncertainty_method_is_one_line(tmp_path, capsys):
    bulk, _ = silicon_files(tmp_path)
    options = silicon_options(tmp_path, bulk, uncertainty="ensemble")
    assert main(["train", str(options), "--check"]) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1
    assert "uncertainty" in error[0] and "llpr" in error[0]


@pytest.mark.slow
def test_two_processes_compute_the_one_process_covariance(tmp_path):
    """In float64, where two processes train the one-process model (to 1e-8): the
    covariance sums every process's share, so it is the one-process matrix to the
    rounding of the sums' order."""
    bulk, _ = silicon_files(tmp_path)
    options = silicon_options(tmp_path, bulk, num_epochs=3)
    settings = yaml.safe_load(options.read_text())
    options.write_text(yaml.safe_dump({**settings, "base_precision": 64}))
    states = []
    for processes in (1, 2):
        run = tmp_path / f"run{processes}"
        command = [PYTHON, "-m", "atomtrain", "train", str(options), "--run-dir", str(run)]
        launcher = start_in_own_session(command + ["--nproc", str(processes)])
        _, stderr = launcher.communicate(timeout=300)
        assert launcher.returncode == 0, stderr[-2000:]
        states.append(torch.load(run / "last.ckpt", weights_only=True)["best_model_state"])
    one, two = states
    covariance = one["llpr_covariance"]
    assert covariance.shape[0] > 0 and float(covariance.abs().max()) > 0
    torch.testing.assert_close(two["llpr_covariance"], covariance, rtol=1e-10, atol=0)
    torch.testing.assert_close(two["llpr_multiplier"], one["llpr_multiplier"], rtol=1e-6, atol=0)
