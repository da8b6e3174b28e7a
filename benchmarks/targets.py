"""Targets beyond energy, measured: against metatrain on the same options and data, two
heads on one backbone against two models, and what an extra head costs.

    python benchmarks/targets.py [--epochs 100] [--part metatrain,fidelity,throughput]

* metatrain: QM7-X polarisabilities (Cartesian rank 2) and the QM9 HOMO-LUMO gap
  (`epsgap`, a scalar), each as ONE options file in metatrain's format with explicit
  training/validation/test files, run by `mtt train` (metatrain 2026.4.1 in
  benchmarks/.venv-metatrain, built by compare_metatrain.py) and `atomtrain train`,
  alternated. Both exported models are then evaluated by the same metatomic code on the
  test file: RMSE and MAE of every value of the target (metatrain's own log divides by
  the atom count). Wall time of each training command.
* fidelity: ethanol (PBE energies and forces) and QM9 (B3LYP energies, as energy/b3lyp)
  in one model with two energy heads, against two separate models; test errors of each
  level and wall time.
* throughput: ethanol energies and forces alone, with a per-structure vector target,
  and with a per-atom vector target (labels derived from the geometry: they time the
  heads, they are not physics); training structures per second over the epochs after
  the first.

It measures and prints; it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import ase.io
import numpy as np
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
QM7X = ROOT / "examples" / "qm7x" / "qm7x_reduced_100.xyz"
QM9 = ROOT / "tests" / "resources" / "qm9_reduced_100.xyz"
ETHANOL = ROOT / "examples" / "ethanol" / "ethanol_1000.xyz"
# an epoch's line ends with the seconds since the previous one (the epoch and its validation)
EPOCH = re.compile(r" epoch (\d+)/\d+ .*\| ([\d.]+) s$", re.M)

EVALUATE = """
import json, sys
import ase.io, numpy as np
from metatomic.torch import ModelOutput
from metatomic_ase import MetatomicCalculator

frames = ase.io.read(sys.argv[1], ":")
name, key = sys.argv[4], sys.argv[5]
calculator = MetatomicCalculator(sys.argv[2], extensions_directory=sys.argv[3])
block = calculator.run_model(frames, {name: ModelOutput(per_atom=False)})[name].block()
predicted = block.values.detach().numpy().reshape(len(frames), -1)
reference = np.stack([np.asarray(atoms.info[key], dtype=float).reshape(-1) for atoms in frames])
error = predicted - reference
print(json.dumps({"rmse": float(np.sqrt((error**2).mean())), "mae": float(np.abs(error).mean())}))
"""


def split_files(source: Path, directory: Path, seed: int = 0) -> dict[str, Path]:
    frames = ase.io.read(source, ":")
    order = np.random.default_rng(seed).permutation(len(frames))
    n_test = n_validation = len(frames) // 10
    parts = {
        "test": order[:n_test],
        "validation": order[n_test : n_test + n_validation],
        "train": order[n_test + n_validation :],
    }
    paths = {}
    for part, indices in parts.items():
        paths[part] = directory / f"{source.stem}_{part}.xyz"
        ase.io.write(paths[part], [frames[i] for i in indices], format="extxyz")
    return paths


def metatrain_options(paths: dict[str, Path], targets: dict, epochs: int) -> dict:
    def section(part):
        return {"systems": {"read_from": str(paths[part])}, "targets": targets}

    return {
        "seed": 0,
        "architecture": {"name": "soap_bpnn", "training": {"num_epochs": epochs}},
        "training_set": section("train"),
        "validation_set": section("validation"),
        "test_set": section("test"),
    }


def timed(command: list[str], cwd: Path) -> tuple[float, str]:
    start = time.perf_counter()
    result = subprocess.run(command, cwd=cwd, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if result.returncode != 0:
        raise SystemExit(f"{command[0]} failed:\n{result.stderr[-3000:]}")
    return elapsed, result.stdout + result.stderr


def evaluate(python: Path, model: Path, data: Path, name: str, key: str) -> dict:
    result = subprocess.run(
        [
            str(python),
            "-c",
            EVALUATE,
            str(data),
            str(model),
            str(model.parent / "extensions"),
            name,
            key,
        ],
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        raise SystemExit(result.stderr[-3000:])
    return json.loads(result.stdout.strip().splitlines()[-1])


def against_metatrain(epochs: int, repeats: int) -> None:
    from compare_metatrain import VENV, ensure_metatrain

    mtt = ensure_metatrain()
    python = VENV / "bin" / "python"
    cases = {
        "QM7-X polarisability (Cartesian rank 2)": (
            QM7X,
            {
                "mtt::polarizability": {
                    "key": "polarizability",
                    "unit": "bohr^3",
                    "type": {"cartesian": {"rank": 2}},
                }
            },
            "mtt::polarizability",
            "polarizability",
        ),
        "QM9 HOMO-LUMO gap (scalar)": (
            QM9,
            {"mtt::gap": {"key": "epsgap", "unit": "hartree"}},
            "mtt::gap",
            "epsgap",
        ),
    }
    print(f"## against metatrain 2026.4.1 ({epochs} epochs, same options file, test set)")
    print("| target | program | run | wall time (s) | test RMSE | test MAE |")
    print("|---|---|---|---|---|---|")
    for label, (source, targets, name, key) in cases.items():
        for repeat in range(repeats):
            with tempfile.TemporaryDirectory() as scratch:
                directory = Path(scratch)
                paths = split_files(source, directory, seed=repeat)
                options = directory / "options.yaml"
                options.write_text(yaml.safe_dump(metatrain_options(paths, targets, epochs)))
                for program, command in (
                    ("metatrain", [str(mtt), "train", str(options), "-o", "model.pt"]),
                    (
                        "atomtrain",
                        [
                            sys.executable,
                            "-m",
                            "atomtrain",
                            "train",
                            str(options),
                            "-o",
                            "model.pt",
                        ],
                    ),
                ):
                    run_dir = directory / program
                    run_dir.mkdir()
                    elapsed, _ = timed(command, run_dir)
                    errors = evaluate(python, run_dir / "model.pt", paths["test"], name, key)
                    print(
                        f"| {label} | {program} | {repeat} | {elapsed:.1f} | "
                        f"{errors['rmse']:.4g} | {errors['mae']:.4g} |",
                        flush=True,
                    )


def epoch_throughput(log: str, structures: int) -> float:
    """Training structures per second over the epochs after the first (each epoch's
    time as its log line gives it, validation included)."""
    seconds = [float(value) for _, value in EPOCH.findall(log)][1:]
    return structures * len(seconds) / sum(seconds)


def atomtrain_run(directory: Path, options: dict, name: str) -> tuple[float, str, Path]:
    run_dir = directory / name
    run_dir.mkdir()
    path = run_dir / "options.yaml"
    path.write_text(yaml.safe_dump(options))
    elapsed, log = timed(
        [sys.executable, "-m", "atomtrain", "train", str(path), "--run-dir", "run"], run_dir
    )
    return elapsed, log, run_dir / "run"


def fidelity(epochs: int, repeats: int) -> None:
    """The same training, validation and test structures for the shared model and the
    two separate ones (explicit files: a fraction cut per section would split each
    file with another seed depending on its position in the list)."""
    print(f"\n## two levels of theory ({epochs} epochs; test errors, meV/atom and meV/A)")
    print(
        "| split | model | wall time (s) | ethanol E/atom RMSE | ethanol F RMSE | QM9 E/atom RMSE |"
    )
    print("|---|---|---|---|---|---|")
    for repeat in range(repeats):
        with tempfile.TemporaryDirectory() as scratch:
            directory = Path(scratch)
            ethanol = directory / "ethanol.xyz"
            ase.io.write(ethanol, ase.io.read(ETHANOL, ":200"), format="extxyz")
            pbe = split_files(ethanol, directory, seed=repeat)
            b3lyp = split_files(QM9, directory, seed=repeat)

            def options(**which):
                return fidelity_options(pbe, b3lyp, epochs, **which)  # noqa: B023 (called here)

            shared_time, shared, _ = atomtrain_run(directory, options(), "shared")
            pbe_time, alone_pbe, _ = atomtrain_run(directory, options(with_qm9=False), "pbe")
            b3lyp_time, alone_b3lyp, _ = atomtrain_run(
                directory, options(variant="energy", with_ethanol=False), "b3lyp"
            )
            shared_ethanol = test_errors(shared, "test: ethanol_test.xyz")
            shared_qm9 = test_errors(shared, "test: qm9_reduced_100_test.xyz")
            print(
                f"| {repeat} | one model, two heads | {shared_time:.1f} | "
                f"{shared_ethanol[0]} | {shared_ethanol[4]} | {shared_qm9[0]} |"
            )
            alone_ethanol, alone_qm9 = (
                test_errors(alone_pbe, "test"),
                test_errors(alone_b3lyp, "test"),
            )
            print(
                f"| {repeat} | two models | {pbe_time + b3lyp_time:.1f} | "
                f"{alone_ethanol[0]} | {alone_ethanol[4]} | {alone_qm9[0]} |",
                flush=True,
            )


def fidelity_options(
    pbe: dict[str, Path],
    b3lyp: dict[str, Path],
    epochs: int,
    variant: str = "energy/b3lyp",
    with_ethanol: bool = True,
    with_qm9: bool = True,
) -> dict:
    """Training, validation and test sets of the ethanol (PBE) and QM9 (B3LYP) files."""
    qm9_energy = {"key": "U0", "unit": "hartree", "forces": False}

    def sections(part: str) -> list[dict]:
        chosen = []
        if with_ethanol:
            chosen.append({"systems": str(pbe[part])})
        if with_qm9:
            chosen.append({"systems": str(b3lyp[part]), "targets": {variant: qm9_energy}})
        return chosen

    parts = (("training", "train"), ("validation", "validation"), ("test", "test"))
    return {
        "seed": 0,
        "architecture": {"training": {"num_epochs": epochs}},
        **{f"{name}_set": sections(part) for name, part in parts},
    }


def test_errors(log: str, label: str) -> list[str]:
    """The cells of the final table's row ``label`` (E/atom RMSE first)."""
    rows = [line for line in log.splitlines() if line.startswith(label + " ")]
    return rows[-1][len(label) :].split() if rows else ["-"] * 6


def throughput(epochs: int, repeats: int) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        directory = Path(scratch)
        frames = ase.io.read(ETHANOL, ":")
        for atoms in frames:  # geometry-derived labels: they time the heads
            centred = atoms.positions - atoms.positions.mean(0)
            atoms.info["vector"] = (centred * atoms.numbers[:, None]).sum(0)
            atoms.arrays["offset"] = centred
        data = directory / "ethanol.xyz"
        ase.io.write(data, frames, format="extxyz")
        vector = {"key": "vector", "type": {"cartesian": {"rank": 1}}}
        offset = {"key": "offset", "per_atom": True, "type": {"cartesian": {"rank": 1}}}
        cases = {
            "energy and forces": {"energy": {"key": "energy"}},
            "+ a vector per structure": {"energy": {"key": "energy"}, "mtt::vector": vector},
            "+ a vector per atom": {"energy": {"key": "energy"}, "mtt::offset": offset},
        }
        train = int(len(frames) * 0.9)
        print(
            f"\n## training throughput, ethanol, batch 8 ({epochs} epochs, "
            f"{train} training structures; structures/s after the first epoch)"
        )
        print("| targets | " + " | ".join(f"run {r}" for r in range(repeats)) + " | median |")
        print("|---|" + "---|" * (repeats + 1))
        results: dict[str, list[float]] = {name: [] for name in cases}
        for repeat in range(repeats):
            for name, targets in cases.items():  # alternated: the machine drifts
                options = {
                    "seed": 0,
                    "architecture": {"training": {"num_epochs": epochs, "batch_size": 8}},
                    "training_set": {"systems": str(data), "targets": targets},
                    "validation_set": 0.1,
                }
                _, log, _ = atomtrain_run(
                    directory, options, f"{repeat}-{len(results[name])}-{list(cases).index(name)}"
                )
                results[name].append(epoch_throughput(log, train))
        for name, values in results.items():
            cells = " | ".join(f"{value:.0f}" for value in values)
            print(f"| {name} | {cells} | {np.median(values):.0f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--part", default="metatrain,fidelity,throughput")
    arguments = parser.parse_args()
    parts = arguments.part.split(",")
    if "metatrain" in parts:
        against_metatrain(arguments.epochs, arguments.repeats)
    if "fidelity" in parts:
        fidelity(arguments.epochs, arguments.repeats)
    if "throughput" in parts:
        throughput(max(arguments.epochs // 10, 4), max(arguments.repeats, 3))


if __name__ == "__main__":
    main()
