"""Each bad input: one clear line naming the file or key, a non-zero exit, no traceback
on the console."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import ase.io
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


def test_cutoff_width_beyond_its_radius(tmp_path, capsys):
    code, error = train_with(
        tmp_path, capsys, architecture__model__soap__cutoff={"radius": 5.0, "width": 6.0}
    )
    assert_one_line(
        code, error, "architecture.model.soap.cutoff", "width 6 is larger than radius 5"
    )


def test_positions_in_a_wrong_length_unit_stop_check_before_any_step(tmp_path, capsys):
    code, error = train_with(
        tmp_path,
        capsys,
        "--check",
        training_set={"systems": {"read_from": str(ETHANOL), "length_unit": "nm"}},
    )
    assert code == 2
    assert_one_line(
        code, error, "ethanol_40.xyz", "no atom", "declare systems.length_unit: angstrom"
    )
    assert not (tmp_path / "outputs").exists()


def test_survey_warnings_name_their_silencer_and_it_silences_them(tmp_path, capsys):
    mev = {"systems": str(ETHANOL), "targets": {"energy": {"key": "energy", "unit": "meV"}}}

    def check(**changes):
        options = write_options(tmp_path, ETHANOL, training_set=mev, **changes)
        assert main(["train", str(options), "--check"]) == 0
        return capsys.readouterr().out

    console = check()
    assert "data survey (28 training structures" in console
    assert "usable, but see the 2 warning(s) above" in console
    assert "silence_warnings: [force_scale]" in console
    assert "declare the energy target's unit: eV (it is meV)" in console
    console = check(silence_warnings=["force_scale", "energy_spread"])
    assert "data survey" in console and "(it is meV)" not in console


def test_unknown_architecture_lists_known_ones(tmp_path, capsys):
    code, error = train_with(tmp_path, capsys, architecture__name="allegro")
    assert_one_line(code, error, "'architecture.name'", "unknown architecture 'allegro'", "mace")


def test_mace_irreps_in_e3nns_notation(tmp_path, capsys):
    code, error = train_with(
        tmp_path, capsys, architecture__name="mace", architecture__model={"hidden_irreps": "16"}
    )
    assert_one_line(code, error, "'architecture.model.hidden_irreps'", "32x0e + 32x1o")


def test_restart_auto_without_earlier_run(tmp_path, capsys):
    code, error = train_with(tmp_path, capsys, "--restart", "auto")
    assert_one_line(code, error, "--restart auto", "no earlier run")


def test_checkpoint_of_another_architecture(tmp_path, capsys):
    checkpoint = tmp_path / "other.ckpt"
    torch.save({"format": FORMAT, "architecture": "allegro"}, checkpoint)
    code, error = train_with(tmp_path, capsys, "--restart", checkpoint)
    assert_one_line(code, error, "other.ckpt", "architecture 'allegro'")
    code, error = run(capsys, "export", checkpoint)
    assert_one_line(code, error, "architecture 'allegro'")


def test_checkpoint_of_another_atomtrain_version(tmp_path, capsys):
    checkpoint = tmp_path / "old.ckpt"
    torch.save({"format": "atomtrain-checkpoint-1", "architecture": "soap_bpnn"}, checkpoint)
    code, error = train_with(tmp_path, capsys, "--restart", checkpoint)
    assert_one_line(code, error, "old.ckpt", "older atomtrain and cannot be upgraded", "train anew")
    torch.save({"format": "atomtrain-checkpoint-9", "architecture": "soap_bpnn"}, checkpoint)
    code, error = train_with(tmp_path, capsys, "--restart", checkpoint)
    assert_one_line(code, error, "old.ckpt", "from a newer atomtrain", FORMAT, "update atomtrain")
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


def corrupt_copy(tmp_path):
    lines = ETHANOL.read_text().splitlines(keepends=True)
    lines[15] = lines[15].replace(lines[15].split()[1], "abc", 1)  # frame 1's first atom
    data = tmp_path / "corrupt.xyz"
    data.write_text("".join(lines))
    return (
        data,
        {},
        (
            f"atomtrain: {data}, frame 1 (line 16): cannot read as extended XYZ (could not "
            "convert string to float: 'abc')"
        ),
    )


def too_short_a_cutoff(tmp_path):
    section = {"cutoff": {"radius": 0.5, "width": 0.1}, "max_radial": 2, "max_angular": 2}
    return ETHANOL, {"architecture__model__soap": section}, "has a neighbor within the cutoff"


@pytest.mark.slow
@pytest.mark.parametrize("case", [corrupt_copy, too_short_a_cutoff])
def test_bad_data_under_nproc_is_one_line_and_leaves_no_outputs(tmp_path, case):
    """Every process reads and checks the same files and fails, each at its moment:
    one line (rank 0's), exit 2, and no run directory, date folder, torchrun marker or
    outputs/ behind. The slower process used to be stopped by the launcher first, its
    run directory left and a second line saying it was killed. A file that cannot be
    read, and a check of the data after the reading (the survey)."""
    data, changes, expected = case(tmp_path)
    options = write_options(tmp_path, data, **changes)
    result = subprocess.run(
        [sys.executable, "-m", "atomtrain", "train", str(options), "--nproc", "2"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("atomtrain: ") and expected in lines[0], lines
    assert not (tmp_path / "outputs").exists()


# ---------------------------------------------------------------------------------------
# Bad input that users reported: each row builds its input in a directory, runs one
# command, and must get exit code 2 with one line holding the fragments, and no run
# directory left behind. Add each new report as a row.

METATRAIN = RESOURCES / "metatrain"


@pytest.fixture(scope="module")
def trained_model(tmp_path_factory):
    """A small trained run: (model.pt, best.ckpt, run directory)."""
    directory = tmp_path_factory.mktemp("trained")
    options = write_options(directory, ETHANOL, architecture__training__num_epochs=2)
    run_dir = directory / "run"
    code = main(["train", str(options), "--run-dir", str(run_dir), "-o", str(directory / "m.pt")])
    assert code == 0
    return directory / "m.pt", run_dir / "best.ckpt", run_dir


def same_atom_twice(directory):
    frames = ase.io.read(ETHANOL, ":12")
    frames[3].positions[2] = frames[3].positions[1]
    path = directory / "overlap.xyz"
    ase.io.write(path, frames)
    return path


def non_atomtrain_torchscript(directory):
    path = directory / "linear.pt"
    torch.jit.save(torch.jit.script(torch.nn.Linear(2, 2)), str(path))
    return path


def truncated_copy(directory, checkpoint):
    path = directory / "last.ckpt"
    shutil.copy(checkpoint.parent / "epoch_2.ckpt", directory / "epoch_2.ckpt")
    data = checkpoint.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return path


def read_only(directory):
    """A directory not even root can write to: a read-only mount (or mode 555 for users)."""
    target = directory / "read_only"
    target.mkdir()
    if os.geteuid() != 0:
        target.chmod(0o555)
        return target
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(target)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip("cannot make a read-only directory for root here (mount failed)")
    READ_ONLY_MOUNTS.append(target)
    return target


READ_ONLY_MOUNTS: list = []


def train_options(directory, **changes):
    return write_options(directory, ETHANOL, **changes)


def train_argv(directory, *extra, data=ETHANOL, finetune_from=None, **changes):
    """``atomtrain train`` of a small options file, runs under ``directory/o``."""
    if finetune_from is not None:
        changes["architecture__training__finetune"] = {"read_from": str(finetune_from)}
    options = write_options(directory, data, **changes)
    return ["train", options, "--outputs", directory / "o", *extra]


# (case, command builder (directory, model.pt, best.ckpt) -> argv, fragments of the line)
CASES = [
    (
        "eval: element the exported model lacks",
        lambda d, pt, ckpt: ["eval", pt, RESOURCES / "si_test.xyz", "-o", d / "p.xyz"],
        ["si_test.xyz", "[14]", "knows [1, 6, 8]"],
    ),
    (
        "eval: element the checkpoint's model lacks",
        lambda d, pt, ckpt: ["eval", ckpt, RESOURCES / "si_test.xyz", "-o", d / "p.xyz"],
        ["si_test.xyz", "[14]", "best.ckpt"],
    ),
    (
        "train: two atoms at the same position",
        lambda d, pt, ckpt: train_argv(d, data=same_atom_twice(d)),
        ["overlap.xyz, frame 3", "atoms 1 and 2", "0 A apart"],
    ),
    (
        "eval: two atoms at the same position",
        lambda d, pt, ckpt: ["eval", pt, same_atom_twice(d), "-o", d / "p.xyz"],
        ["overlap.xyz, frame 3", "atoms 1 and 2"],
    ),
    (
        "train: read-only --run-dir",
        lambda d, pt, ckpt: ["train", train_options(d), "--run-dir", read_only(d) / "run"],
        ["--run-dir", "read_only", "not writable"],
    ),
    (
        "train: outputs in a read-only directory",
        lambda d, pt, ckpt: ["train", train_options(d), "--outputs", read_only(d) / "outputs"],
        ["cannot write to", "read_only/outputs", "read_only is not writable", "--outputs DIR"],
    ),
    (
        "train: read-only -o",
        lambda d, pt, ckpt: train_argv(d, "-o", read_only(d) / "model.pt"),
        ["model.pt", "not writable"],
    ),
    (
        "eval: read-only -o",
        lambda d, pt, ckpt: ["eval", pt, ETHANOL, "-o", read_only(d) / "p.xyz"],
        ["p.xyz", "not writable"],
    ),
    (
        "train: --nproc 0",
        lambda d, pt, ckpt: train_argv(d, "--nproc", "0"),
        ["--nproc 0", "positive number"],
    ),
    (
        "train: --nproc -1",
        lambda d, pt, ckpt: train_argv(d, "--nproc", "-1"),
        ["--nproc -1", "positive number"],
    ),
    (
        "eval: -b 0",
        lambda d, pt, ckpt: ["eval", pt, ETHANOL, "-b", "0", "-o", d / "p.xyz"],
        ["-b 0", "at least 1"],
    ),
    (
        "eval: a TorchScript module that is not an atomtrain model",
        lambda d, pt, ckpt: ["eval", non_atomtrain_torchscript(d), ETHANOL, "-o", d / "p.xyz"],
        ["linear.pt", "not an atomtrain model", "cutoff"],
    ),
    (
        "fine-tune: a TorchScript module that is not an atomtrain model",
        lambda d, pt, ckpt: train_argv(d, finetune_from=non_atomtrain_torchscript(d)),
        ["linear.pt", "not an atomtrain model"],
    ),
    (
        "eval: a model exported by metatrain",
        lambda d, pt, ckpt: ["eval", METATRAIN / "model.pt", ETHANOL, "-o", d / "p.xyz"],
        ["model.pt", "metatomic model", "MetatomicCalculator"],
    ),
    (
        "eval: a metatrain checkpoint",
        lambda d, pt, ckpt: ["eval", METATRAIN / "model.ckpt", ETHANOL, "-o", d / "p.xyz"],
        ["model.ckpt", "metatrain checkpoint"],
    ),
    (
        "fine-tune: a metatrain checkpoint",
        lambda d, pt, ckpt: train_argv(d, finetune_from=METATRAIN / "model.ckpt"),
        ["model.ckpt", "metatrain checkpoint"],
    ),
    (
        "eval: a truncated checkpoint",
        lambda d, pt, ckpt: ["eval", truncated_copy(d, ckpt), ETHANOL, "-o", d / "p.xyz"],
        ["last.ckpt", "truncated or corrupt", "--restart auto would resume from", "epoch_2.ckpt"],
    ),
    (
        "train --restart: a truncated checkpoint",
        lambda d, pt, ckpt: ["train", train_options(d), "--restart", truncated_copy(d, ckpt)],
        ["last.ckpt", "truncated or corrupt", "epoch_2.ckpt"],
    ),
    (
        "train: -r with an unknown key",
        lambda d, pt, ckpt: train_argv(d, "-r", "architecture.model.bogus=1"),
        ["-r architecture.model.bogus=1", "unknown key 'architecture.model.bogus'"],
    ),
    (
        "train: unknown energy unit",
        lambda d, pt, ckpt: train_argv(
            d, training_set={"systems": str(ETHANOL), "targets": {"energy": {"unit": "eVs"}}}
        ),
        ["options.yaml", "training_set.targets.energy.unit", "'eVs'", "did you mean 'ev'"],
    ),
    (
        "train: unknown length unit",
        lambda d, pt, ckpt: train_argv(
            d, training_set={"systems": {"read_from": str(ETHANOL), "length_unit": "angstroms"}}
        ),
        ["training_set.systems.length_unit", "'angstroms'", "did you mean 'angstrom'"],
    ),
    (
        "eval: a YAML description without read_from",
        lambda d, pt, ckpt: [
            *["eval", pt, write_text(d / "data.yaml", "systems:\n  length_unit: angstrom\n")],
            *["-o", d / "p.xyz"],
        ],
        ["data.yaml", "missing required key 'systems.read_from'"],
    ),
    (
        "eval: a training options file given as the data",
        lambda d, pt, ckpt: ["eval", pt, train_options(d), "-o", d / "p.xyz"],
        ["options.yaml is a training options file", "ethanol_40.xyz", "one data section"],
    ),
    (
        "train: a missing data file",
        lambda d, pt, ckpt: train_argv(d, data=d / "absent.xyz"),
        ["absent.xyz", "data file not found"],
    ),
    (
        "eval: an options file given as the model",
        lambda d, pt, ckpt: ["eval", train_options(d), ETHANOL, "-o", d / "p.xyz"],
        ["options.yaml", "not a model file", "model.pt written by atomtrain"],
    ),
    (
        "export: a data file given as the checkpoint",
        lambda d, pt, ckpt: ["export", ETHANOL, "-o", d / "p.xyz"],
        ["ethanol_40.xyz", "not a checkpoint", "best.ckpt"],
    ),
    (
        "export: an exported model given as the checkpoint",
        lambda d, pt, ckpt: ["export", pt, "-o", d / "p.xyz"],
        ["m.pt", "an exported model", "not a checkpoint", "finetune.read_from"],
    ),
    (
        "train --restart: an exported model",
        lambda d, pt, ckpt: ["train", train_options(d), "--restart", pt],
        ["m.pt", "an exported model", "not a checkpoint"],
    ),
    (
        "train --restart: a data file",
        lambda d, pt, ckpt: ["train", train_options(d), "--restart", ETHANOL],
        ["ethanol_40.xyz", "not a checkpoint"],
    ),
]


def write_text(path, text):
    path.write_text(text)
    return path


@pytest.mark.parametrize("case, command, fragments", CASES, ids=[case[0] for case in CASES])
def test_reported_bad_input(tmp_path, capsys, trained_model, case, command, fragments):
    model, checkpoint, _ = trained_model
    try:
        arguments = [str(part) for part in command(tmp_path, model, checkpoint)]
        code, error = run(capsys, *arguments)
    finally:
        while READ_ONLY_MOUNTS:
            subprocess.run(["umount", "-l", str(READ_ONLY_MOUNTS.pop())], check=False)
    assert code == 2, error
    assert_one_line(code, error, *fragments)
    assert "\x1b" not in error  # no terminal escape codes
    assert not (tmp_path / "o").exists()  # no run that never started, nor its outputs/
    assert not (tmp_path / "p.xyz").exists()
    # nothing written beside the inputs either (a log beside a --restart file, say)
    assert not (RESOURCES / "train.log").exists() and not (model.parent / "train.log").exists()


def test_a_checkpoint_is_told_by_its_content_not_its_name(tmp_path, capsys, trained_model):
    """eval and fine-tuning take a checkpoint named .pt; the ASE calculator, which needs
    an exported model, says how to export it."""
    from atomtrain.ase import Calculator
    from atomtrain.errors import AtomtrainError
    from atomtrain.training.checkpoint import best_model
    from atomtrain.training.finetune import pretrained_model

    _, checkpoint, _ = trained_model
    renamed = shutil.copy(checkpoint, tmp_path / "renamed.pt")
    code, error = run(capsys, "eval", renamed, ETHANOL, "-o", tmp_path / "p.xyz")
    assert code == 0, error
    assert len(ase.io.read(tmp_path / "p.xyz", ":")) == len(ase.io.read(ETHANOL, ":"))
    with pytest.raises(AtomtrainError, match="a checkpoint, not an exported model; export it"):
        Calculator(str(renamed))
    expected = best_model(checkpoint).state_dict()
    for name, value in pretrained_model(str(renamed), "soap_bpnn").state_dict().items():
        assert torch.equal(value, expected[name]), name


def test_restart_auto_says_which_checkpoint_it_skips(tmp_path, capsys, trained_model):
    _, checkpoint, run_dir = trained_model
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    truncated_copy(copy, checkpoint)
    os.utime(copy / "epoch_2.ckpt", (1, 1))  # older than last.ckpt
    options = write_options(tmp_path, ETHANOL, architecture__training__num_epochs=2)
    code = main(["train", str(options), "--run-dir", str(copy), "--restart", "auto"])
    error = capsys.readouterr().err
    assert code == 0
    assert f"skipping {copy / 'last.ckpt'}: the checkpoint is truncated or corrupt" in error
    assert f"resuming from {copy / 'epoch_2.ckpt'}" in error
