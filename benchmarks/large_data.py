"""Large data sets: conversion of extended XYZ into a memory-mapped directory.

    python benchmarks/large_data.py [--sizes 10000 100000] [--workdir /tmp/atomtrain-large]

A generator writes synthetic sets of small molecules: the 1,000 real ethanol geometries
of examples/ethanol, each copy perturbed by 0.02 A Gaussian noise, with the energies
and forces of the original frame (the values do not matter for these measures). For
each size it runs `atomtrain convert` with 1 and 2 processes and reports the wall time,
the peak RSS of the main process and of its largest worker (getrusage), the size on
disk against the raw arrays, and checks that both directories are byte-identical.
Measures and prints; asserts nothing.
"""

from __future__ import annotations

import argparse
import filecmp
import shutil
import subprocess
import sys
import time
from pathlib import Path

import ase.io
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "examples" / "ethanol" / "ethanol_1000.xyz"

MEASURED = """
import resource, subprocess, sys, time
start = time.perf_counter()
code = subprocess.call(sys.argv[1:])
wall = time.perf_counter() - start
children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
print(f"{code} {wall:.3f} {children}")
"""


def generate(path: Path, count: int) -> None:
    """``count`` perturbed ethanol molecules, written in chunks (constant memory)."""
    originals = ase.io.read(SOURCE, ":")
    generator = np.random.default_rng(0)
    with open(path, "w") as stream:
        for first in range(0, count, 1000):
            chunk = []
            for index in range(first, min(first + 1000, count)):
                atoms = originals[index % len(originals)].copy()
                atoms.calc = originals[index % len(originals)].calc
                atoms.positions += generator.normal(0.0, 0.02, atoms.positions.shape)
                chunk.append(atoms)
            ase.io.write(stream, chunk, format="extxyz")


def raw_bytes(count: int, atoms_per_structure: int = 9) -> int:
    """float32 positions, int32 types, float32 cells, energies and forces."""
    atoms = count * atoms_per_structure
    return atoms * 3 * 4 + atoms * 4 + count * 9 * 4 + count * 4 + atoms * 3 * 4


def run_convert(data: Path, output: Path, processes: int) -> tuple[float, int]:
    command = [sys.executable, "-m", "atomtrain", "convert", str(data), "-o", str(output)]
    command += ["--nproc", str(processes)]
    result = subprocess.run(
        [sys.executable, "-c", MEASURED, *command], capture_output=True, text=True, check=True
    )
    code, wall, peak_kb = result.stdout.strip().splitlines()[-1].split()
    if code != "0":
        raise RuntimeError(f"convert failed: {result.stderr[-2000:]}")
    return float(wall), int(peak_kb)


def directory_size(path: Path) -> int:
    return sum(file.stat().st_size for file in path.iterdir())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/atomtrain-large"))
    arguments = parser.parse_args()
    arguments.workdir.mkdir(parents=True, exist_ok=True)
    rows = []
    for size in arguments.sizes:
        data = arguments.workdir / f"ethanol_{size}.xyz"
        if not data.exists():
            start = time.perf_counter()
            generate(data, size)
            print(f"generated {data} in {time.perf_counter() - start:.1f} s", flush=True)
        results = {}
        for processes in (1, 2):
            output = arguments.workdir / f"ethanol_{size}_p{processes}"
            shutil.rmtree(output, ignore_errors=True)
            results[processes] = run_convert(data, output, processes)
            print(f"{size} structures, {processes} process(es): {results[processes]}", flush=True)
        one, two = (arguments.workdir / f"ethanol_{size}_p{p}" for p in (1, 2))
        identical = all(
            filecmp.cmp(one / name.name, two / name.name, shallow=False) for name in one.iterdir()
        )
        metatrain_files = ("ns.npy", "na.npy", "x.bin", "a.bin", "c.bin", "energy.bin")
        layout = sum((one / name).stat().st_size for name in (*metatrain_files, "forces.bin"))
        rows.append((size, results, data.stat().st_size, directory_size(one), layout, identical))
    print()
    print(
        "| structures | xyz size | convert, 1 process | convert, 2 processes | speed-up | "
        "peak RSS (largest process) 1 / 2 | directory | metatrain's files / raw arrays | "
        "byte-identical |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for size, results, xyz, total, layout, identical in rows:
        (wall1, rss1), (wall2, rss2) = results[1], results[2]
        print(
            f"| {size:,} | {xyz / 1e6:.0f} MB | {wall1:.1f} s | {wall2:.1f} s | "
            f"{wall1 / wall2:.2f}x | {rss1 / 1024:.0f} / {rss2 / 1024:.0f} MB | "
            f"{total / 1e6:.1f} MB | {layout / raw_bytes(size):.3f} | {identical} |"
        )


if __name__ == "__main__":
    main()
