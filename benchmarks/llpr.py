"""LLPR's energy uncertainty against a deep ensemble, on data the model has not seen.

    python benchmarks/llpr.py [--architecture soap_bpnn] [--members 4] [--epochs 30]

Silicon (examples/silicon/si_train.xyz, mlearn): every architecture trains on 120 bulk
structures (AIMD and strained crystals; 15 % of them validate), and is evaluated on the
held-back rest: 25 bulk structures, 57 with a vacancy, 12 surfaces. For the ensemble,
``--members`` models train with different seeds; its uncertainty is the spread (standard
deviation) of their energies and its error that of their mean. LLPR's uncertainty is the
first member's (atomtrain's default ``uncertainty: llpr``) and its error that member's.

Prints, for each: the Spearman rank correlation of |error| and uncertainty per atom on
the held-back set, the mean uncertainty and error per kind of structure, and the cost
(LLPR: its phase in the log; the ensemble: the other members' whole trainings). A
benchmark: it measures and prints.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import ase.io
import numpy as np
import yaml

from atomtrain.cli.eval_run import spearman

ROOT = Path(__file__).resolve().parent.parent
BULK = ("AIMD-NVT", "Elastic")
UNCERTAINTY_PHASE = re.compile(r"uncertainty ([\d.]+) s")
SECTIONS = {
    "soap_bpnn": {
        "soap": {"cutoff": {"radius": 5.0, "width": 0.5}, "max_radial": 6, "max_angular": 4}
    },
    "mace": {"r_max": 5.0, "hidden_irreps": "16x0e + 16x1o", "num_interactions": 2},
    "pet": {"cutoff": 5.0, "d_pet": 64, "d_head": 64, "d_node": 64, "num_gnn_layers": 2},
}


def split(directory: Path) -> tuple[Path, Path]:
    frames = ase.io.read(ROOT / "examples" / "silicon" / "si_train.xyz", ":")
    bulk = [atoms for atoms in frames if atoms.info["config_type"] in BULK]
    other = [atoms for atoms in frames if atoms.info["config_type"] not in BULK]
    ase.io.write(directory / "bulk.xyz", bulk[:120])
    ase.io.write(directory / "held.xyz", bulk[120:] + other)
    return directory / "bulk.xyz", directory / "held.xyz"


def train(
    directory: Path, data: Path, architecture: str, seed: int, epochs: int
) -> tuple[Path, float]:
    options = {
        "seed": seed,
        "architecture": {
            "name": architecture,
            "model": SECTIONS[architecture],
            "training": {
                "batch_size": 8,
                "num_epochs": epochs,
                "learning_rate": 0.003,
                "loss": {"weights": {"energy": 1.0, "forces": 1.0, "stress": 1.0}},
            },
        },
        "training_set": {
            "systems": str(data),
            "targets": {"energy": {"key": "energy", "forces": True, "stress": True}},
        },
        "validation_set": 0.15,
        "test_set": 0.0,
        "logging": {"tensorboard": False},
    }
    path = directory / f"options_{seed}.yaml"
    path.write_text(yaml.safe_dump(options))
    run = directory / f"run_{seed}"
    started = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "atomtrain", "train", str(path), "--run-dir", str(run)],
        check=True,
        capture_output=True,
    )
    return run, time.perf_counter() - started


def evaluate(run: Path, held: Path) -> list[ase.Atoms]:
    output = run / "held.xyz"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "atomtrain",
            "eval",
            str(run / "model.pt"),
            str(held),
            "-o",
            str(output),
        ],
        check=True,
        capture_output=True,
    )
    return ase.io.read(output, ":")


def report(
    name: str,
    errors: np.ndarray,
    sigmas: np.ndarray,
    kinds: np.ndarray,
    cost: str = "",
    unit: str = "meV/atom",
) -> None:
    """The Spearman correlation of |error| and uncertainty, then their means per kind of
    structure (in milli-``unit``s of the values: errors in eV give meV)."""
    correlation = spearman(np.abs(errors), sigmas)
    print(
        f"{name}: Spearman(|error|, uncertainty) {correlation:.2f}" + (f"; {cost}" if cost else "")
    )
    for kind in ("AIMD-NVT", "Elastic", "Vacancy", "Surface"):
        chosen = kinds == kind
        if not chosen.any():
            continue
        print(
            f"  {kind:9s} ({chosen.sum():2d}): |error| {1e3 * np.abs(errors[chosen]).mean():7.2f} "
            f"{unit}, uncertainty {1e3 * sigmas[chosen].mean():7.2f} {unit}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--architecture", default="soap_bpnn", choices=sorted(SECTIONS))
    parser.add_argument("--members", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=30)
    arguments = parser.parse_args()
    with tempfile.TemporaryDirectory() as temporary:
        directory = Path(temporary)
        bulk, held = split(directory)
        runs, seconds = [], []
        for seed in range(1, arguments.members + 1):
            run, wall = train(directory, bulk, arguments.architecture, seed, arguments.epochs)
            runs.append(run)
            seconds.append(wall)
        predictions = [evaluate(run, held) for run in runs]
        frames = predictions[0]
        atoms = np.array([len(frame) for frame in frames], dtype=float)
        reference = np.array([frame.get_potential_energy() for frame in frames]) / atoms
        energies = (
            np.array(
                [[frame.info["predicted_energy"] for frame in member] for member in predictions]
            )
            / atoms
        )
        kinds = np.array([frame.info["config_type"] for frame in frames])
        llpr_sigma = np.array([frame.info["energy_uncertainty"] for frame in frames]) / atoms
        log = (runs[0] / "train.log").read_text()
        phase = UNCERTAINTY_PHASE.findall(log)
        print(
            f"{arguments.architecture}, {arguments.epochs} epochs on 120 bulk silicon "
            f"structures; {len(frames)} held back; one training {seconds[0]:.1f} s"
        )
        report(
            "LLPR",
            energies[0] - reference,
            llpr_sigma,
            kinds,
            f"cost {phase[-1] if phase else '?'} s after training",
        )
        report(
            f"ensemble of {arguments.members}",
            energies.mean(0) - reference,
            energies.std(0, ddof=1),
            kinds,
            f"cost {sum(seconds[1:]):.1f} s ({arguments.members - 1} more trainings)",
        )


if __name__ == "__main__":
    main()
