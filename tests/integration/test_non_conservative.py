"""Non-conservative (direct) forces and stress, end to end: metatrain's options train
them beside the energy, the exported model gives them as metatomic's outputs to
metatomic-ase's ``non_conservative=True`` (and by i-PI's older name) in a process that
never imports atomtrain, and a model trained on direct forces fine-tunes to
conservative ones."""

from __future__ import annotations

import json
import subprocess
import sys

import ase.io
import numpy as np
import pytest
import torch
import yaml

from atomtrain.ase import Calculator
from atomtrain.data.conventions import TargetKeys
from atomtrain.data.reading import read_structures
from atomtrain.targets import NON_CONSERVATIVE_FORCE, NON_CONSERVATIVE_STRESS
from atomtrain.training.checkpoint import load_checkpoint, model_from_checkpoint
from atomtrain.training.evaluation import predict

from conftest import EXAMPLES, RESOURCES
from helpers import ENGINE_SETTINGS, TINY_PET, environment, run_directories, write_options

PYTHON = sys.executable
SILICON = RESOURCES / "si_test.xyz"  # 25 cells of 63 atoms, energies, forces and stress

# as metatrain's options give them
DIRECT = {
    "non_conservative_forces": {
        "key": "forces",
        "type": {"cartesian": {"rank": 1}},
        "per_atom": True,
        "unit": "eV/A",
    },
    "non_conservative_stress": {
        "key": "stress",
        "type": {"cartesian": {"rank": 2}},
        "unit": "eV/A^3",
    },
}


def options_with(directory, targets, **changes):
    changes = {
        "architecture__training__num_epochs": 2,
        "architecture__training__batch_size": 4,
        **changes,
    }
    options = write_options(directory, SILICON, **changes)
    content = yaml.safe_load(options.read_text())
    content["training_set"] = {"systems": str(SILICON), "targets": targets}
    options.write_text(yaml.safe_dump(content))
    return options


def train(directory, options, *extra):
    result = subprocess.run(
        [PYTHON, "-m", "atomtrain", "train", str(options), *map(str, extra)],
        cwd=directory,
        env=environment(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (run,) = run_directories(directory / "outputs")
    return run


@pytest.fixture(scope="module", params=["soap_bpnn", "pet"])
def direct_run(tmp_path_factory, request):
    """Each architecture's heads sit on its own features: PET's (metatrain's direct
    heads are PET's) and one other."""
    directory = tmp_path_factory.mktemp("direct")
    targets = {"energy": {"key": "energy", "forces": True, "stress": True}, **DIRECT}
    changes = {}
    if request.param == "pet":
        changes = {"architecture__name": "pet", "architecture__model": TINY_PET}
    options = options_with(directory, targets, **changes)
    run = train(directory, options, "-o", directory / "model.pt")
    return directory, run


ENGINE = (
    ENGINE_SETTINGS
    + """
import json, sys
import ase.io
from metatomic.torch import ModelOutput
from metatomic_ase import MetatomicCalculator

frames = ase.io.read(sys.argv[1], ":3")
direct = MetatomicCalculator(sys.argv[2], extensions_directory=sys.argv[3], non_conservative=True)
conservative = MetatomicCalculator(sys.argv[2], extensions_directory=sys.argv[3])
found = {"atomtrain imported": "atomtrain" in sys.modules, "frames": []}
for atoms in frames:
    atoms.calc = direct
    forces, stress = atoms.get_forces().tolist(), atoms.get_stress(voigt=False).tolist()
    atoms.calc = conservative
    found["frames"].append(
        {"forces": forces, "stress": stress, "conservative": atoms.get_forces().tolist()}
    )
# i-PI still asks by the older name
old = direct.run_model(frames[:1], {"non_conservative_forces": ModelOutput(per_atom=True)})
found["old name"] = old["non_conservative_forces"].block().values.reshape(-1, 3).tolist()
found["outputs"] = sorted(direct._model.capabilities().outputs)
print(json.dumps(found))
"""
)


def test_the_export_gives_the_direct_forces_and_stress_to_metatomic_ase(direct_run):
    directory, run = direct_run
    model = directory / "model.pt"
    result = subprocess.run(
        [PYTHON, "-c", ENGINE, str(SILICON), str(model), str(directory / "extensions")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    found = json.loads(result.stdout.strip().splitlines()[-1])
    assert not found["atomtrain imported"]
    assert {"non_conservative_force", "non_conservative_stress", "energy"} <= set(found["outputs"])
    trained = model_from_checkpoint(load_checkpoint(run / "best.ckpt"), best=True)
    keys = TargetKeys(others=tuple(trained.target_specs()))
    structures = read_structures(SILICON, keys)
    batch = structures.batch([0, 1, 2], trained.cutoff).to("cpu", torch.float64)
    expected = predict(trained, batch, True, True)
    forces = expected[NON_CONSERVATIVE_FORCE].detach().numpy().reshape(3, 63, 3)
    stress = expected[NON_CONSERVATIVE_STRESS].detach().numpy().reshape(3, 3, 3)
    conservative = expected["forces"].detach().numpy().reshape(3, 63, 3)
    for index, frame in enumerate(found["frames"]):
        # metatomic-ase takes out the direct forces' net force
        direct = forces[index] - forces[index].mean(axis=0)
        scale = np.abs(direct).max()
        assert np.abs(np.array(frame["forces"]) - direct).max() <= 1e-9 * scale
        assert (
            np.abs(np.array(frame["stress"]) - stress[index]).max()
            <= 1e-9 * np.abs(stress[index]).max()
        )
        assert np.abs(np.array(frame["conservative"]) - conservative[index]).max() <= 1e-9 * (
            np.abs(conservative[index]).max()
        )
        # the direct forces are another output than the energy's gradient
        assert np.abs(direct - conservative[index]).max() > 1e-3
    assert np.abs(np.array(found["old name"]) - forces[0]).max() <= 1e-9 * np.abs(forces).max()


def test_atomtrains_calculator_gives_the_direct_forces_and_stress(direct_run):
    directory, run = direct_run
    trained = model_from_checkpoint(load_checkpoint(run / "best.ckpt"), best=True)
    structures = read_structures(SILICON, TargetKeys(others=tuple(trained.target_specs())))
    batch = structures.batch([0], trained.cutoff).to("cpu", torch.float64)
    expected = predict(trained, batch, True, True)
    forces = expected[NON_CONSERVATIVE_FORCE].detach().numpy()
    atoms = ase.io.read(SILICON, 0)
    atoms.calc = Calculator(str(directory / "model.pt"), non_conservative=True)
    direct = forces - forces.mean(axis=0)
    assert np.abs(atoms.get_forces() - direct).max() <= 1e-9 * np.abs(direct).max()
    stress = expected[NON_CONSERVATIVE_STRESS].detach().numpy().reshape(3, 3)
    found = atoms.get_stress(voigt=False)
    assert np.abs(found - stress).max() <= 1e-9 * np.abs(stress).max()
    atoms.calc = Calculator(str(directory / "model.pt"))
    conservative = expected["forces"].detach().numpy()
    assert np.abs(atoms.get_forces() - conservative).max() <= 1e-9 * np.abs(conservative).max()


def test_ase_md_runs_on_the_direct_forces(direct_run, tmp_path):
    directory, _ = direct_run
    script = EXAMPLES / "md" / "ase_md.py"
    result = subprocess.run(
        [PYTHON, str(script), str(directory / "model.pt"), "--structure", str(SILICON)]
        + ["--steps", "5", "--non-conservative", "--output", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "5 steps of 0.5 fs, 63 atoms" in result.stdout
    assert len((tmp_path / "md_nve.csv").read_text().splitlines()) == 7  # header, 6 rows


def test_the_log_and_eval_report_the_direct_targets_errors(direct_run, tmp_path):
    directory, run = direct_run
    log = (run / "train.log").read_text()
    assert "non_conservative_force RMSE" in log and "non_conservative_stress RMSE" in log
    description = tmp_path / "data.yaml"
    description.write_text(
        yaml.safe_dump(
            {"systems": str(SILICON), "targets": {"energy": {"key": "energy"}, **DIRECT}}
        )
    )
    result = subprocess.run(
        [
            PYTHON,
            "-m",
            "atomtrain",
            "eval",
            str(directory / "model.pt"),
            str(description),
            "-o",
            str(tmp_path / "predicted.xyz"),
        ],
        cwd=tmp_path,
        env=environment(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "non_conservative_force RMSE" in result.stderr + result.stdout
    predicted = ase.io.read(tmp_path / "predicted.xyz", 0)
    assert predicted.arrays["predicted_non_conservative_force"].shape == (63, 3)
    assert np.shape(predicted.info["predicted_non_conservative_stress"]) == (9,)


@pytest.mark.slow
def test_a_model_trained_on_direct_forces_fine_tunes_to_conservative_ones(tmp_path):
    """metatrain's recipe: pretrain on direct forces (the energy without its forces),
    then fine-tune with forces by autograd; the conservative forces' error falls, and
    the direct head is kept. (On SOAP-BPNN, which learns these 18 cells' forces in a
    few epochs; the heads and the fine-tuning are the same for every architecture.)"""
    first = tmp_path / "direct"
    first.mkdir()
    targets = {
        "energy": {"key": "energy", "forces": False, "stress": False},
        "non_conservative_forces": DIRECT["non_conservative_forces"],
    }
    pretrained = train(first, options_with(first, targets))
    second = tmp_path / "conservative"
    second.mkdir()
    finetune = {"read_from": str(pretrained / "best.ckpt")}
    options = options_with(
        second,
        {"energy": {"key": "energy", "forces": True, "stress": False}},
        architecture__training__finetune=finetune,
        architecture__training__num_epochs=8,
        architecture__training__learning_rate=0.01,
    )
    finetuned = train(second, options)
    errors = {}
    for name, run in (("pretrained", pretrained), ("finetuned", finetuned)):
        model = model_from_checkpoint(load_checkpoint(run / "best.ckpt"), best=True)
        assert model.target_names == [NON_CONSERVATIVE_FORCE]
        structures = read_structures(SILICON, TargetKeys(read_stress=False))
        batch = structures.batch(list(range(8)), model.cutoff).to("cpu", torch.float64)
        predicted = predict(model, batch, True, False)["forces"].detach()
        errors[name] = float(torch.sqrt(((predicted - batch.forces) ** 2).mean()))
    assert errors["finetuned"] < 0.8 * errors["pretrained"], errors


@pytest.mark.slow
def test_two_processes_train_the_one_process_direct_heads(tmp_path):
    """The direct heads' baselines and scales (the stress's per volume) and losses are
    sums over every process: --nproc 2 gives the one-process model."""
    targets = {"energy": {"key": "energy", "forces": True, "stress": True}, **DIRECT}
    states = []
    for extra in ([], ["--nproc", "2"]):
        directory = tmp_path / f"run{len(states)}"
        directory.mkdir()
        run = train(directory, options_with(directory, targets), *extra)
        states.append(torch.load(run / "last.ckpt", weights_only=True))
    one, two = (state["model_state"] for state in states)
    assert any(name.startswith("heads.1.") for name in one)  # the stress's head
    for name, value in one.items():
        if value.is_floating_point():
            difference = (two[name] - value).abs().max()
            assert difference <= 1e-8 * value.abs().max().clamp_min(1e-12), name
