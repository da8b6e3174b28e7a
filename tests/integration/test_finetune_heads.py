"""Fine-tuning's heads and lora methods: adapters merged in the export, metatrain's names
of PET's modules, and bad input."""

from __future__ import annotations

import ase.io
import pytest
import torch

from atomtrain.cli.main import main
from atomtrain.models.export import load_exported
from atomtrain.training.checkpoint import best_model

from conftest import RESOURCES
from helpers import (
    TINY_PET,
    run_directories,
    run_model,
    structure_from_atoms,
    write_options,
)
from test_faults import (
    EPOCHS,
    assert_same_model,
    final_state,
    options_in,
    run_uninterrupted,
    stop_then_resume_with_two,
)

ETHANOL = RESOURCES / "ethanol_40.xyz"


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    directory = tmp_path_factory.mktemp("pretrained")
    options = write_options(directory, ETHANOL, architecture__training__num_epochs=1)
    assert main(["train", str(options), "--outputs", str(directory / "outputs")]) == 0
    (run,) = run_directories(directory / "outputs")
    return run / "best.ckpt"


def fine_tune(directory, finetune, **changes):
    directory.mkdir(exist_ok=True)
    options = write_options(
        directory, ETHANOL, architecture__training__finetune=finetune, **changes
    )
    return main(["train", str(options), "--outputs", str(directory / "outputs"), "--check"])


def test_a_module_that_does_not_exist_is_named_with_those_that_do(pretrained, tmp_path, capsys):
    finetune = {
        "read_from": str(pretrained),
        "method": "heads",
        "config": {"head_modules": ["readouts"]},
    }
    assert fine_tune(tmp_path, finetune) == 2
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1
    assert "'readouts' names no module" in error and "networks.networks" in error


def test_modules_to_train_with_method_full_are_one_line(pretrained, tmp_path, capsys):
    finetune = {"read_from": str(pretrained), "config": {"head_modules": ["networks"]}}
    assert fine_tune(tmp_path, finetune) == 2
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1 and "method: heads" in error


def test_lora_keys_with_another_method_and_maps_that_do_not_exist_are_one_line(
    pretrained, tmp_path, capsys
):
    finetune = {"read_from": str(pretrained), "method": "heads", "config": {"rank": 8}}
    assert fine_tune(tmp_path / "a", finetune) == 2
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1 and "config.rank is for method: lora" in error
    finetune = {
        "read_from": str(pretrained),
        "method": "lora",
        "config": {"target_modules": ["attention"]},
    }
    assert fine_tune(tmp_path / "b", finetune) == 2
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1 and "attention names no linear map" in error


@pytest.mark.slow
@pytest.mark.parametrize("name", ["node_heads", "backend.node_heads", "pet.node_heads"])
def test_pet_heads_take_metatrains_names(tmp_path, capsys, name):
    pet = {"architecture__name": "pet", "architecture__model": TINY_PET}
    first = tmp_path / "first"
    first.mkdir()
    options = write_options(first, ETHANOL, architecture__training__num_epochs=1, **pet)
    assert main(["train", str(options), "--outputs", str(first / "outputs")]) == 0
    (run,) = run_directories(first / "outputs")
    finetune = {
        "read_from": str(run / "best.ckpt"),
        "method": "heads",
        "config": {"head_modules": [name], "last_layer_modules": ["node_last_layers"]},
    }
    second = tmp_path / "second"
    second.mkdir()
    options = write_options(
        second,
        ETHANOL,
        architecture__training__finetune=finetune,
        architecture__training__num_epochs=1,
        **pet,
    )
    assert main(["train", str(options), "--outputs", str(second / "outputs")]) == 0
    (tuned,) = run_directories(second / "outputs")
    log = (tuned / "train.log").read_text()
    assert "fine-tuning method heads:" in log and name in log


def lora_run(tmp_path, pretrained, name, section, processes=1, **config):
    finetune = {"read_from": str(pretrained), "method": "lora", "config": config}
    directory = tmp_path / f"lora_{name}"
    directory.mkdir()
    options = write_options(
        directory,
        ETHANOL,
        architecture__name=name,
        architecture__model=section,
        architecture__training__finetune=finetune,
        architecture__training__num_epochs=2,
    )
    command = ["train", str(options), "--outputs", str(directory / "outputs")]
    if processes > 1:
        command += ["--nproc", str(processes)]
    assert main(command) == 0
    (run,) = run_directories(directory / "outputs")
    return run


@pytest.mark.slow
def test_lora_trains_adapters_only_and_exports_them_merged(pretrained, tmp_path):
    """SOAP-BPNN: every weight but the adapters bitwise as pretrained; the checkpoint
    keeps the adapters apart (its model is built with them); the exported model, merged,
    predicts what the adapted model does."""
    run = lora_run(tmp_path, pretrained, "soap_bpnn", {}, rank=2)
    # parameters: the buffers hold the baseline, refitted at the end of every run
    before = {name: p.detach() for name, p in best_model(pretrained).named_parameters()}
    tuned = best_model(run / "best.ckpt")
    assert tuned.hypers["adapters"]["rank"] == 2
    state = tuned.state_dict()
    adapted = [name for name in state if "lora_B" in name]
    assert adapted and any(state[name].abs().max() > 0 for name in adapted)
    for name, value in before.items():
        # an adapted map's weight sits under .base. in the adapted model
        found = (
            name
            if name in state
            else name.replace(".weight", ".base.weight").replace(".bias", ".base.bias")
        )
        assert torch.equal(state[found], value), name
    exported = load_exported(run / "model.pt")
    structure = [structure_from_atoms(ase.io.read(ETHANOL, index=5))]
    ours = run_model(tuned, structure)
    theirs = run_model(exported, structure)
    assert float(theirs["energy"][0]) == pytest.approx(float(ours["energy"][0]), rel=1e-12)
    torch.testing.assert_close(theirs["forces"], ours["forces"], rtol=1e-9, atol=1e-12)
    assert "lora" not in " ".join(name for name, _ in exported.named_parameters())


@pytest.mark.slow
def test_a_stopped_lora_run_resumes_to_the_uninterrupted_adapters(pretrained, tmp_path):
    """The checkpoint keeps the adapters apart and its record names them: stopped after
    its second epoch and resumed on two processes, a lora run ends at the uninterrupted
    run's model, adapters included."""
    finetune = {"read_from": str(pretrained), "method": "lora", "config": {"rank": 2}}
    finals = []
    for name in ("uninterrupted", "resumed"):
        directory = tmp_path / name
        directory.mkdir()
        options = options_in(directory, architecture__training__finetune=finetune)
        run_dir = directory / "run"
        if name == "uninterrupted":
            run_uninterrupted(options, run_dir)
        else:
            stop_then_resume_with_two(options, run_dir, EPOCHS)
        finals.append(final_state(run_dir))
    assert any("lora_A" in key for key in finals[0])
    assert_same_model(finals[1], finals[0])
