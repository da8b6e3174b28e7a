"""Pseudo-labels (a training section's ``pseudo_labels: true``, training/pseudo_labels.py):
the fine-tuning start labels the section's structures, whatever the file holds, before
training; two processes label as one; and the bad inputs."""

from __future__ import annotations

import re

import ase.io
import pytest
import torch
import yaml

from atomtrain.cli.main import main

from conftest import RESOURCES
from helpers import run_directories, write_options
from test_faults import PYTHON, start_in_own_session

ETHANOL = RESOURCES / "ethanol_40.xyz"


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    directory = tmp_path_factory.mktemp("pretrained")
    options = write_options(directory, ETHANOL, architecture__training__num_epochs=2)
    assert main(["train", str(options), "--outputs", str(directory / "outputs")]) == 0
    (run,) = run_directories(directory / "outputs")
    return run


def replay_options(directory, pretrained_run, **training):
    """Fine-tuning on ethanol molecules 0-19 (their DFT labels) with molecules 20-39 as a
    replay section whose energies and forces the file no longer holds."""
    frames = ase.io.read(ETHANOL, ":")
    ase.io.write(directory / "new.xyz", frames[:20])
    replay = [ase.Atoms(atoms.numbers, atoms.positions) for atoms in frames[20:]]
    ase.io.write(directory / "replay.xyz", replay)
    options = write_options(
        directory,
        ETHANOL,
        architecture__training__num_epochs=1,
        architecture__training__learning_rate=1e-12,
        architecture__training__refit_baseline=False,
        architecture__training__finetune={"read_from": str(pretrained_run / "best.ckpt")},
        **training,
    )
    settings = yaml.safe_load(options.read_text())
    settings["training_set"] = [
        {"systems": str(directory / "new.xyz")},
        {"systems": str(directory / "replay.xyz"), "pseudo_labels": True},
    ]
    options.write_text(yaml.safe_dump(settings))
    return options


def file_row(log: str, name: str) -> list[float]:
    """A row of the final metrics table: E/atom RMSE, ..., F RMSE, F MAE (meV)."""
    found = re.search(rf"^train: {re.escape(name)}\s+(.*)$", log, re.M)
    assert found, log[-3000:]
    return [float(value) for value in found[1].split()]


@pytest.mark.parametrize("own_head", [False, True])
def test_a_pseudo_labelled_section_is_labelled_by_the_fine_tuning_start(
    tmp_path, pretrained, own_head
):
    """At a learning rate of 1e-12 the model stays the pretrained one, so on the replay
    section, labelled by that model, its errors vanish; on the DFT section they do not.
    With a head of its own (an energy variant started from the energy's), likewise."""
    options = replay_options(tmp_path, pretrained)
    if own_head:
        settings = yaml.safe_load(options.read_text())
        settings["training_set"][1]["targets"] = {"energy/pretrained": {"key": "energy"}}
        finetune = settings["architecture"]["training"]["finetune"]
        finetune["inherit_heads"] = {"energy/pretrained": "energy"}
        options.write_text(yaml.safe_dump(settings))
    assert main(["train", str(options), "--outputs", str(tmp_path / "outputs")]) == 0
    (run,) = run_directories(tmp_path / "outputs")
    log = (run / "train.log").read_text()
    assert "replay.xyz: 20 structures labelled by the fine-tuning start's predictions" in log
    replayed, new = file_row(log, "replay.xyz"), file_row(log, "new.xyz")
    assert max(replayed) < 1e-6  # meV: the pretrained model's own predictions
    assert new[0] > 0.1 and new[-2] > 1.0


@pytest.mark.slow
def test_two_processes_label_as_one(tmp_path, pretrained):
    states = []
    for processes in (1, 2):
        directory = tmp_path / f"nproc{processes}"
        directory.mkdir()
        options = replay_options(directory, pretrained, architecture__training__batch_size=4)
        settings = yaml.safe_load(options.read_text())
        settings["architecture"]["training"]["learning_rate"] = 0.005
        options.write_text(yaml.safe_dump(settings))
        command = [PYTHON, "-m", "atomtrain", "train", str(options), "--nproc", str(processes)]
        launcher = start_in_own_session(command + ["--run-dir", str(directory / "run")])
        _, stderr = launcher.communicate(timeout=300)
        assert launcher.returncode == 0, stderr[-2000:]
        states.append(torch.load(directory / "run" / "last.ckpt", weights_only=True))
    for name, value in states[0]["model_state"].items():
        if value.is_floating_point():
            scale = float(value.abs().max()) or 1.0
            assert float((states[1]["model_state"][name] - value).abs().max()) <= 1e-10 * scale


def bad(tmp_path, capsys, options) -> str:
    assert main(["train", str(options), "--check"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    return line


def test_pseudo_labels_without_a_model_to_label_them(tmp_path, capsys):
    options = write_options(tmp_path, ETHANOL)
    settings = yaml.safe_load(options.read_text())
    settings["training_set"] = [{"systems": str(ETHANOL), "pseudo_labels": True}]
    options.write_text(yaml.safe_dump(settings))
    line = bad(tmp_path, capsys, options)
    assert "pseudo_labels" in line and "finetune.read_from" in line and str(ETHANOL) in line


def test_pseudo_labels_of_elements_the_model_does_not_know(tmp_path, capsys, pretrained):
    options = replay_options(tmp_path, pretrained)
    settings = yaml.safe_load(options.read_text())
    silicon = RESOURCES / "si_test.xyz"
    settings["training_set"][1] = {"systems": str(silicon), "pseudo_labels": True}
    options.write_text(yaml.safe_dump(settings))
    line = bad(tmp_path, capsys, options)
    assert str(silicon) in line and "[14]" in line and "cannot label" in line


def test_pseudo_labels_in_a_validation_section(tmp_path, capsys, pretrained):
    options = replay_options(tmp_path, pretrained)
    settings = yaml.safe_load(options.read_text())
    settings["validation_set"] = [{"systems": str(ETHANOL), "pseudo_labels": True}]
    options.write_text(yaml.safe_dump(settings))
    line = bad(tmp_path, capsys, options)
    assert "validation_set" in line and "only a training_set section" in line
