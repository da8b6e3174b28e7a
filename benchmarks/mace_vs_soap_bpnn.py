"""MACE against SOAP-BPNN in atomtrain: held-out force error against wall time.

    python benchmarks/mace_vs_soap_bpnn.py [--minutes 60] [--threads 2] [--data ethanol silicon]

Each architecture trains on the same split of each data set for ``--minutes`` of wall
time (then SIGTERM: atomtrain stops at a step boundary and writes its checkpoint). The
held-out part is given as the validation set, so the force RMSE that each epoch logs
is the held-out error; the curve is that error against the time since the start (read
off train.log's timestamps). Both use a constant learning rate (a cosine over a
number of epochs that a wall-time budget cuts short would be unfair to either) and the
examples' hyperparameters: SOAP-BPNN as examples/ethanol, MACE as examples/mace.
Prints each curve's points and the best error of each, and writes mace_vs_soap_bpnn.png.
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
    example = "mace" if architecture == "mace" else "ethanol"
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


def train_for(seconds: float, options_path: Path, directory: Path, threads: int) -> str:
    """Train for ``seconds`` of wall time; the console output. It goes to a file: a
    pipe read only at the end fills up and stalls the run."""
    environment = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    command = [sys.executable, "-m", "atomtrain", "train", str(options_path)]
    command += ["--outputs", str(directory / "outputs")]
    console = directory / "console.txt"
    with console.open("w") as stream:
        process = subprocess.Popen(
            command, cwd=directory, env=environment, stdout=stream, stderr=subprocess.STDOUT
        )
        deadline = time.monotonic() + seconds
        while process.poll() is None and time.monotonic() < deadline:
            time.sleep(1)
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
        process.wait()
    return console.read_text()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--minutes", type=float, default=60)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--data", nargs="+", default=list(DATA), choices=list(DATA))
    arguments = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="mace_vs_soap_"))
    print(f"{arguments.minutes:g} minutes each, {arguments.threads} threads, work in {work}")
    curves = {}
    for name in arguments.data:
        train, test, stress = split(name, work)
        for architecture in ("soap_bpnn", "mace"):
            directory = work / f"{name}_{architecture}"
            directory.mkdir()
            path = directory / "options.yaml"
            path.write_text(yaml.safe_dump(options(architecture, train, test, stress)))
            start = datetime.now().replace(microsecond=0)
            output = train_for(60 * arguments.minutes, path, directory, arguments.threads)
            points = curve(output, start)
            curves[(name, architecture)] = points
            best = min((error for _, error in points), default=float("nan"))
            shown = ", ".join(
                f"{seconds:.0f} s: {error:.1f}"
                for seconds, error in points[:: max(1, len(points) // 12)]
            )
            print(
                f"{name} {architecture}: {len(points)} epochs, best held-out F RMSE "
                f"{best:.1f} meV/A"
            )
            print(f"  {shown}")
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
