"""atomtrain vs metatrain on the same work (SOAP-BPNN or PET), measured side by side.

    python benchmarks/compare_metatrain.py [--structures 200] [--epochs 4] [--threads 2]
        [--architecture soap_bpnn|pet] [--compile]

Builds benchmarks/.venv-metatrain (metatrain[soap-bpnn]==2026.4.1, reusing this
interpreter's torch so both run the same CPU build), then for each data set writes ONE
options file (metatrain's format, which atomtrain reads unchanged) and runs, alternating,
`mtt train` and `atomtrain train` on it, then `mtt eval` and `atomtrain eval`. Prints
the measurements and the ratios atomtrain / metatrain. A benchmark: it measures and
prints, it asserts nothing.

Measured per run, from outside the process:
* training throughput: training structures per second over the epochs after the first
  (wall time between consecutive per-epoch log lines, so validation is included on both
  sides, with the same validation fraction);
* time to first epoch: from starting the command to its first per-epoch log line;
* peak RSS of the process (getrusage of the child);
* evaluation throughput: structures per second with forces, (N - 1) structures over the
  wall time of evaluating N structures minus that of evaluating one (start-up removed).
"""

from __future__ import annotations

import argparse
import csv
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import ase.io
import yaml

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / "benchmarks" / ".venv-metatrain"
METATRAIN = "metatrain[soap-bpnn]==2026.4.1"
DATASETS = {
    "ethanol": (ROOT / "examples" / "ethanol" / "ethanol_1000.xyz", False),
    "silicon": (ROOT / "examples" / "silicon" / "si_train.xyz", True),
    "tio2": (ROOT / "examples" / "tio2" / "tio2_1000.xyz", False),
}
EPOCH_LINE = {
    "metatrain": re.compile(r"Epoch:?\s+\d+ \|"),
    "atomtrain": re.compile(r"epoch \d+/\d+"),
}


def ensure_metatrain() -> Path:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:  # this interpreter has it already (the tests need it): its mtt
        if installed("metatrain") == METATRAIN.split("==")[1]:
            beside = Path(sys.executable).parent / "mtt"
            if beside.exists():
                return beside
    except PackageNotFoundError:
        pass
    mtt = VENV / "bin" / "mtt"
    if not mtt.exists():
        subprocess.run(
            [sys.executable, "-m", "venv", "--system-site-packages", str(VENV)], check=True
        )
        import torch

        version = torch.__version__.split("+")[0]
        subprocess.run(
            [str(VENV / "bin" / "pip"), "install", "-q", f"torch=={version}", METATRAIN], check=True
        )
        # metatrain installs sphericart into the venv, whose package then hides the
        # sphericart.torch of the system's site-packages: install that one beside it
        subprocess.run(
            [str(VENV / "bin" / "pip"), "install", "-q", "--force-reinstall", "--no-deps"]
            + [f"sphericart-torch=={installed('sphericart-torch')}"],
            check=True,
        )
    return mtt


def validation_size(count: int) -> int:
    return max(1, round(0.1 * count))


SOAP_BPNN = {
    "soap": {"cutoff": {"radius": 5.0, "width": 0.5}, "max_radial": 7, "max_angular": 6},
    "bpnn": {"num_hidden_layers": 2, "num_neurons_per_layer": 32, "layernorm": True},
}
# the same section for both tools: metatrain's pet defaults, written out
PET = {
    "cutoff": 4.5,
    "cutoff_width": 0.5,
    "d_pet": 128,
    "d_head": 128,
    "d_node": 256,
    "d_feedforward": 256,
    "num_heads": 8,
    "num_attention_layers": 2,
    "num_gnn_layers": 2,
}
SECTIONS = {"soap_bpnn": (SOAP_BPNN, 0.001), "pet": (PET, 0.0001)}


def write_inputs(
    directory: Path,
    name: str,
    count: int,
    epochs: int,
    batch: int,
    seed: int = 0,
    architecture: str = "soap_bpnn",
) -> Path:
    source, stress = DATASETS[name]
    frames = ase.io.read(source, f":{count}")
    data = directory / f"{name}.xyz"
    ase.io.write(data, frames, format="extxyz")
    # the same explicit split for both tools, so validation errors compare like for like
    n_validation = validation_size(count)
    training_file = directory / f"{name}_train.xyz"
    validation_file = directory / f"{name}_validation.xyz"
    ase.io.write(training_file, frames[: count - n_validation], format="extxyz")
    ase.io.write(validation_file, frames[count - n_validation :], format="extxyz")
    targets = {"key": "energy", "unit": "eV", "forces": {"key": "forces"}}
    if stress:
        targets["stress"] = {"key": "stress"}
    options = {
        "seed": seed,
        "device": "cpu",
        "base_precision": 32,
        "architecture": {
            "name": architecture,
            "model": SECTIONS[architecture][0],
            "training": {
                "batch_size": batch,
                "num_epochs": epochs,
                "log_interval": 1,
                "checkpoint_interval": 1000,
                "learning_rate": SECTIONS[architecture][1],
            },
        },
        "training_set": {
            "systems": {"read_from": training_file.name, "length_unit": "angstrom"},
            "targets": {"energy": targets},
        },
        "validation_set": {
            "systems": {"read_from": validation_file.name, "length_unit": "angstrom"},
            "targets": {"energy": targets},
        },
        "test_set": 0.0,
    }
    path = directory / "options.yaml"
    path.write_text(yaml.safe_dump(options, sort_keys=False))
    return path


def run_measured(command: list[str], cwd: Path, threads: int, pattern=None):
    """Wall time, times at which lines matching ``pattern`` appeared, peak RSS (MiB)."""
    env = {
        **os.environ,
        "OMP_NUM_THREADS": str(threads),
        "PYTHONUNBUFFERED": "1",
        "MKL_NUM_THREADS": str(threads),
    }
    start = time.perf_counter()
    process = subprocess.Popen(
        command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    marks, lines = [], []
    for line in process.stdout:  # type: ignore[union-attr]
        lines.append(line)
        if pattern is not None and pattern.search(line):
            marks.append(time.perf_counter() - start)
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    elapsed = time.perf_counter() - start
    if process.returncode != 0:
        sys.exit(f"{' '.join(command)} failed:\n{''.join(lines[-30:])}")
    return elapsed, marks, usage.ru_maxrss / 1024


def newest(paths) -> Path:
    return max(paths, key=lambda path: path.stat().st_mtime_ns)


def final_validation_errors(tool: str, directory: Path) -> dict:
    """Validation energy RMSE (meV/atom) and force RMSE (meV/A) after the last epoch,
    from the tool's own per-epoch CSV."""
    table = newest(directory.glob("outputs/*/*/train.csv"))
    rows = list(csv.reader(table.read_text().splitlines()))
    header, last = rows[0], rows[-1]
    if tool == "metatrain":  # second row holds units (meV, meV/A)
        columns = ("validation energy RMSE (per atom)", "validation forces RMSE")
        scale = 1.0
    else:  # eV, eV/A
        columns = ("validation_energy_per_atom_rmse (eV/atom)", "validation_forces_rmse (eV/A)")
        scale = 1000.0
    energy, forces = (scale * float(last[header.index(column)]) for column in columns)
    return {
        "validation_energy_rmse_mev_per_atom": energy,
        "validation_forces_rmse_mev_per_a": forces,
    }


def exported_model(tool: str, directory: Path) -> Path:
    if tool == "atomtrain":
        return newest(directory.glob("outputs/*/*/model.pt"))
    return directory / "model.pt"


def train(
    tool: str, mtt: Path, options: Path, threads: int, n_train: int, compile: bool = False
) -> dict:
    directory = options.parent
    command = (
        [str(mtt), "train", options.name]
        if tool == "metatrain"
        else [sys.executable, "-m", "atomtrain", "train", options.name]
    )
    if compile and tool == "atomtrain":  # the options file stays metatrain's
        command += ["-r", "architecture.training.compile=true"]
    _, marks, rss = run_measured(command, directory, threads, EPOCH_LINE[tool])
    steady = (marks[-1] - marks[0]) / max(len(marks) - 1, 1)
    return {
        "train_structures_per_s": n_train / steady,
        "first_epoch_s": marks[0],
        "peak_rss_mib": rss,
    }


def evaluate(tool: str, mtt: Path, directory: Path, data: Path, threads: int) -> float:
    model = exported_model(tool, directory)
    one = directory / "one.xyz"
    ase.io.write(one, ase.io.read(data, 0), format="extxyz")
    count = len(ase.io.read(data, ":"))
    times = []
    for path in (one, data):
        if tool == "metatrain":
            eval_options = directory / f"eval_{path.stem}.yaml"
            eval_options.write_text(
                yaml.safe_dump(
                    {
                        "systems": {"read_from": path.name},
                        "targets": {"energy": {"key": "energy", "forces": {"key": "forces"}}},
                    }
                )
            )
            command = [
                str(mtt),
                "eval",
                str(model),
                eval_options.name,
                "-e",
                "extensions",
                "-o",
                f"mtt_{path.stem}.xyz",
                "-b",
                "16",
            ]
        else:
            command = [
                sys.executable,
                "-m",
                "atomtrain",
                "eval",
                str(model),
                path.name,
                "-o",
                f"at_{path.stem}.xyz",
                "-b",
                "16",
            ]
        times.append(run_measured(command, directory, threads)[0])
    return (count - 1) / max(times[1] - times[0], 1e-9)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--structures", type=int, default=200)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--datasets", nargs="+", default=list(DATASETS))
    parser.add_argument("--workdir", type=Path, default=ROOT / "benchmarks" / "runs")
    parser.add_argument("--architecture", choices=list(SECTIONS), default="soap_bpnn")
    parser.add_argument(
        "--seeds",
        type=int,
        default=1,
        help="train each tool with seeds 0..N-1 and compare validation errors over all "
        "of them (a 20-structure validation set moves by more than the tools differ "
        "from one seed to the next); speed is measured on seed 0",
    )
    parser.add_argument(
        "--compile",
        action="store_true",
        help="atomtrain compiles its training step (its first epoch, with the compilation, "
        "is left out of the throughput as every first epoch is)",
    )
    arguments = parser.parse_args()
    mtt = ensure_metatrain()
    rows = []
    n_train = arguments.structures - validation_size(arguments.structures)
    for name in arguments.datasets:
        results: dict[str, dict] = {"metatrain": {}, "atomtrain": {}}
        errors: dict[str, list[dict]] = {"metatrain": [], "atomtrain": []}
        for seed in range(arguments.seeds):
            for tool in ("metatrain", "atomtrain"):  # alternate, same inputs
                directory = arguments.workdir / name / tool
                if seed > 0:
                    directory = directory / f"seed{seed}"
                directory.mkdir(parents=True, exist_ok=True)
                options = write_inputs(
                    directory,
                    name,
                    arguments.structures,
                    arguments.epochs,
                    arguments.batch_size,
                    seed,
                    arguments.architecture,
                )
                measured = train(tool, mtt, options, arguments.threads, n_train, arguments.compile)
                errors[tool].append(final_validation_errors(tool, directory))
                if seed == 0:  # speed from the first seed only
                    results[tool] = measured
                    results[tool]["eval_structures_per_s"] = evaluate(
                        tool, mtt, directory, directory / f"{name}.xyz", arguments.threads
                    )
                shown = {**(measured if seed == 0 else {}), **errors[tool][-1]}
                print(name, tool, f"seed {seed}", {k: round(v, 2) for k, v in shown.items()})
        rows.append((name, results, errors))
    keys = ["train_structures_per_s", "eval_structures_per_s", "peak_rss_mib", "first_epoch_s"]
    print(
        f"\n{arguments.structures} structures, {arguments.epochs} epochs, batch "
        f"{arguments.batch_size}, {arguments.threads} threads, float32, "
        f"{arguments.architecture}"
    )
    print(f"{'data':<10}" + "".join(f"{key:>24}" for key in keys))
    for name, results, _ in rows:
        ratios = [results["atomtrain"][key] / results["metatrain"][key] for key in keys]
        print(f"{name:<10}" + "".join(f"{ratio:>24.2f}" for ratio in ratios))
    print(
        "(ratios atomtrain / metatrain: higher is better for throughput, lower for RSS "
        "and time to first epoch)"
    )
    print(
        f"\nvalidation errors after epoch {arguments.epochs} (same split for both tools), "
        f"seeds 0..{arguments.seeds - 1} and their mean"
    )
    print(f"{'data':<10}{'tool':<11}{'E RMSE (meV/atom)':>34}{'F RMSE (meV/A)':>34}")
    for name, _, errors in rows:
        for tool in ("metatrain", "atomtrain"):
            cells = []
            for key in ("validation_energy_rmse_mev_per_atom", "validation_forces_rmse_mev_per_a"):
                values = [seed_errors[key] for seed_errors in errors[tool]]
                listed = " ".join(f"{value:.1f}" for value in values)
                cells.append(f"{listed} | {sum(values) / len(values):.2f}")
            print(f"{name:<10}{tool:<11}" + "".join(f" {cell:>33}" for cell in cells))


if __name__ == "__main__":
    main()
