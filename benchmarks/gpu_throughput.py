"""Training and inference throughput of a model (SOAP-BPNN or MACE with its section's
defaults) on one device, by batch size.

    python benchmarks/gpu_throughput.py [DATA.xyz] [--device cuda] [--batch-sizes 8 64 256]
                                        [--steps 20] [--dtype float32]
                                        [--architecture soap_bpnn]

A training step is what the trainer does per batch: collate (cached neighbor lists),
move to the device, energies and forces (autograd with create_graph), the loss, its
backward pass and Adam. Inference is energies and forces without the graph of second
derivatives. Two warm-up steps are not timed; the device is synchronized before every
clock read. Part of scripts/gpu_check.sh; on a CPU it runs as a smoke check.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from atomtrain.data import FrameSet, collate, read_structures
from atomtrain.models import registry
from atomtrain.models.energy_model import EnergyModel
from atomtrain.options import LossOptions
from atomtrain.runtime import keep_freed_memory
from atomtrain.training.batches import global_counts
from atomtrain.training.evaluation import predict
from atomtrain.training.losses import batch_loss

ROOT = Path(__file__).resolve().parent.parent
WARM_UP_STEPS = 2


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def batches_of(structures: list, batch_size: int, steps: int) -> list[list]:
    """``steps`` batches, cycling through the data when it is shorter."""
    return [
        [structures[index % len(structures)] for index in range(first, first + batch_size)]
        for first in range(0, batch_size * steps, batch_size)
    ]


def timed_steps(step, batches: list[list], device: str) -> float:
    """Seconds for the batches after the warm-up ones."""
    for batch in batches[:WARM_UP_STEPS]:
        step(batch)
    synchronize(device)
    start = time.perf_counter()
    for batch in batches[WARM_UP_STEPS:]:
        step(batch)
    synchronize(device)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("data", nargs="?", default=ROOT / "examples/ethanol/ethanol_1000.xyz")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[8, 64, 256])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    parser.add_argument("--architecture", default="soap_bpnn", choices=registry.known())
    parser.add_argument(
        "--cueq",
        choices=["auto", "true", "false"],
        default="auto",
        help="MACE's section's cueq: auto (cuequivariance on CUDA when installed), or not",
    )
    arguments = parser.parse_args()
    keep_freed_memory()
    dtype = getattr(torch, arguments.dtype)
    device = arguments.device
    structures = read_structures(arguments.data)
    types = sorted({int(z) for s in structures for z in s.atomic_numbers})
    stress = all(s.stress is not None for s in structures)
    cutoff = registry.new_model(arguments.architecture, types).cutoff
    for structure in structures:  # neighbor lists are cached once, as in training
        collate([structure], cutoff)
    name = torch.cuda.get_device_name() if device.startswith("cuda") else "cpu"
    print(
        f"gpu_throughput: {arguments.architecture} (default section), {arguments.data}, "
        f"{name}, {arguments.dtype}"
    )
    for batch_size in arguments.batch_sizes:
        batches = batches_of(structures, batch_size, arguments.steps + WARM_UP_STEPS)
        section = {} if arguments.cueq == "auto" else {"cueq": arguments.cueq == "true"}
        model = registry.new_model(arguments.architecture, types, **section)
        model.set_precision(dtype).to(device)
        model.use_kernels_for(torch.device(device))  # as the trainer does
        training, inference = throughput(model, batches, stress, device, dtype)
        print(
            f"  batch {batch_size:4d}: training {training:8.0f} structures/s, "
            f"inference {inference:8.0f} structures/s ({', '.join(model.details())})"
        )


def throughput(
    model: EnergyModel, batches: list[list], stress: bool, device: str, dtype: torch.dtype
) -> tuple[float, float]:
    """Structures per second of training steps and of inference, after the warm-up."""
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    parameters = list(model.parameters())

    def train_step(chosen: list) -> None:
        batch = collate(chosen, model.cutoff).to(device, dtype)
        predictions = predict(model, batch, True, stress, create_graph=True)
        counts = global_counts(FrameSet.from_structures(chosen), list(range(len(chosen))))
        loss = batch_loss(predictions, batch, LossOptions(), counts)
        optimizer.zero_grad()
        loss.backward(inputs=parameters)
        optimizer.step()

    def inference_step(chosen: list) -> None:
        batch = collate(chosen, model.cutoff).to(device, dtype)
        predict(model, batch, True, stress, create_graph=False)

    timed = sum(len(batch) for batch in batches[WARM_UP_STEPS:])
    return (
        timed / timed_steps(train_step, batches, device),
        timed / timed_steps(inference_step, batches, device),
    )


if __name__ == "__main__":
    main()
