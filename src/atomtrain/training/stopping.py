"""Stopping together: signals from the scheduler, non-finite losses. Each step all ranks
reduce one small status tensor, so they all take the same decision at the same step."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator

from ..errors import AtomtrainError
from ..signals import EXIT_STOPPED, SignalArrivals, give_back_signals, take_stop_signals


class StopRequest:
    """Remembers a SIGTERM or SIGUSR1 (sent by SLURM before it kills a job, e.g. with
    ``--signal=USR1@120``), a Ctrl-C or a hangup until the next step boundary. Asked
    again more than REPEAT_WINDOW after the signal first arrived, it stops the process
    at once, even while it waits on a hung peer (see SignalArrivals)."""

    def __init__(self) -> None:
        self.signal_name: str | None = None
        self.previous: dict[int, object] = {}
        self.arrivals: SignalArrivals | None = None
        self.raising = False

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        self.previous = take_stop_signals(self._handle)
        if self.previous:
            self.arrivals = SignalArrivals(self.previous, obey_at_once)

    def uninstall(self) -> None:
        if self.arrivals is not None:
            self.arrivals.stop()
            self.arrivals = None
        give_back_signals(self.previous)
        self.previous.clear()

    def _handle(self, number: int, frame) -> None:
        if self.signal_name is None:
            self.signal_name = signal.Signals(number).name
            if self.raising:
                self.raising = False
                raise StopArrived(self.signal_name)

    @contextlib.contextmanager
    def raised_here(self) -> Iterator[None]:
        """A stop that arrives in this block raises StopArrived in the main thread at
        once, instead of waiting for the step boundary: for work that may take a minute
        (compiling the training step), longer than a scheduler waits after its signal.
        Where the handlers are not installed (not the main thread), nothing raises."""
        self.raising = True
        try:
            yield
        finally:
            self.raising = False

    @property
    def requested(self) -> bool:
        return self.signal_name is not None


def obey_at_once(number: int) -> None:
    """Asked again: the run may be stuck (e.g. waiting on a hung peer). Called from the
    signal thread, which cannot raise in the main thread: leave now, as the shell
    reports a command ended by that signal."""
    name = signal.Signals(number).name
    line = (
        f"atomtrain: {name} again: stopped at once, without writing a checkpoint (the "
        "last one written is kept; resume with --restart auto)\n"
    )
    # not print() nor logging: the main thread may hold their locks, stuck for good
    os.write(2, line.encode())
    os._exit(128 + number)


class StopArrived(BaseException):
    """A stop signal, raised where the work in progress may be given up (see
    StopRequest.raised_here). A BaseException, as KeyboardInterrupt is, so that a
    library's handlers of errors (torch.compile's) do not take it for an error of
    their own."""


class CollectiveError(AtomtrainError):
    """An error every rank raises at the same step, from reduced values: only rank 0
    needs to print it."""

    collective = True


class TrainingStopped(CollectiveError):
    """Stopped by a signal after writing a step checkpoint."""

    exit_code = EXIT_STOPPED


class NonFiniteLoss(CollectiveError):
    """The loss became NaN or infinite."""


class ParametersDiverged(CollectiveError):
    """Ranks hold different parameters (distributed.check_consistency_every)."""
