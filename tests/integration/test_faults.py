"""Faults: preemption signals, resuming mid-epoch (also with another number of
processes), killed ranks, an error on one rank, elastic restarts, corrupt checkpoints."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from conftest import RESOURCES
from helpers import (
    children_of,
    environment,
    finish,
    free_port,
    slurm_available,
    start_ranks,
    write_options,
)

PYTHON = sys.executable
ETHANOL = RESOURCES / "ethanol_40.xyz"
EPOCHS = 12


def options_in(directory, data=ETHANOL, **changes):
    settings = {
        "architecture__training__batch_size": 4,
        "architecture__training__num_epochs": EPOCHS,
        "architecture__training__checkpoint_interval": 1,
        **changes,
    }
    return write_options(directory, data, **settings)


def train_command(options, run_dir, *extra):
    return [
        PYTHON,
        "-m",
        "atomtrain",
        "train",
        str(options),
        "--run-dir",
        str(run_dir),
        *map(str, extra),
    ]


def resume_auto(options, run_dir) -> None:
    """``--restart auto`` in one process, which must finish the run."""
    resumed = subprocess.run(
        train_command(options, run_dir, "--restart", "auto"),
        env=environment(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert resumed.returncode == 0, resumed.stderr


def run_uninterrupted(options, run_dir) -> None:
    """A one-process run from start to end."""
    result = subprocess.run(
        train_command(options, run_dir),
        env=environment(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]


def foreground_signals() -> None:
    """SIGINT as a terminal's foreground job has it, whatever the test run's starter
    left: a suite started in the background (nohup, &) ignores it, and a signal ignored
    by the starter stays ignored (test_stopping)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start_in_own_session(command) -> subprocess.Popen:
    """A launcher (--nproc, torchrun, srun) or a rank in a session of its own, as a
    terminal or a batch job starts it, one thread per process, its output captured."""
    return subprocess.Popen(
        command,
        env=environment(OMP_NUM_THREADS="1"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=foreground_signals,
    )


def wait_for_epochs(run_dir: Path, epochs: int, processes, limit=120.0):
    """Wait until train.csv has ``epochs`` rows (training is under way)."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        csv_file = run_dir / "train.csv"
        if csv_file.exists() and len(csv_file.read_text().splitlines()) > epochs:
            return
        if any(process.poll() is not None for process in processes):
            outputs = [process.communicate() for process in processes]
            pytest.fail(f"training ended early: {outputs}")
        time.sleep(0.02)
    pytest.fail("training did not start in time")


def stop_then_resume_with_two(options: Path, run_dir: Path, epochs: int) -> None:
    """SIGTERM a one-process run after its second epoch, then resume it with two
    processes to its end."""
    process = subprocess.Popen(
        train_command(options, run_dir),
        env=environment(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_for_epochs(run_dir, 2, [process])
    process.send_signal(signal.SIGTERM)
    ((code, _, error),) = finish([process])
    assert code == 75 and "training stopped by SIGTERM" in error
    state = torch.load(run_dir / "last.ckpt", weights_only=True)
    assert (state["epoch"], state["step"]) != (epochs, 0)
    results = finish(start_ranks(train_command(options, run_dir, "--restart", "auto")))
    assert all(code == 0 for code, _, _ in results), results


def final_state(run_dir: Path):
    state = torch.load(run_dir / "last.ckpt", weights_only=True)
    assert state["epoch"] == EPOCHS and state["step"] == 0
    return state["model_state"]


def assert_same_model(actual, expected):
    for name, value in expected.items():
        if value.is_floating_point():
            difference = (actual[name] - value).abs().max()
            assert difference <= 1e-8 * value.abs().max().clamp_min(1e-12), name


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """An uninterrupted single-process run."""
    directory = tmp_path_factory.mktemp("reference")
    run_dir = directory / "run"
    run_uninterrupted(options_in(directory), run_dir)
    return final_state(run_dir)


def learning_rates(run_dir: Path) -> list[float]:
    import csv

    with (run_dir / "train.csv").open() as stream:
        return [float(row["learning_rate"]) for row in csv.DictReader(stream)]


@pytest.mark.slow
def test_a_plateau_schedule_resumes_exactly_on_two_processes(tmp_path_factory):
    """ReduceLROnPlateau's state (best error, validations without improvement, scale)
    goes into the checkpoint: stopped after its second epoch and resumed on two
    processes, a run lowers its rate at the same epochs and ends at the same model as
    an uninterrupted one."""
    # a rate so small that no validation improves by the relative 1e-4 that counts: the
    # plateau lowers it every second validation (at a large rate, the two-process run
    # and the one-process run drift apart by rounding, plateau or not)
    plateau = {
        "architecture__training__lr_scheduler": "ReduceLROnPlateau",
        "architecture__training__lr_scheduler_patience": 1,
        "architecture__training__lr_factor": 0.5,
        "architecture__training__learning_rate": 1e-7,
    }
    runs = []
    for name in ("uninterrupted", "resumed"):
        directory = tmp_path_factory.mktemp(name)
        options, run_dir = options_in(directory, **plateau), directory / "run"
        if name == "uninterrupted":
            run_uninterrupted(options, run_dir)
        else:
            stop_then_resume_with_two(options, run_dir, EPOCHS)
        runs.append(run_dir)
    rates = learning_rates(runs[0])
    lowered = [epoch for epoch in range(1, EPOCHS) if rates[epoch] < rates[epoch - 1]]
    assert len(lowered) >= 3 and lowered[-1] >= 4, rates  # lowered after the stop, too
    assert learning_rates(runs[1]) == pytest.approx(rates, rel=1e-12)
    assert_same_model(final_state(runs[1]), final_state(runs[0]))


@pytest.mark.slow
def test_signal_on_one_rank_stops_both_and_resume_with_one_process(tmp_path, reference):
    options = options_in(tmp_path, distributed__check_consistency_every=3)
    run_dir = tmp_path / "run"
    processes = start_ranks(train_command(options, run_dir))
    wait_for_epochs(run_dir, 1, processes)
    processes[1].send_signal(signal.SIGUSR1)
    results = finish(processes)
    assert [code for code, _, _ in results] == [75, 75], results
    message = results[0][2]
    assert "training stopped by SIGUSR1" not in message  # rank 0 got no signal itself
    assert "training stopped by a signal to another rank" in message
    assert "--restart auto" in message
    assert results[1][2].strip() == ""  # said once, by rank 0
    stopped = torch.load(run_dir / "last.ckpt", weights_only=True)
    assert stopped["epoch"] < EPOCHS
    # resume with a single process: the same model as the uninterrupted run
    resume_auto(options, run_dir)
    assert_same_model(final_state(run_dir), reference)


@pytest.mark.parametrize("data", ["file", "directory"])
@pytest.mark.slow
def test_sigterm_on_single_process_then_resume_with_two(tmp_path, reference, data):
    """Also on a memory-mapped directory (atomtrain convert --float64 of the same
    file): the resumed run ends with the uninterrupted single-process model."""
    source = ETHANOL
    if data == "directory":
        from atomtrain.cli.main import main

        source = tmp_path / "data"
        assert main(["convert", str(ETHANOL), "-o", str(source), "--float64"]) == 0
    options = options_in(tmp_path, source)
    run_dir = tmp_path / "run"
    stop_then_resume_with_two(options, run_dir, EPOCHS)
    assert_same_model(final_state(run_dir), reference)


@pytest.mark.parametrize(
    "receivers, number",
    [
        ("launcher and workers", signal.SIGTERM),  # scancel, or a time limit under SLURM
        ("launcher", signal.SIGUSR1),  # kill of the one process the user started
        ("process group", signal.SIGINT),  # Ctrl-C in the terminal
    ],
)
@pytest.mark.slow
def test_nproc_launcher_stopped_by_a_signal_checkpoints_and_resumes(
    tmp_path, reference, receivers, number
):
    """The workers stop at a step boundary with a checkpoint, whoever got the signal
    (some get it twice: from the sender and from the launcher); the launcher exits 75
    with the workers' one line, not as a failure to start."""
    options = options_in(tmp_path)
    run_dir = tmp_path / "run"
    launcher = start_in_own_session(train_command(options, run_dir, "--nproc", 2))
    wait_for_epochs(run_dir, 2, [launcher])
    if receivers == "process group":
        os.killpg(launcher.pid, number)
    else:
        workers = children_of(launcher.pid) if receivers == "launcher and workers" else []
        for pid in [launcher.pid, *workers]:
            os.kill(pid, number)
    ((code, _, error),) = finish([launcher])
    name = signal.Signals(number).name
    assert code == 75, error
    assert error.count(f"training stopped by {name}") == 1, error
    assert "could not start" not in error and "Traceback" not in error
    state = torch.load(run_dir / "last.ckpt", weights_only=True)
    assert (state["epoch"], state["step"]) != (EPOCHS, 0)
    results = finish(
        [
            subprocess.Popen(
                train_command(options, run_dir, "--restart", "auto"),
                env=environment(),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        ]
    )
    assert results[0][0] == 0, results
    assert_same_model(final_state(run_dir), reference)


# Rank 0 of two gloo ranks, with the training loop's stop request installed, gets a stop
# signal while it waits in a collective for rank 1. "copy": the signal at once and a copy
# 20 ms later (scancel and the launcher's forward), rank 1 joining after 1.5 s, so Python
# runs the copy's handler 1.5 s after the first's. "again": the signal at 0.1 s and again
# at 2.6 s while rank 1 hangs for a minute.
WAITING_RANK = """
import datetime, os, signal, sys, threading, time
import torch, torch.distributed as dist
from atomtrain.training.stopping import StopRequest
rank, case, port, number = int(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                        world_size=2, timeout=datetime.timedelta(seconds=120))
dist.barrier()
if rank == 1:
    time.sleep(1.5 if case == "copy" else 60)
    try:
        dist.all_reduce(torch.ones(1))
    except RuntimeError:
        pass
    dist.destroy_process_group()
    sys.exit(0)
stop = StopRequest()
stop.install()
start = time.monotonic()
if case == "copy":
    os.kill(os.getpid(), number)
    time.sleep(0.01)
    threading.Timer(0.02, os.kill, (os.getpid(), number)).start()
else:
    threading.Timer(0.1, os.kill, (os.getpid(), number)).start()
    threading.Timer(2.6, os.kill, (os.getpid(), number)).start()
dist.all_reduce(torch.ones(1))
print(f"went on after {time.monotonic() - start:.1f} s, asked by {stop.signal_name}")
stop.uninstall()
# a process group left to the interpreter's end can abort it ("terminate called
# without an active exception", seen once on a busy machine)
dist.destroy_process_group()
"""


def waiting_rank_and_peer(case: str, number: int) -> list[subprocess.Popen]:
    port = str(free_port())
    return [
        start_in_own_session([PYTHON, "-c", WAITING_RANK, str(rank), case, port, str(int(number))])
        for rank in (0, 1)
    ]


def test_a_copy_of_a_signal_handled_late_is_the_same_request():
    """A copy that arrived with the first is one request, however late Python runs its
    handler: before, the rank took it for a second request and killed itself, so its
    peer exited 3 and no checkpoint was written (the flaky "launcher and workers")."""
    rank, peer = waiting_rank_and_peer("copy", signal.SIGTERM)
    (code, out, error), _ = finish([rank, peer])
    assert code == 0, error
    assert "asked by SIGTERM" in out and "again" not in error


@pytest.mark.parametrize("number", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_sent_again_stops_a_rank_waiting_on_a_hung_peer(number):
    """The second request, 2.5 s after the first, is obeyed while the rank is still
    inside the collective (before, only once the collective ended: here after a
    minute), in one line, with the shell's code for that signal."""
    rank, peer = waiting_rank_and_peer("again", number)
    started = time.monotonic()
    ((code, _, error),) = finish([rank])
    waited = time.monotonic() - started
    peer.kill()
    finish([peer])
    name = signal.Signals(number).name
    assert code == 128 + number, error
    assert waited < 30, waited
    lines = error.strip().splitlines()
    assert lines[-1].startswith(f"atomtrain: {name} again: stopped at once"), error
    assert "Traceback" not in error


@pytest.mark.slow
def test_killed_rank_stops_the_others_with_a_message(tmp_path):
    options = options_in(tmp_path, distributed__timeout=5)
    run_dir = tmp_path / "run"
    processes = start_ranks(train_command(options, run_dir))
    wait_for_epochs(run_dir, 1, processes)
    processes[1].kill()
    start = time.monotonic()
    code, _, error = finish(processes[:1], limit=60)[0]
    assert time.monotonic() - start < 30
    assert code == 3
    assert f"lost rank 1 on {socket.gethostname()}" in error
    assert "Traceback" not in error
    assert processes[1].wait(5) == -signal.SIGKILL
    torch.load(run_dir / "last.ckpt", weights_only=True)  # intact


@pytest.fixture
def busy_cores():
    """Other work on every core, as on a shared workstation: one busy process per core."""
    hogs = [
        subprocess.Popen([PYTHON, "-c", "while True: pass"])
        for _ in range(len(os.sched_getaffinity(0)))
    ]
    yield
    for hog in hogs:
        hog.kill()
        hog.wait()


@pytest.mark.parametrize("machine", ["idle", "busy"])
@pytest.mark.slow
def test_error_on_one_rank_stops_all_promptly_and_is_shown_once(tmp_path, request, machine):
    """Also on a machine busy with other work, where gloo's event loop (SCHED_IDLE while
    the rank computes) would notice the failed peer only after seconds."""
    if machine == "busy":
        request.getfixturevalue("busy_cores")
    options = options_in(tmp_path, distributed__timeout=120)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "epoch_2.ckpt").mkdir()  # rank 0 cannot write this checkpoint
    processes = start_ranks(train_command(options, run_dir))
    start = time.monotonic()
    results = finish(processes, limit=100)
    assert time.monotonic() - start < 60  # far less than the 120 s timeout
    (code0, _, error0), (code1, _, error1) = results
    assert code0 != 0 and code1 != 0
    assert error0.count("cannot write checkpoint") == 1 and "epoch_2.ckpt" in error0
    assert "cannot write checkpoint" not in error1
    assert "stopping because rank 0" in error1 and "failed" in error1


def test_non_finite_loss_stops_all_ranks_with_one_message(tmp_path):
    options = options_in(
        tmp_path,
        architecture__training__learning_rate=1e200,
        architecture__training__warmup_fraction=0.0,
    )
    results = finish(start_ranks(train_command(options, tmp_path / "run")), limit=100)
    (code0, _, error0), (code1, _, error1) = results
    assert code0 == code1 == 2, (code0, code1, error0[-1500:], error1[-1500:])
    assert "the loss became NaN or infinite" in error0
    assert error1.strip() == ""


def worker_pids(marker: str) -> dict[int, int]:
    """rank -> pid of the atomtrain workers whose command line contains ``marker``."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            command = (entry / "cmdline").read_bytes().split(b"\0")
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if marker.encode() in command and b"atomtrain" in command:
            for item in environ:
                if item.startswith(b"RANK="):
                    found[int(item[5:])] = int(entry.name)
    return found


@pytest.mark.slow
def test_torchrun_restart_resumes_from_the_newest_checkpoint(tmp_path, reference):
    torchrun = shutil.which("torchrun") or pytest.skip("torchrun not on PATH")
    options = options_in(tmp_path)
    run_dir = tmp_path / "elastic-run"
    launcher = subprocess.Popen(
        [
            torchrun,
            "--standalone",
            "--nproc-per-node",
            "2",
            "--max-restarts",
            "1",
            # torchrun takes the module arguments that follow the interpreter
            *train_command(options, run_dir)[1:],
        ],
        env=environment(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_for_epochs(run_dir, 2, [launcher])
    workers = worker_pids(str(run_dir))
    assert set(workers) == {0, 1}
    os.kill(workers[1], signal.SIGKILL)
    ((code, _, error),) = finish([launcher], limit=240)
    assert code == 0, error[-3000:]
    log = (run_dir / "train.log").read_text()
    assert "resuming from" in log
    assert_same_model(final_state(run_dir), reference)


@pytest.mark.slow
def test_torchrun_job_preempted_checkpoints_and_resumes(tmp_path, reference):
    """scancel of ``srun torchrun ...``: SIGTERM to the agent and to its workers, which
    also get the agent's copy. The workers stop at one step with a checkpoint and say so
    once; torchrun itself exits 1 with its own traceback (torch's agent, not atomtrain);
    --restart auto ends at the uninterrupted run's model."""
    torchrun = shutil.which("torchrun") or pytest.skip("torchrun not on PATH")
    options = options_in(tmp_path)
    run_dir = tmp_path / "preempted"
    launcher = start_in_own_session(
        [torchrun, "--standalone", "--nproc-per-node", "2", *train_command(options, run_dir)[1:]]
    )
    wait_for_epochs(run_dir, 2, [launcher])
    for pid in [launcher.pid, *children_of(launcher.pid)]:
        os.kill(pid, signal.SIGTERM)
    ((_, _, error),) = finish([launcher])
    assert error.count("atomtrain: training stopped by SIGTERM") == 1, error[-3000:]
    assert "again" not in error and "lost contact" not in error
    state = torch.load(run_dir / "last.ckpt", weights_only=True)
    assert (state["epoch"], state["step"]) != (EPOCHS, 0)
    resume_auto(options, run_dir)
    assert_same_model(final_state(run_dir), reference)


@pytest.mark.skipif(
    not slurm_available(), reason="no running SLURM (bash .ci/setup_slurm.sh starts one; CI does)"
)
@pytest.mark.slow
@pytest.mark.slurm
def test_scancel_of_an_srun_job_checkpoints_and_resumes(tmp_path, reference):
    """A real SLURM: scancel of a two-task srun job (SIGTERM to every task). The tasks
    stop at one step, rank 0 writes the checkpoint and says so once, srun exits 75;
    --restart auto ends at the uninterrupted run's model."""
    options = options_in(tmp_path)
    run_dir = tmp_path / "cancelled"
    name = f"atomtrain-scancel-{os.getpid()}"
    job = start_in_own_session(
        ["srun", "-N1", "-n2", f"--job-name={name}", *train_command(options, run_dir)]
    )
    try:
        wait_for_epochs(run_dir, 2, [job])
    finally:
        subprocess.run(["scancel", f"--name={name}"], check=True, timeout=30)
    ((code, _, error),) = finish([job])
    assert code == 75, error[-3000:]
    assert error.count("atomtrain: training stopped by SIGTERM") == 1, error
    assert "Traceback" not in error and "lost contact" not in error
    state = torch.load(run_dir / "last.ckpt", weights_only=True)
    assert (state["epoch"], state["step"]) != (EPOCHS, 0)
    resume_auto(options, run_dir)
    assert_same_model(final_state(run_dir), reference)


def test_newest_complete_checkpoint_skips_a_corrupt_one(tmp_path):
    from atomtrain.training.checkpoint import (
        TrainingState,
        newest_complete_checkpoint,
        save_checkpoint,
    )

    written = TrainingState("soap_bpnn", {}, "float64", {}, seed=0, epoch=1)
    save_checkpoint(tmp_path / "epoch_1.ckpt", written)
    time.sleep(0.01)
    (tmp_path / "last.ckpt").write_bytes(b"half a checkpoint")
    path, state = newest_complete_checkpoint(tmp_path)
    assert path.name == "epoch_1.ckpt" and state.epoch == 1


def test_atomic_write_keeps_the_old_file_when_writing_fails(tmp_path):
    from atomtrain.io import atomic_write

    target = tmp_path / "last.ckpt"
    target.write_text("good")

    def crash(stream):
        stream.write(b"partial")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        atomic_write(target, crash)
    assert target.read_text() == "good"
    assert [p.name for p in tmp_path.iterdir()] == ["last.ckpt"]


def wait_for_stall(marker: Path, process, limit=120.0) -> None:
    """Wait until the writer stopped inside its write (see atomtrain.io's test hook)."""
    deadline = time.monotonic() + limit
    while not marker.exists():
        if process.poll() is not None:
            pytest.fail(f"training ended before the stalled write: {process.communicate()}")
        if time.monotonic() > deadline:
            pytest.fail("the write did not stall in time")
        time.sleep(0.02)


def stalled_in_second_checkpoint(options, run_dir, output):
    """A training whose second write of last.ckpt (after epoch 2) has stopped after its
    first 4 KiB (atomtrain.io's test hook): (process, the marker that holds it there)."""
    process = subprocess.Popen(
        train_command(options, run_dir),
        env=environment(ATOMTRAIN_TEST_STALL_WRITE="last.ckpt:2"),
        stdout=output,
        stderr=output,
        text=True,
    )
    marker = run_dir / "last.ckpt.stalled"
    wait_for_stall(marker, process)
    return process, marker


@pytest.mark.slow
def test_a_kill_inside_a_checkpoint_write_leaves_the_previous_checkpoint(tmp_path):
    """The second write of last.ckpt (after epoch 2) stops after its first 4 KiB, the
    process is killed there, and --restart auto resumes from epoch 1's checkpoint."""
    options = options_in(tmp_path)
    run_dir = tmp_path / "run"
    process, marker = stalled_in_second_checkpoint(options, run_dir, subprocess.DEVNULL)
    partial = list(run_dir.glob(".last.ckpt.*.tmp"))
    assert len(partial) == 1 and partial[0].stat().st_size >= 4096  # killed mid-write
    process.kill()
    process.wait()
    assert torch.load(run_dir / "last.ckpt", weights_only=True)["epoch"] == 1
    resume_auto(options, run_dir)
    log = (run_dir / "train.log").read_text()
    assert "resuming after epoch 1" in log
    assert torch.load(run_dir / "last.ckpt", weights_only=True)["epoch"] == EPOCHS


@pytest.fixture
def small_disk(tmp_path):
    """A directory on a 4 MiB file system of its own (root only: a tmpfs mount)."""
    directory = tmp_path / "disk"
    directory.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(directory)],
        capture_output=True,
    )
    if mounted.returncode != 0:
        pytest.skip("cannot mount a small file system here (needs root)")
    yield directory
    subprocess.run(["umount", "-l", str(directory)], check=False)


def fill(directory: Path, leave: int) -> None:
    """Fill the file system of ``directory`` up to ``leave`` bytes."""
    # unbuffered: a write the disk took only part of leaves nothing for close to flush
    with open(directory / "filler", "wb", buffering=0) as stream:
        try:
            while True:
                stream.write(b"\0" * 65536)
        except OSError:
            pass
    with open(directory / "filler", "r+b") as stream:
        stream.truncate(max(0, (directory / "filler").stat().st_size - leave))


def test_disk_full_while_checkpointing_is_named_and_keeps_the_last_checkpoint(tmp_path, small_disk):
    options = options_in(tmp_path)
    run_dir = small_disk / "run"
    process, marker = stalled_in_second_checkpoint(options, run_dir, subprocess.PIPE)
    fill(small_disk, leave=8192)
    marker.unlink()  # the write goes on, into a full disk
    _, error = process.communicate(timeout=120)
    assert process.returncode == 2, error
    lines = error.strip().splitlines()
    assert lines == [lines[-1]] and lines[-1].startswith("atomtrain: no space left on device")
    assert "checkpoint" in lines[-1] and str(run_dir / "last.ckpt") in lines[-1]
    assert torch.load(run_dir / "last.ckpt", weights_only=True)["epoch"] == 1
    assert not list(run_dir.glob("*.tmp"))
