"""``atomtrain train --nproc N``: start N workers on this machine through PyTorch's
elastic launcher (what torchrun uses), each re-running the same command."""

from __future__ import annotations

import logging
import sys
import uuid

from ..errors import DistributedError
from .context import check_port_free
from .env import hostname


def launch_workers(arguments: list[str], nproc: int, port: int | None, timeout: float) -> int:
    """Run ``python -m atomtrain <arguments>`` in ``nproc`` processes; return the exit
    code (0 when all succeeded). Each worker prints its own errors."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    if port is not None:
        check_port_free(hostname(), port)
    logging.getLogger("torch.distributed.elastic").setLevel(logging.ERROR)
    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=nproc,
        run_id=str(uuid.uuid4()),
        rdzv_backend="c10d",
        rdzv_endpoint=f"127.0.0.1:{port or 0}",
        rdzv_timeout=int(timeout),
        max_restarts=0,
        monitor_interval=0.1,
        start_method="spawn",
    )
    try:
        elastic_launch(config, sys.executable)("-m", "atomtrain", *arguments)
    except ChildFailedError as error:
        codes = {failure.exitcode for failure in error.failures.values()}
        return max((code for code in codes if code and code > 0), default=1)
    except Exception as error:
        raise DistributedError(f"could not start {nproc} workers: {error}") from error
    return 0
