"""Where a run's wall time goes, phase by phase, for the log's last line: a short run
(a hyperparameter scan, a fine-tuning) spends as much time outside its epochs as in
them (docs/performance-notes.md, "Short runs")."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager


def process_age() -> float | None:
    """Seconds since this process started (the interpreter and every import included),
    from /proc; None where there is none."""
    try:
        with open("/proc/self/stat") as stream:
            fields = stream.read().rsplit(")", 1)[1].split()
        with open("/proc/uptime") as stream:
            uptime = float(stream.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    started = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22, counted after comm
    return max(uptime - started, 0.0)


class Phases:
    """Named durations in the order they began; ``timed`` adds to a phase."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.notes: dict[str, str] = {}

    def add(self, name: str, seconds: float, note: str = "") -> None:
        self.seconds[name] = self.seconds.get(name, 0.0) + seconds
        if note:
            self.notes[name] = note

    @contextmanager
    def timed(self, name: str, note: str = "") -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - start, note)

    def summary(self) -> str:
        parts = [
            f"{name} {seconds:.2f} s" + (f" ({self.notes[name]})" if name in self.notes else "")
            for name, seconds in self.seconds.items()
        ]
        return "time by phase: " + ", ".join(parts)


# the command's start (set by cli.main when a command begins), for the time before the
# run's own phases
COMMAND_STARTED: list[float] = []


def mark_command_start() -> None:
    COMMAND_STARTED[:] = [time.perf_counter()]


def start_phases() -> Phases:
    """The phases so far: the interpreter and imports (from the process's start to the
    command's), and the command's own work before this call (options, logging, the
    process group)."""
    phases = Phases()
    now = time.perf_counter()
    began = COMMAND_STARTED[0] if COMMAND_STARTED else now
    age = process_age()
    if age is not None:
        phases.add("start and imports", max(age - (now - began), 0.0))
    phases.add("options and processes", now - began)
    return phases
