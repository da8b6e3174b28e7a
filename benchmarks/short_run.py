"""Where a short run's time goes: 5 epochs of the ethanol example's SOAP-BPNN on 200
structures, as a hyperparameter scan or a fine-tuning runs it, from the command to the
process's end, phase by phase as the log's last line gives them.

    python benchmarks/short_run.py [--repeats 5] [--epochs 5] [--structures 200]
                                   [--data-cache warm|cold] [--nproc N]

Each repeat runs ``atomtrain train options.yaml -o model.pt`` in a fresh process (the
console script, as a user runs it) and measures its wall time from outside; the phases
come from the run's "time by phase" line. Prints the median of each over the repeats,
and the time outside the epochs. ``--nproc N``: the command launches N processes
(``atomtrain train --nproc N``). Measures and prints; asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import ase.io
import yaml

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "ethanol"


def prepare(directory: Path, structures: int, epochs: int) -> Path:
    frames = ase.io.read(EXAMPLE / "ethanol_1000.xyz", f":{structures}")
    ase.io.write(directory / "train.xyz", frames)
    options = yaml.safe_load((EXAMPLE / "options.yaml").read_text())
    options["training_set"]["systems"]["read_from"] = "train.xyz"
    options["architecture"]["training"]["num_epochs"] = epochs
    path = directory / "options.yaml"
    path.write_text(yaml.safe_dump(options))
    return path


def phases_of(log: str) -> dict[str, float]:
    line = next(line for line in log.splitlines() if "time by phase:" in line)
    found = re.findall(r"([a-z][a-z ]+?) (\d+\.\d+) s", line.split("time by phase:", 1)[1])
    return {name.strip(): float(seconds) for name, seconds in found}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--structures", type=int, default=200)
    parser.add_argument("--data-cache", choices=("warm", "cold"), default="warm")
    parser.add_argument("--nproc", type=int, default=None)
    arguments = parser.parse_args()
    with tempfile.TemporaryDirectory() as name:
        directory = Path(name)
        options = prepare(directory, arguments.structures, arguments.epochs)
        environment = {**os.environ, "ATOMTRAIN_DATA_CACHE": str(directory / "cache")}
        command = ["atomtrain", "train", str(options), "-o", "model.pt"]
        if arguments.nproc is not None:
            command += ["--nproc", str(arguments.nproc)]
        if arguments.data_cache == "warm":
            subprocess.run(
                [*command, "--check"],
                cwd=directory,
                env=environment,
                check=True,
                capture_output=True,
            )
        walls, runs = [], []
        for repeat in range(arguments.repeats):
            if arguments.data_cache == "cold":
                shutil.rmtree(directory / "cache", ignore_errors=True)
            start = time.perf_counter()
            result = subprocess.run(
                command, cwd=directory, env=environment, capture_output=True, text=True
            )
            walls.append(time.perf_counter() - start)
            if result.returncode != 0:
                raise SystemExit(result.stderr[-2000:])
            runs.append(phases_of(result.stdout))
            print(f"repeat {repeat + 1}: {walls[-1]:.2f} s", flush=True)
    names = list(runs[0])
    print(
        f"\n{arguments.epochs} epochs on {arguments.structures} ethanol structures, "
        f"median of {arguments.repeats} runs, data cache {arguments.data_cache}"
        f"{'' if arguments.nproc is None else f', {arguments.nproc} processes'}:"
    )
    print(f"  {'wall time of the command':<28}{statistics.median(walls):8.2f} s")
    for name in names:
        print(f"  {name:<28}{statistics.median(run[name] for run in runs):8.2f} s")
    outside = [wall - run.get("epochs", 0.0) for wall, run in zip(walls, runs)]
    print(f"  {'outside the epochs':<28}{statistics.median(outside):8.2f} s")


if __name__ == "__main__":
    main()
