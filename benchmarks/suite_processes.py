"""Where the test suite's CPU time goes: every Python process it starts, counted.

    python benchmarks/suite_processes.py [pytest arguments, e.g. tests -m "not slow"]
    python benchmarks/suite_processes.py --summarize LOG

Runs pytest (in this process's working directory) with a ``sitecustomize`` module on
PYTHONPATH that every Python process of the suite imports at its start, since the
environment is inherited: training runs, ranks, launchers, engines, the examples, the
learning curves' child, pytest itself and its forks. At its end (exit handlers, or
``os._exit``, which atomtrain's commands use) each process appends a line to a log: its
CPU time (user and system, all threads), its wall time, the test that started it
(PYTEST_CURRENT_TEST) and its command line. Processes started outside that environment
(slurmd's steps without it, inductor's compile workers that are killed) are not counted:
the difference to pytest's total CPU time is theirs.

Prints the CPU time by kind of process and the tests whose processes took the most.
Run it without ``-n``: pytest-xdist's workers start as ``python -c`` and would be
counted with the engines.
Measures and prints; asserts nothing.
"""

from __future__ import annotations

import argparse
import collections
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SITE = """
import atexit, os, resource, sys, time
_started = time.time()
_written = []
def _write():
    if _written:
        return
    _written.append(True)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    libraries = [name for name in ("mace", "metatrain", "ipi") if name in sys.modules]
    line = "\\t".join([
        f"{usage.ru_utime + usage.ru_stime:.2f}", f"{time.time() - _started:.2f}",
        ",".join(libraries) or "-", os.environ.get("PYTEST_CURRENT_TEST", "-"),
        " ".join(sys.argv)[:300].replace("\\t", " ").replace("\\n", " "),
    ])
    with open(os.environ["SUITE_PROCESSES_LOG"], "a") as log:
        log.write(line + "\\n")
atexit.register(_write)
_exit = os._exit
def _logged_exit(code):
    _write()
    _exit(code)
os._exit = _logged_exit
"""


def kind_of(command: str) -> str:
    words = command.split(" ")
    program = words[0]
    if program.endswith("pytest/__main__.py") or program.endswith("pytest"):
        return "pytest (and its forks)"
    if program.endswith("atomtrain/__main__.py") or program.endswith("bin/atomtrain"):
        return f"atomtrain {words[1] if len(words) > 1 else ''}".strip()
    if program.endswith("curves.py"):
        return "learning curves (child of a run)"
    if program == "-c":
        return "python -c (engines, scripts of tests)"
    return Path(program).name


def summarize(log: Path) -> None:
    cpu: dict[str, float] = collections.defaultdict(float)
    count: collections.Counter[str] = collections.Counter()
    by_test: dict[str, float] = collections.defaultdict(float)
    library_cpu: dict[str, list[float]] = collections.defaultdict(list)
    for line in log.read_text().splitlines():
        seconds, _, libraries, test, command = line.split("\t")
        kind = kind_of(command)
        cpu[kind] += float(seconds)
        count[kind] += 1
        if not kind.startswith("pytest"):
            by_test[test.split(" ")[0]] += float(seconds)
            library_cpu[libraries].append(float(seconds))
    total = sum(cpu.values())
    print(f"{sum(count.values())} processes, {total:.0f} s of CPU\n")
    print("| processes | count | CPU (s) | per process (s) |\n|---|---|---|---|")
    for kind, seconds in sorted(cpu.items(), key=lambda item: -item[1]):
        print(f"| {kind} | {count[kind]} | {seconds:.0f} | {seconds / count[kind]:.1f} |")
    print("\n| libraries imported (processes other than pytest's) | count | CPU (s) |")
    print("|---|---|---|")
    for libraries, values in sorted(library_cpu.items(), key=lambda item: -sum(item[1])):
        print(f"| {libraries} | {len(values)} | {sum(values):.0f} |")
    print("\nTests whose processes took the most CPU:")
    for test, seconds in sorted(by_test.items(), key=lambda item: -item[1])[:15]:
        print(f"  {seconds:7.1f} s  {test}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--summarize", type=Path, help="summarize an earlier log only")
    arguments, pytest_arguments = parser.parse_known_args()
    if arguments.summarize:
        summarize(arguments.summarize)
        return
    directory = Path(tempfile.mkdtemp(prefix="suite_processes_"))
    (directory / "sitecustomize.py").write_text(SITE)
    log = directory / "processes.log"
    path = os.pathsep.join(filter(None, [str(directory), os.environ.get("PYTHONPATH")]))
    environment = {**os.environ, "PYTHONPATH": path, "SUITE_PROCESSES_LOG": str(log)}
    started = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "pytest", *pytest_arguments], env=environment)
    print(f"\npytest ended with {result.returncode} after {time.perf_counter() - started:.0f} s")
    print(f"log: {log}\n")
    summarize(log)


if __name__ == "__main__":
    main()
