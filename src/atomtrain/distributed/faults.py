"""When a peer dies, fails or becomes unreachable: find out which one, say so in one
line, and leave without waiting for collectives that will never complete."""

from __future__ import annotations

import datetime
import threading
import time

import torch.distributed as dist

from ..errors import PeerFailure, PeerReportedError

FAILED_KEY = "atomtrain/failed"
ALIVE_PREFIX = "atomtrain/alive/"
ACK_PREFIX = "atomtrain/ack/"
# how long survivors wait for each other when working out who was lost
ROLL_CALL_SECONDS = 5.0


def is_communication_error(error: BaseException) -> bool:
    """Errors raised by a collective whose peers are gone (gloo, NCCL, c10d)."""
    if isinstance(error, dist.DistError):
        return True
    if not isinstance(error, RuntimeError):
        return False
    text = str(error)
    markers = (
        "gloo",
        "Gloo",
        "NCCL",
        "c10d",
        "Connection",
        "Timed out",
        "timed out",
        "Socket",
        "socket",
        "Broken pipe",
        "pair closure",  # gloo, when an asynchronous collective's peer went silent
    )
    return any(marker in text for marker in markers)


def _store():
    try:
        return dist.distributed_c10d._get_default_store()
    except Exception:
        return None


def announce_failure(rank: int, host: str, message: str, timeout: float):
    """Tell the other ranks (through the rendezvous store) why this rank stops; returns
    the store, which the caller keeps alive while the others read it."""
    store = _store()
    if store is None:
        return None
    try:
        store.set_timeout(datetime.timedelta(seconds=min(timeout, ROLL_CALL_SECONDS)))
        store.set(FAILED_KEY, f"{rank}|{host}|{message}")
    except Exception:
        return None  # the store host may be the one that is gone
    return store


def wait_for_acknowledgements(store, rank: int, world_size: int) -> None:
    """Rank 0 hosts the store: stay until the others have read why it stops (they
    notice as soon as its collectives are gone), or a few seconds have passed."""
    others = [f"{ACK_PREFIX}{other}" for other in range(world_size) if other != rank]
    deadline = time.monotonic() + ROLL_CALL_SECONDS
    while time.monotonic() < deadline:
        try:
            if store.check(others):
                return
        except Exception:
            return
        time.sleep(0.1)


def diagnose(
    rank: int, world_size: int, hosts: list[str], master: str, timeout: float, error: BaseException
) -> PeerFailure:
    """Which rank was lost, as far as the store can tell, as a one-line error.

    The store's client can block without end when the network is down (its requests
    get no answer), so the roll call runs in a helper thread with a deadline.
    """
    outcome: list[PeerFailure] = []
    helper = threading.Thread(
        target=lambda: outcome.append(_roll_call(rank, world_size, hosts, master, timeout, error)),
        daemon=True,
    )
    helper.start()
    helper.join(2 * min(timeout, ROLL_CALL_SECONDS) + 1.0)
    if outcome:
        return outcome[0]
    host = hosts[0] if hosts else "unknown host"
    return PeerFailure(
        f"rank {rank} lost contact with rank 0 on {host} ({master}, which hosts the "
        "rendezvous): that process died or the network to it is down"
    )


def _roll_call(
    rank: int, world_size: int, hosts: list[str], master: str, timeout: float, error: BaseException
) -> PeerFailure:
    store = _store()
    wait = min(timeout, ROLL_CALL_SECONDS)

    def host_of(other: int) -> str:
        return hosts[other] if other < len(hosts) else "unknown host"

    if store is None:
        return PeerFailure(f"lost contact with the other ranks: {_first_line(error)}")
    try:
        store.set_timeout(datetime.timedelta(seconds=wait))
        if store.check([FAILED_KEY]):
            failed_rank, failed_host, _ = store.get(FAILED_KEY).decode().split("|", 2)
            try:
                store.set(f"{ACK_PREFIX}{rank}", "1")
            except Exception:
                # rank 0 may end as soon as it sees the acknowledgement, before the
                # store's answer to it reaches this rank: the reason is known already
                pass
            return PeerReportedError(
                f"stopping because rank {failed_rank} on {failed_host} failed (its error "
                "is shown by that rank)"
            )
        store.set(f"{ALIVE_PREFIX}{rank}", "1")
        deadline = time.monotonic() + wait
        missing = list(range(world_size))
        while time.monotonic() < deadline:
            missing = [
                other for other in range(world_size) if not store.check([f"{ALIVE_PREFIX}{other}"])
            ]
            if store.check([FAILED_KEY]):
                return _roll_call(rank, world_size, hosts, master, timeout, error)
            if not missing:
                break
            time.sleep(0.2)
    except Exception:
        return PeerFailure(
            f"rank {rank} lost contact with rank 0 on {host_of(0)} ({master}, which hosts "
            "the rendezvous): that process died or the network to it is down"
        )
    if missing:
        lost = ", ".join(f"rank {other} on {host_of(other)}" for other in missing)
        return PeerFailure(
            f"lost {lost}: the process died or the network to it is down ({_first_line(error)})"
        )
    return PeerFailure(f"a collective operation failed on all ranks: {_first_line(error)}")


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    line = text[0] if text else type(error).__name__
    return line[:200]
