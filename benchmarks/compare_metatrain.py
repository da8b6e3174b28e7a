"""atomtrain vs metatrain's SOAP-BPNN on the same work, measured side by side.

    python benchmarks/compare_metatrain.py [--structures 200] [--epochs 4] [--threads 2]

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
    return mtt


def write_inputs(directory: Path, name: str, count: int, epochs: int, batch: int) -> Path:
    source, stress = DATASETS[name]
    frames = ase.io.read(source, f":{count}")
    data = directory / f"{name}.xyz"
    ase.io.write(data, frames, format="extxyz")
    targets = {"key": "energy", "unit": "eV", "forces": {"key": "forces"}}
    if stress:
        targets["stress"] = {"key": "stress"}
    options = {
        "seed": 0,
        "device": "cpu",
        "base_precision": 32,
        "architecture": {
            "name": "soap_bpnn",
            "model": {
                "soap": {
                    "cutoff": {"radius": 5.0, "width": 0.5},
                    "max_radial": 7,
                    "max_angular": 6,
                },
                "bpnn": {"num_hidden_layers": 2, "num_neurons_per_layer": 32, "layernorm": True},
            },
            "training": {
                "batch_size": batch,
                "num_epochs": epochs,
                "log_interval": 1,
                "checkpoint_interval": 1000,
                "learning_rate": 0.001,
            },
        },
        "training_set": {
            "systems": {"read_from": data.name, "length_unit": "angstrom"},
            "targets": {"energy": targets},
        },
        "validation_set": 0.1,
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


def exported_model(tool: str, directory: Path) -> Path:
    if tool == "atomtrain":
        return next(directory.glob("outputs/*/*/model.pt"))
    return directory / "model.pt"


def train(tool: str, mtt: Path, options: Path, threads: int, n_train: int) -> dict:
    directory = options.parent
    command = (
        [str(mtt), "train", options.name]
        if tool == "metatrain"
        else [sys.executable, "-m", "atomtrain", "train", options.name]
    )
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
    arguments = parser.parse_args()
    mtt = ensure_metatrain()
    rows = []
    for name in arguments.datasets:
        results = {}
        for tool in ("metatrain", "atomtrain"):  # alternate, same inputs
            directory = arguments.workdir / name / tool
            directory.mkdir(parents=True, exist_ok=True)
            options = write_inputs(
                directory, name, arguments.structures, arguments.epochs, arguments.batch_size
            )
            n_train = arguments.structures - max(1, round(0.1 * arguments.structures))
            results[tool] = train(tool, mtt, options, arguments.threads, n_train)
            results[tool]["eval_structures_per_s"] = evaluate(
                tool, mtt, directory, directory / f"{name}.xyz", arguments.threads
            )
            print(name, tool, {k: round(v, 2) for k, v in results[tool].items()}, flush=True)
        rows.append((name, results))
    keys = ["train_structures_per_s", "eval_structures_per_s", "peak_rss_mib", "first_epoch_s"]
    print(
        f"\n{arguments.structures} structures, {arguments.epochs} epochs, batch "
        f"{arguments.batch_size}, {arguments.threads} threads, float32"
    )
    print(f"{'data':<10}" + "".join(f"{key:>24}" for key in keys))
    for name, results in rows:
        ratios = [results["atomtrain"][key] / results["metatrain"][key] for key in keys]
        print(f"{name:<10}" + "".join(f"{ratio:>24.2f}" for ratio in ratios))
    print(
        "(ratios atomtrain / metatrain: higher is better for throughput, lower for RSS "
        "and time to first epoch)"
    )


if __name__ == "__main__":
    main()
