"""Several processes give the single-process model: --nproc, torchrun and SLURM srun,
on a data set whose size is not a multiple of the batch or of the world size, with a
rare element and a last batch smaller than the number of processes."""

from __future__ import annotations

import csv
import json
import os
import shutil
import socket
import subprocess
import sys
import time

import ase.io
import pytest
import torch
import yaml

from conftest import RESOURCES
from helpers import run_directories, slurm_available, write_options

PYTHON = sys.executable
TIMEOUT = 240


def make_data(directory):
    frames = ase.io.read(RESOURCES / "ethanol_40.xyz", ":")
    frames[3].numbers[-1] = 9  # one fluorine: a rare element, absent from most batches
    ase.io.write(directory / "train.xyz", frames[:26], format="extxyz")
    ase.io.write(directory / "validation.xyz", frames[26:31], format="extxyz")
    ase.io.write(directory / "test.xyz", frames[31:35], format="extxyz")


def options_for(directory, precision=64):
    def dataset(name):
        return {"systems": str(directory / name)}

    return write_options(
        directory,
        directory / "train.xyz",
        architecture__training__batch_size=5,  # 26 = 5 x 5 + 1: last batch of one
        architecture__training__num_epochs=3,
        validation_set=dataset("validation.xyz"),
        test_set=dataset("test.xyz"),
        base_precision=precision,
    )


def environment():
    clean = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(
            ("SLURM_", "MASTER_", "RANK", "WORLD_SIZE", "LOCAL_RANK", "TORCHELASTIC")
        )
    }
    clean["PYTHONUNBUFFERED"] = "1"
    return clean


def launch(command, cwd):
    result = subprocess.run(
        command, cwd=cwd, env=environment(), capture_output=True, text=True, timeout=TIMEOUT
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    (run,) = run_directories(cwd / "outputs")
    return run, result


def read_csv(run):
    with (run / "train.csv").open() as stream:
        return list(csv.DictReader(stream))


def assert_same_run(run, reference, tolerance=1e-8):
    expected = torch.load(reference / "last.ckpt", weights_only=True)["model_state"]
    actual = torch.load(run / "last.ckpt", weights_only=True)["model_state"]
    for name, value in expected.items():
        if value.is_floating_point():
            difference = (actual[name] - value).abs().max()
            assert difference <= tolerance * value.abs().max().clamp_min(1e-12), name
        else:
            assert torch.equal(actual[name], value), name
    expected_rows, actual_rows = read_csv(reference), read_csv(run)
    assert len(expected_rows) == len(actual_rows)
    for expected_row, actual_row in zip(expected_rows, actual_rows):
        for column, value in expected_row.items():
            expected_value = pytest.approx(float(value), rel=tolerance, abs=1e-12)
            assert float(actual_row[column]) == expected_value, column


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    directory = tmp_path_factory.mktemp("single")
    make_data(directory)
    run, _ = launch([PYTHON, "-m", "atomtrain", "train", str(options_for(directory))], directory)
    return run


@pytest.fixture
def workdir(tmp_path):
    make_data(tmp_path)
    return tmp_path


@pytest.mark.slow
def test_nproc_2_equals_single_process(reference, workdir):
    run, result = launch(
        [PYTHON, "-m", "atomtrain", "train", str(options_for(workdir)), "--nproc", "2"],
        workdir,
    )
    assert_same_run(run, reference)
    log = (run / "train.log").read_text()
    assert "2 processes" in log and "rank 0: host" in log and "rank 1: host" in log
    assert "metrics of the best model" in result.stdout


@pytest.mark.slow
def test_float32_nproc_2_matches_single_process_to_rounding(workdir, tmp_path_factory):
    """In float32 the sums over two shards round differently from one sum; the runs
    must still agree to float32 rounding amplified by three epochs, not drift apart."""
    single = tmp_path_factory.mktemp("single32")
    make_data(single)
    command = [PYTHON, "-m", "atomtrain", "train"]
    reference_run, _ = launch([*command, str(options_for(single, precision=32))], single)
    run, _ = launch([*command, str(options_for(workdir, precision=32)), "--nproc", "2"], workdir)
    assert_same_run(run, reference_run, tolerance=1e-3)


@pytest.mark.slow
def test_batches_packed_by_atoms_give_the_single_process_model(tmp_path_factory):
    """Batches packed by atom count hold one to four molecules of 3 to 17 atoms (qm9);
    a molecule larger than the limit is a batch of its own, leaving a rank without work:
    two processes still train the single-process model."""
    frames = ase.io.read(RESOURCES / "qm9_reduced_100.xyz", ":")
    frames = frames[:8] + frames[48:76]
    runs = []
    for extra in ([], ["--nproc", "2"]):
        directory = tmp_path_factory.mktemp("packed")
        ase.io.write(directory / "qm9.xyz", frames, format="extxyz")
        options = write_options(
            directory,
            directory / "qm9.xyz",
            training_set={"systems": "qm9.xyz", "targets": {"energy": {"key": "U0"}}},
            architecture__training__max_atoms_per_batch=16,
            architecture__training__min_atoms_per_batch=6,
            architecture__training__num_epochs=2,
        )
        command = [PYTHON, "-m", "atomtrain", "train", str(options), *extra]
        run, result = launch(command, directory)
        assert "[rank 1] packed batches" not in result.stderr  # rank 0 says it, once
        log = (run / "train.log").read_text()
        assert "training batches packed by atom count:" in log
        assert "structures larger than the limit, each a batch of its own: 1" in log
        idle_warning = "1.2 structures on average for 2 processes: some processes have nothing"
        assert (idle_warning in log) == bool(extra)
        runs.append(run)
    assert_same_run(runs[1], runs[0])


@pytest.mark.slow
def test_clipped_gradients_give_the_single_process_model(reference, tmp_path_factory):
    """Clipping acts on the global batch's gradient: two processes clip as one does. A
    norm this small clips the steps, so the model must differ from the reference's."""
    runs = []
    for extra in ([], ["--nproc", "2"]):
        directory = tmp_path_factory.mktemp("clipped")
        make_data(directory)
        options = options_for(directory)
        record = yaml.safe_load(options.read_text())
        record["architecture"]["training"]["grad_clip_norm"] = 0.05
        options.write_text(yaml.safe_dump(record))
        command = [PYTHON, "-m", "atomtrain", "train", str(options), *extra]
        runs.append(launch(command, directory)[0])
    assert_same_run(runs[1], runs[0])
    clipped = torch.load(runs[0] / "last.ckpt", weights_only=True)["model_state"]
    unclipped = torch.load(reference / "last.ckpt", weights_only=True)["model_state"]
    largest = max((clipped[name] - value).abs().max() for name, value in unclipped.items())
    assert largest > 1e-3


@pytest.mark.slow
def test_files_with_different_targets_give_the_single_process_model(tmp_path_factory):
    """Three files: molecules with forces, molecules with energies only (in hartree, under
    their own key), silicon cells with forces and stress. Each target is learnt and
    reported where it is known; two processes train the single-process model."""
    ethanol = ase.io.read(RESOURCES / "ethanol_40.xyz", ":12")
    qm9 = ase.io.read(RESOURCES / "qm9_reduced_100.xyz", ":12")
    silicon = ase.io.read(RESOURCES / "si_test.xyz", "7:12")  # 24 to 64 atoms
    runs = []
    for extra in ([], ["--nproc", "2"]):
        directory = tmp_path_factory.mktemp("mixed")
        for name, frames in (("ethanol", ethanol), ("qm9", qm9), ("silicon", silicon)):
            ase.io.write(directory / f"{name}.xyz", frames, format="extxyz")
        options = write_options(
            directory,
            directory / "ethanol.xyz",
            training_set=[
                "ethanol.xyz",
                {"systems": "qm9.xyz", "targets": {"energy": {"key": "U0", "unit": "hartree"}}},
                "silicon.xyz",
            ],
            validation_set=0.25,
            test_set=0.0,
            architecture__training__batch_size=4,
            architecture__training__num_epochs=2,
        )
        run, _ = launch([PYTHON, "-m", "atomtrain", "train", str(options), *extra], directory)
        log = (run / "train.log").read_text()
        assert "targets: energy, forces (13 of 22 structures), stress (4 of 22" in log
        header = read_csv(run)[0]
        assert "validation_forces_rmse (eV/A)" in header
        assert "validation_stress_rmse (eV/A^3)" in header
        runs.append(run)
    # Each step's summed gradient equals the single-process one to 1e-15 (a unit test
    # checks it on this data); Adam's first steps, which scale every gradient to about
    # the learning rate, amplify that rounding more on these energies (eV to hartree,
    # molecules to 64-atom cells) than on ethanol alone: 5e-7 after two epochs.
    assert_same_run(runs[1], runs[0], tolerance=1e-6)


@pytest.mark.slow
def test_torchrun_equals_single_process(reference, workdir):
    torchrun = shutil.which("torchrun") or pytest.skip("torchrun not on PATH")
    run, _ = launch(
        [
            torchrun,
            "--standalone",
            "--nproc-per-node",
            "2",
            "-m",
            "atomtrain",
            "train",
            str(options_for(workdir)),
        ],
        workdir,
    )
    assert_same_run(run, reference)


@pytest.mark.skipif(
    not slurm_available(), reason="no running SLURM (bash .ci/setup_slurm.sh starts one; CI does)"
)
@pytest.mark.slurm
def test_srun_equals_single_process(reference, workdir):
    run, _ = launch(
        [
            "srun",
            "-N1",
            "-n2",
            "--kill-on-bad-exit=1",
            PYTHON,
            "-m",
            "atomtrain",
            "train",
            str(options_for(workdir)),
        ],
        workdir,
    )
    assert_same_run(run, reference)
    assert "2 processes" in (run / "train.log").read_text()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("", 0))
        return probe.getsockname()[1]


def slurm_like(rank: int, port: int) -> dict[str, str]:
    return {
        **environment(),
        "SLURM_PROCID": str(rank),
        "SLURM_NTASKS": "2",
        "SLURM_LOCALID": str(rank),
        "SLURM_JOB_NODELIST": "localhost",
        "MASTER_PORT": str(port),
    }


def test_taken_port_fails_fast_with_one_line(workdir):
    with socket.socket() as holder:
        holder.bind(("", 0))
        holder.listen()
        port = holder.getsockname()[1]
        options = str(options_for(workdir))
        for command, env in [
            ([PYTHON, "-m", "atomtrain", "train", options], slurm_like(0, port)),
            (
                [
                    PYTHON,
                    "-m",
                    "atomtrain",
                    "train",
                    options,
                    "--nproc",
                    "2",
                    "-r",
                    f"distributed.port={port}",
                ],
                environment(),
            ),
        ]:
            start = time.monotonic()
            result = subprocess.run(
                command, cwd=workdir, env=env, capture_output=True, text=True, timeout=60
            )
            assert time.monotonic() - start < 30
            assert result.returncode != 0
            assert result.stderr.strip().splitlines() == [
                f"atomtrain: port {port} on node {socket.gethostname()} is already in use "
                "(another job?). Set distributed.port in the options or MASTER_PORT, or "
                "leave both unset to pick a free one."
            ]


@pytest.mark.slow
def test_rank_waiting_for_missing_rank_0_exits_with_message(workdir):
    port = free_port()
    start = time.monotonic()
    result = subprocess.run(
        [
            PYTHON,
            "-m",
            "atomtrain",
            "train",
            str(options_for(workdir)),
            "-r",
            "distributed.timeout=4",
        ],
        cwd=workdir,
        env=slurm_like(1, port),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert time.monotonic() - start < 30
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    assert (
        f"atomtrain: rank 1 on {socket.gethostname()} could not reach rank 0 at "
        f"localhost:{port} within 4 s"
    ) in result.stderr


def test_more_processes_than_batch_is_refused_before_starting(workdir):
    result = subprocess.run(
        [PYTHON, "-m", "atomtrain", "train", str(options_for(workdir)), "--nproc", "8"],
        cwd=workdir,
        env=environment(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "8 processes but architecture.training.batch_size is 5" in result.stderr


def test_nproc_inside_several_slurm_tasks_is_refused(workdir):
    result = subprocess.run(
        [PYTHON, "-m", "atomtrain", "train", str(options_for(workdir)), "--nproc", "2"],
        cwd=workdir,
        env=slurm_like(0, free_port()),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "--nproc 2 was given in each of 2 SLURM tasks" in result.stderr


GLOO_RANK = """
import json, os, sys, threading, time, torch
from atomtrain.distributed.context import initialize
from atomtrain.distributed.env import LaunchInfo
from atomtrain.distributed.event_loop import process_threads, threads_named
rank, port = int(sys.argv[1]), int(sys.argv[2])
launch = LaunchInfo("torchrun", rank, 2, rank, 2, "127.0.0.1", port)
context = initialize(launch, "cpu", 30.0)
total = context.all_reduce_sum(torch.tensor([rank + 1.0]))
cores = sorted(os.sched_getaffinity(0))
loops = threads_named("gloo_tcp_loop")
idle_between = [os.sched_getscheduler(thread) == os.SCHED_IDLE for thread in loops]
# rank 0 waits 0.6 s for rank 1 in this collective: meanwhile its loops run normally
policies_while_waiting = []
if rank == 0:
    look = lambda: policies_while_waiting.extend(os.sched_getscheduler(t) for t in loops)
    threading.Timer(0.3, look).start()
else:
    time.sleep(0.6)
context.all_reduce_sum(torch.tensor([1.0]))
print(json.dumps({
    "sum": float(total),
    "event_loops": idle_between,
    "lifted_while_waiting": policies_while_waiting,
    "idle_again": [os.sched_getscheduler(thread) == os.SCHED_IDLE for thread in loops],
    "cores": cores,
    "threads": torch.get_num_threads(),
    "every_thread_on_them": all(
        sorted(os.sched_getaffinity(thread)) == cores for thread in process_threads()
    ),
}))
context.close()
"""


def run_two_ranks(tmp_path, prefixes):
    """Start two ranks of a gloo group through ``initialize``, each command prefixed (to
    restrict its cores); return what each reports."""
    script = tmp_path / "rank.py"
    script.write_text(GLOO_RANK)
    port = free_port()
    # threads follow the cores when the user does not choose them
    env = {key: value for key, value in environment().items() if key != "OMP_NUM_THREADS"}
    ranks = [
        subprocess.Popen(
            [*prefixes[rank], PYTHON, str(script), str(rank), str(port)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(2)
    ]
    reports = []
    for process in ranks:
        stdout, stderr = process.communicate(timeout=120)
        assert process.returncode == 0, stderr[-2000:]
        reports.append(json.loads(stdout))
    return reports


def test_gloo_event_loop_yields_to_training_and_ranks_split_the_cores(tmp_path):
    """gloo's TCP event loop spins while a peer's data waits for this rank, so each rank
    runs it as SCHED_IDLE: it must not take the training thread's core. A collective
    that waits long gives it its normal priority back until it ends. Two ranks given
    the same cores split them, every thread of a rank on its share."""
    reports = run_two_ranks(tmp_path, [[], []])
    available = sorted(os.sched_getaffinity(0))
    lifted = reports[0]["lifted_while_waiting"]
    assert lifted and all(policy == os.SCHED_OTHER for policy in lifted)
    for report in reports:
        assert report["sum"] == 3.0
        assert report["event_loops"] and all(report["event_loops"])
        assert report["idle_again"] and all(report["idle_again"])
        assert report["every_thread_on_them"]
        assert report["threads"] == len(report["cores"]) == len(available) // 2
    assert not set(reports[0]["cores"]) & set(reports[1]["cores"])


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores")
def test_a_rank_given_its_own_cores_keeps_them(tmp_path):
    """As under srun with CPU binding: a launcher chose each rank's cores, so atomtrain
    does not split them again (rank 0 may use every core, rank 1 only the last)."""
    available = sorted(os.sched_getaffinity(0))
    last = str(available[-1])
    reports = run_two_ranks(tmp_path, [[], ["taskset", "-c", last]])
    assert reports[0]["cores"] == available
    assert reports[0]["threads"] == len(available)
    assert reports[1]["cores"] == [available[-1]]
    assert reports[1]["threads"] == 1
