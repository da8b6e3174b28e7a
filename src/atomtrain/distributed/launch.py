"""``atomtrain train --nproc N``: start N workers on this machine through PyTorch's
elastic launcher (what torchrun uses), each re-running the same command."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

from ..errors import DistributedError
from ..signals import give_back_signals, take_stop_signals
from .context import check_port_free
from .env import hostname


class StoppedBeforeStart(Exception):
    """A stop signal came before any worker ran: nothing to checkpoint."""

    def __init__(self, number: int):
        super().__init__(signal.Signals(number).name)
        self.number = number


def worker_pids() -> list[int] | None:
    """This process's children that run atomtrain (the workers the agent started), from
    /proc on Linux, else from pgrep; None where neither can tell."""
    if Path("/proc/self/task").is_dir():
        found: list[int] = []
        for listing in Path("/proc/self/task").glob("*/children"):
            for pid in map(int, listing.read_text().split()):
                try:
                    command = Path(f"/proc/{pid}/cmdline").read_bytes()
                except OSError:
                    continue
                if b"atomtrain" in command:
                    found.append(pid)
        return found
    try:
        listed = subprocess.run(
            ["pgrep", "-P", str(os.getpid()), "-f", "atomtrain"],
            capture_output=True,
            text=True,
            timeout=5,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return [int(pid) for pid in listed.stdout.split()] if listed.returncode in (0, 1) else None


class SignalForwarder:
    """Installed in the launcher while its workers run: their stop signals
    (training/stopping.py) go on to them, and the launcher waits for their exit code,
    instead of the elastic agent tearing them down and reporting a failure to start."""

    def __init__(self) -> None:
        self.received: int | None = None
        self.previous: dict[int, object] = {}

    def __enter__(self) -> SignalForwarder:
        self.previous = take_stop_signals(self.forward)
        return self

    def __exit__(self, *unused) -> None:
        give_back_signals(self.previous)

    def forward(self, number: int, frame) -> None:
        from torch.distributed.elastic.multiprocessing.api import SignalException

        self.received = number
        workers = worker_pids()
        if workers is None:
            # what the agent's own handler does: it passes the signal on and stops
            raise SignalException(f"got {signal.Signals(number).name}", signal.Signals(number))
        if not workers:
            raise StoppedBeforeStart(number)
        for pid in workers:
            try:
                os.kill(pid, number)
            except ProcessLookupError:
                pass


def quiet_elastic_loggers() -> None:
    """The elastic agent logs each worker's exit code and each signal; the workers
    print what happened themselves, in one line, and the launcher what they cannot."""
    for name, logger in list(logging.root.manager.loggerDict.items()):
        if name.startswith("torch.distributed.elastic") and isinstance(logger, logging.Logger):
            logger.setLevel(logging.CRITICAL)


def stopped_early(number: int) -> int:
    name = signal.Signals(number).name
    print(f"atomtrain: stopped by {name} before training started", file=sys.stderr)
    return 128 + number


def launch_workers(arguments: list[str], nproc: int, port: int | None, timeout: float) -> int:
    """Run ``python -m atomtrain <arguments>`` in ``nproc`` processes; return the exit
    code (0 when all succeeded). Each worker prints its own errors."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    if port is not None:
        check_port_free(hostname(), port)
    quiet_elastic_loggers()
    # the agent keeps only the signals atomtrain's workers do not stop on (a setting of
    # recent torch, 2.13 has it; an older agent handles all of them: SignalException)
    handled = {"signals_to_handle": "SIGQUIT"}
    if "signals_to_handle" not in LaunchConfig.__dataclass_fields__:
        handled = {}
    config = LaunchConfig(
        **handled,
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
    with SignalForwarder() as forwarder:
        try:
            elastic_launch(config, sys.executable)("-m", "atomtrain", *arguments)
        except ChildFailedError as error:
            codes = [failure.exitcode for failure in error.failures.values()]
            worst = max((code for code in codes if code > 0), default=None)
            if worst is None and forwarder.received is not None:
                return stopped_early(forwarder.received)  # killed while starting up
            for rank, failure in sorted(error.failures.items()):
                if failure.exitcode < 0 and forwarder.received is None:
                    name = signal.Signals(-failure.exitcode).name
                    if name == "SIGTERM" and worst is not None:
                        continue  # the agent stopping the others after a rank's own error
                    print(f"atomtrain: rank {rank} was killed by {name}", file=sys.stderr)
            return worst or 1
        except StoppedBeforeStart as error:
            return stopped_early(error.number)
        except SignalException as error:
            # the agent passed the signal on to the workers, which print their own lines
            return 128 + int(error.sigval)
        except Exception as error:
            raise DistributedError(f"could not start {nproc} workers: {error}") from error
    return 0
