"""gloo's TCP event loop: out of the way while this rank computes, at normal priority
again as soon as a collective has to wait for it.

When a peer's data arrives before this rank has posted the matching receive, the event
loop spins on epoll (the data stays unread, so it is always ready; gloo issue 246). On
the rank's own core it then takes turns with the thread that would post the receive and
with the training thread: a collective took 3-7 ms instead of 0.4 ms after 25 ms of
compute. Scheduled as SCHED_IDLE, it runs only while the rank's other threads wait.

But a SCHED_IDLE thread barely runs while any other process wants the core, and the
loop is also what notices a peer's data and a peer's death: on a machine busy with
other work, a rank learnt that its peer had failed only after 5 to 30 s. So a watchdog
gives the loop its normal priority back once a collective has waited ``patience``
seconds (much longer than one normally takes), and SCHED_IDLE again when it ends.
"""

from __future__ import annotations

import atexit
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

LOOP_THREAD_NAME = "gloo_tcp_loop"


def process_threads() -> list[int]:
    """Ids of this process's threads (Linux; none elsewhere)."""
    try:
        return [int(task.name) for task in Path("/proc/self/task").iterdir()]
    except (OSError, ValueError):
        return []


def thread_name(thread: int) -> str | None:
    try:
        return Path(f"/proc/self/task/{thread}/comm").read_text().strip()
    except OSError:
        return None  # the thread ended meanwhile


def threads_named(name: str) -> list[int]:
    """Ids of this process's threads called ``name`` (Linux; none elsewhere)."""
    return [thread for thread in process_threads() if thread_name(thread) == name]


class EventLoopPriority:
    """SCHED_IDLE for gloo's event-loop threads, lifted while a collective waits long."""

    def __init__(self, threads: list[int], patience: float = 0.05):
        self.threads = threads
        self.patience = patience
        self.lock = threading.Lock()
        self.waiting_since: float | None = None
        self.lifted = False
        self.stopped = threading.Event()
        self.watchdog: threading.Thread | None = None
        self.schedule(os.SCHED_IDLE)
        if threads:
            self.watchdog = threading.Thread(target=self.watch, name="atomtrain-loop", daemon=True)
            self.watchdog.start()
            # ended before the interpreter shuts down: a daemon thread that wakes up
            # during shutdown is ended from under it
            atexit.register(self.stop)

    @classmethod
    def for_this_process(cls) -> EventLoopPriority | None:
        """For the event loops gloo started in this process; None where scheduling
        policies cannot be set (not Linux)."""
        if not hasattr(os, "sched_setscheduler"):
            return None
        return cls(threads_named(LOOP_THREAD_NAME))

    def schedule(self, policy: int) -> None:
        for thread in self.threads:
            if thread_name(thread) != LOOP_THREAD_NAME:
                continue  # ended with its process group: the id may be another's now
            try:
                os.sched_setscheduler(thread, policy, os.sched_param(0))
            except OSError:
                continue  # not allowed here: gloo keeps its default

    @contextmanager
    def collective(self) -> Iterator[None]:
        """Around a collective: the watchdog lifts the loop if it waits too long."""
        with self.lock:
            self.waiting_since = time.monotonic()
        try:
            yield
        finally:
            with self.lock:
                self.waiting_since = None
                if self.lifted:
                    self.schedule(os.SCHED_IDLE)
                    self.lifted = False

    def stop(self) -> None:
        self.stopped.set()
        if self.watchdog is not None and self.watchdog is not threading.current_thread():
            self.watchdog.join(timeout=1.0)

    def watch(self) -> None:
        while not self.stopped.wait(self.patience):
            with self.lock:
                since = self.waiting_since
                if since is None or self.lifted or time.monotonic() - since < self.patience:
                    continue
                self.schedule(os.SCHED_OTHER)
                self.lifted = True
