"""Stopping together: signals from the scheduler, non-finite losses. Each step all ranks
reduce one small status tensor, so they all take the same decision at the same step."""

from __future__ import annotations

import os
import signal
import threading
import time

from ..errors import AtomtrainError
from ..signals import EXIT_STOPPED, REPEAT_WINDOW, give_back_signals, take_stop_signals


class StopRequest:
    """Remembers a SIGTERM or SIGUSR1 (sent by SLURM before it kills a job, e.g. with
    ``--signal=USR1@120``), a Ctrl-C or a hangup until the next step boundary. Asked
    again later, it obeys at once."""

    def __init__(self) -> None:
        self.signal_name: str | None = None
        self.received_at = 0.0
        self.previous: dict[int, object] = {}

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        self.previous = take_stop_signals(self._handle)

    def uninstall(self) -> None:
        give_back_signals(self.previous)
        self.previous.clear()

    def _handle(self, number: int, frame) -> None:
        if self.signal_name is None:
            self.signal_name = signal.Signals(number).name
            self.received_at = time.monotonic()
        elif time.monotonic() - self.received_at > REPEAT_WINDOW:
            # asked again: the run may be stuck (e.g. waiting on a dead peer); obey now
            if number == signal.SIGINT:
                raise KeyboardInterrupt
            signal.signal(number, signal.SIG_DFL)
            os.kill(os.getpid(), number)

    @property
    def requested(self) -> bool:
        return self.signal_name is not None


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
