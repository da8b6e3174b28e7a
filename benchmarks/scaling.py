"""atomtrain strong scaling on this machine: 1 process x 1 thread, 1 x 2 threads,
--nproc 2 x 1 thread, same data and global batch (so the same model).

    python benchmarks/scaling.py [--structures 300] [--epochs 4] [--batch-size 8] [--repeats 2]
                                 [--max-atoms N] [--compile]

A last row measures what the machine allows: two separate one-thread runs started
together, each on its own core, each with half the global batch (a rank's share of a
step), with no communication at all. Its speed-up is their summed throughput over one
process alone; `--nproc 2` does the same work plus one all-reduce per step and the wait
for the slower rank, so it cannot beat it, and where the two cores slow each other down
(shared memory bandwidth or caches) the row shows by how much.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path

import yaml
from compare_metatrain import EPOCH_LINE, ROOT, run_measured, validation_size, write_inputs

CONFIGS = [
    ("1 process x 1 thread", 1, []),
    ("1 process x 2 threads", 2, []),
    ("--nproc 2 x 1 thread", 1, ["--nproc", "2"]),
    ("2 runs at once, half batch", 1, []),
]
TOGETHER = CONFIGS[-1][0]


def epoch_rate(command, directory, threads, n_train) -> float:
    """Training structures per second between the first and the last epoch line."""
    _, marks, _ = run_measured(command, directory, threads, EPOCH_LINE["atomtrain"])
    return n_train / ((marks[-1] - marks[0]) / (len(marks) - 1))


def rate_together(command, directories, threads, n_train) -> float:
    """Summed throughput of two copies of ``command`` started together, each in its own
    directory and pinned to its own core."""

    def one(core: int) -> float:
        pinned = ["taskset", "-c", str(core), *command]
        return epoch_rate(pinned, directories[core], threads, n_train)

    with ThreadPoolExecutor(2) as pool:
        return sum(pool.map(one, (0, 1)))


def limit_atoms_per_batch(options: Path, limit: int) -> None:
    data = yaml.safe_load(options.read_text())
    data["architecture"]["training"]["max_atoms_per_batch"] = limit
    options.write_text(yaml.safe_dump(data))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--structures", type=int, default=300)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--datasets", nargs="+", default=["ethanol", "tio2"])
    parser.add_argument("--batch-size", type=int, default=8, help="global batch size")
    parser.add_argument(
        "--repeats",
        type=int,
        default=2,
        help="rounds over all configurations; each configuration's fastest run counts, "
        "and the median over rounds of each round's own speed-up is printed beside it",
    )
    parser.add_argument(
        "--max-atoms",
        type=int,
        default=None,
        help="pack batches by atom count (max_atoms_per_batch) instead of --batch-size",
    )
    parser.add_argument(
        "--compile",
        action="store_true",
        help="every configuration compiles its training step (the first epoch, with the "
        "compilation, is left out of the throughput as every first epoch is)",
    )
    arguments = parser.parse_args()
    compiled = ["-r", "architecture.training.compile=true"] if arguments.compile else []
    n_train = arguments.structures - validation_size(arguments.structures)
    packing = f", packed by atoms (at most {arguments.max_atoms})" if arguments.max_atoms else ""
    print(
        f"global batch {arguments.batch_size}{packing}, {arguments.structures} structures, "
        f"best of {arguments.repeats} runs"
    )
    print(
        f"{'data':<10}{'configuration':<26}{'structures/s':>14}{'speed-up':>10}"
        f"{'median of rounds':>18}"
    )
    for name in arguments.datasets:
        runs = []
        for label, threads, extra in CONFIGS:
            directory = ROOT / "benchmarks" / "runs" / "scaling" / name / label.split()[0]
            together = label == TOGETHER
            places = [directory / "copy0", directory / "copy1"] if together else [directory]
            batch_size = arguments.batch_size // 2 if together else arguments.batch_size
            for place in places:
                place.mkdir(parents=True, exist_ok=True)
                options = write_inputs(
                    place, name, arguments.structures, arguments.epochs, batch_size
                )
                if arguments.max_atoms:
                    limit = arguments.max_atoms // 2 if together else arguments.max_atoms
                    limit_atoms_per_batch(options, limit)
            command = [sys.executable, "-m", "atomtrain", "train", options.name, *extra, *compiled]
            measure = rate_together if together else epoch_rate
            where = places if together else directory
            runs.append((label, partial(measure, command, where, threads, n_train)))
        # round-robin, so that the machine's drift (up to 20 % over half an hour on a
        # shared virtual machine) reaches every configuration alike
        rounds = [{label: run() for label, run in runs} for _ in range(arguments.repeats)]
        first = CONFIGS[0][0]
        for label, _, _ in CONFIGS:
            rate = max(found[label] for found in rounds)
            fastest = rate / max(found[first] for found in rounds)
            # a round's configurations run within a minute or two of each other, so its
            # own ratios are the least touched by the drift
            within = statistics.median(found[label] / found[first] for found in rounds)
            print(
                f"{name:<10}{label:<26}{rate:>14.1f}{fastest:>10.2f}{within:>18.2f}",
                flush=True,
            )


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    main()
