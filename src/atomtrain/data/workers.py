"""Conversion's worker processes (``atomtrain convert --nproc N``): forked, each sends
back one result, and none outlives or hangs its parent.

``multiprocessing.Pool`` would wait forever for the result of a worker killed by the
kernel (out of memory) and leave its workers running when the parent is killed; here a
dead worker is named, a failed one stops the others, and workers die with the parent.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.connection
import os
import signal
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from ..errors import EXIT_PROCESS_LOST, AtomtrainError
from ..runtime import die_with_parent
from ..signals import EXIT_STOPPED, STOP_SIGNALS, give_back_signals, take_stop_signals


class ConversionStopped(AtomtrainError):
    """A stop signal ended the conversion; what it had written is removed."""

    exit_code = EXIT_STOPPED


class WorkerLost(AtomtrainError):
    """A worker process ended without a result (killed, out of memory)."""

    exit_code = EXIT_PROCESS_LOST


class SharedCounter:
    """0, 1, 2, ... handed out once each to whichever forked worker asks first."""

    def __init__(self) -> None:
        self.next = multiprocessing.get_context("fork").Value("q", 0)

    def __iter__(self) -> SharedCounter:
        return self

    def __next__(self) -> int:
        with self.next.get_lock():
            number = self.next.value
            self.next.value += 1
        return number


@contextlib.contextmanager
def stopped_by_signals(output: Path) -> Iterator[None]:
    """Turn a stop signal (SIGTERM, SIGUSR1, Ctrl-C, hangup) into ConversionStopped, so
    that the staging directory is removed on the way out. A second signal while that
    happens takes its default action (the staging directory is hidden and named
    partial, so it never looks complete)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous: dict[int, object] = {}

    def stop(number: int, frame) -> None:
        give_back_signals(previous)
        raise ConversionStopped(
            f"{output}: conversion stopped by {signal.Signals(number).name} before it "
            "finished; nothing was written, run the command again"
        )

    previous.update(take_stop_signals(stop))
    try:
        yield
    finally:
        give_back_signals(previous)


def run_in_processes(function: Callable, jobs: list[tuple], output: Path) -> list[Any]:
    """``function(*job)`` for each job, each in a forked process; the results in order.
    A worker's error is raised here and stops the others."""
    # fork: a spawned worker would spend 1.7 s importing torch, ASE and vesin first
    context = multiprocessing.get_context("fork")
    workers = []
    try:
        for job in jobs:
            receiver, sender = context.Pipe(duplex=False)
            arguments = (function, job, sender, os.getpid())
            process = context.Process(target=_work, args=arguments, daemon=True)
            process.start()
            sender.close()
            workers.append((process, receiver))
        return _collect(workers, output)
    finally:
        for process, receiver in workers:
            if process.is_alive():
                process.kill()
            process.join()
            receiver.close()


def _collect(workers: list, output: Path) -> list[Any]:
    results: dict[int, Any] = {}
    while len(results) < len(workers):
        waiting = {
            handle: number
            for number, (process, receiver) in enumerate(workers)
            if number not in results
            for handle in (receiver, process.sentinel)
        }
        for ready in multiprocessing.connection.wait(list(waiting)):
            number = waiting[ready]
            if number in results:
                continue
            process, receiver = workers[number]
            try:
                # a worker sends its result, then exits: read before judging its exit
                kind, value = receiver.recv() if receiver.poll() else (None, None)
            except EOFError:
                kind, value = None, None
            if kind == "error":
                raise value
            if kind == "result":
                results[number] = value
            else:  # its pipe closed or it exited, with nothing sent
                process.join()
                raise WorkerLost(
                    f"{output}: conversion process {number} ended without finishing its "
                    f"share ({_how(process.exitcode)}); nothing was written. If it ran out "
                    "of memory, use fewer processes"
                )
    return [results[number] for number in range(len(workers))]


def _how(exit_code: int | None) -> str:
    if exit_code is not None and exit_code < 0:
        return f"killed by {signal.Signals(-exit_code).name}"
    return f"exit code {exit_code}"


def _work(function: Callable, job: tuple, sender, parent: int) -> None:
    for number in STOP_SIGNALS:
        # the parent stops the workers (SIGKILL): a Ctrl-C or scancel reaches every
        # process, and a worker dying of it first would read as a lost worker
        signal.signal(number, signal.SIG_IGN)
    die_with_parent()
    if os.getppid() != parent:  # it died before the request above
        os._exit(1)
    # one thread, as torch's DataLoader workers: a forked child must not use the
    # OpenMP pool of a parent that used it (tests call convert in-process)
    torch.set_num_threads(1)
    try:
        message = ("result", function(*job))
    except BaseException as error:  # the parent reports it
        message = ("error", error)
    try:
        sender.send(message)
    except Exception as error:  # an error that does not pickle
        sender.send(("error", RuntimeError(f"{type(message[1]).__name__}: {error}")))
