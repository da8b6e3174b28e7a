"""What an extra target's head costs a training step, in one process, A/B.

    python benchmarks/head_cost.py [--architecture soap_bpnn] [--rounds 15] [--steps 20]

Ethanol (tests/resources/ethanol_40.xyz), batches of 8 molecules, float32, one thread
(``--threads``):
the training step (energy and forces, forces by a graph through the positions, the
loss's backward to the parameters) of a model with the energy alone, against the same
model with a Cartesian vector per structure (``mtt::vector``, labels from the geometry);
with ``--whole-step``, also what the training loop does after it (Adam's update of
every parameter, the metric sums).
The two alternate, ``--rounds`` times ``--steps`` steps each, so that a machine's drift
falls on both; prints each one's median time per step, the ratio, the median and
quartiles of the rounds' own ratios, and the operator calls of one step
(torch.profiler). A benchmark: it measures and prints.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import ase.io
import numpy as np
import torch

from atomtrain.data import collate
from atomtrain.data.system import Structure
from atomtrain.models import registry
from atomtrain.options import LossOptions, TrainingOptions
from atomtrain.targets import TargetSpec
from atomtrain.training.evaluation import predict
from atomtrain.training.losses import GlobalCounts, batch_loss
from atomtrain.training.metrics import MetricSums
from atomtrain.training.schedule import make_optimizer

ETHANOL = Path(__file__).resolve().parent.parent / "tests" / "resources" / "ethanol_40.xyz"
CLOCK = time.perf_counter
VECTOR = TargetSpec("mtt::vector", "vector", "cartesian", rank=1)


def structures() -> list[Structure]:
    found = []
    for atoms in ase.io.read(ETHANOL, ":"):
        structure = Structure(
            torch.tensor(atoms.positions),
            torch.tensor(atoms.numbers),
            torch.zeros(3, 3, dtype=torch.float64),
            torch.zeros(3, dtype=torch.bool),
            energy=float(atoms.get_potential_energy()),
            forces=torch.tensor(atoms.get_forces()),
        )
        centred = atoms.positions - atoms.positions.mean(0)
        structure.targets["mtt::vector"] = torch.tensor((centred * atoms.numbers[:, None]).sum(0))
        found.append(structure)
    return found


def case(architecture: str, with_head: bool, frames: list[Structure]):
    """The model, its batches of 8 and the loss's counts."""
    torch.manual_seed(0)
    model = registry.new_model(architecture, [1, 6, 8], 5.0).set_precision(torch.float32)
    if with_head:
        model.attach_targets([VECTOR])
    batches = []
    for start in range(0, len(frames), 8):
        batch = collate(frames[start : start + 8], model.cutoff).to("cpu", torch.float32)
        if not with_head:
            batch.targets = {}
        batches.append(batch)
    counts = [
        GlobalCounts(
            batch.n_structures,
            batch.forces.numel(),
            0,
            {"mtt::vector": 3 * batch.n_structures} if with_head else {},
        )
        for batch in batches
    ]
    return model, batches, counts


def step(model, batch, counts, loop=None) -> None:
    """``loop``: (the optimizer, the metric sums), to do what the training loop does
    after the backward pass too."""
    model.zero_grad(set_to_none=True)
    predictions = predict(model, batch, True, False, True)
    loss = batch_loss(predictions, batch, LossOptions(), counts)
    loss.backward(inputs=list(model.parameters()))
    if loop is not None:
        optimizer, sums = loop
        optimizer.step()
        sums.accumulate(predictions, batch, loss)


def loop_parts(model, with_head: bool):
    """Adam as a run makes it, and the metric sums of the model's targets."""
    named = [(name, parameter) for name, parameter in model.named_parameters()]
    targets = ("mtt::vector",) if with_head else ()
    return make_optimizer(named, TrainingOptions()), MetricSums("cpu", targets)


def operator_calls(model, batch, counts) -> int:
    with torch.profiler.profile() as profile:
        step(model, batch, counts)
    return sum(event.count for event in profile.key_averages() if event.key.startswith("aten::"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--architecture", default="soap_bpnn", choices=registry.known())
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--whole-step", action="store_true")
    parser.add_argument(
        "--clock",
        choices=["wall", "thread"],
        default="wall",
        help="thread: this thread's CPU time (with --threads 1: the time the step itself "
        "ran, whatever other jobs took from it)",
    )
    arguments = parser.parse_args()
    global CLOCK
    CLOCK = time.thread_time if arguments.clock == "thread" else time.perf_counter
    torch.set_num_threads(arguments.threads)
    frames = structures()
    cases = {name: case(arguments.architecture, name, frames) for name in (False, True)}
    loops = {
        name: loop_parts(cases[name][0], name) if arguments.whole_step else None for name in cases
    }
    times: dict[bool, list[float]] = {False: [], True: []}
    for name, (model, batches, counts) in cases.items():  # warm-up
        for batch, count in zip(batches, counts):
            step(model, batch, count, loops[name])
    for _ in range(arguments.rounds):
        for name, (model, batches, counts) in cases.items():
            started = CLOCK()
            for index in range(arguments.steps):
                position = index % len(batches)
                step(model, batches[position], counts[position], loops[name])
            times[name].append((CLOCK() - started) / arguments.steps * 1e3)
    alone, headed = (float(np.median(times[name])) for name in (False, True))
    # each round's two cases ran back to back: their ratio cancels a drift of the
    # machine's speed that the medians over all rounds keep (another job starting)
    ratios = np.array(times[True]) / np.array(times[False])
    low, middle, high = np.percentile(100 * (ratios - 1), [25, 50, 75])
    calls = {name: operator_calls(model, b[0], c[0]) for name, (model, b, c) in cases.items()}
    what = "the loop's whole step (Adam, metric sums)" if arguments.whole_step else "steps"
    print(
        f"{arguments.architecture}, ethanol, batch 8, float32, {arguments.threads} thread(s), "
        f"{arguments.rounds} x {arguments.steps} {what} each, alternated"
    )
    print(f"energy and forces: {alone:.2f} ms per step, {calls[False]} operator calls")
    print(f"+ a vector per structure: {headed:.2f} ms per step, {calls[True]} operator calls")
    print(f"the head costs {100 * (headed / alone - 1):+.1f} % (ratio of the medians)")
    print(
        f"per round, back to back: median {middle:+.1f} %, quartiles {low:+.1f} % to {high:+.1f} %"
    )


if __name__ == "__main__":
    main()
