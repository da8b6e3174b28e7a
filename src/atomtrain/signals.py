"""The signals that ask a run to stop, shared by the training loop (which checkpoints
and stops) and the --nproc launcher (which forwards them to its workers)."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterable

# exit code of a command stopped by a stop signal: a run after writing its checkpoint
# (resume it), a conversion after removing what it had written (run it again)
EXIT_STOPPED = 75

# the scheduler's (SIGTERM, SIGUSR1), Ctrl-C, and a closed terminal
STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT, signal.SIGHUP)
# A stop signal that arrives within this many seconds of the first is the same request
# delivered twice: scancel signals every process of a step and the --nproc launcher (or
# torchrun's agent) forwards what it got, a terminal's Ctrl-C reaches the launcher and
# its workers alike.
REPEAT_WINDOW = 1.0


def take_stop_signals(handler) -> dict[int, object]:
    """``handler`` for the stop signals, except those ignored by whoever started the
    process (nohup ignores SIGHUP, a shell SIGINT for commands it starts in the
    background); returns the handlers it replaced, for ``give_back_signals``."""
    previous: dict[int, object] = {}
    for number in STOP_SIGNALS:
        if signal.getsignal(number) is not signal.SIG_IGN:
            previous[number] = signal.signal(number, handler)
    return previous


def give_back_signals(previous: dict[int, object]) -> None:
    for number, handler in previous.items():
        signal.signal(number, handler)  # type: ignore[arg-type]


class SignalArrivals:
    """Notes, in a thread, when the stop signals reach this process, and calls
    ``on_repeat(number)`` (in that thread) for one that arrives more than REPEAT_WINDOW
    after the first.

    Python runs a signal's handler only when its main thread runs Python code. While
    that thread waits in a collective, a copy of a signal that arrived with the first
    would be handled seconds later and taken for a second request; and a signal sent
    again to a rank waiting on a hung peer would not be handled until the wait ends. The
    interpreter writes each signal's number to its wakeup file descriptor the moment the
    signal arrives: this reads it."""

    def __init__(self, numbers: Iterable[int], on_repeat: Callable[[int], None]) -> None:
        self.numbers = frozenset(int(number) for number in numbers)
        self.on_repeat = on_repeat
        self.first_arrival: float | None = None
        self.read_end, self.write_end = os.pipe()
        os.set_blocking(self.write_end, False)
        # main thread only (signal.set_wakeup_fd's rule); the previous one still gets
        # every byte
        self.previous_fd = signal.set_wakeup_fd(self.write_end, warn_on_full_buffer=False)
        self.thread = threading.Thread(target=self._watch, name="atomtrain-signals", daemon=True)
        self.thread.start()
        _active.append(self)

    def _watch(self) -> None:
        while True:
            try:
                received = os.read(self.read_end, 512)
            except OSError:
                return
            if not received:  # closed by stop()
                return
            now = time.monotonic()
            if self.previous_fd >= 0:
                try:
                    os.write(self.previous_fd, received)
                except OSError:
                    pass
            for number in received:
                if number not in self.numbers:
                    continue
                if self.first_arrival is None:
                    self.first_arrival = now
                elif now - self.first_arrival > REPEAT_WINDOW:
                    self.on_repeat(number)

    def stop(self) -> None:
        """Gives the wakeup descriptor back and ends the thread (main thread only)."""
        if self in _active:
            _active.remove(self)
            signal.set_wakeup_fd(self.previous_fd)
        os.close(self.write_end)
        self.thread.join(timeout=1.0)
        os.close(self.read_end)


# watchers of this process: a forked child gives their descriptor back, so that its
# signals do not reach its parent's watcher through the inherited pipe
_active: list[SignalArrivals] = []


def _forget_in_child() -> None:
    for watcher in reversed(_active):
        try:
            signal.set_wakeup_fd(watcher.previous_fd)
        except ValueError:  # forked from another thread than the main one
            break
    _active.clear()


os.register_at_fork(after_in_child=_forget_in_child)
