"""Time to build one training batch from a data set, by source and neighbor-list cache.

    python benchmarks/batch_building.py DATA [DATA ...] [--batch-size 16] [--cutoff 5.0]

DATA: an extended XYZ file (read into arrays) or a memory-mapped directory (e.g. the
ones benchmarks/lazy_data.py writes). For each, 100 random batches are built three
ways: "cold" (first time: neighbor lists computed and cached), "warm" (the same batches
again, from the cache), "no cache" (a cache with no room left: computed every time).
Prints milliseconds per batch; asserts nothing.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from atomtrain.data import columns as columns_module
from atomtrain.data import read_structures


def per_batch(structures, batches, cutoff: float) -> float:
    start = time.perf_counter()
    for batch in batches:
        structures.batch(batch, cutoff)
    return (time.perf_counter() - start) / len(batches) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("data", nargs="+")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--cutoff", type=float, default=5.0)
    arguments = parser.parse_args()
    cache = columns_module.NEIGHBOR_CACHE
    print("| data | cold | warm | no cache |")
    print("|---|---|---|---|")
    for path in arguments.data:
        generator = np.random.default_rng(0)
        structures = read_structures(path)
        batches = [
            generator.choice(len(structures), arguments.batch_size, replace=False).tolist()
            for _ in range(100)
        ]
        cold = per_batch(structures, batches, arguments.cutoff)
        warm = per_batch(structures, batches, arguments.cutoff)
        used, cache.used = cache.used, cache.budget  # no room: nothing is kept
        uncached = per_batch(read_structures(path), batches, arguments.cutoff)
        cache.used = used
        print(f"| {path} | {cold:.2f} ms | {warm:.2f} ms | {uncached:.2f} ms |")


if __name__ == "__main__":
    main()
