"""LLPR uncertainties of an energy variant and of an mtt:: vector target, on data the
model has not seen.

    python benchmarks/llpr_targets.py [--architecture soap_bpnn] [--epochs 30]

Silicon (examples/silicon/si_train.xyz, mlearn), split as benchmarks/llpr.py splits it:
120 bulk structures train (15 % of them validate), the held-back rest (bulk, vacancies,
surfaces) evaluates. The 120 are two sections: the first 60 label ``energy``, the other
60 ``energy/second`` (the same DFT, through a variant's own head), and both label the
forces as a direct per-atom vector target, ``mtt::forces`` (a head of its own, not the
energy's gradient). One model learns all three.

Then a Cartesian rank-2 target, whose antisymmetric block LLPR linearises: the QM7-X
polarisability (tests/resources/qm7x_reduced_100.xyz, 100 conformers of C5H7NS), 80
conformers training (15 % of them validating), 20 held back.

Prints, for each: the Spearman rank correlation of |error| and uncertainty on the
held-back set (energies per atom; forces and polarisabilities per component), and the
mean error and uncertainty per kind of structure. A benchmark: it measures and prints.
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
from llpr import ROOT, SECTIONS, UNCERTAINTY_PHASE, report, split

from atomtrain.cli.eval_run import spearman

FORCES = {"key": "forces", "per_atom": True, "unit": "eV/A", "type": {"cartesian": {"rank": 1}}}
QM7X = ROOT / "tests" / "resources" / "qm7x_reduced_100.xyz"
POLARISABILITY = {
    "key": "polarizability",
    "quantity": "polarizability",
    "unit": "bohr^3",
    "per_atom": False,
    "type": {"cartesian": {"rank": 2}},
}


def train(directory: Path, bulk: Path, architecture: str, epochs: int) -> tuple[Path, float]:
    frames = ase.io.read(bulk, ":")
    ase.io.write(directory / "first.xyz", frames[:60])
    ase.io.write(directory / "second.xyz", frames[60:])
    sections = [
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
    ]
    return run_training(directory, "run", sections, architecture, epochs)


def run_training(
    directory: Path, name: str, sections: list[dict], architecture: str, epochs: int
) -> tuple[Path, float]:
    options = {
        "seed": 1,
        "architecture": {
            "name": architecture,
            "model": SECTIONS[architecture],
            "training": {"batch_size": 8, "num_epochs": epochs, "learning_rate": 0.003},
        },
        "training_set": sections,
        "validation_set": 0.15,
        "test_set": 0.0,
        "logging": {"tensorboard": False},
    }
    path = directory / f"{name}.yaml"
    path.write_text(yaml.safe_dump(options))
    run = directory / name
    started = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "atomtrain", "train", str(path), "--run-dir", str(run)],
        check=True,
        capture_output=True,
    )
    return run, time.perf_counter() - started


def evaluate(run: Path, held: Path, energy: str) -> list[ase.Atoms]:
    targets = {energy: {"key": "energy", "forces": False}, "mtt::forces": FORCES}
    return evaluate_targets(run, held, f"held_{energy.replace('/', '_')}", targets)


def evaluate_targets(run: Path, held: Path, name: str, targets: dict) -> list[ase.Atoms]:
    description = run / f"{name}.yaml"
    description.write_text(yaml.safe_dump({"systems": str(held), "targets": targets}))
    output = description.with_suffix(".xyz")
    subprocess.run(
        [sys.executable, "-m", "atomtrain", "eval", str(run / "model.pt"), str(description)]
        + ["-o", str(output)],
        check=True,
        capture_output=True,
    )
    return ase.io.read(output, ":")


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
            report(energy, predicted - reference, sigmas, kinds)
        errors = np.concatenate(
            [(f.arrays["predicted_mtt_forces"] - f.get_forces()).reshape(-1) for f in frames]
        )
        sigmas = np.concatenate([f.arrays["mtt_forces_uncertainty"].reshape(-1) for f in frames])
        components = np.concatenate([[f.info["config_type"]] * 3 * len(f) for f in frames])
        report("mtt::forces (per component)", errors, sigmas, components, unit="meV/A")
        polarisability(directory, arguments.architecture, arguments.epochs)


def polarisability(directory: Path, architecture: str, epochs: int) -> None:
    frames = ase.io.read(QM7X, ":")
    ase.io.write(directory / "qm7x_train.xyz", frames[:80])
    ase.io.write(directory / "qm7x_held.xyz", frames[80:])
    section = {
        "systems": str(directory / "qm7x_train.xyz"),
        "targets": {"mtt::polarizability": POLARISABILITY},
    }
    run, seconds = run_training(directory, "qm7x", [section], architecture, epochs)
    phase = UNCERTAINTY_PHASE.findall((run / "train.log").read_text())
    print(
        f"{architecture}, {epochs} epochs on 80 QM7-X conformers; training {seconds:.1f} s, "
        f"LLPR {phase[-1] if phase else '?'} s"
    )
    held = evaluate_targets(
        run, directory / "qm7x_held.xyz", "held_qm7x", {"mtt::polarizability": POLARISABILITY}
    )
    predicted = np.stack([f.info["predicted_mtt_polarizability"] for f in held]).reshape(-1)
    reference = np.stack([f.info["polarizability"] for f in held]).reshape(-1)
    sigmas = np.stack([f.info["mtt_polarizability_uncertainty"] for f in held]).reshape(-1)
    errors = predicted - reference
    print(
        f"mtt::polarizability (per component, 20 held back): Spearman(|error|, uncertainty) "
        f"{spearman(np.abs(errors), sigmas):.2f}; |error| {np.abs(errors).mean():.3f}, "
        f"uncertainty {sigmas.mean():.3f} bohr^3"
    )


if __name__ == "__main__":
    main()
