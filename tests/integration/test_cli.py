"""End-to-end command-line tests: train, eval, export, restart, reproducibility."""

from __future__ import annotations

import csv
import re
import shutil
import subprocess
import sys

import ase.build
import ase.io
import numpy as np
import pytest
import torch
import yaml

from atomtrain.cli.eval_run import parity_pairs
from atomtrain.cli.main import main
from atomtrain.data import read_structures
from atomtrain.models.export import load_exported

from conftest import RESOURCES
from helpers import checkpoint_weights, run_directories, write_options

ETHANOL = RESOURCES / "ethanol_40.xyz"


def train(tmp_path, options, *extra):
    return main(["train", str(options), "--outputs", str(tmp_path / "outputs"), *extra])


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One real training run shared by the read-only checks."""
    directory = tmp_path_factory.mktemp("run")
    options = write_options(directory, ETHANOL, logging__figures=True)
    assert train(directory, options, "-o", str(directory / "exported.pt")) == 0
    (run,) = run_directories(directory / "outputs")
    return directory, run


def test_run_writes_the_expected_outputs(trained):
    directory, run = trained
    for name in [
        "train.log",
        "train.csv",
        "options.yaml",
        "split.yaml",
        "best.ckpt",
        "last.ckpt",
        "epoch_2.ckpt",
        "model.pt",
        "learning_curves.png",
    ]:
        assert (run / name).is_file(), name
    assert (directory / "exported.pt").is_file()
    log = (run / "train.log").read_text()
    assert "seed 5" in log and "metrics of the best model" in log
    assert run.parent.name.count("-") == 2 and run.name.count("-") == 2  # date / time


def test_every_output_file_has_the_mode_the_umask_gives(trained):
    from atomtrain.io import process_umask

    directory, run = trained
    mask = process_umask()
    for path in [*run.iterdir(), directory / "exported.pt", directory / "extensions"]:
        # extensions/ holds copies of installed libraries, which keep their own modes
        expected = (0o777 if path.is_dir() else 0o666) & ~mask
        assert path.stat().st_mode & 0o777 == expected, path.name


def test_learning_curves_are_panels_in_rows_of_three(trained):
    import matplotlib.image

    _, run = trained
    height, width = matplotlib.image.imread(run / "learning_curves.png").shape[:2]
    # ethanol: energy per atom, energy and forces, one row of three 450 x 350 panels
    assert (width, height) == (1350, 350)


def test_csv_has_one_row_per_logged_epoch(trained):
    _, run = trained
    with (run / "train.csv").open() as stream:
        rows = list(csv.DictReader(stream))
    assert [int(row["epoch"]) for row in rows] == [1, 2, 3]
    for column in [
        "learning_rate",
        "train_loss",
        "train_energy_per_atom_rmse (eV/atom)",
        "train_forces_mae (eV/A)",
        "validation_energy_per_atom_rmse (eV/atom)",
        "validation_forces_rmse (eV/A)",
        "validation_energy_mae (eV)",
    ]:
        assert all(float(row[column]) >= 0 for row in rows), column
    assert float(rows[-1]["train_loss"]) < float(rows[0]["train_loss"])


def test_the_best_model_may_be_picked_by_one_named_error(tmp_path):
    options = write_options(
        tmp_path,
        ETHANOL,
        architecture__training__best_model_metric="forces_mae",
        architecture__training__num_epochs=4,
    )
    assert train(tmp_path, options) == 0
    (run,) = run_directories(tmp_path / "outputs")
    with (run / "train.csv").open() as stream:
        errors = [float(row["validation_forces_mae (eV/A)"]) for row in csv.DictReader(stream)]
    assert f"best model: epoch {1 + errors.index(min(errors))}" in (run / "train.log").read_text()


def test_figures_false_writes_train_csv_and_draws_nothing(tmp_path):
    """logging.figures: false (what helpers.write_options sets): no child process, no
    learning_curves.png, and the log names no curves phase."""
    options = write_options(tmp_path, ETHANOL, architecture__training__num_epochs=1)
    assert train(tmp_path, options) == 0
    (run,) = run_directories(tmp_path / "outputs")
    assert (run / "train.csv").is_file() and not (run / "learning_curves.png").exists()
    assert "learning curves" not in (run / "train.log").read_text()


def test_the_log_ends_with_the_time_of_each_phase(trained):
    """A short run spends as much time outside its epochs as in them: the log's last
    line says where (docs/performance-notes.md, "Short runs")."""
    directory, run = trained
    last = (run / "train.log").read_text().strip().splitlines()[-1]
    assert "time by phase: " in last
    for phase in ("setup", "epochs", "refit", "final evaluation", "export"):
        assert re.search(rf"\b{phase} \d+\.\d\d s", last), (phase, last)
    # -o gets the exported model's very bytes, copied rather than scripted again
    assert (directory / "exported.pt").read_bytes() == (run / "model.pt").read_bytes()
    assert (directory / "extensions").is_dir()
    assert (run / "learning_curves.png").stat().st_size > 10_000  # drawn by a child


def test_expanded_options_and_split_reproduce_the_run(trained):
    _, run = trained
    options = yaml.safe_load((run / "options.yaml").read_text())
    assert options["seed"] == 5
    assert options["architecture"]["training"]["loss"]["type"] == "mse"
    assert options["distributed"]["timeout"] == 300.0
    split = yaml.safe_load((run / "split.yaml").read_text())
    assert sorted(split["training"] + split["validation"] + split["test"]) == list(range(40))
    assert len(split["validation"]) == 8 and len(split["test"]) == 4


def test_same_seed_same_model_and_split(tmp_path, trained, fixed_threads):
    """Bit for bit, at a fixed thread count (fixed_threads)."""
    _, run = trained
    for name in ("first", "second"):
        options = tmp_path / f"{name}.yaml"
        options.write_text((run / "options.yaml").read_text())
        assert main(["train", str(options), "--outputs", str(tmp_path / name)]) == 0
    (first,) = run_directories(tmp_path / "first")
    (second,) = run_directories(tmp_path / "second")
    assert (first / "split.yaml").read_text() == (run / "split.yaml").read_text()
    assert (second / "split.yaml").read_text() == (run / "split.yaml").read_text()
    weights = checkpoint_weights(first / "last.ckpt"), checkpoint_weights(second / "last.ckpt")
    for name in weights[0]:
        assert torch.equal(weights[0][name], weights[1][name]), name


def copied_run(tmp_path, run, checkpoint: str):
    """A run directory under tmp_path/outputs holding ``checkpoint`` of ``run`` as its
    last.ckpt, and the run's options: what --restart auto resumes."""
    copy_directory = tmp_path / "outputs" / "2000-01-01" / "00-00-00"
    copy_directory.mkdir(parents=True)
    (copy_directory / "last.ckpt").write_bytes((run / checkpoint).read_bytes())
    options = tmp_path / "options.yaml"
    options.write_text((run / "options.yaml").read_text())
    return copy_directory, options


def test_restart_from_a_checkpoint_ends_with_the_same_model(tmp_path, trained):
    """Continue from epoch 2 of the shared run: epoch 3 must be reproduced exactly."""
    _, run = trained
    uninterrupted = torch.load(run / "last.ckpt", weights_only=True)["model_state"]
    copy_directory, options = copied_run(tmp_path, run, "epoch_2.ckpt")
    assert train(tmp_path, options, "--restart", "auto") == 0
    resumed = torch.load(copy_directory / "last.ckpt", weights_only=True)
    assert resumed["epoch"] == 3
    for name, value in uninterrupted.items():
        assert torch.allclose(resumed["model_state"][name], value, rtol=1e-12, atol=1e-14), name
    assert "resuming after epoch 2" in (copy_directory / "train.log").read_text()


def test_restart_auto_of_a_complete_run_says_so_and_can_train_further(tmp_path, trained, capsys):
    _, run = trained
    copy_directory, options = copied_run(tmp_path, run, "last.ckpt")
    assert train(tmp_path, options, "--restart", "auto") == 0
    said = capsys.readouterr().out
    assert "the run is complete: its checkpoint is from epoch 3 of 3, so nothing is trained" in said
    assert "epoch 3/3" not in said and (copy_directory / "model.pt").is_file()
    more = ("-r", "architecture.training.num_epochs=4")
    assert train(tmp_path, options, "--restart", "auto", *more) == 0
    assert torch.load(copy_directory / "last.ckpt", weights_only=True)["epoch"] == 4


def test_eval_metrics_match_an_independent_computation(tmp_path, trained, capsys):
    directory, run = trained
    predictions = tmp_path / "predictions.xyz"
    assert main(["eval", str(run / "model.pt"), str(ETHANOL), "-o", str(predictions)]) == 0
    assert predictions.with_suffix(".png").is_file()
    predicted = ase.io.read(predictions, ":")
    reference = ase.io.read(ETHANOL, ":")
    assert len(predicted) == len(reference)
    for p, r in zip(predicted, reference):
        # the reference frame as it was, every key kept, with the predictions beside it
        assert p.info["OH_dist"] == r.info["OH_dist"]
        assert p.get_potential_energy() == r.get_potential_energy()
        np.testing.assert_array_equal(p.get_forces(), r.get_forces())
    energy_error = np.array(
        [
            p.info["predicted_energy"] - r.get_potential_energy()
            for p, r in zip(predicted, reference)
        ]
    )
    force_error = np.concatenate(
        [
            (p.arrays["predicted_forces"] - r.get_forces()).ravel()
            for p, r in zip(predicted, reference)
        ]
    )
    per_atom = energy_error / np.array([len(r) for r in reference])
    expected = {
        "E/atom RMSE": np.sqrt(np.mean(per_atom**2)) * 1e3,
        "F RMSE": np.sqrt(np.mean(force_error**2)) * 1e3,
        "F MAE": np.mean(np.abs(force_error)) * 1e3,
    }
    # the table that eval printed holds the same numbers
    output = capsys.readouterr().out
    assert f"metrics of {run / 'model.pt'}" in output  # not "of the best model"
    table = output.splitlines()
    header = next(line for line in table if line.startswith("set"))
    row = next(line for line in table if line.startswith("ethanol_40.xyz"))
    labels = [label.strip() for label in header[12:].split("  ") if label.strip()]
    values = dict(zip(labels, map(float, row.split()[1:])))
    for label, value in expected.items():
        assert values[label] == pytest.approx(value, abs=1e-4), label


def test_eval_of_a_checkpoint_is_the_eval_of_its_exported_best_model(tmp_path, trained, capsys):
    _, run = trained
    capsys.readouterr()
    assert main(["eval", str(run / "best.ckpt"), str(ETHANOL), "-o", str(tmp_path / "a.xyz")]) == 0
    from_checkpoint = printed_metrics(capsys.readouterr().out, "ethanol_40.xyz")
    assert main(["eval", str(run / "model.pt"), str(ETHANOL), "-o", str(tmp_path / "b.xyz")]) == 0
    exported = printed_metrics(capsys.readouterr().out, "ethanol_40.xyz")
    assert from_checkpoint == pytest.approx(exported, rel=1e-6)


def test_eval_in_a_command_process_leaves_metatensors_operations_out(tmp_path, trained):
    """metatensor-torch compiles its Python operations at its import (0.55 s of an
    eval of 4.3 s here); eval never uses them: a command's process leaves them out,
    and writes the predictions of a process that keeps them. The parity plot is drawn
    by the figures' process a command started early, or in a longer-lived process."""
    _, run = trained
    script = (
        "import sys\n"
        "from atomtrain import runtime\n"
        "if sys.argv[1] == 'one':\n"
        "    runtime.this_process_runs_one_command()\n"
        "from atomtrain.cli.main import main\n"
        "code = main(['eval', *sys.argv[2:]])\n"
        "print(code, 'metatensor_operations' in sys.modules)\n"
    )
    predicted = {}
    for process in ("one", "longer-lived"):
        output = tmp_path / f"{process}.xyz"
        result = subprocess.run(
            [sys.executable, "-c", script, process, str(run / "model.pt"), str(ETHANOL)]
            + ["-o", str(output)],
            capture_output=True,
            text=True,
        )
        assert result.returncode == 0, result.stderr[-2000:]
        assert result.stdout.split()[-2:] == ["0", str(process != "one")]
        predicted[process] = [frame.info["predicted_energy"] for frame in ase.io.read(output, ":")]
        # the parity plot: drawn by the process started early, or in-process
        assert output.with_suffix(".png").stat().st_size > 10_000
    assert predicted["one"] == predicted["longer-lived"]


def test_eval_accepts_metatrain_yaml(tmp_path, trained):
    _, run = trained
    description = tmp_path / "eval.yaml"
    description.write_text(
        yaml.safe_dump(
            {
                "systems": {
                    "read_from": str(RESOURCES / "ethanol_reduced_100.xyz"),
                    "length_unit": "angstrom",
                },
                "targets": {"energy": {"key": "energy", "unit": "kcal/mol", "forces": True}},
            }
        )
    )
    predictions = tmp_path / "out.xyz"
    assert main(["eval", str(run / "model.pt"), str(description), "-o", str(predictions)]) == 0
    frames = ase.io.read(predictions, ":")
    assert len(frames) == 100
    energies = np.array([frame.info["predicted_energy"] for frame in frames])
    reference = np.array(
        [
            s.energy
            for s in read_structures(
                RESOURCES / "ethanol_reduced_100.xyz",
                units=__import__("atomtrain").data.Units(energy="kcal/mol"),
            )
        ]
    )
    # converted to eV: the predictions sit near the reference, not 23 times off
    assert np.abs(energies - reference).mean() < 5.0


def printed_metrics(output: str, row_name: str) -> list[float]:
    row = next(line for line in output.splitlines() if line.startswith(row_name))
    return [float(value) for value in row.split()[1:]]


def test_eval_of_several_files_in_one_description(tmp_path, trained, capsys):
    """A metatrain eval description listing two files with their own keys and units
    gives the metrics of the one file holding both."""
    _, run = trained
    frames = ase.io.read(ETHANOL, ":")
    ase.io.write(tmp_path / "first.xyz", frames[:24], format="extxyz")
    write_in_kcal(tmp_path / "second.xyz", frames[24:], "E_kcal", "F_kcal")
    description = tmp_path / "both.yaml"
    second = {"key": "E_kcal", "unit": "kcal/mol", "forces": {"key": "F_kcal"}}
    description.write_text(
        yaml.safe_dump(["first.xyz", {"systems": "second.xyz", "targets": {"energy": second}}])
    )
    model = str(run / "model.pt")
    assert main(["eval", model, str(description), "-o", str(tmp_path / "both.xyz")]) == 0
    output = capsys.readouterr().out
    both = printed_metrics(output, "both.yaml")
    assert main(["eval", model, str(ETHANOL), "-o", str(tmp_path / "one.xyz")]) == 0
    one = printed_metrics(capsys.readouterr().out, "ethanol_40.xyz")
    assert len(ase.io.read(tmp_path / "both.xyz", ":")) == 40
    assert both == pytest.approx(one, abs=1e-3)
    # each file's row: the whole set's squared errors are theirs added up
    first, second = (printed_metrics(output, f"  {name}") for name in ("first", "second"))
    assert both[0] ** 2 * 40 == pytest.approx(first[0] ** 2 * 24 + second[0] ** 2 * 16, rel=1e-3)


def test_export_command(tmp_path, trained):
    _, run = trained
    output = tmp_path / "exported.pt"
    assert main(["export", str(run / "best.ckpt"), "-o", str(output)]) == 0
    from atomtrain.ase import Calculator

    atoms = ase.io.read(ETHANOL, 0)
    atoms.calc = Calculator(str(output))
    reference = ase.io.read(ETHANOL, 0)
    reference.calc = Calculator(str(run / "model.pt"))
    assert atoms.get_potential_energy() == pytest.approx(reference.get_potential_energy())


def test_compositions_the_training_left_undetermined_are_warned_of_once(tmp_path, trained, capsys):
    """Ethanol only fixes the baseline of C2H6O: methane's total energy is arbitrary,
    which eval and the ASE calculator say once; ethanol itself passes silently."""
    import warnings

    from atomtrain.ase import Calculator

    _, run = trained
    methane = ase.build.molecule("CH4")
    mixed = tmp_path / "mixed.xyz"
    ase.io.write(mixed, [ase.io.read(ETHANOL, 0).copy(), methane, methane])
    capsys.readouterr()
    assert main(["eval", str(run / "model.pt"), str(mixed), "-o", str(tmp_path / "p.xyz")]) == 0
    console = capsys.readouterr().out
    assert console.count("did not determine the per-element energies") == 1, console
    assert "2 of 3 structures (mixed.xyz) have a composition" in console
    assert main(["eval", str(run / "model.pt"), str(ETHANOL), "-o", str(tmp_path / "e.xyz")]) == 0
    assert "did not determine" not in capsys.readouterr().out
    calculator = Calculator(str(run / "model.pt"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ethanol = ase.io.read(ETHANOL, 0)
        ethanol.calc = calculator
        ethanol.get_potential_energy()
        assert not caught
        for _ in range(2):
            molecule = methane.copy()
            molecule.calc = calculator
            molecule.get_potential_energy()
    assert len(caught) == 1 and "this structure has a composition" in str(caught[0].message)


def test_check_reads_everything_says_what_the_run_would_do_and_trains_nothing(tmp_path, capsys):
    options = write_options(tmp_path, ETHANOL, architecture__training__batch_size=4)
    outputs = ["--outputs", str(tmp_path / "outputs")]
    assert main(["train", str(options), "--check", "--nproc", "2", *outputs]) == 0
    said = capsys.readouterr().out
    assert "data: 28 training, 8 validation, 4 test structures; targets: energy, forces" in said
    assert "model: SOAP-BPNN" in said and "elements [1, 6, 8]" in said
    assert "7 steps per epoch, 3 epochs; 2 process(es) (spawn) on cpu" in said
    assert not (tmp_path / "outputs").exists()
    # a data error shows up in the check, as one line
    bad = write_options(
        tmp_path,
        ETHANOL,
        training_set={"systems": str(ETHANOL), "targets": {"energy": {"key": "U0"}}},
    )
    assert main(["train", str(bad), "--check", *outputs]) == 2
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1 and "no energy under key 'U0'" in error, error


def test_energy_only_data_trains(tmp_path):
    options = write_options(
        tmp_path,
        RESOURCES / "qm9_reduced_100.xyz",
        training_set={
            "systems": {"read_from": str(RESOURCES / "qm9_reduced_100.xyz")},
            "targets": {"energy": {"key": "U0", "unit": "hartree"}},
        },
        architecture__training__num_epochs=2,
    )
    assert train(tmp_path, options) == 0
    (run,) = run_directories(tmp_path / "outputs")
    header = (run / "train.csv").read_text().splitlines()[0]
    assert "forces" not in header and "energy_per_atom_rmse" in header


def test_periodic_data_with_stress_trains(tmp_path):
    options = write_options(
        tmp_path,
        RESOURCES / "si_test.xyz",
        architecture__training__num_epochs=2,
        validation_set=0.2,
        test_set=0.0,
    )
    assert train(tmp_path, options) == 0
    (run,) = run_directories(tmp_path / "outputs")
    header = (run / "train.csv").read_text().splitlines()[0]
    assert "validation_stress_rmse" in header


def write_in_kcal(path, frames, energy_key, forces_key):
    """``frames`` with energies and forces in kcal/mol under keys of their own."""
    per_eV = ase.units.mol / ase.units.kcal
    converted = []
    for atoms in frames:
        copy = ase.Atoms(atoms.numbers, atoms.positions, cell=atoms.cell, pbc=atoms.pbc)
        copy.info[energy_key] = atoms.get_potential_energy() * per_eV
        copy.arrays[forces_key] = atoms.get_forces() * per_eV
        converted.append(copy)
    ase.io.write(path, converted, format="extxyz")


def test_several_training_files_train_the_model_of_their_concatenation(tmp_path, fixed_threads):
    """metatrain's list of data sets: two files, the second with its own keys and units,
    train the model that one file holding both trains. Threads fixed: LLPR's Cholesky
    factor, compared to 1e-9, amplifies the rounding of sums split over another number of
    threads (failed so beside another job)."""
    frames = ase.io.read(ETHANOL, ":")
    ase.io.write(tmp_path / "first.xyz", frames[:24], format="extxyz")
    write_in_kcal(tmp_path / "second.xyz", frames[24:], "E_kcal", "F_kcal")
    ase.io.write(tmp_path / "validation.xyz", frames[::5], format="extxyz")
    second = {
        "systems": str(tmp_path / "second.xyz"),
        "targets": {"energy": {"key": "E_kcal", "unit": "kcal/mol", "forces": "F_kcal"}},
    }
    validation = {"systems": str(tmp_path / "validation.xyz")}
    weights = {}
    for name, training_set in (
        ("two files", [str(tmp_path / "first.xyz"), second]),
        ("one file", str(ETHANOL)),
    ):
        directory = tmp_path / name
        directory.mkdir()
        options = write_options(
            directory, ETHANOL, training_set=training_set, validation_set=validation, test_set=0.0
        )
        assert train(directory, options) == 0
        (run,) = run_directories(directory / "outputs")
        weights[name] = checkpoint_weights(run / "best.ckpt")
    for key, value in weights["one file"].items():
        assert torch.allclose(weights["two files"][key], value, rtol=1e-9, atol=1e-9), key


def test_fractions_are_cut_from_each_training_file(tmp_path):
    frames = ase.io.read(ETHANOL, ":")
    ase.io.write(tmp_path / "first.xyz", frames[:24], format="extxyz")
    write_in_kcal(tmp_path / "second.xyz", frames[24:], "E_kcal", "F_kcal")
    second = {
        "systems": "second.xyz",
        "targets": {"energy": {"key": "E_kcal", "unit": "kcal/mol", "forces": "F_kcal"}},
    }
    options = write_options(
        tmp_path,
        ETHANOL,
        training_set=["first.xyz", second],
        validation_set=0.25,
        test_set=0.125,
        architecture__training__num_epochs=1,
    )
    assert train(tmp_path, options) == 0
    (run,) = run_directories(tmp_path / "outputs")
    split = yaml.safe_load((run / "split.yaml").read_text())
    assert [record["file"] for record in split] == [
        str(tmp_path / "first.xyz"),
        str(tmp_path / "second.xyz"),
    ]
    for record, size in zip(split, (24, 16)):
        parts = record["training"] + record["validation"] + record["test"]
        assert sorted(parts) == list(range(size))
        assert (len(record["validation"]), len(record["test"])) == (size // 4, size // 8)
    log = (run / "train.log").read_text()
    assert "data: 25 training, 10 validation, 5 test structures" in log
    # the final table has a row for each file's share of each set, and the set's
    # squared errors are the files' added up
    rows = {}
    for line in log.splitlines():
        for label in ("validation", "validation: first.xyz", "validation: second.xyz"):
            if line.startswith(label + "  "):
                rows[label] = float(line[len(label) :].split()[0])  # E/atom RMSE
    whole, first, second = (rows[label] for label in sorted(rows))
    assert whole**2 * 10 == pytest.approx(first**2 * 6 + second**2 * 4, rel=1e-3)
    # and train.csv has each file's validation errors at every logged epoch
    with (run / "train.csv").open() as stream:
        (row,) = list(csv.DictReader(stream))
    whole, first, second = (
        float(row[f"validation_{share}energy_per_atom_rmse (eV/atom)"])
        for share in ("", "first.xyz_", "second.xyz_")
    )
    assert whole**2 * 10 == pytest.approx(first**2 * 6 + second**2 * 4, rel=1e-12)
    assert "validation_second.xyz_forces_rmse (eV/A)" in row


def test_atomic_types_build_networks_for_elements_the_training_set_lacks(tmp_path):
    """Listed elements absent from training (nitrogen here) get a network and a zero
    baseline, so validation data holding them is accepted (metatrain's atomic_types)."""
    options = write_options(
        tmp_path,
        ETHANOL,
        validation_set={
            "systems": str(RESOURCES / "qm9_reduced_100.xyz"),
            "targets": {"energy": {"key": "U0", "unit": "hartree"}},
        },
        test_set=0.0,
        architecture__atomic_types=[8, 7, 6, 1],
        architecture__training__num_epochs=1,
    )
    assert train(tmp_path, options) == 0
    (run,) = run_directories(tmp_path / "outputs")
    model = load_exported(run / "model.pt")
    assert list(model.atomic_types) == [1, 6, 7, 8]
    assert model.baseline[2].item() == 0.0 and model.baseline[0].item() != 0.0
    assert "validation: E RMSE" in (run / "train.log").read_text()


def finetune_options(directory, checkpoint, data, **training):
    path = directory / "finetune.yaml"
    options = {
        "seed": 1,
        "device": "cpu",
        "base_precision": 64,
        "architecture": {
            "training": {
                "num_epochs": 1,
                "batch_size": 5,
                "finetune": {"read_from": str(checkpoint)},
                **training,
            }
        },
        "training_set": str(data),
        "validation_set": 0.2,
    }
    path.write_text(yaml.safe_dump(options))
    return path


@pytest.mark.parametrize("start", ["best.ckpt", "model.pt"])
def test_finetuning_starts_from_the_best_model_of_a_run(tmp_path, trained, start):
    """With a learning rate of 1e-12 the fine-tuned model is the pretrained one (from
    the checkpoint or the exported model): its weights, baseline and scale, and its
    architecture recorded in options.yaml."""
    _, run = trained
    frames = ase.io.read(ETHANOL, ":20")
    ase.io.write(tmp_path / "new.xyz", frames, format="extxyz")
    options = finetune_options(tmp_path, run / start, "new.xyz", learning_rate=1e-12)
    assert train(tmp_path, options) == 0
    (finetuned,) = run_directories(tmp_path / "outputs")
    record = yaml.safe_load((finetuned / "options.yaml").read_text())
    assert record["architecture"]["model"]["soap"]["max_radial"] == 3  # not the default 7
    assert record["architecture"]["atomic_types"] == [1, 6, 8]
    assert "fine-tuning the best model of" in (finetuned / "train.log").read_text()
    pretrained = checkpoint_weights(run / "best.ckpt")
    weights = torch.load(finetuned / "last.ckpt", weights_only=True)["model_state"]
    for name, value in pretrained.items():
        if not name.startswith("llpr_"):  # LLPR is computed again at the end of a run
            torch.testing.assert_close(weights[name], value, rtol=0.0, atol=1e-9)


def test_finetuning_learning_rate_is_a_tenth_unless_set(tmp_path, trained):
    _, run = trained
    ase.io.write(tmp_path / "new.xyz", ase.io.read(ETHANOL, ":20"), format="extxyz")
    for given, expected in ((None, 1e-4), (0.002, 0.002)):
        directory = tmp_path / str(given)
        directory.mkdir()
        shutil.copy(tmp_path / "new.xyz", directory)
        training = {} if given is None else {"learning_rate": given}
        options = finetune_options(directory, run / "best.ckpt", "new.xyz", **training)
        assert train(directory, options) == 0
        (finetuned,) = run_directories(directory / "outputs")
        record = yaml.safe_load((finetuned / "options.yaml").read_text())
        assert record["architecture"]["training"]["learning_rate"] == expected
        assert f"at learning rate {expected:g}" in (finetuned / "train.log").read_text()


@pytest.mark.parametrize("start", ["best.ckpt", "model.pt"])
def test_finetuning_fits_what_a_one_composition_pretraining_left_open(tmp_path, trained, start):
    """Pretrained on ethanol alone (one composition), the split of the baseline between
    H, C and O is arbitrary; fine-tuning on other molecules fits that part to their
    energies before training, and leaves ethanol's baseline energy as it was."""
    _, run = trained
    assert "fix the per-element energies along 1 of 3" in (run / "train.log").read_text()
    frames = [
        frame
        for frame in ase.io.read(RESOURCES / "qm9_reduced_100.xyz", ":")
        if set(frame.numbers) <= {1, 6, 8}
    ]
    ase.io.write(tmp_path / "others.xyz", frames, format="extxyz")
    options = finetune_options(tmp_path, run / start, "others.xyz", learning_rate=1e-12)
    content = yaml.safe_load(options.read_text())
    content["training_set"] = {
        "systems": "others.xyz",
        "targets": {"energy": {"key": "U0", "unit": "hartree"}},
    }
    options.write_text(yaml.safe_dump(content))
    assert train(tmp_path, options) == 0
    (finetuned,) = run_directories(tmp_path / "outputs")
    assert "undetermined: fitted to this data" in (finetuned / "train.log").read_text()
    before = checkpoint_weights(run / "best.ckpt")["baseline"]
    after = torch.load(finetuned / "last.ckpt", weights_only=True)["model_state"]["baseline"]
    ethanol = torch.tensor([6.0, 2.0, 1.0], dtype=torch.float64)  # H, C, O
    assert float(ethanol @ after) == pytest.approx(float(ethanol @ before), abs=1e-8)
    counts = torch.tensor(
        [[(frame.numbers == z).sum() for z in (1, 6, 8)] for frame in frames], dtype=torch.float64
    )
    energies = torch.tensor([frame.info["U0"] * 27.211386245988 for frame in frames])
    error_before = float(((counts @ before - energies) / counts.sum(1)).abs().mean())
    error_after = float(((counts @ after - energies) / counts.sum(1)).abs().mean())
    assert error_after < 0.01 * error_before  # tens of eV per atom before, not after


@pytest.mark.parametrize(
    "case, fragments",
    [
        ("model key", ["'architecture.model.soap.max_radial' is 5", "has 3", "remove the key"]),
        ("element", ["[7]", "the model fine-tuned from", "lacks (it knows [1, 6, 8])"]),
        ("checkpoint", ["nowhere.ckpt: checkpoint not found"]),
    ],
)
def test_finetuning_refuses_what_does_not_fit_the_model(tmp_path, trained, capsys, case, fragments):
    _, run = trained
    checkpoint = tmp_path / "nowhere.ckpt" if case == "checkpoint" else run / "best.ckpt"
    data = ETHANOL
    if case == "element":
        data = tmp_path / "qm9.xyz"
        frames = ase.io.read(RESOURCES / "qm9_reduced_100.xyz", ":10")
        for atoms in frames:
            atoms.info["energy"] = atoms.info["U0"]
        ase.io.write(data, frames, format="extxyz")
    options = finetune_options(tmp_path, checkpoint, data)
    if case == "model key":
        content = yaml.safe_load(options.read_text())
        content["architecture"]["model"] = {"soap": {"max_radial": 5}}
        options.write_text(yaml.safe_dump(content))
    capsys.readouterr()
    assert train(tmp_path, options) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("atomtrain: ") and len(error.splitlines()) == 1, error
    for fragment in fragments:
        assert fragment in error, (fragment, error)


def test_the_options_file_metatrain_writes_reads_molecules_without_stress(tmp_path, capsys):
    """metatrain writes stress: {key: stress} for every energy, periodic or not, and
    trains molecules without it: so does atomtrain. stress: true still requires it, and
    its error says how to turn it off."""
    frames = ase.io.read(ETHANOL, ":")
    ase.io.write(tmp_path / "silicon_train.xyz", frames[:30], format="extxyz")
    ase.io.write(tmp_path / "silicon_validation.xyz", frames[30:], format="extxyz")
    options = tmp_path / "options_restart.yaml"
    options.write_text((RESOURCES / "metatrain_options_restart.yaml").read_text())
    assert main(["train", str(options), "--check"]) == 0
    said = capsys.readouterr().out
    assert "30 training, 10 validation, 0 test structures; targets: energy, forces\n" in said
    data = yaml.safe_load(options.read_text())
    data["training_set"][0]["targets"]["energy"]["stress"] = True
    options.write_text(yaml.safe_dump(data))
    assert main(["train", str(options), "--check"]) == 2
    error = capsys.readouterr().err
    assert "no stress under key 'stress'" in error and "or to false to train without" in error


def test_the_options_file_metatrain_writes_trains(tmp_path, capsys):
    """metatrain's options_restart.yaml as is (full-size SOAP-BPNN, stress, the best
    model by metatrain's product of RMSEs), on 20 + 5 silicon cells."""
    frames = ase.io.read(RESOURCES / "si_test.xyz", ":")
    ase.io.write(tmp_path / "silicon_train.xyz", frames[:20], format="extxyz")
    ase.io.write(tmp_path / "silicon_validation.xyz", frames[20:], format="extxyz")
    options = tmp_path / "options_restart.yaml"
    options.write_text((RESOURCES / "metatrain_options_restart.yaml").read_text())
    epochs = "architecture.training.num_epochs=3"
    assert train(tmp_path, options, "-r", epochs) == 0
    (run,) = run_directories(tmp_path / "outputs")
    with (run / "train.csv").open() as stream:
        rows = list(csv.DictReader(stream))
    products = [
        float(row["validation_energy_per_atom_rmse (eV/atom)"])
        * float(row["validation_forces_rmse (eV/A)"])
        * float(row["validation_virial_per_atom_rmse (eV/atom)"])
        for row in rows
    ]
    best = 1 + products.index(min(products))
    assert f"best model: epoch {best}" in (run / "train.log").read_text()

    # eval of periodic cells through a one-file description: rows named by the data file,
    # stress predicted beside the reference, and a stress panel in the parity plot
    description = tmp_path / "validation.yaml"
    description.write_text(yaml.safe_dump({"systems": "silicon_validation.xyz"}))
    predictions = tmp_path / "predictions.xyz"
    capsys.readouterr()
    assert main(["eval", str(run / "model.pt"), str(description), "-o", str(predictions)]) == 0
    assert len(printed_metrics(capsys.readouterr().out, "silicon_validation.xyz")) == 8
    predicted = ase.io.read(predictions, ":")
    assert len(predicted) == 5
    for frame, reference in zip(predicted, frames[20:]):
        assert frame.info["predicted_stress"].shape == (6,)
        assert frame.info["config_type"] == reference.info["config_type"]
        np.testing.assert_allclose(frame.get_stress(), reference.get_stress())
    assert predictions.with_suffix(".png").is_file()
    structures = read_structures(tmp_path / "silicon_validation.xyz")
    entries = [
        {
            "energy": f.info["predicted_energy"],
            "forces": f.arrays["predicted_forces"],
            "stress": voigt_to_matrix(f.info["predicted_stress"]),
        }
        for f in predicted
    ]
    assert list(parity_pairs(structures, entries)) == [
        "energy per atom (eV)",
        "force component (eV/A)",
        "stress component (GPa)",
    ]
    log = (run / "train.log").read_text()
    assert "S RMSE" in log
    import matplotlib.image

    # five curves (energy per atom, energy, forces, stress, virial): two rows of three
    curves = matplotlib.image.imread(run / "learning_curves.png")
    assert curves.shape[:2] == (700, 1350)


@pytest.mark.slow
def test_help_and_version_answer_without_importing_torch():
    """A new user's first commands answer at once: torch's import (3 s of 3.3 s here)
    waits until a command runs. Python's import log (-X importtime) names every module
    the process imported."""
    for arguments, expected in (
        (["--version"], "atomtrain"),
        (["--help"], "usage"),
        *(([command, "--help"], "usage") for command in ("train", "eval", "export", "convert")),
    ):
        result = subprocess.run(
            [sys.executable, "-X", "importtime", "-m", "atomtrain", *arguments],
            capture_output=True,
            text=True,
        )
        assert result.returncode == 0 and expected in result.stdout, arguments
        imported = {line.rsplit("|", 1)[-1].strip() for line in result.stderr.splitlines()}
        assert "atomtrain.cli.main" in imported and "torch" not in imported, arguments


def test_options_are_checked_and_the_drawing_process_started_before_torch(tmp_path):
    """A mistake in the options (or eval's data description) is said before torch's
    import (1.5-2 s), and starts no process for figures; usable ones start the figures'
    process before it, so that matplotlib's import (0.4 s of a short run) overlaps
    torch's."""
    script = (
        "import sys\n"
        "import atomtrain.training.figures as figures\n"
        "started = []\n"
        "figures.start_early = lambda: started.append('torch' in sys.modules)\n"
        "from atomtrain.cli.main import main\n"
        "from atomtrain.runtime import this_process_runs_one_command\n"
        "this_process_runs_one_command()\n"
        "code = main(sys.argv[1:])\n"
        "print(code, started, 'torch' in sys.modules)\n"
    )
    (tmp_path / "bad.yaml").write_text("architecture: {name: soap_bpnn, modle: {}}\n")
    (tmp_path / "good.yaml").write_text("training_set: missing.xyz\n")
    for arguments, expected in (
        (["train", "bad.yaml"], "2 [] False"),  # said without torch, nothing started
        (["train", "good.yaml"], "2 [False] True"),  # started before torch; no data
        (["train", "good.yaml", "-r", "logging.figures=false"], "2 [] True"),
        (["eval", "model.pt", "good.yaml"], "2 [] False"),  # not a data description
        (["eval", "model.pt", "missing.xyz"], "2 [False] True"),  # no model: after torch
    ):
        result = subprocess.run(
            [sys.executable, "-c", script, *arguments],
            capture_output=True,
            text=True,
            cwd=tmp_path,
        )
        assert result.stdout.strip().splitlines()[-1] == expected, (arguments, result.stderr)


def voigt_to_matrix(voigt):
    xx, yy, zz, yz, xz, xy = voigt
    return np.array([[xx, xy, xz], [xy, yy, yz], [xz, yz, zz]])
