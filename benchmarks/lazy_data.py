"""Training from a memory-mapped directory of a million structures: time to the first
step, memory per process, and throughput against the same data read into memory.

    python benchmarks/lazy_data.py [--size 1000000] [--processes 1 2]
        [--throughput-size 10000] [--workdir /tmp/atomtrain-large]

Data: the 1,000 real ethanol geometries of examples/ethanol, each copy perturbed by
0.02 A Gaussian noise, with the energies and forces of its original frame (the values
do not matter for these measures), written as extended XYZ by a fast text writer and
converted with ``atomtrain convert --nproc 2``.

1. Time to the first step: ``atomtrain train`` (examples/ethanol's SOAP-BPNN, 5 %
   validation and 5 % test) on the directory, with each number of processes. The run is
   stopped by SIGTERM once it logs its first step (it checkpoints and exits 75); the
   table gives the setup time the run logs, the wall time to that line, and per
   process, read from /proc at that moment: resident memory and its private part (the
   mapped files' pages are shared between the processes and with the page cache).
2. Throughput on ``--throughput-size`` structures: epochs 2 and 3 of the same run read
   from the extended XYZ file (arrays in memory) and from its converted directory, with
   ``num_workers`` 0 and 1, and with the neighbor-list cache off
   (ATOMTRAIN_NEIGHBOR_CACHE_MB=0), one process.

Measures and prints; asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import ase.io
import numpy as np
import yaml

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "examples" / "ethanol" / "ethanol_1000.xyz"
FIRST_STEP = re.compile(r"first training step done ([0-9.]+) s after the setup began")
EPOCH = re.compile(r"epoch (\d+)/\d+ .*\| ([0-9.]+) s$")


def generate(path: Path, count: int) -> None:
    """``count`` perturbed ethanol molecules as extended XYZ, a block at a time."""
    originals = ase.io.read(SOURCE, ":")
    symbols = originals[0].get_chemical_symbols()
    positions = np.stack([atoms.positions for atoms in originals])
    forces = np.stack([atoms.get_forces() for atoms in originals])
    energies = np.array([atoms.get_potential_energy() for atoms in originals])
    generator = np.random.default_rng(0)
    header = 'Properties=species:S:1:pos:R:3:forces:R:3 energy={:.10f} pbc="F F F"\n'
    with open(path, "w") as stream:
        for first in range(0, count, 10_000):
            lines = []
            for index in range(first, min(first + 10_000, count)):
                source = index % len(originals)
                moved = positions[source] + generator.normal(0.0, 0.02, positions[source].shape)
                lines.append(f"{len(symbols)}\n" + header.format(energies[source]))
                for symbol, xyz, force in zip(symbols, moved, forces[source]):
                    lines.append(
                        f"{symbol} {xyz[0]:.8f} {xyz[1]:.8f} {xyz[2]:.8f} "
                        f"{force[0]:.8f} {force[1]:.8f} {force[2]:.8f}\n"
                    )
            stream.write("".join(lines))


def convert(data: Path, output: Path) -> float:
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "atomtrain", "convert", str(data), "-o", str(output)]
        + ["--nproc", "2"],
        check=True,
        capture_output=True,
    )
    return time.perf_counter() - start


def options_file(directory: Path, data: Path, epochs: int, workers: int | None) -> Path:
    options = yaml.safe_load((ROOT / "examples" / "ethanol" / "options.yaml").read_text())
    options["training_set"]["systems"]["read_from"] = str(data)
    options["validation_set"] = 0.05
    options["test_set"] = 0.05
    training = options["architecture"]["training"]
    training.update(num_epochs=epochs, log_interval=1, batch_size=16)
    if workers is not None:
        training["num_workers"] = workers
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "options.yaml"
    path.write_text(yaml.safe_dump(options))
    return path


def descendants(pid: int) -> list[int]:
    found = []
    for child in Path("/proc").glob("[0-9]*"):
        try:
            parent = int((child / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        if parent == pid:
            found += [int(child.name), *descendants(int(child.name))]
    return found


def memory(pid: int) -> tuple[float, float] | None:
    """(resident, private) MB of a process, from /proc/PID/smaps_rollup."""
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return None
    values = {
        line.split(":")[0]: int(line.split()[1]) for line in text.splitlines()[1:] if ":" in line
    }
    private = values.get("Private_Clean", 0) + values.get("Private_Dirty", 0)
    return values.get("Rss", 0) / 1024, private / 1024


def first_step(data: Path, workdir: Path, processes: int) -> dict:
    directory = workdir / f"first_step_p{processes}"
    shutil.rmtree(directory, ignore_errors=True)
    options = options_file(directory, data, 1, None)
    command = [sys.executable, "-m", "atomtrain", "train", str(options), "-o", "model.pt"]
    if processes > 1:
        command += ["--nproc", str(processes)]
    start = time.perf_counter()
    log = open(directory / "stderr.log", "w+")  # noqa: SIM115
    process = subprocess.Popen(
        command, cwd=directory, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    result: dict = {}
    while process.poll() is None:
        time.sleep(0.5)
        log.seek(0)
        found = FIRST_STEP.search(log.read())
        if found:
            result["wall"] = time.perf_counter() - start
            result["setup"] = float(found.group(1))
            pids = [process.pid, *descendants(process.pid)]
            measured = [memory(pid) for pid in pids]
            result["memory"] = [value for value in measured if value and value[0] > 100]
            os.killpg(process.pid, signal.SIGTERM)
            break
    result["exit"] = process.wait()
    log.seek(0)
    result["log_tail"] = log.read()[-1500:]
    return result


def throughput(data: Path, workdir: Path, name: str, workers: int, cache_mb: str) -> list[float]:
    directory = workdir / f"throughput_{name}_w{workers}_c{cache_mb}"
    shutil.rmtree(directory, ignore_errors=True)
    options = options_file(directory, data, 3, workers)
    environment = {**os.environ, "ATOMTRAIN_NEIGHBOR_CACHE_MB": cache_mb}
    completed = subprocess.run(
        [sys.executable, "-m", "atomtrain", "train", str(options), "-o", "model.pt"],
        cwd=directory,
        env=environment,
        capture_output=True,
        text=True,
    )
    output = completed.stdout + completed.stderr
    seconds = [float(m.group(2)) for m in map(EPOCH.search, output.splitlines()) if m]
    if completed.returncode != 0 or len(seconds) < 3:
        raise RuntimeError(output[-2000:])
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=1_000_000)
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 2])
    parser.add_argument(
        "--throughput-size", type=int, default=10_000, help="0: no throughput rows"
    )
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/atomtrain-large"))
    arguments = parser.parse_args()
    workdir = arguments.workdir
    workdir.mkdir(parents=True, exist_ok=True)
    directories = {}
    for size in sorted({arguments.size, arguments.throughput_size} - {0}):
        xyz = workdir / f"ethanol_fast_{size}.xyz"
        directory = workdir / f"ethanol_fast_{size}"
        if not xyz.exists():
            start = time.perf_counter()
            generate(xyz, size)
            print(f"generated {xyz} in {time.perf_counter() - start:.1f} s", flush=True)
        if not directory.exists():
            print(f"converted in {convert(xyz, directory):.1f} s (2 processes)", flush=True)
        directories[size] = (xyz, directory)
    if arguments.size:
        print(
            f"\n| {arguments.size:,} structures | setup (logged) | wall to first step | "
            "per process: resident / private MB |"
        )
        print("|---|---|---|---|")
        for processes in arguments.processes:
            result = first_step(directories[arguments.size][1], workdir, processes)
            if "wall" not in result:
                print(f"run with {processes} process(es) ended before its first step:")
                print(result["log_tail"])
                continue
            per_process = ", ".join(
                f"{rss:.0f} / {private:.0f}" for rss, private in result["memory"]
            )
            print(
                f"| {processes} process(es) | {result['setup']:.1f} s | {result['wall']:.1f} s | "
                f"{per_process} | (exit {result['exit']} after SIGTERM)",
                flush=True,
            )
    if not arguments.throughput_size:
        return
    xyz, directory = directories[arguments.throughput_size]
    print(
        f"\n| {arguments.throughput_size:,} structures, 1 process | num_workers | "
        "neighbor cache | epoch 2 | epoch 3 |"
    )
    print("|---|---|---|---|---|")
    for name, data in (("xyz", xyz), ("directory", directory)):
        for workers in (0, 1):
            for cache in ("1024", "0"):
                seconds = throughput(data, workdir, name, workers, cache)
                print(
                    f"| {name} | {workers} | {'on' if cache != '0' else 'off'} | "
                    f"{seconds[1]:.1f} s | {seconds[2]:.1f} s |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
