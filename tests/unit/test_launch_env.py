"""Launcher detection is a pure function of the environment: plain dicts suffice. Device
choice too, with what torch reports about GPUs stubbed."""

from __future__ import annotations

import pytest
import torch

from atomtrain.distributed.context import choose_device, core_share, cores_of_rank, threads_for
from atomtrain.distributed.env import detect_launch, slurm_port
from atomtrain.errors import DistributedError

TORCHRUN = {
    "RANK": "3",
    "WORLD_SIZE": "8",
    "LOCAL_RANK": "1",
    "LOCAL_WORLD_SIZE": "4",
    "MASTER_ADDR": "node01",
    "MASTER_PORT": "29500",
    "TORCHELASTIC_RUN_ID": "abc",
    "TORCHELASTIC_USE_AGENT_STORE": "True",
}
SLURM = {
    "SLURM_PROCID": "5",
    "SLURM_NTASKS": "8",
    "SLURM_LOCALID": "1",
    "SLURM_JOB_NODELIST": "node[01-04,07]",
    "SLURM_JOB_ID": "123456",
    "SLURM_STEP_ID": "2",
    "SLURM_STEP_TASKS_PER_NODE": "2(x4)",
}


def test_single_process_by_default():
    launch = detect_launch({})
    assert launch.kind == "single" and launch.world_size == 1 and not launch.is_distributed


def test_torchrun():
    launch = detect_launch(TORCHRUN)
    assert (launch.kind, launch.rank, launch.world_size, launch.local_rank) == ("torchrun", 3, 8, 1)
    assert launch.local_world_size == 4
    assert (launch.master_addr, launch.master_port) == ("node01", 29500)
    assert launch.agent_store


def test_torchrun_wins_inside_a_slurm_allocation():
    launch = detect_launch({**SLURM, **TORCHRUN})
    assert launch.kind == "torchrun" and launch.rank == 3


def test_slurm_step_with_several_tasks():
    launch = detect_launch(SLURM)
    assert (launch.kind, launch.rank, launch.world_size, launch.local_rank) == ("slurm", 5, 8, 1)
    assert launch.master_addr == "node01"  # first host of the expanded node list
    assert launch.local_world_size == 2
    assert launch.master_port == slurm_port(SLURM)


def test_slurm_port_differs_between_jobs_and_steps():
    ports = {
        slurm_port({"SLURM_JOB_ID": str(job), "SLURM_STEP_ID": str(step)})
        for job in (1000, 1001, 1002)
        for step in (0, 1)
    }
    assert len(ports) == 6
    assert all(20000 <= port < 60000 for port in ports)


def test_slurm_port_from_options_or_master_port():
    assert detect_launch(SLURM, port=31000).master_port == 31000
    assert detect_launch({**SLURM, "MASTER_PORT": "32000"}).master_port == 32000
    assert detect_launch({**SLURM, "MASTER_PORT": "32000"}, port=31000).master_port == 31000


def test_slurm_master_addr_override():
    assert detect_launch({**SLURM, "MASTER_ADDR": "10.0.0.9"}).master_addr == "10.0.0.9"


def test_slurm_step_with_one_task_is_single_process():
    launch = detect_launch({**SLURM, "SLURM_NTASKS": "1", "SLURM_PROCID": "0"})
    assert launch.kind == "single"


def test_step_task_count_wins_over_job_task_count():
    # an sbatch job of 8 tasks running a 1-task step is a single process
    launch = detect_launch({**SLURM, "SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "1"})
    assert launch.kind == "single"


def test_nproc_spawns_workers():
    launch = detect_launch({}, nproc=4)
    assert launch.kind == "spawn" and launch.world_size == 4
    assert detect_launch({}, nproc=1).kind == "single"


def test_nproc_in_several_slurm_tasks_is_an_error():
    with pytest.raises(DistributedError, match="--nproc 2 was given in each of 8 SLURM tasks"):
        detect_launch(SLURM, nproc=2)


def test_nproc_under_torchrun_is_an_error():
    with pytest.raises(DistributedError, match="--nproc cannot be used under torchrun"):
        detect_launch(TORCHRUN, nproc=2)


def test_bad_node_list_is_a_clear_error():
    with pytest.raises(DistributedError, match="cannot expand SLURM node list"):
        detect_launch({**SLURM, "SLURM_JOB_NODELIST": "node[01-"})


def test_ranks_given_the_same_cores_split_them_and_bound_ranks_keep_theirs():
    everything = tuple(range(8))
    # --nproc 2 or torchrun on one host: both ranks see all cores
    placements = [("a", everything), ("a", everything)]
    assert [cores_of_rank(placements, rank) for rank in range(2)] == [{0, 1, 2, 3}, {4, 5, 6, 7}]
    # srun with CPU binding: each task got its own cores, and keeps all of them
    placements = [("a", (0, 1, 2, 3)), ("a", (4, 5, 6, 7)), ("b", (0, 1, 2, 3))]
    assert [cores_of_rank(placements, rank) for rank in range(3)] == [
        {0, 1, 2, 3},
        {4, 5, 6, 7},
        {0, 1, 2, 3},
    ]
    # two hosts, two ranks each, unbound: each host's cores split among its own ranks
    placements = [("a", everything), ("b", everything), ("a", everything), ("b", everything)]
    assert [cores_of_rank(placements, rank) for rank in range(4)] == [
        {0, 1, 2, 3},
        {0, 1, 2, 3},
        {4, 5, 6, 7},
        {4, 5, 6, 7},
    ]


def test_user_thread_count_is_kept_when_it_fits_and_cut_when_it_would_share_cores():
    assert threads_for(4, None) == (4, None)
    assert threads_for(4, "2") == (2, None)
    threads, note = threads_for(1, "2")
    assert threads == 1
    assert note is not None and note.startswith(
        "OMP_NUM_THREADS=2 is more than the 1 core(s) this process trains on; using 1"
    )
    threads, note = threads_for(4, "many")
    assert (threads, note) == (4, "OMP_NUM_THREADS='many' is not a positive integer; using 4")


def test_local_processes_get_equal_disjoint_core_shares():
    cores = [0, 1, 2, 3, 4, 5, 6, 7]
    shares = [core_share(cores, rank, 4) for rank in range(4)]
    assert shares == [{0, 1}, {2, 3}, {4, 5}, {6, 7}]
    assert [core_share([4, 9, 5], rank, 2) for rank in range(2)] == [{4}, {5}]
    # alone, or more processes than cores: no binding beyond what was given
    assert core_share(cores, 0, 1) == set(cores)
    assert core_share([3], 1, 2) == {3}


@pytest.fixture
def two_gpus(monkeypatch):
    """What torch reports on a host with two GPUs; set_device only records its argument."""
    chosen = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    return chosen


def test_each_local_process_gets_its_own_gpu(two_gpus):
    launch = detect_launch({**TORCHRUN, "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}, None, None)
    assert choose_device("auto", launch) == torch.device("cuda", 1)
    assert two_gpus == [torch.device("cuda", 1)]
    assert choose_device("cpu", launch) == torch.device("cpu")


def test_more_local_processes_than_gpus_is_a_clear_error(two_gpus):
    launch = detect_launch(TORCHRUN, None, None)  # 4 processes on this host
    with pytest.raises(DistributedError, match=r"4 processes on .* but 2 visible GPU\(s\)"):
        choose_device("cuda", launch)
    assert two_gpus == []


def test_slurm_tasks_may_each_see_only_their_own_gpu(monkeypatch, two_gpus):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)  # --gpus-per-task=1
    launch = detect_launch(SLURM, None, None)  # 2 tasks on this node
    assert choose_device("auto", launch) == torch.device("cuda", 0)


def test_cuda_requested_without_a_gpu_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    launch = detect_launch({}, None, None)
    with pytest.raises(DistributedError, match="no GPU is visible; set device: cpu"):
        choose_device("cuda", launch)
    assert choose_device("auto", launch) == torch.device("cpu")
