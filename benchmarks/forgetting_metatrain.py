"""Fine-tuning a metatrain PET: metatrain's heads and lora against atomtrain's, on the
same files, from the same checkpoint.

    python benchmarks/forgetting_metatrain.py [--pretrain-epochs 30]
        [--finetune-epochs 20] [--methods full heads lora]

The split of benchmarks/forgetting.py (silicon, mlearn): a PET is pretrained by
metatrain 2026.4's ``mtt train`` on the AIMD, Elastic and Surface structures; each
method then fine-tunes that ``model.ckpt`` on 20 vacancies, once with ``mtt train`` and
once with ``atomtrain train`` (the same hyperparameters: epochs, batch size, learning
rate, seed; metatrain's method configuration). Both exported ``model.pt`` files are
evaluated by metatomic's ASE calculator on the new (37 vacancies) and old (held-back
pretraining kinds) test sets. Prints energy and force RMSE and each run's wall time.
A benchmark: it measures and prints.
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from forgetting import split  # noqa: E402

PET = {"cutoff": 5.0, "d_pet": 32, "d_head": 32, "d_node": 32, "num_gnn_layers": 2}
CONFIG = {
    "heads": {
        "head_modules": ["node_heads", "edge_heads"],
        "last_layer_modules": ["node_last_layers", "edge_last_layers"],
    },
    "lora": {"rank": 4, "alpha": 8.0},
    "full": {},
}


def options(data: Path, epochs: int, learning_rate: float, finetune: dict | None) -> dict:
    training = {"batch_size": 8, "num_epochs": epochs, "learning_rate": learning_rate}
    if finetune is not None:
        training["finetune"] = finetune
    targets = {"energy": {"key": "energy", "unit": "eV", "forces": {"key": "forces"}}}
    return {
        "seed": 0,
        "architecture": {"name": "pet", "model": PET, "training": training},
        "training_set": {"systems": {"read_from": str(data)}, "targets": targets},
        "validation_set": 0.1,
        "test_set": 0.0,
    }


def run(directory: Path, command: list[str], settings: dict) -> tuple[Path, float]:
    directory.mkdir(parents=True)
    (directory / "options.yaml").write_text(yaml.safe_dump(settings))
    start = time.perf_counter()
    result = subprocess.run(
        [*command, "options.yaml"], cwd=directory, capture_output=True, text=True
    )
    seconds = time.perf_counter() - start
    if result.returncode != 0:
        raise RuntimeError(f"{command}: {result.stderr[-3000:]}")
    return directory, seconds


def mtt(directory: Path, settings: dict) -> tuple[Path, float]:
    found, seconds = run(directory, [sys.executable, "-m", "metatrain", "train"], settings)
    return found / "model.pt", seconds


def atomtrain(directory: Path, settings: dict) -> tuple[Path, float]:
    found, seconds = run(directory, [sys.executable, "-m", "atomtrain", "train"], settings)
    return next(found.glob("outputs/*/*/model.pt")), seconds


def errors(model: Path, data: Path) -> tuple[float, float]:
    """(energy RMSE meV/atom, force RMSE meV/A), by metatomic's ASE calculator."""
    from metatomic_ase import MetatomicCalculator

    extensions = model.parent / "extensions"
    calculator = MetatomicCalculator(
        str(model),
        extensions_directory=str(extensions) if extensions.exists() else None,
        uncertainty_threshold=None,
    )
    energy, forces = [], []
    for atoms in ase.io.read(data, ":"):
        reference_energy = atoms.get_potential_energy()
        reference_forces = atoms.get_forces()
        atoms.calc = calculator
        energy.append((atoms.get_potential_energy() - reference_energy) / len(atoms))
        forces.append((atoms.get_forces() - reference_forces).reshape(-1))
    energy_rmse = float(np.sqrt(np.mean(np.square(energy))))
    force_rmse = float(np.sqrt(np.mean(np.square(np.concatenate(forces)))))
    return 1e3 * energy_rmse, 1e3 * force_rmse


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pretrain-epochs", type=int, default=30)
    parser.add_argument("--finetune-epochs", type=int, default=20)
    parser.add_argument("--methods", nargs="+", default=["full", "heads", "lora"])
    arguments = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="forgetting_metatrain_"))
    files = split(work, 40)
    pretrained, seconds = mtt(
        work / "pretrained", options(files["old_train"], arguments.pretrain_epochs, 1e-3, None)
    )
    checkpoint = pretrained.parent / "model.ckpt"
    print(
        f"PET {PET}; pretrained by mtt train, {arguments.pretrain_epochs} epochs, in "
        f"{seconds:.0f} s; fine-tuned {arguments.finetune_epochs} epochs on 20 vacancies; "
        "RMSE as E meV/atom, F meV/A (metatomic's ASE calculator)"
    )
    print(f"{'run':<22}{'new E':>8}{'new F':>8}{'old E':>8}{'old F':>8}{'time s':>8}")

    def show(label: str, model: Path, seconds: float) -> None:
        new, old = errors(model, files["new_test"]), errors(model, files["old_test"])
        print(
            f"{label:<22}{new[0]:>8.2f}{new[1]:>8.1f}{old[0]:>8.2f}{old[1]:>8.1f}{seconds:>8.1f}",
            flush=True,
        )

    show("pretrained", pretrained, 0.0)
    for method in arguments.methods:
        finetune = {"method": method, "read_from": str(checkpoint)}
        if CONFIG[method]:
            finetune["config"] = CONFIG[method]
        settings = options(files["new_train"], arguments.finetune_epochs, 1e-4, finetune)
        for program, train in (("metatrain", mtt), ("atomtrain", atomtrain)):
            model, seconds = train(work / f"{method}_{program}", settings)
            show(f"{method} ({program})", model, seconds)


if __name__ == "__main__":
    main()
