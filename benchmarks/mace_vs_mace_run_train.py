"""atomtrain-MACE against mace-torch's own trainer (mace_run_train) on the same data and
hyperparameters, alternated in one run: training throughput and test errors.

    python benchmarks/mace_vs_mace_run_train.py [--structures 200] [--epochs 4]
        [--dtypes float64 float32] [--seeds 1 2 3] [--threads 2]

The first ``--structures`` frames of examples/ethanol/ethanol_1000.xyz are split 80/10/10
into train/valid/test files, with energies and forces under REF_energy and REF_forces
(mace_run_train's convention). Both tools get r_max, the irreps, max_ell, correlation,
interactions, radial basis, batch size, learning rate, epochs, dtype and seed.

Throughput: each tool runs once for 1 epoch and once for ``--epochs``; the difference
of the wall times over the extra epochs is the time of an epoch (training plus the
validation pass each does every epoch), without start-up. Structures per second is the
training set's size over it. Test errors: each tool's own report of its final model
on the test file (mace_run_train: its log's table; atomtrain: the metrics table).

The loss weights (energy 1, forces 100), Adam's AMSGrad and weight decay (5e-7), the
clipping of the gradient norm at 10, no warmup, and ReduceLROnPlateau (factor 0.8,
patience 50 validations, judged every epoch) are mace_run_train's defaults, given to
both. What differs by design (so errors are not expected to match to the digit): the
energy baseline (mace_run_train: "--E0s average"; atomtrain: least squares; the same
for a data set of one composition, and atomtrain refits it to the trained model at the
end: refit_baseline), the plateau's metric (mace_run_train: its validation
loss; atomtrain: the validation errors weighed as the loss weighs them) and the
random initialisation and order of the batches.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import ase.io
import yaml

ROOT = Path(__file__).resolve().parent.parent
HYPERS = {
    "r_max": 5.0,
    "num_radial_basis": 8,
    "max_ell": 2,
    "hidden_irreps": "16x0e + 16x1o",
    "correlation": 3,
    "num_interactions": 2,
    "MLP_irreps": "16x0e",
}
BATCH_SIZE = 8
LEARNING_RATE = 0.01


def write_data(directory: Path, structures: int) -> dict[str, Path]:
    frames = ase.io.read(ROOT / "examples/ethanol/ethanol_1000.xyz", f":{structures}")
    for atoms in frames:
        atoms.info["REF_energy"] = atoms.get_potential_energy()
        atoms.arrays["REF_forces"] = atoms.get_forces()
        atoms.calc = None
    train, valid = int(0.8 * structures), int(0.9 * structures)
    files = {}
    for name, part in (("train", frames[:train]), ("valid", frames[train:valid])):
        files[name] = directory / f"{name}.xyz"
        ase.io.write(files[name], part, format="extxyz")
    files["test"] = directory / "test.xyz"
    ase.io.write(files["test"], frames[valid:], format="extxyz")
    return files


def mace_command(files, epochs, dtype, seed, name) -> list[str]:
    return [
        "mace_run_train",
        f"--name={name}",
        f"--train_file={files['train']}",
        f"--valid_file={files['valid']}",
        f"--test_file={files['test']}",
        "--energy_key=REF_energy",
        "--forces_key=REF_forces",
        "--E0s=average",
        "--model=ScaleShiftMACE",
        f"--r_max={HYPERS['r_max']}",
        f"--num_radial_basis={HYPERS['num_radial_basis']}",
        f"--max_ell={HYPERS['max_ell']}",
        f"--hidden_irreps={HYPERS['hidden_irreps']}",
        f"--correlation={HYPERS['correlation']}",
        f"--num_interactions={HYPERS['num_interactions']}",
        f"--MLP_irreps={HYPERS['MLP_irreps']}",
        f"--batch_size={BATCH_SIZE}",
        f"--valid_batch_size={BATCH_SIZE}",
        f"--lr={LEARNING_RATE}",
        f"--max_num_epochs={epochs}",
        f"--default_dtype={dtype}",
        f"--seed={seed}",
        "--device=cpu",
        "--eval_interval=1",
    ]


def atomtrain_options(directory: Path, files, epochs, dtype, seed) -> Path:
    def section(path):
        return {
            "systems": str(path),
            "targets": {"energy": {"key": "REF_energy", "forces": {"key": "REF_forces"}}},
        }

    options = {
        "seed": seed,
        "base_precision": 64 if dtype == "float64" else 32,
        "architecture": {
            "name": "mace",
            "model": HYPERS,
            "training": {
                "batch_size": BATCH_SIZE,
                "num_epochs": epochs,
                "learning_rate": LEARNING_RATE,
                "log_interval": 1,
                "checkpoint_interval": 1000,
                # mace_run_train's defaults
                "loss": {"weights": {"energy": 1.0, "forces": 100.0}},
                "warmup_fraction": 0.0,
                "lr_scheduler": "ReduceLROnPlateau",
                "lr_factor": 0.8,
                "lr_scheduler_patience": 50,
                "amsgrad": True,
                "weight_decay": 5e-7,
                "grad_clip_norm": 10.0,
            },
        },
        "training_set": section(files["train"]),
        "validation_set": section(files["valid"]),
        "test_set": section(files["test"]),
    }
    path = directory / f"options_{dtype}_{seed}_{epochs}.yaml"
    path.write_text(yaml.safe_dump(options))
    return path


def timed(command: list[str], cwd: Path, threads: int) -> tuple[float, str]:
    environment = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    start = time.perf_counter()
    result = subprocess.run(command, cwd=cwd, env=environment, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if result.returncode != 0:
        sys.exit(f"{command[0]} failed:\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}")
    return seconds, result.stdout + result.stderr


def mace_test_errors(directory: Path, name: str) -> tuple[float, float]:
    """(energy per atom meV, forces meV/A) RMSE on the test file, from mace's log table."""
    (log,) = (directory / "logs").glob(f"{name}_run-*[0-9].log")
    text = log.read_text()
    if "Error-table on TEST" not in text:
        sys.exit(f"no test table in {log}")
    table = text.split("Error-table on TEST", 1)[1].splitlines()
    rows = [line for line in table if line.startswith("|") and "config_type" not in line]
    cells = [cell.strip() for cell in rows[0].split("|") if cell.strip()]
    return float(cells[1]), float(cells[2])


def atomtrain_test_errors(output: str) -> tuple[float, float]:
    """(energy per atom meV, forces meV/A) RMSE of the test row of the metrics table."""
    (row,) = [line for line in output.splitlines() if re.match(r"^test\s", line)]
    cells = row.split()
    return float(cells[1]), float(cells[5])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--structures", type=int, default=200)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--dtypes", nargs="+", default=["float64", "float32"])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--threads", type=int, default=2)
    arguments = parser.parse_args()
    directory = Path(tempfile.mkdtemp(prefix="mace_bench_"))
    files = write_data(directory, arguments.structures)
    n_train = len(ase.io.read(files["train"], ":"))
    print(
        f"ethanol, {n_train} training structures, batch {BATCH_SIZE}, {HYPERS}, "
        f"{arguments.threads} threads, work in {directory}"
    )
    for dtype in arguments.dtypes:
        rows: dict[str, list] = {"mace_run_train": [], "atomtrain": []}
        for seed in arguments.seeds:
            for tool in ("mace_run_train", "atomtrain"):  # alternated
                walls = {}
                for epochs in (1, arguments.epochs):
                    name = f"run_{dtype}_{seed}_{epochs}"
                    if tool == "mace_run_train":
                        command = mace_command(files, epochs, dtype, seed, name)
                    else:
                        options = atomtrain_options(directory, files, epochs, dtype, seed)
                        command = [sys.executable, "-m", "atomtrain", "train", str(options)]
                        command += ["-r", "device=cpu", "--outputs", str(directory / name)]
                    walls[epochs], output = timed(command, directory, arguments.threads)
                epoch_seconds = (walls[arguments.epochs] - walls[1]) / (arguments.epochs - 1)
                if tool == "mace_run_train":
                    errors = mace_test_errors(directory, f"run_{dtype}_{seed}_{arguments.epochs}")
                else:
                    errors = atomtrain_test_errors(output)
                rows[tool].append((n_train / epoch_seconds, walls[1], *errors))
                print(
                    f"  {dtype} seed {seed} {tool:>14}: {n_train / epoch_seconds:7.1f} "
                    f"structures/s, start-up + 1 epoch {walls[1]:5.1f} s, test E "
                    f"{errors[0]:.2f} meV/atom, F {errors[1]:.1f} meV/A"
                )
        for tool, values in rows.items():
            speed, startup, energy, forces = (statistics.mean(column) for column in zip(*values))
            print(
                f"{dtype} {tool:>14} mean: {speed:7.1f} structures/s, start-up + 1 epoch "
                f"{startup:5.1f} s, test E {energy:.2f} meV/atom, F {forces:.1f} meV/A"
            )
        ratio = statistics.mean(r[0] for r in rows["atomtrain"]) / statistics.mean(
            r[0] for r in rows["mace_run_train"]
        )
        print(f"{dtype}: atomtrain / mace_run_train throughput {ratio:.2f}x")


if __name__ == "__main__":
    main()
