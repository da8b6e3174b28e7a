"""Fine-tuning's heads method: metatrain's names of PET's modules, and bad input."""

from __future__ import annotations

import pytest

from atomtrain.cli.main import main

from conftest import RESOURCES
from helpers import TINY_PET, run_directories, write_options

ETHANOL = RESOURCES / "ethanol_40.xyz"


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    directory = tmp_path_factory.mktemp("pretrained")
    options = write_options(directory, ETHANOL, architecture__training__num_epochs=1)
    assert main(["train", str(options), "--outputs", str(directory / "outputs")]) == 0
    (run,) = run_directories(directory / "outputs")
    return run / "best.ckpt"


def fine_tune(directory, finetune, **changes):
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


def test_lora_is_named_as_not_implemented(pretrained, tmp_path, capsys):
    finetune = {"read_from": str(pretrained), "method": "lora"}
    assert fine_tune(tmp_path, finetune) == 2
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1 and "'heads'" in error


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
