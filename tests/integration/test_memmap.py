"""Data in metatrain's memory-mapped directory layout, written here with numpy as its
docs describe, trains and evaluates like the same data in an extended XYZ file."""

from __future__ import annotations

import subprocess
import sys

import ase
import ase.io
import numpy as np
import pytest
import torch
from ase.calculators.singlepoint import SinglePointCalculator

from atomtrain.cli.main import main
from atomtrain.data import read_structures

from conftest import RESOURCES
from helpers import checkpoint_weights, environment, write_options


def write_memmap(directory, frames, ns_shape=(), stress=False):
    """metatrain's layout, with numpy: float32 arrays, int64 cumulative atom counts."""
    directory.mkdir()
    counts = [len(frame) for frame in frames]
    np.save(directory / "ns.npy", np.array(len(frames)).reshape(ns_shape))
    np.save(directory / "na.npy", np.concatenate([[0], np.cumsum(counts)]).astype(np.int64))
    join = np.concatenate
    join([f.positions for f in frames]).astype(np.float32).tofile(directory / "x.bin")
    join([f.numbers for f in frames]).astype(np.int32).tofile(directory / "a.bin")
    np.array([f.cell.array for f in frames], dtype=np.float32).tofile(directory / "c.bin")
    energies = np.array([[f.get_potential_energy()] for f in frames], dtype=np.float32)
    energies.tofile(directory / "energy.bin")
    forces = join([f.get_forces() for f in frames])[:, :, None].astype(np.float32)
    forces.tofile(directory / "forces.bin")
    if stress:
        matrices = np.array([f.get_stress(voigt=False) for f in frames], dtype=np.float32)
        matrices[:, :, :, None].tofile(directory / "stress.bin")
    return directory


def float32_copy(frames, stress=False):
    """The frames with every value rounded to float32, as the directory holds them."""
    copies = []
    for frame in frames:
        single = lambda value: np.asarray(value, dtype=np.float32).astype(np.float64)  # noqa: E731
        copy = ase.Atoms(
            numbers=frame.numbers,
            positions=single(frame.positions),
            cell=single(frame.cell.array),
            pbc=frame.pbc,
        )
        results = {
            "energy": float(single(frame.get_potential_energy())),
            "forces": single(frame.get_forces()),
        }
        if stress:
            results["stress"] = single(frame.get_stress())
        copy.calc = SinglePointCalculator(copy, **results)
        copies.append(copy)
    return copies


def test_directory_reads_as_its_float32_xyz(tmp_path):
    frames = ase.io.read(RESOURCES / "si_test.xyz", ":6")
    directory = write_memmap(tmp_path / "silicon", frames, ns_shape=(1,), stress=True)
    # an ASE trajectory keeps the float32 values exactly (extxyz text rounds them)
    ase.io.write(tmp_path / "silicon.traj", float32_copy(frames, stress=True))
    from_directory = read_structures(directory)
    from_file = read_structures(tmp_path / "silicon.traj")
    assert len(from_directory) == 6
    for a, b in zip(from_directory, from_file):
        torch.testing.assert_close(a.positions, b.positions, rtol=0, atol=1e-12)
        torch.testing.assert_close(a.cell, b.cell, rtol=0, atol=1e-12)
        assert a.pbc.all() and a.energy == pytest.approx(b.energy, abs=1e-9)
        torch.testing.assert_close(a.forces, b.forces, rtol=0, atol=1e-9)
        torch.testing.assert_close(a.stress, b.stress, rtol=0, atol=1e-9)


def test_training_from_a_directory_is_training_from_the_file(tmp_path, fixed_threads):
    """To 1e-10 at a fixed thread count (fixed_threads): a busy machine's would differ
    between the two runs."""
    frames = []
    for frame in ase.io.read(RESOURCES / "ethanol_40.xyz", ":"):
        # molecules without a cell: c.bin holds zeros, as metatrain's writer leaves it
        molecule = ase.Atoms(numbers=frame.numbers, positions=frame.positions)
        molecule.calc = SinglePointCalculator(
            molecule, energy=frame.get_potential_energy(), forces=frame.get_forces()
        )
        frames.append(molecule)
    write_memmap(tmp_path / "ethanol", frames)
    ase.io.write(tmp_path / "ethanol.traj", float32_copy(frames))
    states = []
    for source in ("ethanol", "ethanol.traj"):
        directory = tmp_path / f"from_{source}"
        directory.mkdir()
        options = write_options(directory, tmp_path / source)
        assert main(["train", str(options), "--run-dir", str(directory / "run")]) == 0
        states.append(checkpoint_weights(directory / "run" / "best.ckpt"))
    for name, value in states[0].items():
        torch.testing.assert_close(states[1][name], value, rtol=0, atol=1e-10)
    predictions = tmp_path / "predictions.xyz"
    model = tmp_path / "from_ethanol" / "run" / "model.pt"
    assert main(["eval", str(model), str(tmp_path / "ethanol"), "-o", str(predictions)]) == 0
    written = ase.io.read(predictions, ":")
    assert len(written) == 40 and "predicted_energy" in written[0].info


def corrupt(directory, case):
    if case == "missing":
        (directory / "a.bin").unlink()
    elif case == "counts":
        np.save(directory / "na.npy", np.arange(5, dtype=np.int64))
    elif case == "truncated":
        data = (directory / "x.bin").read_bytes()
        (directory / "x.bin").write_bytes(data[:-12])
    elif case == "nan":
        energies = np.fromfile(directory / "energy.bin", dtype=np.float32)
        energies[3] = np.nan
        energies.tofile(directory / "energy.bin")
    elif case == "element":
        numbers = np.fromfile(directory / "a.bin", dtype=np.int32)
        numbers[40] = 0
        numbers.tofile(directory / "a.bin")
    elif case == "on top":  # frame 6 (9-atom molecules): atom 4 onto atom 2
        positions = np.fromfile(directory / "x.bin", dtype=np.float32).reshape(-1, 3)
        positions[6 * 9 + 4] = positions[6 * 9 + 2] + [0.03, 0, 0]
        positions.tofile(directory / "x.bin")


@pytest.mark.parametrize(
    "case, fragments",
    [
        ("missing", ["a.bin missing", "ns.npy, na.npy, x.bin, a.bin"]),
        ("counts", ["na.npy", "expected 11 int64", "found 5"]),
        ("truncated", ["x.bin", "truncated or belongs to another data set"]),
        ("nan", ["frame 3", "energy (energy.bin)", "NaN or infinite"]),
        ("on top", ["frame 6", "0.03 A apart", "the same atom twice"]),
        ("element", ["atomic number 0 is not an element"]),
    ],
)
def test_a_broken_directory_is_named_in_one_line(tmp_path, capsys, case, fragments):
    frames = ase.io.read(RESOURCES / "ethanol_40.xyz", ":10")
    directory = write_memmap(tmp_path / "data", frames)
    corrupt(directory, case)
    options = write_options(tmp_path, directory)
    code = main(["train", str(options), "--outputs", str(tmp_path / "outputs")])
    error = capsys.readouterr().err.strip()
    assert code == 2 and len(error.splitlines()) == 1 and error.startswith("atomtrain: ")
    assert str(directory) in error
    for fragment in fragments:
        assert fragment in error, (fragment, error)


def train_in_a_process(options, run, extra: list[str]) -> None:
    """``atomtrain train`` in a fresh process (``extra``: e.g. --nproc 2), to its end."""
    command = [sys.executable, "-m", "atomtrain", "train", str(options), "--run-dir", str(run)]
    result = subprocess.run(
        [*command, *extra], env=environment(), capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr


@pytest.mark.slow
def test_one_list_of_a_file_and_a_directory_packed_by_atoms_on_two_processes(tmp_path):
    """Ethanol molecules from an extended XYZ file and silicon cells (stress) from a
    directory in metatrain's layout in one training list, batches packed by atom count:
    two processes give the one-process model, the final table has a row per file, and
    the model fine-tunes on the directory alone."""
    silicon = write_memmap(
        tmp_path / "silicon", ase.io.read(RESOURCES / "si_test.xyz", ":10"), stress=True
    )
    states = []
    for extra in ([], ["--nproc", "2"]):
        run = tmp_path / f"run{len(extra)}"
        path = write_options(
            tmp_path,
            RESOURCES / "ethanol_40.xyz",
            test_set=0.0,
            training_set=[
                {"systems": {"read_from": str(RESOURCES / "ethanol_40.xyz")}},
                {"systems": {"read_from": str(silicon)}},
            ],
            architecture__training__max_atoms_per_batch=150,
        )
        train_in_a_process(path, run, extra)
        log = (run / "train.log").read_text()
        assert "train: ethanol_40.xyz" in log and "train: silicon" in log
        assert "training batches packed by atom count" in log
        states.append(torch.load(run / "last.ckpt", weights_only=True)["model_state"])
    for name, value in states[0].items():
        torch.testing.assert_close(states[1][name], value, rtol=1e-8, atol=1e-10)
    finetune = write_options(
        tmp_path,
        silicon,
        architecture__training__num_epochs=1,
        architecture__training__finetune={"read_from": str(tmp_path / "run0" / "model.pt")},
    )
    assert main(["train", str(finetune), "--run-dir", str(tmp_path / "finetuned")]) == 0
