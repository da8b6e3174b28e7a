"""SOAP-BPNN, MACE and PET in atomtrain: held-out force error against wall time.

    python benchmarks/mace_vs_soap_bpnn.py [--minutes 60] [--threads 2] [--data ethanol silicon]
        [--architectures soap_bpnn mace pet]
    python benchmarks/mace_vs_soap_bpnn.py --side-by-side   # two at once, one core each

Each architecture trains on the same split of each data set for ``--minutes`` of wall
time (then SIGTERM: atomtrain stops at a step boundary and writes its checkpoint). The
held-out part is given as the validation set, so the force RMSE that each epoch logs
is the held-out error; the curve is that error against the time since the start (read
off train.log's timestamps). Both use a constant learning rate (a cosine over a
number of epochs that a wall-time budget cuts short would be unfair to either) and the
examples' hyperparameters: SOAP-BPNN as examples/ethanol, MACE as examples/mace, PET
as examples/pet.
Prints each curve's points and the best error of each, and writes mace_vs_soap_bpnn.png.

``--side-by-side`` trains the two architectures of a data set at the same time, each
pinned to a core of its own with one thread (the machine needs two free cores): an
hour each on two data sets then takes two hours instead of four, and each model has
the same share of the machine.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

import ase.io
import yaml

ROOT = Path(__file__).resolve().parent.parent
# (training file, held-out file or the number of leading frames to train on)
DATA = {
    "ethanol": (ROOT / "examples/ethanol/ethanol_1000.xyz", 800),
    "silicon": (ROOT / "examples/silicon/si_train.xyz", ROOT / "examples/silicon/si_test.xyz"),
}
EPOCH = re.compile(r"^(\d\d:\d\d:\d\d) epoch (\d+)/\d+ .*validation: .*F RMSE ([\d.]+) meV/A")


def split(name: str, directory: Path) -> tuple[Path, Path, bool]:
    """Train and held-out files, and whether the data has stress."""
    path, held_out = DATA[name]
    frames = ase.io.read(path, ":")
    if isinstance(held_out, Path):
        train, test = path, held_out
    else:
        train, test = directory / f"{name}_train.xyz", directory / f"{name}_test.xyz"
        ase.io.write(train, frames[:held_out], format="extxyz")
        ase.io.write(test, frames[held_out:], format="extxyz")
    stress = frames[0].calc is not None and "stress" in frames[0].calc.results
    return train, test, stress


def options(architecture: str, train: Path, test: Path, stress: bool) -> dict:
    example = {"soap_bpnn": "ethanol"}.get(architecture, architecture)
    chosen = yaml.safe_load((ROOT / f"examples/{example}/options.yaml").read_text())
    chosen["architecture"]["training"].update(
        # no warmup: a fraction of 100000 epochs would be most of the budget
        {"num_epochs": 100000, "log_interval": 1, "lr_scheduler": "constant", "warmup_fraction": 0}
    )
    energy = {"key": "energy", "unit": "eV", "forces": True}
    if stress:
        energy["stress"] = True
    chosen["training_set"] = {"systems": str(train), "targets": {"energy": energy}}
    chosen["validation_set"] = {"systems": str(test), "targets": {"energy": energy}}
    chosen["test_set"] = 0.0
    return chosen


def curve(log: str, start: datetime) -> list[tuple[float, float]]:
    """(seconds since the start, held-out force RMSE in meV/A) of each epoch."""
    points = []
    for line in log.splitlines():
        found = EPOCH.match(line)
        if found:
            stamp = datetime.combine(start.date(), datetime.strptime(found[1], "%H:%M:%S").time())
            points.append(((stamp - start).total_seconds() % 86400, float(found[3])))
    return points


def start_training(options_path: Path, directory: Path, threads: int, core: int | None):
    """Start a training whose console output goes to a file (a pipe read only at the
    end fills up and stalls the run)."""
    environment = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    command = [sys.executable, "-m", "atomtrain", "train", str(options_path)]
    command += ["--outputs", str(directory / "outputs")]
    pin = None if core is None else (lambda: os.sched_setaffinity(0, {core}))
    with (directory / "console.txt").open("w") as stream:
        return subprocess.Popen(
            command,
            cwd=directory,
            env=environment,
            stdout=stream,
            stderr=subprocess.STDOUT,
            preexec_fn=pin,
        )


def stop_after(seconds: float, processes: list[subprocess.Popen]) -> None:
    """SIGTERM each process still running ``seconds`` from now (atomtrain then stops
    at a step boundary and writes its checkpoint)."""
    deadline = time.monotonic() + seconds
    while any(process.poll() is None for process in processes) and time.monotonic() < deadline:
        time.sleep(1)
    for process in processes:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
    for process in processes:
        process.wait()


def report(name: str, architecture: str, points: list[tuple[float, float]]) -> None:
    best = min((error for _, error in points), default=float("nan"))
    shown = ", ".join(
        f"{seconds:.0f} s: {error:.1f}" for seconds, error in points[:: max(1, len(points) // 12)]
    )
    print(f"{name} {architecture}: {len(points)} epochs, best held-out F RMSE {best:.1f} meV/A")
    print(f"  {shown}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--minutes", type=float, default=60)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--data", nargs="+", default=list(DATA), choices=list(DATA))
    parser.add_argument("--side-by-side", action="store_true")
    parser.add_argument("--architectures", nargs="+", default=["soap_bpnn", "mace", "pet"])
    arguments = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="mace_vs_soap_"))
    threads = 1 if arguments.side_by_side else arguments.threads
    how = "side by side, one core each" if arguments.side_by_side else "one after the other"
    print(f"{arguments.minutes:g} minutes each, {threads} threads, {how}, work in {work}")
    architectures = tuple(arguments.architectures)
    if arguments.side_by_side and len(architectures) > len(os.sched_getaffinity(0)):
        parser.error(f"--side-by-side pins each of {len(architectures)} runs to a core of its own")
    curves = {}
    for name in arguments.data:
        train, test, stress = split(name, work)
        # one group when side by side, else one group per architecture
        groups = [architectures] if arguments.side_by_side else [(a,) for a in architectures]
        for group in groups:
            start = datetime.now().replace(microsecond=0)
            processes = []
            for core, architecture in enumerate(group):
                directory = work / f"{name}_{architecture}"
                directory.mkdir()
                path = directory / "options.yaml"
                path.write_text(yaml.safe_dump(options(architecture, train, test, stress)))
                pinned = core if arguments.side_by_side else None
                processes.append(start_training(path, directory, threads, pinned))
            stop_after(60 * arguments.minutes, processes)
            for architecture in group:
                console = (work / f"{name}_{architecture}" / "console.txt").read_text()
                curves[(name, architecture)] = curve(console, start)
                report(name, architecture, curves[(name, architecture)])
    plot(curves, work / "mace_vs_soap_bpnn.png")
    print(f"plot: {work / 'mace_vs_soap_bpnn.png'}")


def plot(curves: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = sorted({name for name, _ in curves})
    figure, axes = plt.subplots(1, len(names), figsize=(5 * len(names), 4), squeeze=False)
    for axis, name in zip(axes[0], names):
        for (data, architecture), points in curves.items():
            if data == name and points:
                axis.plot(*zip(*points), label=architecture)
        axis.set(title=name, xlabel="wall time (s)", ylabel="held-out force RMSE (meV/A)")
        axis.set_yscale("log")
        axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
