"""metatrain's loading of a memory-mapped directory, against atomtrain's, on the same
directory: time from the command to the start of training, and peak memory.

    python benchmarks/metatrain_loading.py DIR [DIR ...] [--timeout 600]

DIR: a directory ``atomtrain convert`` wrote, with energies and forces, and stress when
it has a stress.bin (e.g. benchmarks/lazy_data.py's ``/tmp/atomtrain-large/ethanol_100000``
or ``emt_100000``). Both tools get
examples/ethanol's SOAP-BPNN section (metatrain's format, which atomtrain reads
unchanged), 5 % validation, 5 % test, one process. metatrain (benchmarks/.venv-metatrain,
see compare_metatrain.py) is timed to its "Starting training" line, atomtrain to its
"first training step done" line; each is then stopped (SIGKILL to its process group)
and its peak RSS read from getrusage. A tool that does not get there within
``--timeout`` seconds is reported as such. Measures and prints; asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
MTT = ROOT / "benchmarks" / ".venv-metatrain" / "bin" / "mtt"
MARKS = {
    "metatrain": re.compile(r"Starting training"),
    "atomtrain": re.compile(r"first training step done"),
}


def options(directory: Path, data: Path) -> Path:
    options = yaml.safe_load((ROOT / "examples" / "ethanol" / "options.yaml").read_text())
    options["training_set"]["systems"]["read_from"] = str(data)
    # metatrain fails on a missing stress.bin unless told there is none
    options["training_set"]["targets"]["energy"]["stress"] = (data / "stress.bin").is_file()
    options["validation_set"] = 0.05
    options["test_set"] = 0.05
    options["architecture"]["training"]["num_epochs"] = 1
    # the example's loss mapping (type, weights) is atomtrain's form; both take the default
    del options["architecture"]["training"]["loss"]
    path = directory / "options.yaml"
    path.write_text(yaml.safe_dump(options))
    return path


def measure(tool: str, data: Path, timeout: float) -> tuple[float | None, float, str]:
    """(seconds to the mark or None, peak RSS in MB, the last line printed)."""
    with tempfile.TemporaryDirectory() as scratch:
        directory = Path(scratch)
        path = options(directory, data)
        command = (
            [str(MTT), "train", path.name]
            if tool == "metatrain"
            else [sys.executable, "-m", "atomtrain", "train", path.name]
        )
        start = time.perf_counter()
        process = subprocess.Popen(
            command,
            cwd=directory,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        timer = threading.Timer(timeout, os.killpg, (process.pid, signal.SIGKILL))
        timer.start()
        reached = None
        last = ""
        for line in process.stdout:  # type: ignore[union-attr]
            last = line.strip() or last
            if MARKS[tool].search(line):
                reached = time.perf_counter() - start
                os.killpg(process.pid, signal.SIGKILL)
                break
        timer.cancel()
        _, status, usage = os.wait4(process.pid, 0)
        if reached is None and os.waitstatus_to_exitcode(status) > 0:
            sys.exit(f"{tool} failed: {last}")
        return reached, usage.ru_maxrss / 1024, last


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("directories", type=Path, nargs="+")
    parser.add_argument("--timeout", type=float, default=600.0)
    arguments = parser.parse_args()
    if not MTT.exists():
        sys.exit(f"{MTT} not found: python benchmarks/compare_metatrain.py creates it")
    print("| directory | tool | command to training start | peak RSS |")
    print("|---|---|---|---|")
    for data in arguments.directories:
        for tool in ("metatrain", "atomtrain"):
            seconds, peak, last = measure(tool, data.resolve(), arguments.timeout)
            reached = (
                f"{seconds:.1f} s"
                if seconds is not None
                else f"not within {arguments.timeout:.0f} s (last line: {last[-80:]})"
            )
            print(f"| {data.name} | {tool} | {reached} | {peak:.0f} MB |", flush=True)


if __name__ == "__main__":
    main()
