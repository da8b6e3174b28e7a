"""MACE (mace-torch) trained by atomtrain's trainer: symmetry and derivatives of the
model, exact resume on two processes, a metatrain
``experimental.mace`` options file, and mace-torch's import kept from weakening
atomtrain's checkpoint loads. Tiny hyperparameters keep it fast."""

from __future__ import annotations

import dataclasses
import logging
import os
import subprocess
import sys

import ase
import ase.build
import ase.io
import numpy as np
import pytest
import torch
import yaml

from atomtrain.ase import Calculator
from atomtrain.cli.main import main
from atomtrain.data import FrameSet, collate
from atomtrain.distributed.context import single_process
from atomtrain.errors import AtomtrainError
from atomtrain.models import registry
from atomtrain.models.architecture import DataFacts
from atomtrain.options import parse_options
from atomtrain.training.baseline import fit_baseline
from atomtrain.training.checkpoint import best_model, load_checkpoint, model_from_checkpoint
from atomtrain.training.evaluation import model_inputs
from atomtrain.training.outputs import LOGGER_NAME

from conftest import RESOURCES
from helpers import (
    TINY_MACE,
    environment,
    read,
    run_directories,
    run_model,
    small_model,
    structure_from_atoms,
    write_options,
)
from test_faults import stop_then_resume_with_two

PYTHON = sys.executable
ETHANOL = RESOURCES / "ethanol_40.xyz"
EPOCHS = 8


def tiny_mace(atomic_types, seed=0):
    torch.manual_seed(seed)
    architecture = registry.architecture("mace")
    options = architecture.model_options.model_validate(TINY_MACE)
    model = architecture.build(options, DataFacts(atomic_types, 9.0)).set_precision(torch.float64)
    model.set_baseline(torch.linspace(-3.0, -1.0, len(atomic_types)), 0.7)
    return model


def mace_options(directory, data=ETHANOL, **changes):
    settings = {
        "architecture__name": "mace",
        "architecture__model": TINY_MACE,
        "architecture__training__batch_size": 4,
        "architecture__training__num_epochs": EPOCHS,
        "architecture__training__checkpoint_interval": 1,
        "architecture__training__learning_rate": 0.01,
        **changes,
    }
    return write_options(directory, data, **settings)


def silicon_cell() -> ase.Atoms:
    atoms = ase.build.bulk("Si", "diamond", a=5.43, cubic=True)
    atoms.rattle(0.1, seed=1)
    atoms.set_cell(atoms.cell.array @ (np.eye(3) + 0.03 * np.triu(np.ones((3, 3)), 1)), True)
    return atoms


def ethanol() -> ase.Atoms:
    return ase.io.read(ETHANOL, index=2)


def train_command(options, run_dir, *extra):
    command = [PYTHON, "-m", "atomtrain", "train", str(options), "--run-dir", str(run_dir)]
    return command + list(extra)


def run_to_the_end(command) -> None:
    result = subprocess.run(command, env=environment(), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]


def final_model(run_dir, epochs=EPOCHS):
    state = torch.load(run_dir / "last.ckpt", weights_only=True)
    assert (state["epoch"], state["step"]) == (epochs, 0)
    return state["model_state"]


def assert_same_model(actual, expected, tolerance=1e-8):
    compared = 0
    for name, value in expected.items():
        if value.is_floating_point() and value.numel() > 0:
            difference = (actual[name] - value).abs().max()
            assert difference <= tolerance * value.abs().max().clamp_min(1e-12), name
            compared += value.numel()
    assert compared > 100


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """An uninterrupted single-process MACE run."""
    directory = tmp_path_factory.mktemp("mace_reference")
    run_to_the_end(train_command(mace_options(directory), directory / "run"))
    return final_model(directory / "run")


@pytest.mark.slow
def test_stopped_mid_run_resumes_with_two_processes_to_the_same_model(tmp_path, reference):
    run_dir = tmp_path / "run"
    stop_then_resume_with_two(mace_options(tmp_path), run_dir, EPOCHS)
    assert_same_model(final_model(run_dir), reference)


def test_cuequivariance_kernels_keep_the_model_and_its_e3nn_state():
    """Switching a model to cuequivariance's kernels (its PyTorch code, on a CPU) keeps
    its energies, forces and stress; its state_dict stays in e3nn's layout, and loading
    one gives the model that wrote it."""
    pytest.importorskip("cuequivariance_torch")
    structures = [structure_from_atoms(ethanol()), structure_from_atoms(silicon_cell())]
    model = tiny_mace([1, 6, 8, 14])
    model.hypers["model"]["cueq"] = True
    expected = run_model(model, structures, stress=True)
    saved = {name: value.clone() for name, value in model.state_dict().items()}
    model.use_kernels_for(torch.device("cpu"))
    assert model.parameter_layout() == "cuequivariance"
    assert len(list(model.parameters())) != len(saved) - 3  # other modules train
    switched = run_model(model, structures, stress=True)
    for key in ("energy", "forces", "stress"):
        torch.testing.assert_close(switched[key], expected[key], atol=1e-10, rtol=0)
    state = model.state_dict()
    assert {name: value.shape for name, value in state.items()} == {
        name: value.shape for name, value in saved.items()
    }
    other = tiny_mace([1, 6, 8, 14], seed=1)
    model.load_state_dict(other.state_dict())
    torch.testing.assert_close(
        run_model(model, structures, stress=True)["forces"],
        run_model(other, structures, stress=True)["forces"],
        atol=1e-10,
        rtol=0,
    )


@pytest.mark.slow
def test_a_run_on_cuequivariance_kernels_resumes_exactly_and_exports_e3nn(tmp_path, capsys):
    """cueq: true on a CPU. Adam follows another path in cuequivariance's parameters
    (mace-torch's reduced projection is not orthogonal), so the reference is an
    uninterrupted run on the same kernels: stopped after two epochs and resumed on two
    processes, the run ends at its model. Its model.pt runs in an engine that never
    imports cuequivariance, and a resume on e3nn's kernels is refused in one line."""
    pytest.importorskip("cuequivariance_torch")
    from test_metatomic import engine_predictions  # it imports this module

    epochs = 4  # stopped after the second
    options = mace_options(
        tmp_path,
        architecture__model={**TINY_MACE, "cueq": True},
        architecture__training__num_epochs=epochs,
    )
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    assert main(["train", str(options), "--run-dir", str(whole)]) == 0
    assert "cuequivariance kernels" in (whole / "train.log").read_text()
    stop_then_resume_with_two(options, resumed, epochs)
    # the same model: e3nn's layout is one of many for it (mace-torch's conversion sets
    # weights the products ignore to ~1e-8), so the predictions are compared
    structures = [structure_from_atoms(ethanol()), structure_from_atoms(ase.io.read(ETHANOL, 7))]
    model = model_from_checkpoint(load_checkpoint(resumed / "last.ckpt"), best=False)
    predictions = [run_model(model, structures)]
    # the same model takes the other state (a second switch to the kernels costs seconds)
    model.load_state_dict(load_checkpoint(whole / "last.ckpt").model_state)
    predictions.append(run_model(model, structures))
    for key in ("energy", "forces"):
        torch.testing.assert_close(predictions[0][key], predictions[1][key], atol=1e-8, rtol=0)

    engine = engine_predictions(whole / "model.pt", [ethanol()], tmp_path)
    assert not [name for name in engine["imported"] if name.startswith("cuequivariance")]
    ours = run_model(best_model(whole / "best.ckpt"), [structure_from_atoms(ethanol())])
    assert engine["results"][0]["energy"] == pytest.approx(float(ours["energy"][0]), abs=1e-9)

    # as if trained on a GPU with cueq unset, then resumed on a CPU (e3nn's kernels)
    state = torch.load(whole / "last.ckpt", weights_only=True)
    state["hypers"]["model"]["cueq"] = None
    torch.save(state, whole / "last.ckpt")
    longer = mace_options(tmp_path, architecture__training__num_epochs=epochs + 1)
    capsys.readouterr()
    restart = ["--run-dir", str(whole), "--restart", str(whole / "last.ckpt")]
    assert main(["train", str(longer), *restart]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "cuequivariance" in line and "architecture.model.cueq" in line


@pytest.mark.parametrize(
    "correlation, installed, fragment",
    [(4, True, "correlation 2 or 3"), (2, False, "pip install cuequivariance-torch")],
)
def test_cueq_that_cannot_be_honoured_is_one_line(
    tmp_path, monkeypatch, capsys, correlation, installed, fragment
):
    from atomtrain.models.mace import cuequivariance

    monkeypatch.setattr(cuequivariance, "installed", lambda: installed)
    model = {**TINY_MACE, "correlation": correlation, "cueq": True}
    options = mace_options(tmp_path, architecture__model=model)
    for check in ([], ["--check"]):  # refused before the data is read, --check too
        capsys.readouterr()
        assert main(["train", str(options), "--run-dir", str(tmp_path / "run"), *check]) == 2
        (line,) = capsys.readouterr().err.strip().splitlines()
        assert "architecture.model.cueq is true" in line and fragment in line


def test_weight_decay_falls_where_mace_run_train_puts_it():
    import argparse

    from mace.tools.scripts_utils import get_params_options

    from atomtrain.models.mace.plugin import decays

    model = tiny_mace([1, 6, 8])
    settings = {"lr": 0.01, "weight_decay": 5e-7, "amsgrad": True, "beta": 0.9}
    arguments = argparse.Namespace(**settings, lr_params_factors="{}", freeze=None)
    groups = get_params_options(arguments, model.mace)["params"]
    theirs = {id(p) for group in groups if group["weight_decay"] > 0 for p in group["params"]}
    ours = {id(parameter) for name, parameter in model.named_parameters() if decays(name)}
    assert ours == theirs and 0 < len(ours) < len(list(model.parameters()))


def test_a_checkpoint_of_one_optimizer_group_is_refused_in_one_line(tmp_path, capsys):
    """As an atomtrain before MACE's weight decay groups wrote it."""
    run = tmp_path / "run"
    options = mace_options(tmp_path, architecture__training__num_epochs=1)
    assert main(["train", str(options), "--run-dir", str(run)]) == 0
    state = torch.load(run / "last.ckpt", weights_only=True)
    groups = state["optimizer_state"]["param_groups"]
    groups[0]["params"] = sorted(index for group in groups for index in group["params"])
    state["optimizer_state"]["param_groups"] = groups[:1]
    torch.save(state, run / "last.ckpt")
    longer = mace_options(tmp_path, architecture__training__num_epochs=2)
    capsys.readouterr()
    assert main(["train", str(longer), "--run-dir", str(run), "--restart", "auto"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "optimizer state does not fit" in line and "finetune.read_from" in line


METATRAIN_OPTIONS = """
seed: 42
base_precision: 64
architecture:
  name: experimental.mace
  model:
    r_max: 4.0
    num_radial_basis: 4
    max_ell: 1
    hidden_irreps: 4x0e + 4x1o
    correlation: 2
    num_interactions: 1
    radial_MLP: [8]
    MLP_irreps: 4x0e
    gate: silu
    interaction: RealAgnosticResidualInteractionBlock
  training:
    batch_size: 8
    num_epochs: 2
    log_interval: 1
    checkpoint_interval: 100
    learning_rate: 0.01
    lr_scheduler: constant
    amsgrad: true
    weight_decay: 5.0e-7
    grad_clip_norm: 10.0
training_set:
  systems:
    read_from: ethanol_40.xyz
    length_unit: angstrom
  targets:
    energy:
      key: energy
      unit: eV
validation_set: 0.1
test_set: 0.1
"""


def test_a_metatrain_experimental_mace_options_file_trains(tmp_path, monkeypatch, capsys):
    (tmp_path / "ethanol_40.xyz").write_bytes(ETHANOL.read_bytes())
    (tmp_path / "options.yaml").write_text(METATRAIN_OPTIONS)
    monkeypatch.chdir(tmp_path)
    assert main(["train", "options.yaml", "-o", "model.pt"]) == 0
    (run,) = run_directories(tmp_path / "outputs")
    assert "model: MACE, 1 interactions of 4x0e + 4x1o" in (run / "train.log").read_text()
    record = yaml.safe_load((run / "options.yaml").read_text())["architecture"]
    assert (record["name"], record["training"]["grad_clip_norm"]) == ("mace", 10.0)
    # metatrain's MACE training keys reach the optimizer and the schedule
    state = torch.load(run / "last.ckpt", weights_only=True)
    decayed, spared = state["optimizer_state"]["param_groups"]  # mace_run_train's split
    assert decayed["amsgrad"] is spared["amsgrad"] is True
    assert (decayed["weight_decay"], spared["weight_decay"]) == (5e-7, 0.0)
    assert decayed["lr"] == spared["lr"] == pytest.approx(0.01)  # constant: the peak rate
    # the ASE calculator and eval on the exported model give the checkpoint's predictions
    atoms = ase.io.read(ETHANOL, index=5)
    expected = run_model(best_model(run / "best.ckpt"), [structure_from_atoms(atoms)])
    atoms.calc = Calculator("model.pt")
    assert atoms.get_potential_energy() == pytest.approx(float(expected["energy"][0]), abs=1e-10)
    np.testing.assert_allclose(atoms.get_forces(), expected["forces"].detach(), atol=1e-10)
    assert main(["eval", "model.pt", "ethanol_40.xyz", "-o", "predicted.xyz"]) == 0
    assert len(ase.io.read("predicted.xyz", ":")) == 40
    # fine-tuning from the exported model keeps MACE and its hyperparameters
    finetune = yaml.safe_load(METATRAIN_OPTIONS)
    finetune["architecture"]["training"]["finetune"] = {"read_from": "model.pt"}
    finetune["architecture"]["training"]["num_epochs"] = 1
    (tmp_path / "finetune.yaml").write_text(yaml.safe_dump(finetune))
    assert main(["train", "finetune.yaml", "-o", "finetuned.pt"]) == 0
    assert "fine-tuning the best model of" in capsys.readouterr().err + "".join(
        path.read_text() for path in (tmp_path / "outputs").rglob("train.log")
    )
    # a metatrain key whose feature atomtrain lacks: one line naming it, exit code 2
    bad = METATRAIN_OPTIONS.replace("    gate: silu\n", "    gate: silu\n    mace_head_name: pbe\n")
    (tmp_path / "bad.yaml").write_text(bad)
    capsys.readouterr()
    assert main(["train", "bad.yaml"]) == 2
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1
    assert "'architecture.model.mace_head_name'" in error and "not supported" in error


class NotWeights:
    def __reduce__(self):
        return (print, ("code ran while loading",))


def test_mace_leaves_checkpoint_loading_strict(tmp_path):
    """The variable e3nn needs at import is set for the import only: afterwards a
    checkpoint holding arbitrary Python objects is still refused, not executed."""
    tiny_mace([1, 6, 8])
    assert "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD" not in os.environ
    path = tmp_path / "evil.ckpt"
    torch.save({"format": "atomtrain-checkpoint-3", "payload": NotWeights()}, path)
    with pytest.raises(AtomtrainError, match="not a readable atomtrain checkpoint"):
        load_checkpoint(path)


def fit_baseline_saying(model, structures, options, context) -> list[str]:
    """fit_baseline, and what it logged. A handler of its own: an earlier run in this
    process may have kept the logger's records from reaching pytest's."""
    said: list[str] = []
    handler = logging.Handler(logging.INFO)
    handler.emit = lambda record: said.append(record.getMessage())
    logger = logging.getLogger(LOGGER_NAME)
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    forces_scale = registry.architecture(options.architecture.name).scale_from_forces
    try:
        fit_baseline(model, structures, options, context, forces_scale)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    return said


def test_mace_scales_its_outputs_by_the_rms_of_the_training_forces():
    """As mace_run_train does by default; SOAP-BPNN keeps the energies' spread."""
    structures = read(ETHANOL)[:10]
    forces = torch.cat([structure.forces for structure in structures])
    context = single_process(torch.device("cpu"))
    for name, model in [("mace", tiny_mace([1, 6, 8])), ("soap_bpnn", small_model([1, 6, 8]))]:
        options = parse_options({"training_set": str(ETHANOL), "architecture": {"name": name}})
        fit_baseline(
            model, structures, options, context, registry.architecture(name).scale_from_forces
        )
        rms = float(forces.double().pow(2).mean().sqrt())
        assert (float(model.scale) == pytest.approx(rms, rel=1e-12)) == (name == "mace")
    # without forces, MACE too takes the energies' spread, and says so
    energies_only = FrameSet.from_structures(
        [dataclasses.replace(structure, forces=None) for structure in structures]
    )
    scales = {}
    for name, model in [("mace", tiny_mace([1, 6, 8])), ("soap_bpnn", small_model([1, 6, 8]))]:
        options = parse_options({"training_set": str(ETHANOL), "architecture": {"name": name}})
        said = fit_baseline_saying(model, energies_only, options, context)
        scales[name] = float(model.scale)
        assert any(line.endswith(f"target scale {scales[name]:.6g} eV") for line in said)
    assert scales["mace"] == pytest.approx(scales["soap_bpnn"], rel=1e-12)


MACE_ENERGY_AND_FORCES = """
import json, sys
import ase.io
from mace.calculators import MACECalculator
atoms = ase.io.read(sys.argv[2], index=int(sys.argv[3]))
atoms.calc = MACECalculator(model_paths=sys.argv[1], device="cpu", default_dtype="float64")
print(json.dumps({"energy": atoms.get_potential_energy(), "forces": atoms.get_forces().tolist()}))
"""


@pytest.fixture(scope="module")
def mace_run_train_model(tmp_path_factory):
    """A small MACE trained here by mace-torch's own mace_run_train on bundled data."""
    directory = tmp_path_factory.mktemp("mace_run_train")
    frames = ase.io.read(ETHANOL, ":")
    for atoms in frames:
        atoms.info["REF_energy"] = atoms.get_potential_energy()
        atoms.arrays["REF_forces"] = atoms.get_forces()
        atoms.calc = None
    ase.io.write(directory / "train.xyz", frames[:30])
    ase.io.write(directory / "valid.xyz", frames[30:])
    command = [
        "mace_run_train", "--name=tiny", "--train_file=train.xyz", "--valid_file=valid.xyz",
        "--energy_key=REF_energy", "--forces_key=REF_forces", "--E0s=average",
        "--model=ScaleShiftMACE", "--r_max=4.0", "--num_radial_basis=4", "--max_ell=1",
        "--hidden_irreps=4x0e + 4x1o", "--correlation=2", "--num_interactions=2",
        "--MLP_irreps=4x0e", "--radial_MLP=[8]", "--batch_size=10", "--max_num_epochs=1",
        "--default_dtype=float64", "--device=cpu", "--seed=1",
    ]  # fmt: skip
    result = subprocess.run(command, cwd=directory, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    return directory / "tiny.model"


@pytest.mark.slow
def test_a_model_file_of_mace_run_train_is_read_as_mace_itself_predicts(mace_run_train_model):
    """atomtrain's model of the file (E0s, scale, shift and weights kept) gives mace-torch's
    own calculator's energy and forces, in a process of mace's own."""
    from atomtrain.models.mace.model import read_mace_file

    model = read_mace_file(str(mace_run_train_model)).set_precision(torch.float64)
    atoms = ase.io.read(ETHANOL, index=35)
    result = subprocess.run(
        [PYTHON, "-c", MACE_ENERGY_AND_FORCES, str(mace_run_train_model), str(ETHANOL), "35"],
        capture_output=True,
        text=True,
        env={**environment(), "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1"},  # mace's own way
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    theirs = yaml.safe_load(result.stdout.strip().splitlines()[-1])
    ours = run_model(model, [structure_from_atoms(atoms)])
    assert float(ours["energy"][0]) == pytest.approx(theirs["energy"], abs=1e-10, rel=0)
    np.testing.assert_allclose(ours["forces"].detach().numpy(), theirs["forces"], atol=1e-10)
    assert model.hypers["model"]["hidden_irreps"] == "4x0e+4x1o"


def test_fine_tuning_a_mace_run_train_model_with_metatrains_key(
    mace_run_train_model, tmp_path, monkeypatch, capsys
):
    options = yaml.safe_load(METATRAIN_OPTIONS)
    options["architecture"]["model"] = {"mace_model": str(mace_run_train_model)}
    options["architecture"]["training"]["num_epochs"] = 1
    (tmp_path / "ethanol_40.xyz").write_bytes(ETHANOL.read_bytes())
    (tmp_path / "options.yaml").write_text(yaml.safe_dump(options))
    monkeypatch.chdir(tmp_path)
    assert main(["train", "options.yaml", "-o", "model.pt"]) == 0
    (run,) = run_directories(tmp_path / "outputs")
    log = (run / "train.log").read_text()
    assert f"fine-tuning the best model of {mace_run_train_model}" in log
    assert "model: MACE, 2 interactions of 4x0e+4x1o" in log
    # the run's record builds the model again without the file
    assert best_model(run / "best.ckpt").hypers["facts"]["extra"]["atomic_inter_scale"] > 0
    # a key of the section that disagrees with the file: one line naming it, exit 2
    options["architecture"]["model"]["r_max"] = 5.0
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(options))
    capsys.readouterr()
    assert main(["train", "bad.yaml"]) == 2
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1 and "'architecture.model.r_max' is 5.0" in error


@pytest.mark.slow
def test_fine_tuning_a_mace_run_train_model_adds_heads(mace_run_train_model, tmp_path):
    """A mace-torch .model fine-tuned to data of another level of theory (an energy
    variant, started from the model's energy head) and a dipole: both heads are added,
    trained and exported, and at a learning rate of 1e-12 the variant predicts what the
    file's model predicts, but for its per-element energies, fitted to the new data."""
    from metatomic.torch import load_atomistic_model

    from atomtrain.models.mace.model import read_mace_file

    generator = np.random.default_rng(0)
    frames = ase.io.read(ETHANOL, ":")
    for atoms in frames:
        atoms.info["dipole"] = generator.normal(size=3)
    ase.io.write(tmp_path / "data.xyz", frames)
    options = {
        "seed": 1,
        "base_precision": 64,
        "architecture": {
            "name": "mace",
            "training": {
                "batch_size": 8,
                "num_epochs": 1,
                "learning_rate": 1e-12,
                "refit_baseline": False,
                "finetune": {
                    "read_from": str(mace_run_train_model),
                    "inherit_heads": {"energy/b3lyp": "energy"},
                },
            },
        },
        "training_set": {
            "systems": str(tmp_path / "data.xyz"),
            "targets": {
                "energy/b3lyp": {"key": "energy", "forces": True},
                "mtt::dipole": {"key": "dipole", "type": {"cartesian": {"rank": 1}}},
            },
        },
        "validation_set": 0.2,
        "test_set": 0.0,
        "logging": {"tensorboard": False},
    }
    (tmp_path / "options.yaml").write_text(yaml.safe_dump(options))
    assert main(["train", str(tmp_path / "options.yaml"), "--outputs", str(tmp_path / "o")]) == 0
    (run,) = run_directories(tmp_path / "o")
    log = (run / "train.log").read_text()
    assert "fine-tuning adds heads for" in log and "energy/b3lyp (from energy)" in log
    assert "mtt::dipole" in log
    exported = load_atomistic_model(str(run / "model.pt"), str(run / "extensions"))
    assert {"energy", "energy/b3lyp", "mtt::dipole"} <= set(exported.capabilities().outputs)
    tuned = best_model(run / "best.ckpt")
    original = read_mace_file(str(mace_run_train_model)).set_precision(torch.float64)
    structure = structure_from_atoms(frames[3])
    batch = collate([structure], tuned.cutoff).to("cpu", torch.float64)
    variant = torch.tensor([1])
    ours = tuned(**{**model_inputs(batch), "energy_variant": variant})
    theirs = run_model(original, [structure])
    # the variant's head starts as the energy's, with its per-element energies refitted
    # to the new data: the same forces, the energy shifted by the composition's refit
    torch.testing.assert_close(ours["forces"], theirs["forces"], rtol=0, atol=1e-9)
    refit, _ = tuned.energy_baseline(1)
    shift = float(refit[tuned.type_to_index[structure.atomic_numbers]].sum())
    assert abs(shift) > 1e-3  # the refit moved them: the check below is not 0 == 0
    difference = float(ours["energy"][0]) - float(theirs["energy"][0])
    assert difference == pytest.approx(shift, abs=1e-8)
