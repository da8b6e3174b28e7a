"""Each bad input: one clear line naming the file or key, a non-zero exit, no traceback
on the console."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from atomtrain.cli.main import main
from atomtrain.training.checkpoint import FORMAT

from conftest import RESOURCES
from helpers import write_options

ETHANOL = RESOURCES / "ethanol_40.xyz"


def run(capsys, *arguments):
    code = main(list(map(str, arguments)))
    error = capsys.readouterr().err.strip()
    return code, error


def assert_one_line(code, error, *fragments):
    assert code != 0
    assert error.startswith("atomtrain: "), error
    assert len(error.splitlines()) == 1, error
    assert "Traceback" not in error
    for fragment in fragments:
        assert fragment in error, (fragment, error)


def train_with(tmp_path, capsys, *extra, **changes):
    options = write_options(tmp_path, ETHANOL, **changes)
    return run(capsys, "train", options, "--outputs", tmp_path / "outputs", *extra)


def test_missing_options_file(tmp_path, capsys):
    code, error = run(capsys, "train", tmp_path / "nope.yaml")
    assert_one_line(code, error, "nope.yaml", "options file not found")


def test_yaml_syntax_error_names_the_line(tmp_path, capsys):
    path = tmp_path / "broken.yaml"
    path.write_text("seed: 1\narchitecture:\n  name: soap_bpnn\n   training: [1, 2\n")
    code, error = run(capsys, "train", path)
    assert_one_line(code, error, "broken.yaml", "YAML syntax error", "line 4")


def test_unknown_key_suggests_the_right_one(tmp_path, capsys):
    code, error = train_with(tmp_path, capsys, architecture__training__batchsize=4)
    assert_one_line(
        code, error, "unknown key 'architecture.training.batchsize'", "did you mean 'batch_size'"
    )


def test_wrong_type(tmp_path, capsys):
    code, error = train_with(tmp_path, capsys, architecture__training__num_epochs="many")
    assert_one_line(code, error, "architecture.training.num_epochs", "'many'")


@pytest.mark.parametrize(
    "changes, fragment",
    [
        ({"validation_set": 1.2}, "validation_set"),
        ({"test_set": -0.1}, "test_set"),
        ({"validation_set": 0.6, "test_set": 0.5}, "add up to 1.1"),
    ],
)
def test_bad_fractions(tmp_path, capsys, changes, fragment):
    code, error = train_with(tmp_path, capsys, **changes)
    assert_one_line(code, error, fragment)


def test_empty_training_set_after_split(tmp_path, capsys):
    single = tmp_path / "one.xyz"
    single.write_text("".join(ETHANOL.read_text().splitlines(keepends=True)[:11]))
    options = write_options(tmp_path, single, validation_set=0.1, test_set=0.0)
    code, error = run(capsys, "train", options, "--outputs", tmp_path / "outputs")
    assert_one_line(code, error, "one.xyz", "no training structure is left")


def test_missing_data_file(tmp_path, capsys):
    options = write_options(tmp_path, tmp_path / "absent.xyz")
    code, error = run(capsys, "train", options, "--outputs", tmp_path / "outputs")
    assert_one_line(code, error, "absent.xyz", "data file not found")


def test_missing_target_key_lists_present_keys(tmp_path, capsys):
    code, error = train_with(
        tmp_path,
        capsys,
        training_set={"systems": str(ETHANOL), "targets": {"energy": {"key": "U0"}}},
    )
    assert_one_line(code, error, "ethanol_40.xyz", "frame 0", "'U0'", "keys present", "energy")


def test_forces_requested_but_absent(tmp_path, capsys):
    qm9 = RESOURCES / "qm9_reduced_100.xyz"
    code, error = train_with(
        tmp_path,
        capsys,
        training_set={"systems": str(qm9), "targets": {"energy": {"key": "U0", "forces": True}}},
    )
    assert_one_line(code, error, "qm9_reduced_100.xyz", "no forces under key 'forces'")


def test_element_missing_from_training(tmp_path, capsys):
    code, error = train_with(
        tmp_path,
        capsys,
        validation_set={
            "systems": str(RESOURCES / "qm9_reduced_100.xyz"),
            "targets": {"energy": {"key": "U0"}},
        },
    )
    assert_one_line(code, error, "validation_set", "[7]", "training set")


def test_element_missing_from_atomic_types(tmp_path, capsys):
    code, error = train_with(tmp_path, capsys, architecture__atomic_types=[1, 6, 7])
    assert_one_line(code, error, "training_set", "[8]", "architecture.atomic_types [1, 6, 7]")


def test_cutoff_must_be_positive(tmp_path, capsys):
    code, error = train_with(
        tmp_path, capsys, architecture__model__soap__cutoff={"radius": 0.0, "width": 0.5}
    )
    assert_one_line(code, error, "architecture.model.soap.cutoff.radius", "greater than 0")


def test_unknown_architecture_lists_known_ones(tmp_path, capsys):
    code, error = train_with(tmp_path, capsys, architecture__name="pet")
    assert_one_line(code, error, "unknown architecture 'pet'", "soap_bpnn")


def test_restart_auto_without_earlier_run(tmp_path, capsys):
    code, error = train_with(tmp_path, capsys, "--restart", "auto")
    assert_one_line(code, error, "--restart auto", "no earlier run")


def test_checkpoint_of_another_architecture(tmp_path, capsys):
    checkpoint = tmp_path / "other.ckpt"
    torch.save({"format": FORMAT, "architecture": "pet"}, checkpoint)
    code, error = train_with(tmp_path, capsys, "--restart", checkpoint)
    assert_one_line(code, error, "other.ckpt", "architecture 'pet'")
    code, error = run(capsys, "export", checkpoint)
    assert_one_line(code, error, "architecture 'pet'")


def test_checkpoint_of_another_atomtrain_version(tmp_path, capsys):
    checkpoint = tmp_path / "old.ckpt"
    torch.save({"format": "atomtrain-checkpoint-1", "architecture": "soap_bpnn"}, checkpoint)
    code, error = train_with(tmp_path, capsys, "--restart", checkpoint)
    assert_one_line(code, error, "old.ckpt", "another atomtrain version", FORMAT)
    torch.save({"weights": [1.0]}, checkpoint)
    code, error = run(capsys, "export", checkpoint)
    assert_one_line(code, error, "old.ckpt", "not an atomtrain checkpoint")


def test_nproc_with_more_processes_than_gpus_fails_once_before_starting(
    tmp_path, capsys, monkeypatch
):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    code, error = train_with(tmp_path, capsys, "--nproc", "2", device="cuda")
    assert_one_line(code, error, "2 processes on", "but 1 visible GPU(s)", "--nproc")
    assert not (tmp_path / "outputs").exists()  # no worker started a run


def test_output_path_in_missing_directory(tmp_path, capsys):
    code, error = train_with(tmp_path, capsys, "-o", tmp_path / "no" / "such" / "model.pt")
    assert_one_line(code, error, "does not exist")
    assert not (tmp_path / "outputs").exists()  # failed before any work


def test_real_command_line_exit_code_and_single_line(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "atomtrain", "train", str(tmp_path / "missing.yaml")],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"atomtrain: {tmp_path / 'missing.yaml'}: options file not found"
    ]
