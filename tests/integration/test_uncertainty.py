"""The energy's LLPR uncertainty (architecture.training.uncertainty, training/llpr.py),
end to end: a model trained on bulk silicon (AIMD and strained crystals) is more
uncertain where it errs more on held-back structures (vacancies and surfaces among
them); the exported model's ``energy_uncertainty`` (per structure and per atom) is what
``atomtrain eval`` writes; ``uncertainty: none`` exports none; two processes compute the
one-process covariance."""

from __future__ import annotations

import ase.io
import numpy as np
import pytest
import torch
import yaml

from atomtrain.cli.main import main

from conftest import EXAMPLES, RESOURCES
from helpers import run_directories, write_options
from test_faults import PYTHON, start_in_own_session

BULK = ("AIMD-NVT", "Elastic")


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
    options = silicon_options(directory, bulk)
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
