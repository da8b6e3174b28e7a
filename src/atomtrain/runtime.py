"""Process-wide settings that keep every training step as fast as the last.

The command line's entry imports this module before it parses its arguments, so torch
is imported where a thread count is read or set: ``atomtrain --help`` needs no torch."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import platform
import signal
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

# mallopt parameters, from glibc's malloc.h
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
# the largest mmap threshold glibc accepts on 64-bit systems
LARGEST_MMAP_THRESHOLD = 32 * 1024 * 1024
# mallopt takes an int: the largest trim threshold it accepts
NEVER_TRIM = 2**31 - 1

# a user who tunes malloc through the environment keeps their choice
USER_MALLOC_SETTINGS = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_MMAP_MAX_")


def keep_freed_memory(environment: dict[str, str] | None = None) -> bool:
    """Ask glibc's malloc to keep the memory a training step frees for the next step;
    True when it took effect.

    A step allocates and frees the same large tensors (the padded neighbor layout, the
    double backward's intermediates) again and again. By default glibc hands large
    freed blocks back to the kernel (fresh mappings, heap trimming), so the next step
    faults them in again page by page: about 2,200 page faults per step on tio2 at
    batch 32. Serving blocks up to 32 MiB from the heap and never trimming it removes
    them. Measured on tio2 (docs/performance-notes.md): one process at batch 32 6 % faster,
    two processes on two cores 3 % (batch 32) and 8 % (batch 8), for a peak resident
    size 2 to 5 % higher.

    Nothing happens outside glibc, when the user set a malloc variable, or when
    ``LD_PRELOAD`` brings another allocator (jemalloc, tcmalloc, mimalloc).
    """
    environment = dict(os.environ) if environment is None else environment
    if platform.libc_ver()[0] != "glibc":
        return False
    if any(name in environment for name in USER_MALLOC_SETTINGS):
        return False
    if "glibc.malloc" in environment.get("GLIBC_TUNABLES", ""):
        return False
    if "malloc" in environment.get("LD_PRELOAD", ""):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return False
    # mallopt returns 1 on success, 0 when it refused the value
    return bool(libc.mallopt(M_MMAP_THRESHOLD, LARGEST_MMAP_THRESHOLD)) and bool(
        libc.mallopt(M_TRIM_THRESHOLD, NEVER_TRIM)
    )


def read_core_ticks(cores: set[int], stat_text: str | None = None) -> int | None:
    """Busy clock ticks (all but idle and iowait; steal counted as busy) of ``cores``
    since boot, from /proc/stat; None where it cannot be read."""
    try:
        text = stat_text if stat_text is not None else Path("/proc/stat").read_text()
    except OSError:
        return None
    busy = 0
    for line in text.splitlines():
        name, *fields = line.split()
        if not name.startswith("cpu") or name == "cpu" or int(name[3:]) not in cores:
            continue
        ticks = [int(value) for value in fields]
        busy += sum(ticks) - ticks[3] - ticks[4] - sum(ticks[8:])  # guest time is in user
    return busy


def read_own_ticks(stat_text: str | None = None) -> int | None:
    """This process's user and system clock ticks, all threads, from /proc/self/stat."""
    try:
        text = stat_text if stat_text is not None else Path("/proc/self/stat").read_text()
    except OSError:
        return None
    fields = text.rsplit(")", 1)[1].split()  # the name may hold spaces
    return int(fields[11]) + int(fields[12])


class _Helpers:
    running: set[int] = set()
    ticks: dict[int, int] = {}  # the last count read of each, kept once it has ended


def note_helper(pid: int) -> None:
    """A child working for this process (the learning curves' drawing process): its
    CPU time counts as this process's own, not as another job's, for BusyCores."""
    _Helpers.running.add(pid)


def forget_helper(pid: int) -> None:
    _Helpers.running.discard(pid)


def read_own_and_helper_ticks() -> int | None:
    """read_own_ticks, plus the helpers' ticks. A helper's last count is kept after it
    ends, so that its time, gone from /proc, does not look like a drop in this
    process's own."""
    own = read_own_ticks()
    if own is None:
        return None
    for pid in tuple(_Helpers.running):
        try:
            _Helpers.ticks[pid] = read_own_ticks(Path(f"/proc/{pid}/stat").read_text()) or 0
        except OSError:
            _Helpers.running.discard(pid)
    return own + sum(_Helpers.ticks.values())


@dataclass
class ThreadDecision:
    threads: int
    message: str | None  # for the log, when the decision changed


class BusyCores:
    """Trains with fewer threads while other processes use this process's cores.

    Measured (docs/performance-notes.md, "A busy machine"): beside another job, torch's
    OpenMP threads spin at every parallel region waiting for a thread whose core the
    other job holds, and training took 2x (another torch job) to 3.4x (busy loops) the
    time of one thread. One thread never waits for another; on an idle machine several
    threads are up to 1.7x faster. So every ``interval`` seconds ``poll`` compares the
    busy time of this process's cores with its own CPU time: the difference is what
    other processes used, and each core they fill takes a thread away (at least one
    stays); the threads come back when they leave. A thread count the user set with
    OMP_NUM_THREADS is kept, with a note that the machine is busy.

    ``two_levels``: only the full count and one thread. A compiled training step is
    compiled again for every new thread count (measured: 37 s for a small SOAP-BPNN,
    and torch.compile gives up after 8, silently, to eager steps); with two levels it
    is compiled twice at most.
    """

    def __init__(
        self,
        cores: set[int],
        threads: int,
        user_fixed: bool,
        interval: float = 0.5,
        clock=time.monotonic,
        core_ticks=read_core_ticks,
        own_ticks=read_own_and_helper_ticks,
    ):
        self.cores = cores
        self.full_threads = threads
        self.threads = threads
        self.user_fixed = user_fixed
        self.interval = interval
        self.clock = clock
        self.core_ticks = core_ticks
        self.own_ticks = own_ticks
        self.ticks_per_second = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        self.warned = False
        self.two_levels = False
        self.compilations = 0
        self.last = self.sample()

    @classmethod
    def for_this_process(cls) -> BusyCores:
        import torch

        cores = set(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else set()
        return cls(cores, torch.get_num_threads(), "OMP_NUM_THREADS" in os.environ)

    def sample(self) -> tuple[float, int | None, int | None]:
        return self.clock(), self.core_ticks(self.cores), self.own_ticks()

    def others(self) -> float | None:
        """Cores' worth of time other processes used since the last measurement, or None
        when it is not time to measure (or /proc cannot be read)."""
        now = self.clock()
        if now - self.last[0] < self.interval:
            return None
        current = self.sample()
        (then, cores_then, own_then), (_, cores_now, own_now) = self.last, current
        self.last = current
        if None in (cores_then, own_then, cores_now, own_now):
            return None
        used = (cores_now - cores_then) - (own_now - own_then)  # type: ignore[operator]
        return max(0.0, used / self.ticks_per_second / (now - then))

    def poll(self, compilations: int = 0) -> ThreadDecision | None:
        """A new thread count when the others' use of the cores changed it, else None.

        ``compilations``: how often the training step was compiled so far. After a new
        one, the cores' time since the last sample is not measured: it went to
        inductor's compiler processes, this run's own work. Taken for another job's, it
        took a thread away, and the new thread count compiled the step again (dynamo
        guards on it: 35 s more for a small SOAP-BPNN with a cold cache)."""
        if compilations > self.compilations:
            self.compilations = compilations
            self.last = self.sample()
            return None
        others = self.others()
        if others is None or self.full_threads <= 1 and self.user_fixed:
            return None
        busy_cores = int(others + 0.5)
        if self.user_fixed:
            if busy_cores and not self.warned:
                self.warned = True
                return ThreadDecision(self.threads, self.busy_note(others, fixed=True))
            return None
        wanted = max(1, min(self.full_threads, len(self.cores) - busy_cores))
        if self.two_levels and wanted < self.full_threads:
            wanted = 1
        if wanted == self.threads:
            return None
        self.threads = wanted
        import torch

        torch.set_num_threads(wanted)
        if wanted < self.full_threads:
            return ThreadDecision(wanted, self.busy_note(others, fixed=False))
        return ThreadDecision(
            wanted, f"the other work on this process's cores has ended: back to {wanted} threads"
        )

    def busy_note(self, others: float, fixed: bool) -> str:
        where = f"{others:.1f} of the {len(self.cores)} core(s) this process runs on"
        if fixed:
            return (
                f"the machine is busy: other processes use {where}, and OMP_NUM_THREADS="
                f"{self.threads} threads wait for each other's cores (measured up to 3x "
                "slower); unset OMP_NUM_THREADS to let atomtrain adapt, or set it to 1"
            )
        return (
            f"the machine is busy: other processes use {where}; training with {self.threads} "
            f"thread(s) instead of {self.full_threads} while they run (threads waiting for "
            "a busy core were measured up to 3x slower); OMP_NUM_THREADS fixes the number"
        )


class _Process:
    runs_one_command = False


def this_process_runs_one_command() -> None:
    """Said by the command line's entry: this process runs one command, then exits. An
    optional import that a library could need later in a longer-lived process (a
    notebook, the tests) can then be left out when the command is done with it."""
    _Process.runs_one_command = True


def runs_one_command() -> bool:
    return _Process.runs_one_command


def user_cache() -> Path:
    """atomtrain's folder in the user's cache ($XDG_CACHE_HOME, else ~/.cache), where
    inductor's compiled code and the data cache live."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "atomtrain"


@contextlib.contextmanager
def unimported(*names: str) -> Iterator[None]:
    """Imports made here find none of the modules ``names`` (ImportError) unless they
    are imported already: for libraries that import optional packages, at a cost, for
    what atomtrain does not use.

    - metatensor-torch (imported by metatomic) imports IPython only to register an HTML
      display with a running IPython: 0.13-0.3 s of each export, eval and metatrain
      checkpoint read where IPython is installed (a Jupyter environment).
    - metatensor-torch compiles its Python operations with TorchScript at its import
      (0.9 s of its 1.0 s here) when metatensor-operations is installed (metatrain
      needs it); metatomic uses none of them. metatensor-torch decides once, at its
      import, so they are left out only where nothing later in the process needs them.
    - TensorBoard's file layer imports fsspec (a torch dependency) and boto3 for remote
      paths: 0.15 s of each run's start; its event files go to the run directory."""
    blocked = [name for name in names if name not in sys.modules]
    for name in blocked:
        sys.modules[name] = None  # type: ignore[assignment]
    try:
        yield
    finally:
        for name in blocked:
            if name in sys.modules and sys.modules[name] is None:
                del sys.modules[name]


PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with_parent() -> None:
    """Ask Linux to kill this child (SIGKILL) when its parent dies, even by SIGKILL,
    which leaves the parent no time to stop it; elsewhere the parent's own cleanup has
    to do. The caller checks os.getppid() afterwards: the parent may have died before."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
