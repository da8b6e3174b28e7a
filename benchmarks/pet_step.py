"""What atomtrain's wrapper of PETBackend costs, against metatrain's own PET model, on the
same batch with the same weights: one training step's model work (energies, forces by
autograd with create_graph, a loss on both, its backward to the parameters).

    python benchmarks/pet_step.py [--checkpoint model.ckpt] [--batch 8] [--repeats 20]

Without --checkpoint it trains a PET of metatrain's default size for one epoch with
``mtt train`` on 40 ethanol molecules. Both models are read from that checkpoint:
metatrain's by its own PET.load_checkpoint, atomtrain's by finetune's reader. Prints the
median time of a step of each and their ratio. A benchmark: it measures and prints.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import ase.io
import torch
import yaml

ROOT = Path(__file__).resolve().parent.parent
ETHANOL = ROOT / "tests" / "resources" / "ethanol_40.xyz"


def trained_checkpoint(directory: Path) -> Path:
    options = {
        "seed": 0,
        "architecture": {"name": "pet", "training": {"batch_size": 8, "num_epochs": 1}},
        "training_set": {
            "systems": str(ETHANOL),
            "targets": {"energy": {"key": "energy", "forces": {"key": "forces"}}},
        },
        "validation_set": 0.1,
        "test_set": 0.0,
    }
    (directory / "options.yaml").write_text(yaml.safe_dump(options))
    subprocess.run(
        [sys.executable, "-m", "metatrain", "train", "options.yaml"],
        cwd=directory,
        check=True,
        capture_output=True,
    )
    return directory / "model.ckpt"


def metatrain_step(model, systems, outputs):
    """metatrain's trainer's model work: positions requiring grad, the model's energy,
    forces with create_graph, a loss, its backward."""
    for system in systems:
        system.positions.requires_grad_(True)
    energy = model(systems, outputs)["energy"].block().values.sum()
    positions = [system.positions for system in systems]
    forces = torch.autograd.grad(energy, positions, create_graph=True)
    loss = energy**2 + sum((force**2).sum() for force in forces)
    loss.backward()
    model.zero_grad(set_to_none=True)


def atomtrain_step(model, batch, predict):
    found = predict(model, batch, True, False, True)
    loss = (found["energy"] ** 2).sum() + (found["forces"] ** 2).sum()
    loss.backward()
    model.zero_grad(set_to_none=True)


def timed(step, repeats: int) -> float:
    step()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", type=Path)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=20)
    arguments = parser.parse_args()
    torch.set_num_threads(2)
    with tempfile.TemporaryDirectory() as scratch:
        checkpoint = arguments.checkpoint or trained_checkpoint(Path(scratch))
        from metatomic.torch import ModelOutput, systems_to_torch
        from metatrain.pet import PET
        from metatrain.utils.neighbor_lists import get_system_with_neighbor_lists

        from atomtrain.data import collate
        from atomtrain.data.system import Structure
        from atomtrain.models import metatrain_checkpoint
        from atomtrain.training.evaluation import predict

        raw = torch.load(checkpoint, weights_only=False)
        theirs = PET.load_checkpoint(raw, "finetune").to(torch.float32).train()
        ours = metatrain_checkpoint.read(checkpoint).set_precision(torch.float32).train()
        frames = ase.io.read(ETHANOL, f":{arguments.batch}")
        systems = systems_to_torch(frames, dtype=torch.float32)
        systems = [
            get_system_with_neighbor_lists(system, theirs.requested_neighbor_lists())
            for system in systems
        ]
        outputs = {"energy": ModelOutput(per_atom=False)}
        structures = [
            Structure(
                torch.tensor(atoms.positions),
                torch.tensor(atoms.numbers),
                torch.tensor(atoms.cell.array),
                torch.tensor(atoms.pbc),
            )
            for atoms in frames
        ]
        batch = collate(structures, ours.cutoff).to("cpu", torch.float32)
        metatrain_time = timed(lambda: metatrain_step(theirs, systems, outputs), arguments.repeats)
        atomtrain_time = timed(lambda: atomtrain_step(ours, batch, predict), arguments.repeats)
    print(f"batch of {arguments.batch} ethanol molecules, float32, 2 threads, median step:")
    print(f"  metatrain's PET model: {1000 * metatrain_time:.1f} ms")
    print(f"  atomtrain's PetModel:  {1000 * atomtrain_time:.1f} ms")
    print(f"  atomtrain / metatrain: {atomtrain_time / metatrain_time:.3f}")


if __name__ == "__main__":
    main()
