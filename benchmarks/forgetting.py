"""Fine-tuning without forgetting: full, heads and lora, each with and without replay.

    python benchmarks/forgetting.py [--architecture soap_bpnn] [--pretrain-epochs 60]
        [--finetune-epochs 40] [--replay 40]

The silicon set of examples/silicon (mlearn, VASP PBE) has four kinds of structures.
The "foundation" model is pretrained on three of them (AIMD-NVT, Elastic, Surface;
a quarter of them held back as the old test set); the new task is the fourth, Vacancy:
20 structures drawn at random to fine-tune on, the other 37 as the new test set. Each
fine-tuning run starts from the pretrained best model; with replay, ``--replay``
structures drawn from the pretraining set are a second training file beside the new
one (the same head: the same level of theory); with pseudo-labelled replay, the same
structures without their labels are a ``pseudo_labels`` section, labelled by the
pretrained model before fine-tuning. Prints, for the pretrained model and
each run, the energy and force RMSE on the new and the old test sets (atomtrain eval)
and the run's wall time.
A benchmark: it measures and prints.
"""

from __future__ import annotations

import argparse
import random
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import ase.io
import yaml

ROOT = Path(__file__).resolve().parent.parent
SILICON = ROOT / "examples" / "silicon" / "si_train.xyz"
ROW = re.compile(r"^(\S+)\s+([\d.]+)\s+[\d.]+\s+[\d.]+\s+[\d.]+\s+([\d.]+)", re.M)


def write(path: Path, frames) -> Path:
    ase.io.write(path, frames, format="extxyz")
    return path


def split(work: Path, replay: int) -> dict[str, Path]:
    frames = ase.io.read(SILICON, ":")
    new = [atoms for atoms in frames if atoms.info["config_type"] == "Vacancy"]
    old = [atoms for atoms in frames if atoms.info["config_type"] != "Vacancy"]
    random.Random(0).shuffle(old)
    # the file holds each kind's snapshots in order (the first vacancies are 0.5 eV/atom
    # above the later ones): shuffled, the 20 fine-tuned on are like the 37 tested on
    random.Random(2).shuffle(new)
    held = len(old) // 4
    replayed = random.Random(1).sample(old[held:], replay)
    return {
        "old_train": write(work / "old_train.xyz", old[held:]),
        "old_test": write(work / "old_test.xyz", old[:held]),
        "new_train": write(work / "new_train.xyz", new[:20]),
        "new_test": write(work / "new_test.xyz", new[20:]),
        "replay": write(work / "replay.xyz", replayed),
        "unlabelled": write(work / "unlabelled.xyz", [unlabelled(atoms) for atoms in replayed]),
    }


def unlabelled(atoms: ase.Atoms) -> ase.Atoms:
    return ase.Atoms(atoms.numbers, atoms.positions, cell=atoms.cell, pbc=atoms.pbc)


def data_section(path: Path) -> dict:
    if path.stem == "unlabelled":
        return {"systems": str(path), "pseudo_labels": True}
    targets = {"energy": {"key": "energy", "unit": "eV", "forces": True, "stress": True}}
    return {"systems": str(path), "targets": targets}


def train(directory: Path, architecture: str, files: list[Path], epochs: int, finetune=None):
    directory.mkdir(parents=True)
    training = {"batch_size": 8, "num_epochs": epochs, "log_interval": 5}
    if finetune is not None:
        training["finetune"] = finetune
    options = {
        "seed": 0,
        "architecture": {"name": architecture, "training": training},
        "training_set": [data_section(path) for path in files],
        "validation_set": 0.1,
        "test_set": 0.0,
    }
    path = directory / "options.yaml"
    path.write_text(yaml.safe_dump(options))
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "atomtrain", "train", str(path), "--outputs", "outputs"],
        cwd=directory,
        check=True,
        capture_output=True,
    )
    seconds = time.perf_counter() - start
    return next(directory.glob("outputs/*/*/best.ckpt")), seconds


def errors(checkpoint: Path, data: Path) -> tuple[float, float]:
    """(energy RMSE meV/atom, force RMSE meV/A) of the checkpoint's best model."""
    result = subprocess.run(
        [sys.executable, "-m", "atomtrain", "eval", str(checkpoint), str(data), "-o",
         str(checkpoint.parent / f"eval_{data.stem}.xyz")],
        check=True,
        capture_output=True,
        text=True,
    )  # fmt: skip
    for found in ROW.finditer(result.stderr + result.stdout):
        if found[1] == data.name:
            return float(found[2]), float(found[3])
    raise RuntimeError(result.stderr[-2000:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--architecture", default="soap_bpnn")
    parser.add_argument("--pretrain-epochs", type=int, default=60)
    parser.add_argument("--finetune-epochs", type=int, default=40)
    parser.add_argument("--replay", type=int, default=40)
    arguments = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="forgetting_"))
    files = split(work, arguments.replay)
    pretrained, seconds = train(
        work / "pretrained", arguments.architecture, [files["old_train"]],
        arguments.pretrain_epochs,
    )  # fmt: skip
    print(
        f"{arguments.architecture}; pretrained {arguments.pretrain_epochs} epochs on "
        f"{len(ase.io.read(files['old_train'], ':'))} structures in {seconds:.0f} s; "
        f"fine-tuned {arguments.finetune_epochs} epochs on 20 vacancies (+ {arguments.replay} "
        "replayed); RMSE as E meV/atom, F meV/A"
    )
    header = f"{'run':<22}{'new E':>8}{'new F':>8}{'old E':>8}{'old F':>8}{'time s':>8}"
    print(header)

    def show(label: str, checkpoint: Path, seconds: float) -> None:
        new, old = errors(checkpoint, files["new_test"]), errors(checkpoint, files["old_test"])
        print(
            f"{label:<22}{new[0]:>8.2f}{new[1]:>8.1f}{old[0]:>8.2f}{old[1]:>8.1f}{seconds:>8.1f}",
            flush=True,
        )

    show("pretrained", pretrained, 0.0)
    for method in ("full", "heads", "lora"):
        for replay in ("", "replay", "unlabelled"):
            name = {"replay": " + replay", "unlabelled": " + pseudo-labels"}.get(replay, "")
            label = f"{method}{name}"
            data = [files["new_train"], *([files[replay]] if replay else [])]
            finetune = {"read_from": str(pretrained), "method": method}
            directory = work / label.replace(" + ", "_").replace("-", "_")
            checkpoint, seconds = train(
                directory, arguments.architecture, data, arguments.finetune_epochs, finetune
            )
            show(label, checkpoint, seconds)


if __name__ == "__main__":
    main()
