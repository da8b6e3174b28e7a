"""Where a training step of atomtrain-MACE goes (CPU): collation of cached neighbor
lists, energies and forces (autograd with create_graph), the loss's backward pass,
and Adam, for benchmarks/mace_vs_mace_run_train.py's hyperparameters.

    python benchmarks/mace_step_phases.py [--steps 30] [--batch-size 8] [--threads 2]
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict
from pathlib import Path

import torch
from mace_vs_mace_run_train import BATCH_SIZE, HYPERS

from atomtrain.data import FrameSet, collate, read_structures
from atomtrain.models import registry
from atomtrain.options import LossOptions
from atomtrain.training.batches import global_counts
from atomtrain.training.evaluation import predict
from atomtrain.training.losses import batch_loss

ROOT = Path(__file__).resolve().parent.parent
WARM_UP_STEPS = 3


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=BATCH_SIZE)
    parser.add_argument("--threads", type=int, default=2)
    arguments = parser.parse_args()
    torch.set_num_threads(arguments.threads)
    size = arguments.batch_size
    count = (arguments.steps + WARM_UP_STEPS) * size
    structures = read_structures(ROOT / "examples/ethanol/ethanol_1000.xyz")[:count]
    for dtype in (torch.float64, torch.float32):
        model = registry.new_model("mace", [1, 6, 8], 16.0, **HYPERS).set_precision(dtype)
        optimizer = torch.optim.Adam(
            model.parameters(), lr=1e-3, amsgrad=True, weight_decay=5e-7, fused=True
        )
        parameters = list(model.parameters())
        for structure in structures:  # neighbor lists are cached once, as in training
            collate([structure], model.cutoff)
        seconds: dict[str, float] = defaultdict(float)
        for step in range(arguments.steps + WARM_UP_STEPS):
            chosen = structures[step * size : (step + 1) * size]
            counts = global_counts(FrameSet.from_structures(chosen), list(range(len(chosen))))
            marks = [time.perf_counter()]
            batch = collate(chosen, model.cutoff).to("cpu", dtype)
            marks.append(time.perf_counter())
            predictions = predict(model, batch, True, False, create_graph=True)
            marks.append(time.perf_counter())
            loss = batch_loss(predictions, batch, LossOptions(), counts)
            optimizer.zero_grad()
            loss.backward(inputs=parameters)
            marks.append(time.perf_counter())
            optimizer.step()
            marks.append(time.perf_counter())
            if step >= WARM_UP_STEPS:
                for name, start, end in zip(
                    ("collate", "energies and forces", "loss backward", "optimizer"),
                    marks,
                    marks[1:],
                ):
                    seconds[name] += end - start
        total = sum(seconds.values())
        print(f"{dtype}: {total / arguments.steps * 1e3:.1f} ms per step of {size}")
        for name, value in seconds.items():
            share = 100 * value / total
            print(f"  {name:<20} {value / arguments.steps * 1e3:7.2f} ms  {share:5.1f} %")


if __name__ == "__main__":
    main()
