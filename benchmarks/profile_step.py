"""Where a training step of SOAP-BPNN spends its time, phase by phase (CPU).

    python benchmarks/profile_step.py [DATA.xyz] [--batch-size 8] [--steps 30] [--threads 2]

Phases: data (collating cached neighbor lists into a flat batch), features (pair
vectors, radial and angular basis, density, power spectrum), networks (LayerNorm and
per-element MLPs), forces (energy sum and its autograd with create_graph),
backward (loss gradient through all of it), optimizer (Adam). Communication is zero in
one process; with several, one all-reduce of the gradients follows the backward pass.
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict
from pathlib import Path

import torch

from atomtrain.data import FrameSet, collate, read_structures
from atomtrain.models.soap_bpnn.model import SoapBpnn
from atomtrain.options import LossOptions
from atomtrain.runtime import keep_freed_memory
from atomtrain.training.batches import global_counts
from atomtrain.training.evaluation import predict
from atomtrain.training.losses import batch_loss

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("data", nargs="?", default=ROOT / "examples/ethanol/ethanol_1000.xyz")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--threads", type=int, default=2)
    arguments = parser.parse_args()
    torch.set_num_threads(arguments.threads)
    keep_freed_memory()  # as every atomtrain command does
    structures = read_structures(arguments.data)[: arguments.batch_size * arguments.steps]
    types = sorted({int(z) for s in structures for z in s.atomic_numbers})
    model = SoapBpnn(types).set_precision(torch.float32)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, fused=True)
    stress = all(s.stress is not None for s in structures)
    parameters = list(model.parameters())
    timings: dict[str, float] = defaultdict(float)

    # the model itself runs; its sub-modules' hooks mark where each phase ends
    marks: dict[str, float] = {}

    def mark(name):
        return lambda *_: marks.__setitem__(name, time.perf_counter())

    model.soap.register_forward_hook(mark("features"))
    model.networks.register_forward_hook(mark("networks"))

    def lap(name, start):
        now = time.perf_counter()
        timings[name] += now - start
        return now

    for structure in structures:  # neighbor lists are computed once, before training
        collate([structure], model.cutoff)
    for step in range(arguments.steps):
        # cycle through the data when it holds fewer than steps x batch structures
        first = step * arguments.batch_size
        chosen = [
            structures[index % len(structures)]
            for index in range(first, first + arguments.batch_size)
        ]
        counts = global_counts(FrameSet.from_structures(chosen), list(range(len(chosen))))
        start = time.perf_counter()
        batch = collate(chosen, model.cutoff).to("cpu", torch.float32)
        start = lap("data", start)
        predictions = predict(model, batch, True, stress, create_graph=True)
        timings["features"] += marks["features"] - start
        timings["networks"] += marks["networks"] - marks["features"]
        start = lap("forces", marks["networks"])
        loss = batch_loss(predictions, batch, LossOptions(), counts)
        optimizer.zero_grad()
        loss.backward(inputs=parameters)
        start = lap("backward", start)
        optimizer.step()
        lap("optimizer", start)
    total = sum(timings.values())
    print(
        f"{arguments.data}: {arguments.steps} steps of {arguments.batch_size} structures, "
        f"{arguments.threads} threads, {total / arguments.steps * 1e3:.1f} ms per step"
    )
    for name, seconds in timings.items():
        print(
            f"  {name:<10} {seconds / arguments.steps * 1e3:8.2f} ms  "
            f"{100 * seconds / total:5.1f} %"
        )


if __name__ == "__main__":
    main()
