"""LLPR uncertainties of an energy variant and of an mtt:: vector target, on data the
model has not seen.

    python benchmarks/llpr_targets.py [--architecture soap_bpnn] [--epochs 30]

Silicon (examples/silicon/si_train.xyz, mlearn), split as benchmarks/llpr.py splits it:
120 bulk structures train (15 % of them validate), the held-back rest (bulk, vacancies,
surfaces) evaluates. The 120 are two sections: the first 60 label ``energy``, the other
60 ``energy/second`` (the same DFT, through a variant's own head), and both label the
forces as a direct per-atom vector target, ``mtt::forces`` (a head of its own, not the
energy's gradient). One model learns all three.

Prints, for each of the three: the Spearman rank correlation of |error| and uncertainty
on the held-back set (energies per atom; forces per component), and the mean error and
uncertainty per kind of structure. A benchmark: it measures and prints.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import ase.io
import numpy as np
import yaml
from llpr import SECTIONS, UNCERTAINTY_PHASE, split

from atomtrain.cli.eval import spearman

FORCES = {"key": "forces", "per_atom": True, "unit": "eV/A", "type": {"cartesian": {"rank": 1}}}
KINDS = ("AIMD-NVT", "Elastic", "Vacancy", "Surface")


def train(directory: Path, bulk: Path, architecture: str, epochs: int) -> tuple[Path, float]:
    frames = ase.io.read(bulk, ":")
    ase.io.write(directory / "first.xyz", frames[:60])
    ase.io.write(directory / "second.xyz", frames[60:])
    options = {
        "seed": 1,
        "architecture": {
            "name": architecture,
            "model": SECTIONS[architecture],
            "training": {"batch_size": 8, "num_epochs": epochs, "learning_rate": 0.003},
        },
        "training_set": [
            {
                "systems": str(directory / "first.xyz"),
                "targets": {"energy": {"key": "energy", "forces": False}, "mtt::forces": FORCES},
            },
            {
                "systems": str(directory / "second.xyz"),
                "targets": {
                    "energy/second": {"key": "energy", "forces": False},
                    "mtt::forces": FORCES,
                },
            },
        ],
        "validation_set": 0.15,
        "test_set": 0.0,
        "logging": {"tensorboard": False},
    }
    path = directory / "options.yaml"
    path.write_text(yaml.safe_dump(options))
    run = directory / "run"
    started = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "atomtrain", "train", str(path), "--run-dir", str(run)],
        check=True,
        capture_output=True,
    )
    return run, time.perf_counter() - started


def evaluate(run: Path, held: Path, energy: str) -> list[ase.Atoms]:
    description = run / f"held_{energy.replace('/', '_')}.yaml"
    targets = {energy: {"key": "energy", "forces": False}, "mtt::forces": FORCES}
    description.write_text(yaml.safe_dump({"systems": str(held), "targets": targets}))
    output = description.with_suffix(".xyz")
    subprocess.run(
        [sys.executable, "-m", "atomtrain", "eval", str(run / "model.pt"), str(description)]
        + ["-o", str(output)],
        check=True,
        capture_output=True,
    )
    return ase.io.read(output, ":")


def report(name: str, errors: np.ndarray, sigmas: np.ndarray, kinds: np.ndarray, unit: str):
    print(f"{name}: Spearman(|error|, uncertainty) {spearman(np.abs(errors), sigmas):.2f}")
    for kind in KINDS:
        chosen = kinds == kind
        if chosen.any():
            print(
                f"  {kind:9s}: |error| {1e3 * np.abs(errors[chosen]).mean():8.2f} {unit}, "
                f"uncertainty {1e3 * sigmas[chosen].mean():8.2f} {unit}"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--architecture", default="soap_bpnn", choices=sorted(SECTIONS))
    parser.add_argument("--epochs", type=int, default=30)
    arguments = parser.parse_args()
    with tempfile.TemporaryDirectory() as temporary:
        directory = Path(temporary)
        bulk, held = split(directory)
        run, seconds = train(directory, bulk, arguments.architecture, arguments.epochs)
        log = (run / "train.log").read_text()
        phase = UNCERTAINTY_PHASE.findall(log)
        print(
            f"{arguments.architecture}, {arguments.epochs} epochs on 2 x 60 bulk silicon "
            f"structures; training {seconds:.1f} s, LLPR {phase[-1] if phase else '?'} s"
        )
        for energy in ("energy", "energy/second"):
            frames = evaluate(run, held, energy)
            atoms = np.array([len(frame) for frame in frames], dtype=float)
            kinds = np.array([frame.info["config_type"] for frame in frames])
            reference = np.array([frame.get_potential_energy() for frame in frames]) / atoms
            predicted = np.array([frame.info["predicted_energy"] for frame in frames]) / atoms
            sigmas = np.array([frame.info["energy_uncertainty"] for frame in frames]) / atoms
            report(energy, predicted - reference, sigmas, kinds, "meV/atom")
        errors = np.concatenate(
            [(f.arrays["predicted_mtt_forces"] - f.get_forces()).reshape(-1) for f in frames]
        )
        sigmas = np.concatenate([f.arrays["mtt_forces_uncertainty"].reshape(-1) for f in frames])
        components = np.concatenate([[f.info["config_type"]] * 3 * len(f) for f in frames])
        report("mtt::forces (per component)", errors, sigmas, components, "meV/A")


if __name__ == "__main__":
    main()
