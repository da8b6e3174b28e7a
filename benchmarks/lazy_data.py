"""Training from memory-mapped directories of up to a million structures: conversion,
size on disk, time to the first step, memory per process, and throughput against the
same data read into memory.

    python benchmarks/lazy_data.py [--kinds ethanol emt] [--sizes 10000 100000 1000000]
        [--xyz-up-to 100000] [--throughput-sizes 10000 100000] [--repeats 2]
        [--watch-seconds 0] [--workdir /tmp/atomtrain-large]

Two synthetic kinds of data, written as extended XYZ by a fast text writer:
- ``ethanol``: the 1,000 real ethanol geometries of examples/ethanol, each copy
  perturbed by 0.02 A Gaussian noise, with the energies and forces of its original
  frame;
- ``emt``: 64-atom periodic Cu/Au cells (fcc, random composition, 2 % random strain,
  0.1 A rattle) labelled by ASE's EMT (energy, forces, stress); 2,000 cells are
  labelled (7 ms each), larger sets are copies of them perturbed by 0.01 A with their
  labels (the values do not matter for these measures).

For each kind and size:
1. ``atomtrain convert`` with 1 and 2 processes (wall time; the two directories are
   compared byte for byte), the directory's size against the raw float32/int32 arrays.
2. Time to the first step: ``atomtrain train`` (SOAP-BPNN of examples/ethanol, float32,
   batch 16, 5 % validation and test) on the directory, and on the xyz file up to
   ``--xyz-up-to`` structures, with 1 and 2 processes. The run is stopped by SIGTERM
   once it logs its first step (it checkpoints and exits 75); the table gives the
   setup time it logs, the wall time to that line and, per process, VmRSS and RssAnon
   from /proc/PID/status at that moment (RssAnon is private; mapped data files' pages
   are shared and reclaimable). With 2 processes the first entry is the launcher. With
   ``--watch-seconds S`` training goes on S seconds more, RssAnon sampled every 0.5 s,
   and the largest value per process is reported too, with the training rate over that
   time (steps after the first times the batch size, or the epoch's rate when the
   epoch ends first).
3. Throughput for the sizes in ``--throughput-sizes``: one epoch (1 % validation),
   directory and xyz alternated ``--repeats`` times, one process, structures per
   second over the epoch as logged.

Measures and prints; asserts nothing.
"""

from __future__ import annotations

import argparse
import filecmp
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import ase
import ase.build
import ase.io
import numpy as np
import yaml
from ase.calculators.emt import EMT

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "examples" / "ethanol" / "ethanol_1000.xyz"
FIRST_STEP = re.compile(r"first training step done ([0-9.]+) s after the setup began")
EPOCH = re.compile(r"epoch (\d+)/\d+ .*\| ([0-9.]+) s$")
STOPPED = re.compile(r"stopped by SIGTERM at epoch \d+, step (\d+)")
TRAINING = re.compile(r"data: (\d+) training")
BATCH_SIZE = 16
LABELLED_CELLS = 2_000


def ethanol_templates() -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray, None, float]:
    originals = ase.io.read(SOURCE, ":")
    return (
        originals[0].get_chemical_symbols(),
        np.stack([atoms.positions for atoms in originals]),
        np.stack([atoms.get_forces() for atoms in originals]),
        np.array([atoms.get_potential_energy() for atoms in originals]),
        None,
        0.02,
    )


def emt_templates(count: int) -> list[ase.Atoms]:
    generator = np.random.default_rng(1)
    cells = []
    for _ in range(count):
        atoms = ase.build.bulk("Cu", "fcc", a=3.7, cubic=True) * (2, 2, 4)
        atoms.numbers = np.where(generator.random(len(atoms)) < 0.3, 79, 29)
        strain = np.eye(3) + generator.normal(0.0, 0.02, (3, 3))
        atoms.set_cell(atoms.cell.array @ strain, scale_atoms=True)
        atoms.positions += generator.normal(0.0, 0.1, atoms.positions.shape)
        atoms.calc = EMT()
        atoms.info["energy"] = atoms.get_potential_energy()
        atoms.arrays["forces"] = atoms.get_forces()
        atoms.info["stress"] = atoms.get_stress(voigt=False).reshape(9)
        cells.append(atoms)
    return cells


def generate(kind: str, path: Path, count: int) -> None:
    """``count`` structures of ``kind`` as extended XYZ, a block at a time."""
    generator = np.random.default_rng(0)
    if kind == "ethanol":
        symbols, positions, forces, energies, _, noise = ethanol_templates()
        templates = [
            (symbols, positions[i], forces[i], energies[i], None) for i in range(len(energies))
        ]
    else:
        noise = 0.01
        templates = [
            (a.get_chemical_symbols(), a.positions, a.arrays["forces"], a.info["energy"], a)
            for a in emt_templates(min(count, LABELLED_CELLS))
        ]
    with open(path, "w") as stream:
        for first in range(0, count, 10_000):
            lines = []
            for index in range(first, min(first + 10_000, count)):
                symbols, positions, forces, energy, cell = templates[index % len(templates)]
                moved = positions + generator.normal(0.0, noise, positions.shape)
                if cell is None:
                    header = (
                        "Properties=species:S:1:pos:R:3:forces:R:3 "
                        f'energy={energy:.10f} pbc="F F F"'
                    )
                else:
                    lattice = " ".join(f"{v:.10f}" for v in cell.cell.array.reshape(-1))
                    stress = " ".join(f"{v:.10f}" for v in cell.info["stress"])
                    header = (
                        f'Lattice="{lattice}" Properties=species:S:1:pos:R:3:forces:R:3 '
                        f'energy={energy:.10f} stress="{stress}" pbc="T T T"'
                    )
                lines.append(f"{len(symbols)}\n{header}\n")
                for symbol, xyz, force in zip(symbols, moved, forces):
                    lines.append(
                        f"{symbol} {xyz[0]:.8f} {xyz[1]:.8f} {xyz[2]:.8f} "
                        f"{force[0]:.8f} {force[1]:.8f} {force[2]:.8f}\n"
                    )
            stream.write("".join(lines))


def raw_bytes(directory: Path) -> int:
    """float32 positions, forces, cells, energies (stress), int32 types."""
    structures = int(np.load(directory / "ns.npy").reshape(-1)[0])
    atoms = int(np.load(directory / "na.npy")[-1])
    stress = 36 * structures if (directory / "stress.bin").exists() else 0
    return atoms * (12 + 4 + 12) + structures * (36 + 4) + stress


def convert(data: Path, output: Path, processes: int) -> tuple[float, float]:
    """Wall time of the command, and the conversion's own time as it prints it (without
    the interpreter's start and imports)."""
    shutil.rmtree(output, ignore_errors=True)
    start = time.perf_counter()
    completed = subprocess.run(
        [sys.executable, "-m", "atomtrain", "convert", str(data), "-o", str(output)]
        + ["--nproc", str(processes)],
        check=True,
        capture_output=True,
        text=True,
    )
    wall = time.perf_counter() - start
    return wall, float(re.search(r" in ([0-9.]+) s with", completed.stdout).group(1))


def options_file(directory: Path, data: Path, validation: float) -> Path:
    options = yaml.safe_load((ROOT / "examples" / "ethanol" / "options.yaml").read_text())
    options["training_set"]["systems"]["read_from"] = str(data)
    options["validation_set"] = validation
    options["test_set"] = 0.05
    options["architecture"]["training"].update(num_epochs=1, log_interval=1, batch_size=BATCH_SIZE)
    if "emt" in data.name:
        options["training_set"]["targets"]["energy"]["stress"] = True
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
    """(VmRSS, RssAnon) MB of a process, from /proc/PID/status."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    values = {
        line.split(":")[0]: int(line.split()[1]) for line in text.splitlines() if "kB" in line
    }
    return values.get("VmRSS", 0) / 1024, values.get("RssAnon", 0) / 1024


def first_step(data: Path, workdir: Path, processes: int, watch: float) -> dict:
    """Time to the first step and memory then; with ``watch`` seconds, also the largest
    RssAnon per process sampled while training goes on that long."""
    directory = workdir / f"first_step_{data.name}_p{processes}"
    shutil.rmtree(directory, ignore_errors=True)
    options = options_file(directory, data, 0.05)
    command = [sys.executable, "-m", "atomtrain", "train", str(options)]
    if processes > 1:
        command += ["--nproc", str(processes)]
    start = time.perf_counter()
    log = open(directory / "output.log", "w+")  # noqa: SIM115
    process = subprocess.Popen(
        command, cwd=directory, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    result: dict = {}
    while process.poll() is None:
        time.sleep(0.2)
        log.seek(0)
        found = FIRST_STEP.search(log.read())
        if found:
            result["wall"] = time.perf_counter() - start
            result["setup"] = float(found.group(1))
            pids = [process.pid, *descendants(process.pid)]
            measured = [memory(pid) for pid in pids]
            result["memory"] = [value for value in measured if value and value[0] > 100]
            peaks = [anon for _, anon in result["memory"]]
            watched_until = time.perf_counter() + watch
            while time.perf_counter() < watched_until and process.poll() is None:
                time.sleep(0.5)
                for position, pid in enumerate(pids[: len(peaks)]):
                    value = memory(pid)
                    if value:
                        peaks[position] = max(peaks[position], value[1])
            result["peak_anon"] = peaks
            watched = time.perf_counter() - (watched_until - watch)
            if process.poll() is None:  # a small set may finish its epoch while watched
                os.killpg(process.pid, signal.SIGTERM)
            break
    result["exit"] = process.wait()
    log.seek(0)
    text = log.read()
    result["log_tail"] = text[-1500:]
    result["rate"] = watched_rate(text, watched) if watch and "wall" in result else None
    return result


def watched_rate(log: str, watched: float) -> float | None:
    """Training structures per second while watched: the steps after the first one over
    the watched time (the run stops at the step after the signal), or, when the epoch
    ended meanwhile, the epoch's logged rate."""
    stopped = STOPPED.search(log)
    if stopped:
        return (int(stopped.group(1)) - 1) * BATCH_SIZE / watched
    epochs = [float(m.group(2)) for m in map(EPOCH.search, log.splitlines()) if m]
    trained = TRAINING.search(log)
    return int(trained.group(1)) / epochs[0] if epochs and trained else None


def epoch_rate(data: Path, workdir: Path) -> float:
    """Training structures per second over one epoch, one process."""
    directory = workdir / f"throughput_{data.name}"
    shutil.rmtree(directory, ignore_errors=True)
    options = options_file(directory, data, 0.01)
    completed = subprocess.run(
        [sys.executable, "-m", "atomtrain", "train", str(options)],
        cwd=directory,
        capture_output=True,
        text=True,
    )
    output = completed.stdout + completed.stderr
    seconds = [float(m.group(2)) for m in map(EPOCH.search, output.splitlines()) if m]
    trained = re.search(r"data: (\d+) training", output)
    if completed.returncode != 0 or not seconds or trained is None:
        raise RuntimeError(output[-2000:])
    return int(trained.group(1)) / seconds[0]


def describe_memory(result: dict) -> str:
    return ", ".join(f"{rss:.0f} / {anon:.0f}" for rss, anon in result["memory"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kinds", nargs="+", default=["ethanol", "emt"])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--xyz-up-to", type=int, default=100_000)
    parser.add_argument("--convert-up-to", type=int, default=1_000_000)
    parser.add_argument("--throughput-sizes", type=int, nargs="*", default=[10_000, 100_000])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--watch-seconds", type=float, default=0.0)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/atomtrain-large"))
    arguments = parser.parse_args()
    workdir = arguments.workdir
    workdir.mkdir(parents=True, exist_ok=True)
    conversions, starts, rates = [], [], []
    for kind in arguments.kinds:
        for size in arguments.sizes:
            xyz = workdir / f"{kind}_{size}.xyz"
            directory = workdir / f"{kind}_{size}"
            if not xyz.exists():
                start = time.perf_counter()
                generate(kind, xyz, size)
                print(f"generated {xyz} in {time.perf_counter() - start:.1f} s", flush=True)
            if size <= arguments.convert_up_to or not directory.exists():
                one, one_logged = convert(xyz, workdir / f"{kind}_{size}_one", 1)
                two, two_logged = convert(xyz, directory, 2)
                identical = all(
                    filecmp.cmp(file, directory / file.name, shallow=False)
                    for file in (workdir / f"{kind}_{size}_one").iterdir()
                )
                shutil.rmtree(workdir / f"{kind}_{size}_one")
                disk = sum(file.stat().st_size for file in directory.iterdir())
                metatrain_files = ("ns.npy", "na.npy", "x.bin", "a.bin", "c.bin")
                metatrain_files += ("energy.bin", "forces.bin", "stress.bin")
                layout = sum(
                    (directory / name).stat().st_size
                    for name in metatrain_files
                    if (directory / name).exists()
                )
                row = (
                    f"| {kind} | {size:,} | {xyz.stat().st_size / 1e6:,.0f} MB | {one:.1f} s | "
                    f"{two:.1f} s | {one / two:.2f}x | {one_logged:.1f} / {two_logged:.1f} s | "
                    f"{one_logged / two_logged:.2f}x | {disk / 1e6:,.1f} MB | "
                    f"{layout / raw_bytes(directory):.3f} | {identical} |"
                )
                conversions.append(row)
                print(row, flush=True)
            sources = [("directory", directory)] + (
                [("xyz", xyz)] if size <= arguments.xyz_up_to else []
            )
            for name, data in sources:
                for processes in (1, 2):
                    result = first_step(data, workdir, processes, arguments.watch_seconds)
                    if "wall" not in result:
                        print(f"{kind} {size} {name} {processes}: no first step")
                        print(result["log_tail"])
                        continue
                    row = (
                        f"| {kind} | {size:,} | {name} | {processes} | {result['setup']:.1f} s | "
                        f"{result['wall']:.1f} s | {describe_memory(result)} | "
                        + ", ".join(f"{peak:.0f}" for peak in result["peak_anon"])
                        + (f" | {result['rate']:.0f} |" if result["rate"] else " | |")
                    )
                    starts.append(row)
                    print(row, flush=True)
            if size in arguments.throughput_sizes:
                measured: dict[str, list[float]] = {"directory": [], "xyz": []}
                for _ in range(arguments.repeats):
                    for name, data in (("directory", directory), ("xyz", xyz)):
                        measured[name].append(epoch_rate(data, workdir))
                mean = {name: float(np.mean(values)) for name, values in measured.items()}
                row = (
                    f"| {kind} | {size:,} | "
                    + " | ".join(
                        ", ".join(f"{v:.0f}" for v in measured[name])
                        for name in ("directory", "xyz")
                    )
                    + f" | {mean['directory'] / mean['xyz']:.2f}x |"
                )
                rates.append(row)
                print(row, flush=True)
    print(
        "\n| kind | structures | xyz | convert, 1 process | 2 processes | speed-up | "
        "conversion as logged, 1 / 2 | speed-up | directory | metatrain's files / raw "
        "arrays | byte-identical |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    print("\n".join(conversions))
    print(
        "\n| kind | structures | data | processes | setup (logged) | command to first "
        f"step | per process: VmRSS / RssAnon MB | largest RssAnon in {arguments.watch_seconds:g} "
        "s of training, MB | structures/s while watched |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    print("\n".join(starts))
    print("\n| kind | structures | directory, structures/s | xyz, structures/s | directory / xyz |")
    print("|---|---|---|---|---|")
    print("\n".join(rates))


if __name__ == "__main__":
    main()
