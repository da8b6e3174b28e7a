"""atomtrain strong scaling on this machine: 1 process x 1 thread, 1 x 2 threads,
--nproc 2 x 1 thread, same data and global batch (so the same model).

    python benchmarks/scaling.py [--structures 300] [--epochs 4] [--batch-size 8] [--repeats 2]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from compare_metatrain import EPOCH_LINE, ROOT, run_measured, validation_size, write_inputs

CONFIGS = [
    ("1 process x 1 thread", 1, []),
    ("1 process x 2 threads", 2, []),
    ("--nproc 2 x 1 thread", 1, ["--nproc", "2"]),
]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--structures", type=int, default=300)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--datasets", nargs="+", default=["ethanol", "tio2"])
    parser.add_argument("--batch-size", type=int, default=8, help="global batch size")
    parser.add_argument(
        "--repeats", type=int, default=2, help="runs per configuration; the fastest counts"
    )
    arguments = parser.parse_args()
    n_train = arguments.structures - validation_size(arguments.structures)
    print(
        f"global batch {arguments.batch_size}, {arguments.structures} structures, "
        f"best of {arguments.repeats} runs"
    )
    print(f"{'data':<10}{'configuration':<26}{'structures/s':>14}{'speed-up':>10}")
    for name in arguments.datasets:
        baseline = None
        for label, threads, extra in CONFIGS:
            directory = ROOT / "benchmarks" / "runs" / "scaling" / name / label.split()[0]
            directory.mkdir(parents=True, exist_ok=True)
            options = write_inputs(
                directory, name, arguments.structures, arguments.epochs, arguments.batch_size
            )
            command = [sys.executable, "-m", "atomtrain", "train", options.name, *extra]
            rates = []
            for _ in range(arguments.repeats):
                _, marks, _ = run_measured(command, directory, threads, EPOCH_LINE["atomtrain"])
                rates.append(n_train / ((marks[-1] - marks[0]) / (len(marks) - 1)))
            rate = max(rates)
            baseline = baseline or rate
            print(f"{name:<10}{label:<26}{rate:>14.1f}{rate / baseline:>10.2f}", flush=True)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    main()
