"""The weights' moving average on against off at equal epochs (ema_decay).

    python benchmarks/ema.py [--architectures soap_bpnn mace pet] [--epochs 20]
        [--structures 300] [--seeds 0 1] [--decay 0.99]

For each architecture and seed, trains the example's options (examples/ethanol for
SOAP-BPNN, examples/mace, examples/pet) on the first ``--structures`` ethanol molecules
with and without ``ema_decay``, the last 20 % held out as validation, and prints the
best model's validation errors of each (the model the export holds). A benchmark: it
measures and prints.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import ase.io
import yaml

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = {"soap_bpnn": "ethanol", "mace": "mace", "pet": "pet"}
ROW = re.compile(r"^validation\s+([\d.]+)\s+[\d.]+\s+[\d.]+\s+[\d.]+\s+([\d.]+)", re.M)


def options(architecture: str, data: Path, epochs: int, seed: int, decay: float | None) -> dict:
    path = ROOT / "examples" / EXAMPLE[architecture] / "options.yaml"
    chosen = yaml.safe_load(path.read_text())
    training = chosen["architecture"]["training"]
    training.update({"num_epochs": epochs, "log_interval": 1})
    if decay is not None:
        training["ema_decay"] = decay
    chosen["seed"] = seed
    chosen["training_set"]["systems"]["read_from"] = str(data)
    chosen["validation_set"] = 0.2
    chosen["test_set"] = 0.0
    return chosen


def best_errors(directory: Path) -> tuple[float, float]:
    log = next(directory.glob("outputs/*/*/train.log")).read_text()
    found = ROW.search(log)
    assert found, log[-2000:]
    return float(found[1]), float(found[2])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--architectures", nargs="+", default=["soap_bpnn", "mace"])
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--structures", type=int, default=300)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--decay", type=float, default=0.99)
    arguments = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="ema_"))
    data = work / "ethanol.xyz"
    frames = ase.io.read(ROOT / "examples/ethanol/ethanol_1000.xyz", f":{arguments.structures}")
    ase.io.write(data, frames, format="extxyz")
    print(f"{arguments.structures} ethanol, {arguments.epochs} epochs, validation 20 %")
    print(f"{'architecture':<12}{'seed':>5}{'ema':>7}{'E RMSE meV/atom':>18}{'F RMSE meV/A':>15}")
    for architecture in arguments.architectures:
        for seed in arguments.seeds:
            for decay in (None, arguments.decay):
                directory = work / f"{architecture}_{seed}_{decay}"
                directory.mkdir()
                path = directory / "options.yaml"
                chosen = options(architecture, data, arguments.epochs, seed, decay)
                path.write_text(yaml.safe_dump(chosen))
                subprocess.run(
                    [sys.executable, "-m", "atomtrain", "train", str(path)],
                    cwd=directory,
                    check=True,
                    capture_output=True,
                )
                energy, forces = best_errors(directory)
                shown = "off" if decay is None else f"{decay:g}"
                print(f"{architecture:<12}{seed:>5}{shown:>7}{energy:>18.2f}{forces:>15.1f}")


if __name__ == "__main__":
    main()
