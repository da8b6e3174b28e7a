"""Where a training step of SOAP-BPNN spends its time, phase by phase (CPU).

    python benchmarks/profile_step.py [DATA.xyz] [--batch-size 8] [--steps 30] [--threads 2]

Phases: data (collating cached neighbor lists into a flat batch), features (pair
vectors, radial and angular basis, density, power spectrum), networks (LayerNorm and
per-element MLPs, energy sum), forces (autograd of the energy with create_graph),
backward (loss gradient through all of it), optimizer (Adam). Communication is zero in
one process; with several, one all-reduce of the gradients follows the backward pass.
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict
from pathlib import Path

import torch

from atomtrain.data import collate, read_structures
from atomtrain.models import SoapBpnn
from atomtrain.options import LossOptions
from atomtrain.training.losses import GlobalCounts, batch_loss

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("data", nargs="?", default=ROOT / "examples/ethanol/ethanol_1000.xyz")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--threads", type=int, default=2)
    arguments = parser.parse_args()
    torch.set_num_threads(arguments.threads)
    structures = read_structures(arguments.data)[: arguments.batch_size * arguments.steps]
    types = sorted({int(z) for s in structures for z in s.atomic_numbers})
    model = SoapBpnn(types).set_precision(torch.float32)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, fused=True)
    stress = all(s.stress is not None for s in structures)
    parameters = list(model.parameters())
    timings: dict[str, float] = defaultdict(float)

    def lap(name, start):
        now = time.perf_counter()
        timings[name] += now - start
        return now

    for structure in structures:  # neighbor lists are computed once, before training
        collate([structure], model.cutoff)
    for step in range(arguments.steps):
        chosen = structures[step * arguments.batch_size : (step + 1) * arguments.batch_size]
        start = time.perf_counter()
        batch = collate(chosen, model.cutoff).to("cpu", torch.float32)
        start = lap("data", start)
        positions = batch.positions.detach().requires_grad_(True)
        strain = torch.zeros_like(batch.cell, requires_grad=stress)
        symmetric = 0.5 * (strain + strain.transpose(1, 2))
        moved = positions + torch.bmm(
            positions.unsqueeze(1), symmetric[batch.system_index]
        ).squeeze(1)
        cell = batch.cell + torch.bmm(batch.cell, symmetric)
        pair_cell = cell[batch.system_index[batch.pair_first]]
        vectors = (
            moved[batch.pair_second]
            - moved[batch.pair_first]
            + torch.bmm(batch.cell_shifts.unsqueeze(1), pair_cell).squeeze(1)
        )
        element = model.type_to_index[batch.atomic_numbers]
        features = model.soap(
            vectors, batch.pair_first, element[batch.pair_second], positions.shape[0]
        )
        start = lap("features", start)
        atomic = model.networks(model.layernorm(features), element).double() * model.scale
        atomic = atomic + model.baseline[element]
        energy = torch.zeros(batch.n_structures, dtype=torch.float64).index_add(
            0, batch.system_index, atomic
        )
        start = lap("networks", start)
        inputs = [positions, strain] if stress else [positions]
        gradients = torch.autograd.grad(energy.sum(), inputs, create_graph=True)
        predictions = {"energy": energy, "forces": -gradients[0]}
        if stress:
            volume = torch.linalg.det(batch.cell).abs().reshape(-1, 1, 1)
            predictions["stress"] = gradients[1] / volume
        start = lap("forces", start)
        counts = GlobalCounts(
            batch.n_structures, 3 * int(batch.n_atoms.sum()), 9 * batch.n_structures
        )
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
