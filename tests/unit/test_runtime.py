"""keep_freed_memory: glibc's malloc keeps a step's freed memory, unless the user chose."""

from __future__ import annotations

import importlib
import platform
import subprocess
import sys

import pytest

from atomtrain.runtime import keep_freed_memory, unimported


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc only")
def test_glibc_accepts_the_settings():
    # mallopt refuses values out of range (0): both must have been taken
    assert keep_freed_memory({})


@pytest.mark.parametrize(
    "environment",
    [
        {"MALLOC_TRIM_THRESHOLD_": "0"},
        {"MALLOC_MMAP_THRESHOLD_": "131072"},
        {"MALLOC_MMAP_MAX_": "65536"},
        {"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=0"},
        {"LD_PRELOAD": "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"},
    ],
)
def test_the_users_allocator_settings_are_kept(environment):
    assert not keep_freed_memory(environment)


class FakeMachine:
    """A clock and tick counters that tests advance by hand (100 ticks per second)."""

    def __init__(self):
        self.now = 0.0
        self.core_busy = 0
        self.own = 0

    def run(self, seconds: float, own_cores: float, other_cores: float) -> None:
        self.now += seconds
        self.own += int(100 * seconds * own_cores)
        self.core_busy += int(100 * seconds * (own_cores + other_cores))


def watcher(machine: FakeMachine, threads: int = 2, user_fixed: bool = False):
    from atomtrain.runtime import BusyCores

    busy = BusyCores(
        {0, 1},
        threads,
        user_fixed,
        interval=1.0,
        clock=lambda: machine.now,
        core_ticks=lambda cores: machine.core_busy,
        own_ticks=lambda: machine.own,
    )
    busy.ticks_per_second = 100
    return busy


def test_busy_cores_take_threads_away_and_give_them_back(monkeypatch):
    import torch

    monkeypatch.setattr(torch, "set_num_threads", lambda n: calls.append(n))
    calls: list[int] = []
    machine = FakeMachine()
    busy = watcher(machine)
    machine.run(0.5, own_cores=2.0, other_cores=0.0)
    assert busy.poll() is None  # not yet time to measure
    machine.run(0.6, own_cores=2.0, other_cores=0.0)
    assert busy.poll() is None  # idle: nothing changes
    machine.run(1.5, own_cores=1.0, other_cores=1.0)
    decision = busy.poll()
    assert decision.threads == 1 and calls == [1]
    assert "machine is busy" in decision.message and "1.0 of the 2 core(s)" in decision.message
    machine.run(1.5, own_cores=0.7, other_cores=1.3)
    assert busy.poll() is None  # still busy, still one thread
    machine.run(1.5, own_cores=2.0, other_cores=0.1)
    decision = busy.poll()
    assert decision.threads == 2 and calls == [1, 2] and "back to 2 threads" in decision.message


def test_with_two_levels_a_busy_machine_gets_one_thread_not_another_count(monkeypatch):
    """A compiled step is compiled again for each thread count: 4 cores, one of them busy,
    give 1 thread (not 3), and back to 4."""
    import torch

    calls: list[int] = []
    monkeypatch.setattr(torch, "set_num_threads", lambda n: calls.append(n))
    machine = FakeMachine()
    busy = watcher(machine, threads=4)
    busy.cores = {0, 1, 2, 3}
    busy.two_levels = True
    machine.run(1.5, own_cores=3.0, other_cores=1.0)
    assert busy.poll().threads == 1
    machine.run(1.5, own_cores=1.0, other_cores=2.0)
    assert busy.poll() is None  # busier still: one thread already
    machine.run(1.5, own_cores=4.0, other_cores=0.0)
    assert busy.poll().threads == 4
    assert calls == [1, 4]
    busy.two_levels = False  # without: the cores left
    machine.run(1.5, own_cores=3.0, other_cores=1.0)
    assert busy.poll().threads == 3


def test_a_compilation_is_not_taken_for_another_jobs_work(monkeypatch):
    """inductor compiles in processes of its own, which keep a core busy; after a new
    compilation that time is not measured (taken for another job's, it took a thread
    away, and the new count compiled the step again), and the next interval is."""
    import torch

    calls: list[int] = []
    monkeypatch.setattr(torch, "set_num_threads", lambda n: calls.append(n))
    machine = FakeMachine()
    busy = watcher(machine)
    busy.two_levels = True
    machine.run(35.0, own_cores=1.0, other_cores=1.0)  # the first compilation
    assert busy.poll(compilations=1) is None
    machine.run(1.5, own_cores=2.0, other_cores=0.0)
    assert busy.poll(compilations=1) is None and calls == []
    machine.run(1.5, own_cores=1.0, other_cores=1.0)  # another job, after it
    assert busy.poll(compilations=1).threads == 1 and calls == [1]


def test_busy_cores_keep_the_users_thread_count_and_say_so_once(monkeypatch):
    import torch

    monkeypatch.setattr(torch, "set_num_threads", lambda n: pytest.fail("threads changed"))
    machine = FakeMachine()
    busy = watcher(machine, user_fixed=True)
    machine.run(1.5, own_cores=1.0, other_cores=1.0)
    decision = busy.poll()
    assert decision.threads == 2 and "unset OMP_NUM_THREADS" in decision.message
    machine.run(1.5, own_cores=1.0, other_cores=1.0)
    assert busy.poll() is None


def test_core_ticks_read_from_proc_stat_format():
    from atomtrain.runtime import read_core_ticks, read_own_ticks

    stat = (
        "cpu  30 0 10 100 5 0 0 2 0 0\n"
        "cpu0 10 0 5 50 5 0 0 1 0 0\n"
        "cpu1 20 0 5 50 0 0 0 1 0 0\n"
        "intr 1 2 3\n"
    )
    assert read_core_ticks({0}, stat) == 16  # user + system + steal, not idle or iowait
    assert read_core_ticks({0, 1}, stat) == 42
    own = "123 (python (x) y) S 1 2 3 4 5 6 7 8 9 10 17 4 0 0"
    assert read_own_ticks(own) == 21


def test_unimported_modules_are_refused_inside_and_importable_after():
    """``unimported`` keeps optional imports out (metatensor-torch's IPython,
    TensorBoard's fsspec) without changing what is imported already."""
    import json

    assert "json" in sys.modules
    name = "atomtrain_never_imported_module"
    with unimported(name, "json"):
        with pytest.raises(ImportError):
            importlib.import_module(name)
        assert importlib.import_module("json") is json
    assert name not in sys.modules
    with pytest.raises(ModuleNotFoundError, match=name):
        importlib.import_module(name)  # the ordinary failure again, not the block's
    assert sys.modules["json"] is json


def test_tensorboard_writes_its_events_without_fsspec(tmp_path):
    """The run's event files are local: the experiment logs' TensorBoard, imported
    without its remote layers, still writes them, and fsspec stays importable."""
    script = (
        "import sys\n"
        "from pathlib import Path\n"
        "from atomtrain.options import LoggingOptions\n"
        "from atomtrain.training.experiment_logs import ExperimentLogs\n"
        f"logs = ExperimentLogs(LoggingOptions(tensorboard=True), Path({str(tmp_path)!r}), {{}})\n"
        "logs.log(1, {'epoch': 1, 'loss': 0.5})\n"
        "logs.close()\n"
        "assert 'fsspec' not in sys.modules\n"
        "import fsspec\n"
    )
    subprocess.run([sys.executable, "-c", script], check=True, timeout=120)
    events = list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    assert len(events) == 1 and events[0].stat().st_size > 0


def test_a_helpers_cpu_time_counts_as_this_processs_own_and_stays_after_it_ends(monkeypatch):
    """The learning curves' drawing process works for the run: BusyCores must not take
    it for another job, neither while it runs nor when its /proc entry goes."""
    import os
    import subprocess
    import sys

    from atomtrain import runtime
    from atomtrain.runtime import forget_helper, note_helper, read_own_and_helper_ticks

    # this process's own ticks as zero: what is left is the helpers'
    real = runtime.read_own_ticks
    monkeypatch.setattr(runtime, "read_own_ticks", lambda text=None: real(text) if text else 0)
    before = read_own_and_helper_ticks()  # helpers of earlier tests, ended

    # the helper uses 0.3 s of CPU, says so, and waits for its end of input
    busy = (
        "import sys, time\n"
        "while time.process_time() < 0.3: pass\n"
        "print('busy', flush=True)\n"
        "sys.stdin.read()\n"
    )
    helper = subprocess.Popen(
        [sys.executable, "-c", busy], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    note_helper(helper.pid)
    assert helper.stdout.readline().strip() == "busy"
    seen = read_own_and_helper_ticks() - before
    helper.communicate("")
    forget_helper(helper.pid)
    after = read_own_and_helper_ticks() - before
    assert seen >= 0.3 * os.sysconf("SC_CLK_TCK") - 1  # its CPU time while it runs
    assert after == seen  # its last count is kept once it has ended
