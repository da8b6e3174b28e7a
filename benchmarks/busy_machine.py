"""Training and calculator calls beside another job, with atomtrain's default thread
settings against one thread (and any environment given with --setting).

    python benchmarks/busy_machine.py [--structures 400] [--epochs 4] [--repeats 2]
        [--setting NAME:VAR=VALUE,VAR=VALUE ...] [--data examples/ethanol/ethanol_1000.xyz]

Conditions: an idle machine; "another multi-threaded job" (a torch loop of 64x64 matrix
products with torch's default threads, as another training on the node would be); and
"busy Python loops" (one plain busy loop per core). Each training runs the ethanol
example's options on the first --structures structures; its time is the wall time of
the command, start-up included. The calculator case times one energy-and-forces call
of atomtrain.ase.Calculator on an ethanol molecule (median of 200 after 20 warm-up
calls) in a fresh process, three such processes per repeat. Settings alternate within
each condition. Prints one table; nothing is asserted.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable

TORCH_JOB = """
import torch
x = torch.randn(64, 64)
while True:
    for _ in range(1000):
        x @ x
"""
PYTHON_LOOP = "while True: pass"

CALCULATOR_CALLS = """
import statistics, sys, time
import ase.io
from atomtrain.ase import Calculator
atoms = ase.io.read(sys.argv[2], 0)
atoms.calc = Calculator(sys.argv[1])
times = []
for call in range(220):
    atoms.positions[0, 0] += 1e-4  # a new structure for every call
    start = time.perf_counter()
    atoms.get_forces()
    times.append(time.perf_counter() - start)
print(statistics.median(times[20:]) * 1e3)
"""


@contextmanager
def other_job(kind: str):
    """Start the other job(s) of a condition and stop them afterwards."""
    commands = {
        "idle": [],
        "another multi-threaded job": [[PYTHON, "-c", TORCH_JOB]],
        "busy Python loops": [[PYTHON, "-c", PYTHON_LOOP]] * len(os.sched_getaffinity(0)),
    }[kind]
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "GOMP_"))}
    jobs = [subprocess.Popen(command, env=clean) for command in commands]
    time.sleep(1.0 if jobs else 0.0)  # let them reach their loop
    try:
        yield
    finally:
        for job in jobs:
            job.kill()
            job.wait()


def environment(setting: dict[str, str]) -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "GOMP_"))}
    return {**clean, **setting, "PYTHONUNBUFFERED": "1"}


def write_options(directory: Path, data: Path, structures: int, epochs: int) -> Path:
    import ase.io

    frames = ase.io.read(data, f":{structures}")
    ase.io.write(directory / "data.xyz", frames)
    options = yaml.safe_load((ROOT / "examples/ethanol/options.yaml").read_text())
    options["training_set"]["systems"]["read_from"] = "data.xyz"
    options["architecture"]["training"].update(num_epochs=epochs, log_interval=epochs)
    path = directory / "options.yaml"
    path.write_text(yaml.safe_dump(options))
    return path


def training_time(options: Path, setting: dict[str, str], run: int) -> float:
    command = ["atomtrain", "train", str(options), "--run-dir", str(options.parent / f"r{run}")]
    start = time.perf_counter()
    subprocess.run(command, env=environment(setting), check=True, capture_output=True)
    return time.perf_counter() - start


def calculator_time(model: Path, data: Path, setting: dict[str, str]) -> float:
    command = [PYTHON, "-c", CALCULATOR_CALLS, str(model), str(data)]
    result = subprocess.run(
        command, env=environment(setting), check=True, capture_output=True, text=True
    )
    return float(result.stdout.split()[-1])


def parse_setting(text: str) -> tuple[str, dict[str, str]]:
    name, _, assignments = text.partition(":")
    pairs = [item.split("=", 1) for item in assignments.split(",") if item]
    return name, dict(pairs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--structures", type=int, default=400)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--data", type=Path, default=ROOT / "examples/ethanol/ethanol_1000.xyz")
    parser.add_argument(
        "--setting",
        action="append",
        default=[],
        help="NAME:VAR=VALUE,... an environment to compare (besides default and 1 thread)",
    )
    parser.add_argument(
        "--conditions",
        default="idle,another multi-threaded job,busy Python loops",
        help="comma-separated conditions",
    )
    arguments = parser.parse_args()
    settings = {"default": {}, "OMP_NUM_THREADS=1": {"OMP_NUM_THREADS": "1"}}
    settings.update(parse_setting(text) for text in arguments.setting)
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        directory = Path(scratch)
        options = write_options(directory, arguments.data, arguments.structures, arguments.epochs)
        training_time(options, {}, 0)  # the model the calculator uses
        model = directory / "r0" / "model.pt"
        run = 1
        for condition in arguments.conditions.split(","):
            train_times: dict[str, list[float]] = {name: [] for name in settings}
            call_times: dict[str, list[float]] = {name: [] for name in settings}
            with other_job(condition):
                # settings alternate, so that a phase of the other job hits them alike
                for _ in range(arguments.repeats):
                    for name, setting in settings.items():
                        train_times[name].append(training_time(options, setting, run))
                        run += 1
                        for _ in range(3):
                            call_times[name].append(calculator_time(model, arguments.data, setting))
            for name in settings:
                times, call = train_times[name], statistics.median(call_times[name])
                rows.append((condition, name, min(times), max(times), call))
                print(
                    f"{condition:28s} {name:24s} train {min(times):6.1f} s  "
                    f"calculator {call:7.2f} ms",
                    flush=True,
                )
    print(
        f"\n{arguments.structures} structures, {arguments.epochs} epochs, "
        f"{len(os.sched_getaffinity(0))} cores; training: fastest (slowest) of "
        f"{arguments.repeats} runs; calculator: median ms per force call, median of "
        "3 processes per repeat"
    )
    print("| condition | setting | training (s) | vs 1 thread | calculator (ms) | vs 1 thread |")
    print("|---|---|---|---|---|---|")
    one = {cond: (t, c) for cond, name, t, _, c in rows if name == "OMP_NUM_THREADS=1"}
    for condition, name, fastest, slowest, call in rows:
        base_train, base_call = one[condition]
        print(
            f"| {condition} | {name} | {fastest:.1f} ({slowest:.1f}) | "
            f"{fastest / base_train:.2f}x | {call:.2f} | {call / base_call:.2f}x |"
        )


if __name__ == "__main__":
    main()
