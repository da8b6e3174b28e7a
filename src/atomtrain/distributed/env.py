"""Which launcher started us: a pure function of the environment variables."""

from __future__ import annotations

import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass

import hostlist

from ..errors import DistributedError


@dataclass(frozen=True)
class LaunchInfo:
    """How this process fits into the job."""

    kind: str  # "single", "torchrun", "slurm" or "spawn" (we start --nproc workers)
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    master_addr: str = "127.0.0.1"
    master_port: int | None = None
    # True when torchrun's agent already serves the rendezvous store on master_port
    agent_store: bool = False

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1


def slurm_port(environ: Mapping[str, str]) -> int:
    """A port in [20000, 60000) derived from the job and step ids, so two jobs (or two
    steps of one job) sharing a node are unlikely to pick the same one."""
    job = int(environ.get("SLURM_JOB_ID", "0") or 0)
    step = int(re.sub(r"\D", "", environ.get("SLURM_STEP_ID", "0")) or 0)
    return 20000 + (job * 7919 + step * 104729) % 40000


def _first_count(tasks_per_node: str) -> int:
    """First count of a SLURM tasks-per-node string such as '2(x3),1'."""
    match = re.match(r"\s*(\d+)", tasks_per_node)
    return int(match.group(1)) if match else 1


def _integer(environ: Mapping[str, str], name: str) -> int:
    try:
        return int(environ[name])
    except (KeyError, ValueError) as error:
        raise DistributedError(
            f"environment variable {name}={environ.get(name)!r} is missing or not an integer"
        ) from error


def _torchrun(environ: Mapping[str, str], nproc: int | None) -> LaunchInfo:
    if nproc and nproc > 1:
        raise DistributedError(
            "--nproc cannot be used under torchrun (it already started the workers); "
            "drop --nproc or use --nproc-per-node of torchrun"
        )
    return LaunchInfo(
        kind="torchrun",
        rank=_integer(environ, "RANK"),
        world_size=_integer(environ, "WORLD_SIZE"),
        local_rank=int(environ.get("LOCAL_RANK", "0")),
        local_world_size=int(environ.get("LOCAL_WORLD_SIZE", environ["WORLD_SIZE"])),
        master_addr=environ.get("MASTER_ADDR", "127.0.0.1"),
        master_port=int(environ["MASTER_PORT"]) if "MASTER_PORT" in environ else None,
        agent_store="TORCHELASTIC_RUN_ID" in environ
        and environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true",
    )


def _slurm(environ: Mapping[str, str], nproc: int | None, port: int | None) -> LaunchInfo:
    if nproc and nproc > 1:
        raise DistributedError(
            f"--nproc {nproc} was given in each of {environ['SLURM_NTASKS']} SLURM tasks; "
            "either let srun start the processes (srun -n N atomtrain train ...) or "
            "start one task with --nproc, not both"
        )
    nodes = environ.get("SLURM_STEP_NODELIST") or environ.get("SLURM_JOB_NODELIST", "")
    try:
        master = hostlist.expand_hostlist(nodes)[0] if nodes else "127.0.0.1"
    except hostlist.BadHostlist as error:
        raise DistributedError(f"cannot expand SLURM node list '{nodes}': {error}") from error
    if "MASTER_ADDR" in environ:
        master = environ["MASTER_ADDR"]
    if port is None:
        port = int(environ["MASTER_PORT"]) if "MASTER_PORT" in environ else slurm_port(environ)
    tasks_per_node = environ.get("SLURM_STEP_TASKS_PER_NODE") or environ.get(
        "SLURM_TASKS_PER_NODE", "1"
    )
    return LaunchInfo(
        kind="slurm",
        rank=_integer(environ, "SLURM_PROCID"),
        world_size=_integer(environ, "SLURM_NTASKS"),
        local_rank=int(environ.get("SLURM_LOCALID", "0")),
        local_world_size=_first_count(tasks_per_node),
        master_addr=master,
        master_port=port,
    )


def detect_launch(
    environ: Mapping[str, str], nproc: int | None = None, port: int | None = None
) -> LaunchInfo:
    """torchrun first (also inside a SLURM allocation), then a SLURM step of several
    tasks, then ``--nproc N`` (we launch the workers), else a single process.

    ``port`` is ``distributed.port`` from the options; it wins over MASTER_PORT where
    we create the rendezvous ourselves.
    """
    if "RANK" in environ and "WORLD_SIZE" in environ:
        return _torchrun(environ, nproc)
    n_tasks = environ.get("SLURM_STEP_NUM_TASKS") or environ.get("SLURM_NTASKS")
    if "SLURM_PROCID" in environ and n_tasks and int(n_tasks) > 1:
        return _slurm({**environ, "SLURM_NTASKS": n_tasks}, nproc, port)
    if nproc and nproc > 1:
        return LaunchInfo(kind="spawn", world_size=nproc, local_world_size=nproc, master_port=port)
    return LaunchInfo(kind="single")


def hostname() -> str:
    return socket.gethostname()
